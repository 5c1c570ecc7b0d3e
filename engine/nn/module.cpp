#include "cumulus/nn/module.h"

namespace cumulus::nn {

void Module::collect(const std::string& prefix, What what,
                     std::vector<std::pair<std::string, Tensor>>& out) const {
  if (what != What::buffers)
    for (const auto& [name, t] : parameters_) out.emplace_back(prefix + name, t);
  if (what != What::parameters)
    for (const auto& [name, t] : buffers_) out.emplace_back(prefix + name, t);
  for (const auto& [name, child] : children_) child->collect(prefix + name + ".", what, out);
}

std::vector<std::pair<std::string, Tensor>> Module::named_parameters() const {
  std::vector<std::pair<std::string, Tensor>> out;
  collect("", What::parameters, out);
  return out;
}

std::vector<std::pair<std::string, Tensor>> Module::named_buffers() const {
  std::vector<std::pair<std::string, Tensor>> out;
  collect("", What::buffers, out);
  return out;
}

std::vector<std::pair<std::string, Tensor>> Module::state_dict() const {
  std::vector<std::pair<std::string, Tensor>> out;
  collect("", What::both, out);
  return out;
}

Module& Module::train(bool on) {
  training_ = on;
  for (const auto& [name, child] : children_) child->train(on);
  return *this;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& [name, t] : named_parameters()) out.push_back(t);
  return out;
}

int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (const Tensor& t : parameters()) n += t.numel();
  return n;
}

void Module::zero_grad() const {
  for (const Tensor& t : parameters()) t.mark_grad_stale();
}

Tensor Module::register_parameter(const std::string& name, const Tensor& initial, Device device) {
  Tensor p;
  {
    MemoryCategoryScope scope(MemoryCategory::parameters);
    p = initial.device() == device ? initial.clone() : initial.to(device);
  }
  p.set_requires_grad(true);
  p.allocate_grad();
  parameters_.emplace_back(name, p);
  return p;
}

Tensor Module::register_buffer(const std::string& name, const Tensor& tensor) {
  CUMULUS_CHECK(tensor.defined(), InvalidArgument, "register_buffer(\"", name, "\"): undefined tensor");
  CUMULUS_CHECK(!tensor.requires_grad(), InvalidArgument, "register_buffer(\"", name,
                "\"): a buffer must not require grad (register a parameter instead)");
  buffers_.emplace_back(name, tensor);
  return tensor;
}

Tensor Module::register_buffer(const std::string& name, const Tensor& initial, Device device) {
  Tensor b;
  {
    MemoryCategoryScope scope(MemoryCategory::parameters);
    b = initial.device() == device ? initial.clone() : initial.to(device);
  }
  return register_buffer(name, b);
}

}  // namespace cumulus::nn
