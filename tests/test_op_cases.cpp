// Every registered op case (tests/op_cases/, Note [Op cases] in op_case.h) through five checks:
// the forward against its double-precision reference, each floating input's gradient against
// central finite differences of the reference, the memory accounting (the output is an activation,
// every allocation is named after the op, or after one of a composite case's ops), the same case
// with its inputs as strided views, and CPU against CUDA (skipped without a GPU). An op without a
// gradient (OpCase::differentiable false) is checked to record none, and its forward alone is
// compared across devices.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <string>

#include "cumulus/memory/allocator.h"
#include "cumulus/ops/linear.h"
#include "cumulus/ops/pointwise.h"
#include "cumulus/ops/reduce.h"
#include "cumulus/ops/shape.h"
#include "cumulus/tensor/random.h"
#include "op_cases/op_case.h"
#include "test_util.h"

namespace cumulus::testing {
namespace {

constexpr uint64_t kInputSeed = 20261124;
constexpr uint64_t kWeightSeed = 7;

// The loss weights of Note [Op cases]: +-m/8, m in 1..16, exact in every floating dtype.
std::vector<double> loss_weights(int64_t n) {
  std::vector<float> u(static_cast<std::size_t>(2 * n));
  Generator(kWeightSeed).fill_uniform(u.data(), 2 * n, 0.0f, 1.0f);
  std::vector<double> w(static_cast<std::size_t>(n));
  for (int64_t k = 0; k < n; ++k)
    w[k] = (u[2 * k] < 0.5f ? -1.0 : 1.0) * std::min(16.0, std::floor(1.0 + 16.0 * u[2 * k + 1])) / 8.0;
  return w;
}

// sum_k w_k out_k through the engine's ops (recorded), as a scalar.
Tensor engine_loss(const Tensor& out, const std::vector<double>& w) {
  const int64_t n = out.numel();
  const Tensor weights = Tensor::from_vector(std::vector<float>(w.begin(), w.end()), {1, n}, out.device());
  const Tensor row = ops::reshape(ops::cast(out, DType::f32), {1, n});
  return ops::sum(ops::linear(row, weights, Tensor()));
}

double reference_loss(const OpCase& c, const Values& x, const std::vector<double>& w) {
  const std::vector<double> y = c.reference(x);
  double loss = 0;
  for (std::size_t k = 0; k < y.size(); ++k) loss += w[k] * y[k];
  return loss;
}

// Over the finite values: a scale for tolerances, which an infinity would make vacuous.
double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v)
    if (std::isfinite(x)) m = std::max(m, std::fabs(x));
  return m;
}

// max |a - b|, NaN when the sizes differ or one holds a NaN where the other does not. Equal values
// differ by 0, infinities included (masked_fill's -inf), and so do two NaNs (where passing one on).
double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return NAN;
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i] == b[i] || (std::isnan(a[i]) && std::isnan(b[i]))) continue;
    const double d = std::fabs(a[i] - b[i]);
    if (!(d <= m)) m = std::isnan(d) ? NAN : d;
    if (std::isnan(m)) return m;
  }
  return m;
}

Values input_values(const Inputs& inputs) {
  Values v;
  for (const Tensor& t : inputs) v.push_back(values_of(t));
  return v;
}

// The elements of an input of n at which its gradient is checked (OpCase::fd_samples).
std::vector<std::size_t> checked_elements(const OpCase& c, std::size_t n) {
  std::vector<std::size_t> ks;
  const auto samples = static_cast<std::size_t>(c.fd_samples);
  if (samples == 0 || samples >= n) {
    for (std::size_t k = 0; k < n; ++k) ks.push_back(k);
    return ks;
  }
  for (std::size_t s = 0; s < samples; ++s) ks.push_back(samples == 1 ? 0 : s * (n - 1) / (samples - 1));
  return ks;
}

std::vector<double> at(const std::vector<double>& v, const std::vector<std::size_t>& ks) {
  std::vector<double> out;
  for (std::size_t k : ks) out.push_back(v[k]);
  return out;
}

// The gradient of reference_loss with respect to input i at elements ks, by central differences
// in double.
std::vector<double> finite_differences(const OpCase& c, const Values& x, std::size_t i, const std::vector<double>& w,
                                       const std::vector<std::size_t>& ks) {
  const double h = c.fd_step;
  std::vector<double> g;
  Values xp = x;
  for (std::size_t k : ks) {
    xp[i][k] = x[i][k] + h;
    const double up = reference_loss(c, xp, w);
    xp[i][k] = x[i][k] - h;
    const double down = reference_loss(c, xp, w);
    xp[i][k] = x[i][k];
    g.push_back((up - down) / (2 * h));
  }
  return g;
}

class OpCaseTest : public ::testing::TestWithParam<std::size_t> {
 protected:
  const OpCase& op_case() const { return all_op_cases()[GetParam()]; }
};

TEST_P(OpCaseTest, ForwardMatchesReference) {
  const OpCase& c = op_case();
  const CaseTensors t = make_inputs(c, Device::cpu(), kInputSeed);
  const std::vector<double> expected = c.reference(input_values(t.inputs));
  const std::vector<double> got = values_of(c.forward(t.inputs));
  ASSERT_EQ(got.size(), expected.size()) << "the output's numel differs from the reference's";
  const double err = max_abs_diff(got, expected) / std::max(1.0, max_abs(expected));
  EXPECT_LE(err, c.tolerance) << "max |engine - reference| relative to max(1, max |reference|)";
}

TEST_P(OpCaseTest, GradientsMatchFiniteDifferences) {
  const OpCase& c = op_case();
  const CaseTensors t = make_inputs(c, Device::cpu(), kInputSeed);
  const Values x = input_values(t.inputs);
  const Tensor out = c.forward(t.inputs);
  if (!c.differentiable) {
    EXPECT_FALSE(out.requires_grad()) << "the case says the op has no gradient, but its output requires one";
    return;
  }
  const std::vector<double> w = loss_weights(out.numel());
  engine_loss(out, w).backward();
  int checked = 0;
  for (std::size_t i = 0; i < t.leaves.size(); ++i) {
    if (!is_floating(c.inputs[i].dtype) || !c.inputs[i].grad) continue;
    SCOPED_TRACE("input " + std::to_string(i) + " " + t.leaves[i].shape().str());
    const std::vector<std::size_t> ks = checked_elements(c, x[i].size());
    const std::vector<double> fd = finite_differences(c, x, i, w, ks);
    const double scale = max_abs(fd);
    EXPECT_GT(scale, 1e-3) << "the reference gradient is ~0: the check would be empty";
    const Tensor g = t.leaves[i].grad();
    ASSERT_TRUE(g.defined()) << "no gradient reached the input";
    EXPECT_LE(max_abs_diff(at(values_of(g), ks), fd), c.grad_tolerance * scale)
        << "analytic gradient against finite differences (tolerance relative to max |fd| = " << scale << ")";
    ++checked;
  }
  if (checked == 0) GTEST_SKIP() << "no floating input takes a gradient";
}

// Records which op each allocation was made under (Note [Op cases]: the tracker and the
// out-of-memory report name the op from the same OpScope).
class OpRecorder final : public AllocationObserver {
 public:
  void on_change(const MemoryStats& stats) override {
    if (stats.allocated > last_) ops_.insert(current_op().name ? current_op().name : "(no op)");
    last_ = stats.allocated;
  }
  std::set<std::string> ops_;
  int64_t last_ = 0;
};

TEST_P(OpCaseTest, OutputIsAnActivationNamedAfterTheOp) {
  const OpCase& c = op_case();
  if (c.view) GTEST_SKIP() << "a view allocates nothing";
  const CaseTensors t = make_inputs(c, Device::cpu(), kInputSeed);
  CachingAllocator& allocator = allocator_for(Device::cpu());
  OpRecorder recorder;
  recorder.last_ = allocator.stats().allocated;
  allocator.set_observer(&recorder);
  Tensor out;
  try {
    out = c.forward(t.inputs);
  } catch (...) {
    allocator.set_observer(nullptr);
    throw;
  }
  allocator.set_observer(nullptr);
  EXPECT_EQ(out.memory_category(), MemoryCategory::activations);
  ASSERT_FALSE(recorder.ops_.empty()) << "the op allocated nothing; mark the case a view if it is one";
  std::set<std::string> allowed(c.inner_ops.begin(), c.inner_ops.end());
  allowed.insert(c.op);
  EXPECT_EQ(recorder.ops_.count(c.op), 1u) << "nothing was allocated under the op's OpScope";
  for (const std::string& op : recorder.ops_)
    EXPECT_EQ(allowed.count(op), 1u) << "an allocation made under '" << op << "', outside the case's op(s)";
}

// `x` with the same values as a strided view, recorded so gradients reach x: every element at twice
// its dense stride, in storage of x's shape plus a last dimension of 2 (x beside zeros); at the
// most dimensions a shape has, the transpose of a dense transposed copy instead.
Tensor strided_copy_of(const Tensor& x) {
  if (x.ndim() == Shape::kMaxDims) return ops::transpose(ops::contiguous(ops::transpose(x, -1, -2)), -1, -2);
  const Tensor pair = ops::cat({ops::unsqueeze(x, -1), ops::unsqueeze(ops::mul(x, 0.0f), -1)}, -1);
  return ops::squeeze(ops::narrow(pair, -1, 0, 1), -1);
}

// The case's output values and (when it is differentiable) its floating leaves' gradients on
// `device`; `strided`: every floating input of more than one element given as a strided view
// (but for the buffers a differentiable op updates in place, which take no gradient: batch norm's
// running statistics).
std::vector<double> run_case(const OpCase& c, Device device, bool strided, std::vector<std::vector<double>>& grads) {
  CaseTensors t = make_inputs(c, device, kInputSeed);
  for (std::size_t i = 0; strided && i < t.inputs.size(); ++i) {
    Tensor& in = t.inputs[i];
    if (is_floating(in.dtype()) && in.ndim() >= 1 && in.numel() > 1 && (c.inputs[i].grad || !c.differentiable)) {
      in = strided_copy_of(in);
      EXPECT_FALSE(in.is_contiguous());
    }
  }
  const Tensor out = c.forward(t.inputs);
  const std::vector<double> y = values_of(out);
  if (!c.differentiable) return y;
  engine_loss(out, loss_weights(out.numel())).backward();
  for (std::size_t i = 0; i < t.leaves.size(); ++i)
    if (is_floating(c.inputs[i].dtype) && c.inputs[i].grad) grads.push_back(values_of(t.leaves[i].grad()));
  return y;
}

// Note [Strided views] in engine/ops/view.cpp: every op takes strided views, with the values and
// gradients it gives their dense copies.
TEST_P(OpCaseTest, StridedInputsMatchDenseOnes) {
  const OpCase& c = op_case();
  const bool any = std::any_of(c.inputs.begin(), c.inputs.end(), [&c](const CaseInput& in) {
    return is_floating(in.dtype) && in.shape.ndim() >= 1 && in.shape.numel() > 1 && (in.grad || !c.differentiable);
  });
  if (!any) GTEST_SKIP() << "no floating input of more than one element";
  std::vector<std::vector<double>> dense_grads, strided_grads;
  const std::vector<double> dense = run_case(c, Device::cpu(), false, dense_grads);
  const std::vector<double> strided = run_case(c, Device::cpu(), true, strided_grads);
  EXPECT_LE(max_abs_diff(strided, dense), c.tolerance * std::max(1.0, max_abs(dense))) << "forward";
  ASSERT_EQ(strided_grads.size(), dense_grads.size());
  for (std::size_t i = 0; i < dense_grads.size(); ++i)
    EXPECT_LE(max_abs_diff(strided_grads[i], dense_grads[i]), c.grad_tolerance * std::max(1.0, max_abs(dense_grads[i])))
        << "gradient " << i;
}

TEST_P(OpCaseTest, CudaMatchesCpu) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device" << (cuda_compiled() ? "" : " (built without CUDA)");
  const OpCase& c = op_case();
  std::vector<std::vector<double>> cpu_grads, cuda_grads;
  const std::vector<double> cpu = run_case(c, Device::cpu(), false, cpu_grads);
  const std::vector<double> cuda = run_case(c, Device::cuda(0), false, cuda_grads);
  EXPECT_LE(max_abs_diff(cuda, cpu), c.tolerance * std::max(1.0, max_abs(cpu))) << "forward";
  for (std::size_t i = 0; i < cpu_grads.size(); ++i)
    EXPECT_LE(max_abs_diff(cuda_grads[i], cpu_grads[i]), c.grad_tolerance * std::max(1.0, max_abs(cpu_grads[i])))
        << "gradient " << i;
  std::vector<std::vector<double>> strided_grads;
  const std::vector<double> strided = run_case(c, Device::cuda(0), true, strided_grads);
  EXPECT_LE(max_abs_diff(strided, cuda), c.tolerance * std::max(1.0, max_abs(cuda))) << "strided forward";
}

INSTANTIATE_TEST_SUITE_P(Registry, OpCaseTest, ::testing::Range<std::size_t>(0, all_op_cases().size()),
                         [](const ::testing::TestParamInfo<std::size_t>& info) {
                           return all_op_cases()[info.param].name;
                         });

}  // namespace
}  // namespace cumulus::testing
