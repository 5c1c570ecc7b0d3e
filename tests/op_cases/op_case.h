// The op-case registry (Note [Op cases]): every op's test cases in one place, each driving
//   tests/test_op_cases.cpp   the forward against a double-precision reference; every floating
//                             input's gradient against central finite differences of that
//                             reference (double); the output counted as activations and the op
//                             named in an out-of-memory report; CPU against CUDA (when a GPU is
//                             present: the op-level parity; the CUDA kernels themselves also run
//                             on the CPU through the emulation, tests/emulated/)
//   bench/bench_ops.cpp       forward and forward + backward time per case, GB/s and FLOP/s
//
// A case file (tests/op_cases/cases_*.cpp) registers its cases with CUMULUS_OP_CASES:
//
//   CUMULUS_OP_CASES(activation) {
//     OpCase c;
//     c.op = "relu";
//     c.name = "relu_3x5_f32";
//     c.inputs = {{{3, 5}, DType::f32, -2, 2, 0.05}};  // |x| >= 0.05: off the kink at 0
//     c.forward = [](const Inputs& t) { return ops::relu(t[0]); };
//     c.reference = [](const Values& v) { return map(v[0], [](double x) { return std::max(x, 0.0); }); };
//     cases.push_back(c);
//   }
//
// Note [Op cases]
// The registry is the one place op correctness is checked: an op's values and gradients are
// tested here and nowhere else (tests/test_ops.cpp, test_cnn.cpp and the like keep only what a case
// cannot say: error messages, edge cases, launch counts, bit-for-bit equalities between ops,
// PyTorch-pinned values). A new op adds its cases in a file of its own (cases_<group>.cpp) with a
// double reference written from the op's definition; the drivers pick it up.
// The drivers reduce an op's output to a scalar themselves: loss = sum_k w_k * out_k with fixed
// weights w_k = +-m/8 (m in 1..16), exact in bf16 and f16, so the upstream gradient is not uniform
// (a uniform one hides transposed or misplaced gradients) and a 16-bit case sees no rounding of it.
// The engine computes the loss as cast(out, f32) reshaped to [1, N] times w through ops::linear; the
// reference as the same sum in double. Each input's values are drawn once, stored in its dtype, and
// read back, so the reference sees exactly the (rounded) values the engine does. Integer inputs
// (labels, indices: i32, i64, u8; masks: bool) take no gradient and are not perturbed.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "cumulus/tensor/tensor.h"

namespace cumulus::testing {

using Inputs = std::vector<Tensor>;
using Values = std::vector<std::vector<double>>;  // one flat, row-major vector per input

// How one input is made. Floating values are uniform in [lo, hi) and kept at |v| >= min_abs (off an
// op's kinks: relu at 0, an abs at 0); integer values (i32, i64, u8, bool) are uniform integers in
// [lo, hi) (a bool input: lo 0, hi 2).
struct CaseInput {
  Shape shape;
  DType dtype = DType::f32;
  double lo = -1, hi = 1, min_abs = 0;
  bool grad = true;  // floating inputs: a leaf requiring grad, checked by finite differences
  // Floating inputs: edits the drawn values (before their rounding to dtype), to place what a
  // uniform draw never gives: a NaN, a constant channel.
  std::function<void(std::vector<float>&)> edit;
};

struct OpCase {
  std::string op;    // the op's name as it gives it to OpScope: "relu", "add"
  std::string name;  // unique, [A-Za-z0-9_]: "relu_3x5_f32"
  std::vector<CaseInput> inputs;
  // The op under test, on the inputs' device. Its output may have any shape and a floating dtype
  // (or any dtype when the case is not differentiable: a bool output reads as 0 and 1).
  std::function<Tensor(const Inputs&)> forward;
  // The same function in double precision, flat and row-major, on the inputs' values.
  std::function<std::vector<double>(const Values&)> reference;
  // Forward: max |engine - reference| <= tolerance * max(1, max |reference|).
  double tolerance = 1e-5;
  // Gradients: max |engine - finite differences| <= grad_tolerance * max |finite differences|.
  double grad_tolerance = 1e-4;
  // The finite differences' step, absolute: inputs of magnitude 1e20 or 1e-23 need their own.
  double fd_step = 1e-6;
  // A wide case (a row of a million) checks its gradient at this many evenly spaced elements of
  // each input (the first and last among them) rather than at all; 0: all.
  int64_t fd_samples = 0;
  // The op returns a view of its input (reshape, narrow): it allocates nothing, so the driver checks
  // neither the output's memory category nor an out-of-memory report for it.
  bool view = false;
  // Per forward, for the benchmark: FLOPs (0 for memory-bound ops, reported in GB/s). The bytes are
  // counted by the driver: every input read once and the output written once.
  double flops = 0;

  // ---- optional (the defaults leave a case as above) ----
  // false: the op has no gradient (argmax: an integer output). The drivers check the forward, that
  // the output does not require grad, and the CPU/CUDA forward; bench_ops times the forward only.
  bool differentiable = true;
  // A composite case (a model's block: several ops chained, so that gradients also pass between ops
  // through the engine's pending gradients rather than into leaves): the other ops its forward
  // runs. Its allocations may be named after `op` or any of these.
  std::vector<std::string> inner_ops;
  // Note [Benchmark sizes]
  // Cases are sized for finite differences (tens of elements); a benchmark wants sizes where the
  // op's time is its work, not its launch. bench_shapes, when not empty, gives one shape per input
  // that bench/bench_ops.cpp uses instead of inputs[i].shape (the same dtypes and ranges), and
  // bench_flops the FLOPs per forward at those shapes (0: memory-bound, GB/s only). A case that
  // sets them must take every size in its forward from its inputs' shapes, never from constants
  // it captured; its reference is not used at these sizes. Without them the case is benchmarked
  // at its own shapes (with `flops`).
  std::vector<Shape> bench_shapes;
  double bench_flops = 0;
};

using OpCaseFactory = void (*)(std::vector<OpCase>& cases);

// Every registered case, in registration order within a group and groups by name.
const std::vector<OpCase>& all_op_cases();

// Registration (use CUMULUS_OP_CASES): returns true so it can initialize a static.
bool register_op_cases(const char* group, OpCaseFactory factory);

// ---- for the drivers ----
// A case's inputs on one device. Only f32 tensors can be leaves (16-bit types are compute types,
// Note [Mixed precision] in engine/ops/linear.cpp), so a 16-bit input is its f32 leaf cast to the
// type, recorded: its gradient reaches the leaf converted exactly.
struct CaseTensors {
  Inputs leaves;  // f32 leaves (requiring grad when the input takes one), integer inputs as they are
  Inputs inputs;  // what the op gets: the leaves, cast to each input's dtype
};
// The case's inputs on `device`, drawn from `seed` (the same values on every device), each rounded
// to its dtype once.
CaseTensors make_inputs(const OpCase& c, Device device, uint64_t seed);
// The case at its benchmark sizes (Note [Benchmark sizes]): inputs[i].shape = bench_shapes[i] and
// flops = bench_flops where bench_shapes is given, else the case as it is.
OpCase at_bench_sizes(const OpCase& c);
// A tensor's values (any dtype, any device) as doubles, flat and row-major.
std::vector<double> values_of(const Tensor& t);

// A shape in a case's name: "8x64x128", or "scalar" for 0-d.
std::string shape_name(const Shape& s);

// ---- for references ----
// f applied to every element.
std::vector<double> map(const std::vector<double>& x, const std::function<double(double)>& f);
// out[i] = f(a[ia], b[ib]) under numpy's broadcasting of a's shape sa and b's shape sb.
std::vector<double> broadcast(const std::vector<double>& a, const Shape& sa, const std::vector<double>& b,
                              const Shape& sb, const std::function<double(double, double)>& f);

}  // namespace cumulus::testing

#define CUMULUS_OP_CASES(group)                                                         \
  static void cumulus_op_cases_##group(std::vector<::cumulus::testing::OpCase>& cases); \
  [[maybe_unused]] static const bool cumulus_op_cases_registered_##group =              \
      ::cumulus::testing::register_op_cases(#group, cumulus_op_cases_##group);          \
  static void cumulus_op_cases_##group(std::vector<::cumulus::testing::OpCase>& cases)
