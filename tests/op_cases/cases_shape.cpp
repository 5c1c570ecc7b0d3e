// Op cases (Note [Op cases] in op_case.h): cast between the floating types, and the views reshape
// and flatten (ops:: and Tensor's methods).
#include <string>

#include "cumulus/ops/shape.h"
#include "op_case.h"

namespace cumulus::testing {

namespace {

std::vector<double> identity(const Values& v) { return v[0]; }

// Rounding to `to` moves a value by at most 2^-9 (bf16) or 2^-12 (f16) of itself; inputs lie in
// [-2, 2), so the error relative to max(1, max |x|) is at most that. The gradient is cast back
// exactly (the loss weights are exact in every type).
OpCase cast_case(DType from, DType to) {
  OpCase c;
  c.op = "cast";
  c.name = std::string("cast_3x7_") + dtype_name(from) + "_to_" + dtype_name(to);
  c.inputs = {{{3, 7}, from, -2, 2, 0.01}};  // |x| >= 0.01: normal in f16, so bf16 -> f16 is exact
  c.forward = [to](const Inputs& t) { return ops::cast(t[0], to); };
  c.reference = identity;
  const bool widening = to == DType::f32 || (from == DType::bf16 && to == DType::f16);
  c.tolerance = widening ? 0 : to == DType::bf16 ? 2.0 / 512 : 2.0 / 4096;
  c.grad_tolerance = 1e-6;
  c.bench_shapes = {{1024, 4096}};
  return c;
}

OpCase view_case(const std::string& op, const std::string& name, const Shape& shape, DType dtype,
                 std::function<Tensor(const Inputs&)> forward) {
  OpCase c;
  c.op = op;
  c.name = name + "_" + dtype_name(dtype);
  c.inputs = {{shape, dtype}};
  c.forward = std::move(forward);
  c.reference = identity;
  c.view = true;
  return c;
}

}  // namespace

CUMULUS_OP_CASES(shape) {
  cases.push_back(cast_case(DType::f32, DType::bf16));
  cases.push_back(cast_case(DType::f32, DType::f16));
  cases.push_back(cast_case(DType::bf16, DType::f32));
  cases.push_back(cast_case(DType::f16, DType::f32));
  cases.push_back(cast_case(DType::bf16, DType::f16));
  cases.push_back(cast_case(DType::f16, DType::bf16));

  // A 16-bit input reaches the view through its cast, so the view's gradient goes to a pending
  // (inner node) gradient rather than into a leaf.
  for (DType dtype : {DType::f32, DType::bf16}) {
    cases.push_back(view_case("reshape", "reshape_3x8_to_4x6", {3, 8}, dtype, [](const Inputs& t) {
      return ops::reshape(t[0], {4, 6});
    }));
    cases.push_back(view_case("flatten", "flatten_2x3x2x2_from_1", {2, 3, 2, 2}, dtype,
                              [](const Inputs& t) { return ops::flatten(t[0], 1); }));
  }
  cases.push_back(view_case("flatten", "flatten_2x3x2x2_from_2", {2, 3, 2, 2}, DType::f32,
                            [](const Inputs& t) { return ops::flatten(t[0], 2); }));
  cases.push_back(view_case("reshape", "tensor_reshape_2x3x5_to_5x6", {2, 3, 5}, DType::f32, [](const Inputs& t) {
    return t[0].reshape({5, 6});
  }));
  cases.push_back(view_case("flatten", "tensor_flatten_2x2x2x3", {2, 2, 2, 3}, DType::f32,
                            [](const Inputs& t) { return t[0].flatten(); }));
}

}  // namespace cumulus::testing
