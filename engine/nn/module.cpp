#include "cumulus/nn/module.h"
#include "engine/tensor/tensor_impl.h"

#include <cxxabi.h>

#include <cstdlib>
#include <memory>
#include <typeinfo>
#include <unordered_set>

namespace cumulus::nn {

namespace {

// The C++ name of a module's class, for messages ("Block", not "5Block").
std::string class_name(const Module& m) {
  const char* mangled = typeid(m).name();
  int status = 0;
  const std::unique_ptr<char, void (*)(void*)> readable(abi::__cxa_demangle(mangled, nullptr, nullptr, &status),
                                                         std::free);
  return status == 0 && readable ? readable.get() : mangled;
}

}  // namespace

void Module::collect(const std::string& prefix, What what,
                     std::vector<std::pair<std::string, Tensor>>& out) const {
  if (what != What::buffers)
    for (const Parameter& p : parameters_) out.emplace_back(prefix + p.name, p.tensor);
  if (what != What::parameters)
    for (const Buffer& b : buffers_)
      if (b.persistent || what == What::buffers) out.emplace_back(prefix + b.name, b.tensor);
  for (const auto& [name, child] : children_) child->collect(prefix + name + ".", what, out);
}

std::vector<std::pair<std::string, Tensor>> Module::named_parameters(bool remove_duplicate) const {
  std::vector<std::pair<std::string, Tensor>> all;
  collect("", What::parameters, all);
  if (!remove_duplicate) return all;
  // By identity (the impl), as PyTorch's memo set: the first name of a shared tensor stays.
  std::vector<std::pair<std::string, Tensor>> out;
  std::unordered_set<const TensorImpl*> seen;
  for (auto& named : all)
    if (seen.insert(impl_of(named.second).get()).second) out.push_back(std::move(named));
  return out;
}

std::vector<std::pair<std::string, Tensor>> Module::named_buffers() const {
  std::vector<std::pair<std::string, Tensor>> out;
  collect("", What::buffers, out);
  return out;
}

std::vector<std::pair<std::string, Tensor>> Module::state_dict() const {
  std::vector<std::pair<std::string, Tensor>> out;
  collect("", What::state, out);
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
  parameters_.push_back({name, p, nullptr});
  return p;
}

void Module::register_parameter(const std::string& name, Tensor& slot, const Tensor& initial, Device device) {
  slot = register_parameter(name, initial, device);
  parameters_.back().slot = &slot;
}

void Module::share_parameter(const std::string& name, const Tensor& tensor) {
  const std::string where = "Module::share_parameter(\"" + name + "\")";
  // Down the dotted path to the module that owns the parameter.
  Module* owner = this;
  std::size_t start = 0;
  for (std::size_t dot; (dot = name.find('.', start)) != std::string::npos; start = dot + 1) {
    const std::string child = name.substr(start, dot - start);
    Module* next = nullptr;
    for (const auto& [child_name, module] : owner->children_)
      if (child_name == child) next = module.get();
    CUMULUS_CHECK(next != nullptr, InvalidArgument, where, ": no child module '", name.substr(0, dot), "'");
    owner = next;
  }
  Parameter* p = nullptr;
  for (Parameter& candidate : owner->parameters_)
    if (candidate.name == name.substr(start)) p = &candidate;
  CUMULUS_CHECK(p != nullptr, InvalidArgument, where,
                ": no parameter of that name (share_parameter replaces an existing parameter; it does not "
                "register a new one)");
  CUMULUS_CHECK(p->slot != nullptr, InvalidArgument, where,
                ": the module registered it without a slot (register_parameter(name, slot, initial, device)), "
                "so it would keep reading the old tensor");
  CUMULUS_CHECK(tensor.defined() && tensor.is_leaf() && tensor.requires_grad(), InvalidArgument, where,
                ": the tensor must be a leaf that requires grad (a parameter)");
  CUMULUS_CHECK(tensor.shape() == p->tensor.shape() && tensor.dtype() == p->tensor.dtype() &&
                    tensor.device() == p->tensor.device(),
                InvalidArgument, where, ": the tensor is ", tensor.str(), ", the parameter ", p->tensor.str());
  Tensor replaced = p->tensor;
  p->tensor = tensor;
  *p->slot = tensor;
  // Note [Tied after the optimizer]: the dropped tensor stops training unless it is still a
  // parameter here under another name.
  bool still_used = false;
  for (const auto& named : named_parameters()) still_used = still_used || impl_of(named.second) == impl_of(replaced);
  if (!still_used && replaced.requires_grad()) replaced.set_requires_grad(false);
}

Tensor Module::forward(const Tensor&) {
  throw InvalidArgument("Module::forward(const Tensor&): " + class_name(*this) +
                        " has no one-tensor forward (its forward takes other arguments: call it with them, not "
                        "through a Sequential)");
}

Tensor Module::register_buffer(const std::string& name, const Tensor& tensor, bool persistent) {
  CUMULUS_CHECK(tensor.defined(), InvalidArgument, "register_buffer(\"", name, "\"): undefined tensor");
  CUMULUS_CHECK(!tensor.requires_grad(), InvalidArgument, "register_buffer(\"", name,
                "\"): a buffer must not require grad (register a parameter instead)");
  buffers_.push_back({name, tensor, persistent});
  return tensor;
}

Tensor Module::register_buffer(const std::string& name, const Tensor& initial, Device device, bool persistent) {
  Tensor b;
  {
    MemoryCategoryScope scope(MemoryCategory::parameters);
    b = initial.device() == device ? initial.clone() : initial.to(device);
  }
  return register_buffer(name, b, persistent);
}

Module& ModuleList::operator[](std::size_t i) const {
  CUMULUS_CHECK(i < modules_.size(), InvalidArgument, "ModuleList: index ", i, " out of range for ", modules_.size(),
                " modules");
  return *modules_[i];
}

void ModuleList::append(std::shared_ptr<Module> module) {
  CUMULUS_CHECK(module != nullptr, InvalidArgument, "ModuleList::add: a null module");
  register_module(std::to_string(modules_.size()), module);
  modules_.push_back(std::move(module));
}

void ModuleList::wrong_type(std::size_t i) const {
  throw InvalidArgument(std::string("ModuleList::at(") + std::to_string(i) + "): the module is a " +
                        class_name((*this)[i]) + ", not the type asked for");
}

}  // namespace cumulus::nn
