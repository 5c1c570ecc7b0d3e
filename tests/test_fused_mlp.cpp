// The fused MLP op (ops::mlp_cross_entropy, Note [Fused MLP] in engine/ops/fused_mlp.cpp) against an
// independent double-precision reference and against the generic ops, on every device: outputs,
// loss and every gradient, at micro-batch sizes 1 to 1024, overwriting and accumulating, with labels
// at the class boundaries and with large logits. Also its saved activations against their analytic
// size, run-to-run bits, the model's choice of path, the errors, and (CUDA) its launch count.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "cumulus/autograd/node.h"
#include "cumulus/cumulus.h"
#include "cumulus/memory/allocator.h"
#include "cumulus/models/mlp.h"
#include "cumulus/train/trainer.h"
#include "test_util.h"
#if CUMULUS_WITH_CUDA
#include "engine/core/cuda_context.h"
#endif

namespace cumulus::testing {
namespace {

// ---- the problem ----------------------------------------------------------------------------

// An MLP of widths {in, hidden..., classes}, weights [out, in] and biases as PyTorch's nn.Linear
// draws them (uniform in +-1/sqrt(in)); head_gain scales the last layer (large logits).
struct Net {
  std::vector<int64_t> widths;
  std::vector<std::vector<float>> w, b;
  int64_t layers() const { return static_cast<int64_t>(w.size()); }
};

Net make_net(const std::vector<int64_t>& widths, uint64_t seed, float head_gain = 1.0f) {
  Net net;
  net.widths = widths;
  Generator gen(seed);
  for (std::size_t l = 0; l + 1 < widths.size(); ++l) {
    const int64_t in = widths[l], out = widths[l + 1];
    const float bound = 1.0f / std::sqrt(static_cast<float>(in)) * (l + 2 == widths.size() ? head_gain : 1.0f);
    std::vector<float> w(static_cast<std::size_t>(out * in)), b(static_cast<std::size_t>(out));
    gen.fill_uniform(w.data(), out * in, -bound, bound);
    gen.fill_uniform(b.data(), out, -bound, bound);
    net.w.push_back(std::move(w));
    net.b.push_back(std::move(b));
  }
  return net;
}

const std::vector<int64_t> kSeedWidths = {784, 512, 512, 10};

struct Batch {
  int64_t size = 0;
  std::vector<float> x;
  std::vector<int32_t> y;
};

// x uniform in [0, 1) like scaled pixels; labels cycle through the first class, the last and the
// ones between, so both class boundaries occur at every size above 1.
Batch make_batch(int64_t size, int64_t in, int64_t classes, uint64_t seed) {
  Batch b;
  b.size = size;
  b.x.resize(static_cast<std::size_t>(size * in));
  Generator gen(seed);
  gen.fill_uniform(b.x.data(), size * in, 0.0f, 1.0f);
  for (int64_t i = 0; i < size; ++i)
    b.y.push_back(static_cast<int32_t>(i % 3 == 0 ? 0 : i % 3 == 1 ? classes - 1 : (i * 7) % classes));
  return b;
}

// The loss and gradients {x, w0, b0, w1, b1, ...}.
template <typename T>
struct Result {
  T loss = 0;
  std::vector<std::vector<T>> grads;
};

// The summed loss and its gradients in double, by the textbook formulas (no code shared with the engine).
Result<double> reference(const Net& net, const Batch& batch) {
  const int64_t layers = net.layers(), n = batch.size;
  std::vector<std::vector<double>> acts;  // acts[l]: layer l's input, [n, widths[l]]
  acts.emplace_back(batch.x.begin(), batch.x.end());
  std::vector<double> logits;
  for (int64_t l = 0; l < layers; ++l) {
    const int64_t in = net.widths[l], out = net.widths[l + 1];
    std::vector<double> y(static_cast<std::size_t>(n * out));
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < out; ++j) {
        double s = net.b[l][j];
        for (int64_t k = 0; k < in; ++k) s += acts[l][i * in + k] * static_cast<double>(net.w[l][j * in + k]);
        y[i * out + j] = l + 1 < layers ? std::max(s, 0.0) : s;
      }
    if (l + 1 < layers) acts.push_back(std::move(y));
    else logits = std::move(y);
  }
  const int64_t classes = net.widths.back();
  Result<double> r;
  std::vector<double> dz(static_cast<std::size_t>(n * classes));
  for (int64_t i = 0; i < n; ++i) {
    double m = -std::numeric_limits<double>::infinity();
    for (int64_t c = 0; c < classes; ++c) m = std::max(m, logits[i * classes + c]);
    double s = 0;
    for (int64_t c = 0; c < classes; ++c) s += std::exp(logits[i * classes + c] - m);
    r.loss += m + std::log(s) - logits[i * classes + batch.y[i]];
    for (int64_t c = 0; c < classes; ++c)
      dz[i * classes + c] = std::exp(logits[i * classes + c] - m) / s - (c == batch.y[i] ? 1.0 : 0.0);
  }
  r.grads.resize(static_cast<std::size_t>(1 + 2 * layers));
  for (int64_t l = layers - 1; l >= 0; --l) {
    const int64_t in = net.widths[l], out = net.widths[l + 1];
    std::vector<double> dw(static_cast<std::size_t>(out * in), 0.0), db(static_cast<std::size_t>(out), 0.0),
        dx(static_cast<std::size_t>(n * in), 0.0);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < out; ++j) {
        const double g = dz[i * out + j];
        db[j] += g;
        for (int64_t k = 0; k < in; ++k) {
          dw[j * in + k] += g * acts[l][i * in + k];
          dx[i * in + k] += g * static_cast<double>(net.w[l][j * in + k]);
        }
      }
    if (l > 0)
      for (std::size_t k = 0; k < dx.size(); ++k)
        if (acts[l][k] <= 0) dx[k] = 0;
    r.grads[static_cast<std::size_t>(1 + 2 * l)] = std::move(dw);
    r.grads[static_cast<std::size_t>(2 + 2 * l)] = std::move(db);
    dz = dx;
    if (l == 0) r.grads[0] = std::move(dx);
  }
  return r;
}

std::vector<float> values(const Tensor& t) { return t.to(Device::cpu()).to_vector<float>(); }

// Leaves {x, w0, b0, ...} on `device`, each requiring grad.
std::vector<Tensor> make_leaves(const Net& net, const Batch& batch, Device device) {
  std::vector<Tensor> leaves{Tensor::from_vector(batch.x, Shape{batch.size, net.widths[0]}, device)};
  for (int64_t l = 0; l < net.layers(); ++l) {
    leaves.push_back(Tensor::from_vector(net.w[l], Shape{net.widths[l + 1], net.widths[l]}, device));
    leaves.push_back(Tensor::from_vector(net.b[l], Shape{net.widths[l + 1]}, device));
  }
  for (Tensor& t : leaves) t.set_requires_grad(true);
  return leaves;
}

// The summed loss of the leaves' MLP through the fused op or the generic ops.
Tensor loss_of(const std::vector<Tensor>& leaves, const Tensor& labels, bool fused) {
  std::vector<Tensor> weights, biases;
  for (std::size_t i = 1; i < leaves.size(); i += 2) {
    weights.push_back(leaves[i]);
    biases.push_back(leaves[i + 1]);
  }
  if (fused) return ops::mlp_cross_entropy(leaves[0], labels, weights, biases, ops::Reduction::Sum);
  Tensor h = leaves[0];
  for (std::size_t l = 0; l < weights.size(); ++l)
    h = l + 1 < weights.size() ? ops::linear(h, weights[l], biases[l], ops::Activation::relu)
                               : ops::linear(h, weights[l], biases[l]);
  return ops::cross_entropy(h, labels, ops::Reduction::Sum);
}

// The engine's loss and gradients. passes 1: the gradient buffers start stale and hold NaN (an
// overwriting write must not read them); passes 2: a second backward adds to the first.
Result<float> engine_result(const Net& net, const Batch& batch, Device device, bool fused, int passes) {
  const std::vector<Tensor> leaves = make_leaves(net, batch, device);
  const Tensor labels = Tensor::from_vector(batch.y, Shape{batch.size}, device);
  for (const Tensor& t : leaves) {
    t.allocate_grad();
    t.grad_buffer().copy_from(Tensor::full(t.shape(), std::numeric_limits<float>::quiet_NaN(), device));
    t.mark_grad_stale();
  }
  Result<float> r;
  for (int p = 0; p < passes; ++p) {
    const Tensor loss = loss_of(leaves, labels, fused);
    r.loss = loss.item();
    loss.backward();
  }
  for (const Tensor& t : leaves) r.grads.push_back(values(t.grad()));
  return r;
}

// max |a - b| / max |b| (b the reference), per tensor.
double rel_to_reference(const std::vector<float>& a, const std::vector<double>& b, double scale = 1.0) {
  double worst = 0, largest = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, std::abs(static_cast<double>(a[i]) - scale * b[i]));
    largest = std::max(largest, std::abs(scale * b[i]));
  }
  return largest > 0 ? worst / largest : worst;
}

const char* kGradNames[] = {"dx", "dW0", "db0", "dW1", "db1", "dW2", "db2"};

class FusedMLPTest : public DeviceTest {};

// ---- correctness ----------------------------------------------------------------------------

// Against double precision, overwriting and accumulating, at every micro-batch size the issue
// names; the seed MLP's shape, then large logits (the head scaled by 40: logits of tens, softmax
// saturated) at two sizes.
TEST_P(FusedMLPTest, MatchesTheDoublePrecisionReference) {
  struct Case {
    int64_t batch;
    float head_gain;
  };
  const std::vector<Case> cases = {{1, 1}, {7, 1}, {16, 1}, {64, 1}, {100, 1}, {1024, 1}, {7, 40}, {64, 40}};
  for (const Case& c : cases) {
    SCOPED_TRACE("batch " + std::to_string(c.batch) + ", head gain " + std::to_string(c.head_gain));
    const Net net = make_net(kSeedWidths, 11, c.head_gain);
    const Batch batch = make_batch(c.batch, kSeedWidths[0], kSeedWidths.back(), 100 + c.batch);
    const Result<double> ref = reference(net, batch);
    for (int passes : {1, 2}) {
      SCOPED_TRACE(passes == 1 ? "overwrite" : "accumulate");
      const Result<float> got = engine_result(net, batch, device(), /*fused=*/true, passes);
      EXPECT_LT(std::abs(got.loss - ref.loss), 1e-5 * std::abs(ref.loss) + 1e-5) << got.loss << " vs " << ref.loss;
      for (std::size_t i = 0; i < got.grads.size(); ++i)
        EXPECT_LT(rel_to_reference(got.grads[i], ref.grads[i], passes), 1e-4) << kGradNames[i];
    }
  }
}

// Against the generic ops on the same device: the same bits on the CPU (the same kernels in the
// same order), within float rounding on CUDA.
TEST_P(FusedMLPTest, MatchesTheGenericPath) {
  for (int64_t size : {1, 7, 16, 64, 100, 1024}) {
    SCOPED_TRACE("batch " + std::to_string(size));
    const Net net = make_net(kSeedWidths, 12);
    const Batch batch = make_batch(size, kSeedWidths[0], kSeedWidths.back(), 200 + size);
    for (int passes : {1, 2}) {
      const Result<float> fused = engine_result(net, batch, device(), true, passes);
      const Result<float> generic = engine_result(net, batch, device(), false, passes);
      if (device().is_cpu()) {
        EXPECT_EQ(fused.loss, generic.loss);
        EXPECT_EQ(fused.grads, generic.grads);
      } else {
        EXPECT_NEAR(fused.loss, generic.loss, 1e-5 * std::abs(generic.loss));
        for (std::size_t i = 0; i < fused.grads.size(); ++i)
          EXPECT_LT(max_rel_diff(fused.grads[i], generic.grads[i]), 1e-5) << kGradNames[i];
      }
    }
  }
}

// Other shapes: one layer (the head alone, no ReLU), three hidden layers of odd widths, and a batch
// that is not a multiple of any tile.
TEST_P(FusedMLPTest, TakesAnyDepthAndWidth) {
  for (const std::vector<int64_t>& widths :
       std::vector<std::vector<int64_t>>{{33, 5}, {37, 19, 3, 29, 2}, {130, 257, 32}}) {
    SCOPED_TRACE("widths " + std::to_string(widths.size()) + " layers, in " + std::to_string(widths[0]));
    const Net net = make_net(widths, 13);
    const Batch batch = make_batch(21, widths[0], widths.back(), 21);
    const Result<double> ref = reference(net, batch);
    const Result<float> got = engine_result(net, batch, device(), true, 1);
    EXPECT_LT(std::abs(got.loss - ref.loss), 1e-5 * std::abs(ref.loss) + 1e-5);
    for (std::size_t i = 0; i < got.grads.size(); ++i) EXPECT_LT(rel_to_reference(got.grads[i], ref.grads[i]), 1e-4);
  }
}

// Every sum in a fixed order: two runs give the same bits.
TEST_P(FusedMLPTest, TwoRunsGiveTheSameBits) {
  const Net net = make_net(kSeedWidths, 14);
  const Batch batch = make_batch(100, kSeedWidths[0], kSeedWidths.back(), 14);
  const Result<float> a = engine_result(net, batch, device(), true, 2);
  const Result<float> b = engine_result(net, batch, device(), true, 2);
  EXPECT_EQ(a.loss, b.loss);
  EXPECT_EQ(a.grads, b.grads);
}

// The mean reduction divides the loss and every gradient by the batch.
TEST_P(FusedMLPTest, MeanReductionScalesLossAndGradients) {
  const Net net = make_net({20, 8, 4}, 15);
  const Batch batch = make_batch(9, 20, 4, 15);
  const std::vector<Tensor> leaves = make_leaves(net, batch, device());
  const Tensor labels = Tensor::from_vector(batch.y, Shape{batch.size}, device());
  const Tensor loss = ops::mlp_cross_entropy(leaves[0], labels, {leaves[1], leaves[3]}, {leaves[2], leaves[4]});
  loss.backward();
  const Result<double> ref = reference(net, batch);
  EXPECT_NEAR(loss.item(), ref.loss / 9, 1e-6);
  EXPECT_LT(rel_to_reference(values(leaves[1].grad()), ref.grads[1], 1.0 / 9), 1e-5);
}

// ---- NaN through the ReLU ----------------------------------------------------------------------
// Note [ReLU epilogues and NaN] in engine/ops/linear.cpp: a NaN pre-activation stays NaN through
// the ReLU and its gradient passes there, while a unit the ReLU cuts for every sample gets an exact
// 0 (not 0 * NaN), on every path. So the NaN positions of every gradient are a property of the
// model, not of the kernels that ran it.

// Positions where a and b differ, a NaN matching only a NaN.
int64_t differences(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return -1;
  int64_t n = 0;
  for (std::size_t i = 0; i < a.size(); ++i) n += std::isnan(a[i]) ? !std::isnan(b[i]) : !(a[i] == b[i]);
  return n;
}

// The smallest |max over samples of x W^T + b| over the units, NaN units skipped: how far every
// unit is from changing between "cut for every sample" and "passed for some", which decides the
// NaN rows of dW. The tests ask for 1e-3, above the worst-case rounding of these sums (k eps
// sum |x w|: about 2e-4 for the seed MLP's 784 inputs), so those rows are the same on every device.
float unit_margin(const Tensor& x, const Tensor& w, const Tensor& b) {
  NoGradGuard no_grad;
  const std::vector<float> z = values(ops::linear(x.to(Device::cpu()), w.to(Device::cpu()), b.to(Device::cpu())));
  const int64_t samples = x.size(0), units = w.size(0);
  float margin = std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < units; ++j) {
    float top = -std::numeric_limits<float>::infinity();
    for (int64_t i = 0; i < samples; ++i) top = std::max(top, z[static_cast<std::size_t>(i * units + j)]);
    if (!std::isnan(top)) margin = std::min(margin, std::abs(top));
  }
  return margin;
}

// Linear -> ReLU -> Linear -> cross-entropy (sum) three ways: the unfused ops (linear, relu), the
// generic path as models run it (linear+relu as one op: on CUDA a cuBLASLt GEMM with the BIAS
// epilogue), and the fused MLP op.
enum class TwoLayerPath { linear_then_relu, linear_relu, mlp_op };
const char* path_name(TwoLayerPath p) {
  return p == TwoLayerPath::linear_then_relu ? "linear, relu"
         : p == TwoLayerPath::linear_relu    ? "linear+relu"
                                             : "mlp op";
}

Result<float> two_layer_result(const Net& net, const Batch& batch, Device device, TwoLayerPath path) {
  const std::vector<Tensor> l = make_leaves(net, batch, device);
  const Tensor labels = Tensor::from_vector(batch.y, Shape{batch.size}, device);
  const Tensor loss = path == TwoLayerPath::linear_then_relu
                          ? ops::cross_entropy(ops::linear(ops::relu(ops::linear(l[0], l[1], l[2])), l[3], l[4]),
                                               labels, ops::Reduction::Sum)
                          : loss_of(l, labels, path == TwoLayerPath::mlp_op);
  Result<float> r;
  r.loss = loss.item();
  loss.backward();
  for (const Tensor& t : l) r.grads.push_back(values(t.grad()));
  return r;
}

// One NaN in the first layer's pre-activation (its bias, so one unit of every sample) and one unit
// the ReLU cuts for every sample: the NaN reaches the loss and dW1 (= kGradNames' dW0) at the same
// positions on all three paths, on every device, against the CPU's unfused ops.
TEST_P(FusedMLPTest, NaNPreActivationReachesTheFirstWeightGradientAlikeOnEveryPath) {
  const int64_t in = 24, hidden = 16, classes = 5, nan_unit = 3, dead_unit = 7;
  Net net = make_net({in, hidden, classes}, 20);
  net.b[0][nan_unit] = std::numeric_limits<float>::quiet_NaN();
  net.b[0][dead_unit] = -100.0f;  // below 0 for every sample: x in [0, 1), |W| < 0.21
  const Batch batch = make_batch(6, in, classes, 20);
  const std::vector<Tensor> l = make_leaves(net, batch, Device::cpu());
  ASSERT_GT(unit_margin(l[0], l[1], l[2]), 1e-3f) << "a unit on the edge of the ReLU would make the NaN rows fragile";
  const Result<float> ref = two_layer_result(net, batch, Device::cpu(), TwoLayerPath::linear_then_relu);
  ASSERT_TRUE(std::isnan(ref.loss)) << "the NaN must reach the loss";
  const std::vector<float>& dw1 = ref.grads[1];
  int64_t nan_rows = 0;
  for (int64_t j = 0; j < hidden; ++j) nan_rows += std::isnan(dw1[static_cast<std::size_t>(j * in)]);
  for (int64_t k = 0; k < in; ++k) {
    EXPECT_TRUE(std::isnan(dw1[static_cast<std::size_t>(nan_unit * in + k)])) << "the NaN unit's gradient passes";
    EXPECT_EQ(dw1[static_cast<std::size_t>(dead_unit * in + k)], 0.0f) << "the cut unit's stays 0, not 0 * NaN";
  }
  EXPECT_LT(nan_rows, hidden) << "rows cut for every sample stay finite";
  for (TwoLayerPath path : {TwoLayerPath::linear_then_relu, TwoLayerPath::linear_relu, TwoLayerPath::mlp_op}) {
    SCOPED_TRACE(path_name(path));
    const Result<float> got = two_layer_result(net, batch, device(), path);
    EXPECT_TRUE(std::isnan(got.loss)) << got.loss;
    // Every gradient is NaN or an exact 0 here, so equality (NaN with NaN) holds on CUDA too.
    for (std::size_t i = 0; i < ref.grads.size(); ++i)
      EXPECT_EQ(differences(got.grads[i], ref.grads[i]), 0) << kGradNames[i];
  }
}

// The same through the seed model, as the app runs it: --kernels generic (cuBLASLt with its
// epilogues on CUDA) against --kernels fused, one NaN in the first layer's bias and one unit cut
// for every sample; dW1 compared with the CPU's generic result.
TEST_P(FusedMLPTest, SeedMLPNaNReachesTheFirstWeightGradientAlikeWithEitherKernels) {
  const int64_t b = 16, nan_unit = 5, dead_unit = 9;
  const Batch batch = make_batch(b, models::SeedMLP::kInputs, models::SeedMLP::kClasses, 22);
  auto run = [&](Device device, models::KernelChoice kernels) {
    Generator gen(22);
    models::SeedMLP model(gen, device);
    model.set_kernels(kernels);
    Tensor bias, weight;
    for (const auto& [name, t] : model.named_parameters()) {
      if (name == "linear_relu_stack.0.bias") bias = t;
      if (name == "linear_relu_stack.0.weight") weight = t;
    }
    std::vector<float> bv = values(bias);
    bv[nan_unit] = std::numeric_limits<float>::quiet_NaN();
    bv[dead_unit] = -100.0f;  // |x W^T| < 784 * 0.036 for x in [0, 1)
    bias.copy_from(Tensor::from_vector(bv, bias.shape(), device));
    const Tensor x = Tensor::from_vector(batch.x, Shape{b, models::SeedMLP::kInputs}, device);
    const Tensor y = Tensor::from_vector(batch.y, Shape{b}, device);
    EXPECT_GT(unit_margin(x, weight, bias), 1e-3f) << "a unit on the edge of the ReLU would make the NaN rows fragile";
    const Tensor loss = model.loss(x, y, ops::Reduction::Sum);
    EXPECT_STREQ(loss.grad_fn()->name(),
                 kernels == models::KernelChoice::fused ? "mlp_cross_entropy" : "cross_entropy");
    EXPECT_TRUE(std::isnan(loss.item())) << "the NaN must reach the loss";
    loss.backward();
    return values(weight.grad());
  };
  const std::vector<float> ref = run(Device::cpu(), models::KernelChoice::generic);
  const int64_t in = models::SeedMLP::kInputs;
  for (int64_t k = 0; k < in; ++k) {
    ASSERT_TRUE(std::isnan(ref[static_cast<std::size_t>(nan_unit * in + k)])) << "the NaN unit's gradient passes";
    ASSERT_EQ(ref[static_cast<std::size_t>(dead_unit * in + k)], 0.0f) << "the cut unit's stays 0, not 0 * NaN";
  }
  for (models::KernelChoice kernels : {models::KernelChoice::generic, models::KernelChoice::fused}) {
    SCOPED_TRACE(models::kernel_choice_name(kernels));
    EXPECT_EQ(differences(run(device(), kernels), ref), 0) << "dW1: NaN rows and exact zeros alike";
  }
}

// ---- memory ---------------------------------------------------------------------------------

int64_t blocks_of(int64_t bytes) { return (bytes + 511) / 512 * 512; }  // the allocator's rounding

// What a recorded forward keeps for backward, in category activations: the two hidden outputs, the
// head's [B, 10] (logits or softmax) and the loss scalar, each rounded to the allocator's 512-byte
// blocks: the analytic footprint.
TEST_P(FusedMLPTest, KeepsTheAnalyticActivationFootprint) {
  Generator gen(16);
  models::SeedMLP model(gen, device());
  model.set_kernels(models::KernelChoice::fused);
  CachingAllocator& alloc = allocator_for(device());
  for (int64_t b : {16, 100}) {
    const Tensor x = Tensor::zeros(Shape{b, 784}, DType::f32, device());
    const Tensor y = Tensor::zeros(Shape{b}, DType::i32, device());
    const int64_t before = alloc.stats()[MemoryCategory::activations].current;
    const Tensor loss = model.loss(x, y, ops::Reduction::Sum);
    ASSERT_STREQ(loss.grad_fn()->name(), "mlp_cross_entropy");
    const int64_t held = alloc.stats()[MemoryCategory::activations].current - before;
    EXPECT_EQ(held, 2 * blocks_of(b * 512 * 4) + blocks_of(b * 10 * 4) + blocks_of(4)) << "batch " << b;
  }
}

// ---- the model's choice ---------------------------------------------------------------------

TEST_P(FusedMLPTest, SeedMLPChoosesThePathByDeviceDtypeAndSize) {
  Generator gen(17);
  models::SeedMLP model(gen, device());
  const Tensor x16 = Tensor::zeros(Shape{16, 784}, DType::f32, device());
  const Tensor x_big = Tensor::zeros(Shape{models::SeedMLP::kFusedAutoMaxBatch + 1, 784}, DType::f32, device());
  const Tensor x_bf16 = Tensor::zeros(Shape{16, 784}, DType::bf16, device());
  EXPECT_EQ(model.kernels(), models::KernelChoice::automatic);
  EXPECT_EQ(model.fuses(x16), ops::kFusedMlpMeasuredOnGpu && device().is_cuda())
      << "automatic: fused on CUDA only, once a GPU has measured the kernels";
  EXPECT_FALSE(model.fuses(x_big)) << "automatic: cuBLASLt above kFusedAutoMaxBatch";
  EXPECT_FALSE(model.fuses(x_bf16)) << "automatic: f32 only";
  model.set_recompute(true);
  EXPECT_FALSE(model.fuses(x16)) << "automatic: recompute keeps the generic path";
  model.set_kernels(models::KernelChoice::fused);
  const Tensor y = Tensor::zeros(Shape{16}, DType::i32, device());
  EXPECT_THROW(model.loss(x16, y, ops::Reduction::Sum), InvalidArgument) << "fused with recompute";
  model.set_recompute(false);
  EXPECT_STREQ(model.loss(x16, y, ops::Reduction::Sum).grad_fn()->name(), "mlp_cross_entropy");
  EXPECT_THROW(model.loss(x_bf16, y, ops::Reduction::Sum), InvalidArgument) << "fused takes f32 only";
  model.set_kernels(models::KernelChoice::generic);
  EXPECT_STREQ(model.loss(x16, y, ops::Reduction::Sum).grad_fn()->name(), "cross_entropy");

  models::KernelChoice c = models::KernelChoice::generic;
  EXPECT_TRUE(models::parse_kernel_choice("auto", c));
  EXPECT_EQ(c, models::KernelChoice::automatic);
  EXPECT_FALSE(models::parse_kernel_choice("Fused", c));
}

// ---- errors ---------------------------------------------------------------------------------

TEST_P(FusedMLPTest, RefusesBadArgumentsNamingThem) {
  const Net net = make_net({6, 4, 3}, 18);
  const Batch batch = make_batch(5, 6, 3, 18);
  const std::vector<Tensor> l = make_leaves(net, batch, device());
  const Tensor labels = Tensor::from_vector(batch.y, Shape{5}, device());
  auto message = [](auto&& fn) {
    try {
      fn();
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message([&] { ops::mlp_cross_entropy(l[0], labels, {l[3], l[1]}, {l[4], l[2]}); }).find("layer 0 weight"),
            std::string::npos);
  EXPECT_NE(message([&] { ops::mlp_cross_entropy(l[0], labels, {l[1], l[3]}, {l[2]}); }).find("2 weights but 1 biases"),
            std::string::npos);
  EXPECT_NE(message([&] {
              ops::mlp_cross_entropy(l[0], labels.narrow_rows(0, 4), {l[1], l[3]}, {l[2], l[4]});
            }).find("labels"),
            std::string::npos);
  EXPECT_NE(message([&] { ops::mlp_cross_entropy(l[0].to(DType::bf16), labels, {l[1], l[3]}, {l[2], l[4]}); })
                .find("f32 only"),
            std::string::npos);
  const Tensor bad = Tensor::from_vector(std::vector<int32_t>{0, 1, 3, 0, 1}, Shape{5}, device());
  if (device().is_cpu()) {
    EXPECT_THROW(ops::mlp_cross_entropy(l[0], bad, {l[1], l[3]}, {l[2], l[4]}), InvalidArgument);
  } else {  // as cross_entropy on CUDA: no host check, a NaN loss the step's guard sees
    EXPECT_TRUE(std::isnan(ops::mlp_cross_entropy(l[0], bad, {l[1], l[3]}, {l[2], l[4]}).item()));
  }
}

CUMULUS_INSTANTIATE_DEVICES(FusedMLPTest);

// ---- CUDA only ------------------------------------------------------------------------------

// The CUDA kernels against the CPU path (the generic arithmetic) at the sizes above.
TEST(FusedMLPParity, CudaMatchesTheCpu) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device" << (cuda_compiled() ? "" : " (built without CUDA)");
  for (int64_t size : {1, 7, 16, 64, 100, 1024}) {
    SCOPED_TRACE("batch " + std::to_string(size));
    const Net net = make_net(kSeedWidths, 19);
    const Batch batch = make_batch(size, kSeedWidths[0], kSeedWidths.back(), 300 + size);
    const Result<float> cpu = engine_result(net, batch, Device::cpu(), true, 2);
    const Result<float> gpu = engine_result(net, batch, Device::cuda(0), true, 2);
    EXPECT_NEAR(gpu.loss, cpu.loss, 1e-5 * std::abs(cpu.loss));
    for (std::size_t i = 0; i < cpu.grads.size(); ++i)
      EXPECT_LT(max_rel_diff(gpu.grads[i], cpu.grads[i]), 1e-5) << kGradNames[i];
  }
}

// Launches of one eager fused micro-batch (forward, loss, Trainer::backward): forward 3 (two
// hidden layers, the head), backward 3 (the head, two hidden layers), the micro-batch record 1, in
// either gradient mode; the generic path makes 15-16 with the record when cuBLASLt fuses every
// epilogue (tests/test_nn.cpp).
TEST(FusedMLPLaunches, SeedMLPEagerMicroBatch) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device" << (cuda_compiled() ? "" : " (built without CUDA)");
  const Device d = Device::cuda(0);
  Generator gen(0);
  models::SeedMLP model(gen, d);
  model.set_kernels(models::KernelChoice::fused);
  train::TrainerOptions o;
  o.accum_steps = 1 << 30;  // never steps: the test decides when gradients are stale
  train::Trainer acc(std::make_shared<optim::SGD>(std::make_shared<nn::FlatParameters>(model), optim::SGDOptions{}),
                         o);
  const int64_t b = 16;
  const Tensor x = Tensor::full(Shape{b, 784}, 0.5f, d);
  const Tensor y = Tensor::zeros(Shape{b}, DType::i32, d);
  auto micro_batch = [&] {
    const int64_t before = cuda_kernel_launches();
    acc.backward(model.loss(x, y, ops::Reduction::Sum), b);
    return cuda_kernel_launches() - before;
  };
  acc.optimizer().zero_grad();
  micro_batch();  // warm-up: the arrival counter, step buffers
  acc.optimizer().zero_grad();
  EXPECT_EQ(micro_batch(), 3 + 3 + 1) << "overwriting";
  EXPECT_EQ(micro_batch(), 3 + 3 + 1) << "accumulating";
}

// Item 6 of issue 26: the head kernel's arrival counter is made with the execution context. So the
// first fused micro-batch allocates no workspace of its own, and a capture may be the first to run
// the op (made lazily, the counter threw "made during a graph capture"). Each case runs in a process
// of its own under ctest, so the op has not run before in it.
TEST(FusedMLPContext, TheFirstMicroBatchAllocatesNoWorkspace) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device" << (cuda_compiled() ? "" : " (built without CUDA)");
  const Device d = Device::cuda(0);
  Generator gen(0);
  models::SeedMLP model(gen, d);
  model.set_kernels(models::KernelChoice::fused);
  const Tensor x = Tensor::full(Shape{16, 784}, 0.5f, d);
  const Tensor y = Tensor::zeros(Shape{16}, DType::i32, d);
  CachingAllocator& alloc = allocator_for(d);
  const int64_t before = alloc.stats()[MemoryCategory::workspace].allocs;
  const Tensor loss = model.loss(x, y, ops::Reduction::Sum);
  ASSERT_STREQ(loss.grad_fn()->name(), "mlp_cross_entropy");
  EXPECT_EQ(alloc.stats()[MemoryCategory::workspace].allocs, before) << "the first fused forward allocated workspace";
}

#if CUMULUS_WITH_CUDA
TEST(FusedMLPContext, ACaptureMayBeTheFirstToRunTheOp) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device" << (cuda_compiled() ? "" : " (built without CUDA)");
  const Device d = Device::cuda(0);
  Generator gen(0);
  models::SeedMLP model(gen, d);
  model.set_kernels(models::KernelChoice::fused);
  const Tensor x = Tensor::full(Shape{16, 784}, 0.5f, d);
  const Tensor y = Tensor::zeros(Shape{16}, DType::i32, d);
  NoGradGuard no_grad;
  Tensor captured;
  cuda::Graph graph;
  ASSERT_NO_THROW(
      graph = cuda::Graph::capture(cuda::context(0), [&] { captured = model.loss(x, y, ops::Reduction::Sum); }));
  graph.launch();
  const std::vector<float> eager = model.loss(x, y, ops::Reduction::Sum).to_vector<float>();
  EXPECT_EQ(captured.to_vector<float>(), eager) << "the replayed loss differs from the eager one";
}
#endif

}  // namespace
}  // namespace cumulus::testing
