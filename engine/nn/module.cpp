#include "cumulus/nn/module.h"

namespace cumulus::nn {

void Module::collect(const std::string& prefix,
                     std::vector<std::pair<std::string, Tensor>>& out) const {
  for (const auto& [name, t] : parameters_) out.emplace_back(prefix + name, t);
  for (const auto& [name, child] : children_) child->collect(prefix + name + ".", out);
}

std::vector<std::pair<std::string, Tensor>> Module::named_parameters() const {
  std::vector<std::pair<std::string, Tensor>> out;
  collect("", out);
  return out;
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

}  // namespace cumulus::nn
