// The op-case registry and the input making the drivers share (tests/op_cases/op_case.h).
#include <algorithm>
#include <cmath>
#include <map>

#include "cumulus/autograd/grad_mode.h"
#include "cumulus/core/error.h"
#include "cumulus/ops/shape.h"
#include "cumulus/tensor/random.h"
#include "op_case.h"

namespace cumulus::testing {

namespace {

// Groups by name, so the order of the cases does not depend on the order of static initialization.
std::map<std::string, OpCaseFactory>& factories() {
  static std::map<std::string, OpCaseFactory> groups;
  return groups;
}

bool valid_name(const std::string& name) {
  return !name.empty() && std::all_of(name.begin(), name.end(), [](char ch) {
    return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_';
  });
}

std::vector<OpCase> build_cases() {
  std::vector<OpCase> cases;
  for (const auto& [group, factory] : factories()) factory(cases);
  std::vector<std::string> names;
  for (const OpCase& c : cases) {
    CUMULUS_CHECK(valid_name(c.name), InvalidArgument, "op case name '", c.name, "' must be [A-Za-z0-9_]+");
    CUMULUS_CHECK(!c.op.empty() && c.forward && c.reference, InvalidArgument, "op case ", c.name,
                  " needs an op name, a forward and a reference");
    CUMULUS_CHECK(c.bench_shapes.empty() || c.bench_shapes.size() == c.inputs.size(), InvalidArgument, "op case ",
                  c.name, ": ", c.bench_shapes.size(), " bench_shapes for ", c.inputs.size(), " inputs");
    names.push_back(c.name);
  }
  std::sort(names.begin(), names.end());
  const auto dup = std::adjacent_find(names.begin(), names.end());
  CUMULUS_CHECK(dup == names.end(), InvalidArgument, "two op cases are named ", *dup);
  return cases;
}

// Floating values uniform in [lo, hi), moved off (-min_abs, min_abs).
std::vector<float> floating_values(const CaseInput& in, Generator& gen) {
  std::vector<float> v(static_cast<std::size_t>(in.shape.numel()));
  gen.fill_uniform(v.data(), static_cast<int64_t>(v.size()), static_cast<float>(in.lo), static_cast<float>(in.hi));
  const float m = static_cast<float>(in.min_abs);
  for (float& x : v)
    if (std::fabs(x) < m) x = x < 0 ? -m - (m + x) : m + (m - x);  // reflected out of the gap
  return v;
}

std::vector<int32_t> integer_values(const CaseInput& in, Generator& gen) {
  std::vector<float> u(static_cast<std::size_t>(in.shape.numel()));
  gen.fill_uniform(u.data(), static_cast<int64_t>(u.size()), 0.0f, 1.0f);
  std::vector<int32_t> v(u.size());
  const double span = in.hi - in.lo;
  for (std::size_t i = 0; i < u.size(); ++i)
    v[i] = static_cast<int32_t>(std::min(in.hi - 1, std::floor(in.lo + u[i] * span)));
  return v;
}

// An integer input in its dtype: i32, i64, u8, or bool (values in [0, 2), stored as bytes: bool has no
// from_vector, Note [Bool tensors] in engine/ops/compare.cpp).
Tensor integer_input(const OpCase& c, const CaseInput& in, Generator& gen, Device device) {
  const std::vector<int32_t> v = integer_values(in, gen);
  switch (in.dtype) {
    case DType::i32: return Tensor::from_vector(v, in.shape, device);
    case DType::i64: return Tensor::from_vector(std::vector<int64_t>(v.begin(), v.end()), in.shape, device);
    case DType::u8: return Tensor::from_vector(std::vector<uint8_t>(v.begin(), v.end()), in.shape, device);
    case DType::boolean: {
      Tensor t = Tensor::empty(in.shape, DType::boolean, Device::cpu());
      auto* bytes = static_cast<uint8_t*>(t.raw_data());
      for (std::size_t i = 0; i < v.size(); ++i) bytes[i] = v[i] != 0;
      return t.to(device);
    }
    default:
      throw InvalidArgument(
          detail::concat("op case ", c.name, ": integer inputs are i32, i64, u8 or bool, got ", dtype_name(in.dtype)));
  }
}

}  // namespace

bool register_op_cases(const char* group, OpCaseFactory factory) {
  factories().emplace(group, factory);
  return true;
}

const std::vector<OpCase>& all_op_cases() {
  static const std::vector<OpCase> cases = build_cases();
  return cases;
}

CaseTensors make_inputs(const OpCase& c, Device device, uint64_t seed) {
  Generator gen(seed);
  CaseTensors made;
  for (const CaseInput& in : c.inputs) {
    if (!is_floating(in.dtype)) {
      made.leaves.push_back(integer_input(c, in, gen, device));
      made.inputs.push_back(made.leaves.back());
      continue;
    }
    std::vector<float> values = floating_values(in, gen);
    if (in.edit) in.edit(values);
    Tensor leaf = Tensor::from_vector(values, in.shape, device);
    {
      NoGradGuard no_grad;  // round the leaf's values to the input's type once
      leaf = ops::cast(ops::cast(leaf, in.dtype), DType::f32);
    }
    if (in.grad) leaf.set_requires_grad(true);
    made.leaves.push_back(leaf);
    made.inputs.push_back(ops::cast(leaf, in.dtype));
  }
  return made;
}

OpCase at_bench_sizes(const OpCase& c) {
  OpCase b = c;
  if (c.bench_shapes.empty()) return b;
  for (std::size_t i = 0; i < b.inputs.size(); ++i) b.inputs[i].shape = c.bench_shapes[i];
  b.flops = c.bench_flops;
  return b;
}

std::vector<double> values_of(const Tensor& t) {
  Tensor host = t.to(Device::cpu());
  if (host.dtype() == DType::i32) {
    const std::vector<int32_t> v = host.to_vector<int32_t>();
    return std::vector<double>(v.begin(), v.end());
  }
  if (host.dtype() == DType::i64) {
    const std::vector<int64_t> v = host.to_vector<int64_t>();
    return std::vector<double>(v.begin(), v.end());
  }
  if (host.dtype() == DType::u8 || host.dtype() == DType::boolean) {  // bool reads as bytes, 0 or 1
    const std::vector<uint8_t> v = host.to_vector<uint8_t>();
    return std::vector<double>(v.begin(), v.end());
  }
  NoGradGuard no_grad;
  const std::vector<float> v = ops::cast(host, DType::f32).to_vector<float>();
  return std::vector<double>(v.begin(), v.end());
}

std::string shape_name(const Shape& s) {
  std::string name;
  for (int d = 0; d < s.ndim(); ++d) name += (d > 0 ? "x" : "") + std::to_string(s[d]);
  return s.ndim() == 0 ? "scalar" : name;
}

std::vector<double> map(const std::vector<double>& x, const std::function<double(double)>& f) {
  std::vector<double> y(x.size());
  std::transform(x.begin(), x.end(), y.begin(), f);
  return y;
}

std::vector<double> broadcast(const std::vector<double>& a, const Shape& sa, const std::vector<double>& b,
                              const Shape& sb, const std::function<double(double, double)>& f) {
  const int nd = std::max(sa.ndim(), sb.ndim());
  auto dim = [&](const Shape& s, int d) { return d - (nd - s.ndim()) >= 0 ? s[d - (nd - s.ndim())] : int64_t{1}; };
  std::vector<int64_t> out(static_cast<std::size_t>(nd));
  int64_t n = 1;
  for (int d = 0; d < nd; ++d) n *= out[d] = std::max(dim(sa, d), dim(sb, d));
  std::vector<double> y(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    int64_t rest = i, ia = 0, ib = 0, stride_a = 1, stride_b = 1;
    for (int d = nd - 1; d >= 0; --d) {
      const int64_t k = rest % out[d];
      rest /= out[d];
      if (dim(sa, d) > 1) ia += k * stride_a;
      if (dim(sb, d) > 1) ib += k * stride_b;
      stride_a *= dim(sa, d);
      stride_b *= dim(sb, d);
    }
    y[i] = f(a[ia], b[ib]);
  }
  return y;
}

}  // namespace cumulus::testing
