// ops::scaled_dot_product_attention (engine/ops/attention.cpp, Note [Fused attention] in
// kernels/cpu/attention.cpp) beside what a case of the registry cannot say
// (tests/op_cases/cases_attention.cpp checks its values and gradients against double references):
// it gives the composition's output and gradients (matmul, masked_fill(tril), softmax, matmul) on
// the same views of a qkv projection; its activations per token are constant in T while the
// composition's grow; q = k = v as one tensor; a last dimension that is not dense; the same bits at
// any thread count; errors that name the op and the shapes. ops::packed_qkv_attention against the
// composition it replaces, to the bit.
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "cumulus/autograd/node.h"
#include "cumulus/core/threads.h"
#include "cumulus/cumulus.h"
#include "test_util.h"

namespace cumulus::testing {
namespace {

constexpr int64_t kRound = 512;  // the caching allocator's block rounding
int64_t rounded(int64_t bytes) { return (bytes + kRound - 1) / kRound * kRound; }

Tensor random_tensor(const Shape& shape, uint64_t seed, Device device, float lo = -1.0f, float hi = 1.0f) {
  std::vector<float> v(static_cast<std::size_t>(shape.numel()));
  Generator gen(seed);
  gen.fill_uniform(v.data(), shape.numel(), lo, hi);
  return Tensor::from_vector(v, shape, device);
}

// The heads of qkv [B, T, 3C] as [B, H, T, D] views, as a GPT block makes them.
std::vector<Tensor> heads(const Tensor& qkv, int64_t H) {
  const int64_t B = qkv.size(0), T = qkv.size(1), C = qkv.size(2) / 3;
  std::vector<Tensor> parts = ops::split(qkv, C, -1);
  for (Tensor& p : parts) p = ops::permute(ops::reshape(p, {B, T, H, C / H}), {0, 2, 1, 3});
  return parts;
}

Tensor composition(const Tensor& q, const Tensor& k, const Tensor& v, bool causal) {
  const int64_t T = q.size(-2);
  Tensor att = ops::matmul(q, ops::transpose(k, -2, -1)) * static_cast<float>(1.0 / std::sqrt(double(q.size(-1))));
  if (causal) {
    const Tensor ones = Tensor::full({T, T}, 1.0f, q.device());
    att = ops::masked_fill(att, ops::eq(ops::tril(ones), 0.0), -INFINITY);
  }
  return ops::matmul(ops::softmax(att, -1), v);
}

// max |a - b| / max(1, max |b|)
double relative_difference(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, scale = 1;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(double(a[i]) - double(b[i])));
    scale = std::max(scale, std::abs(double(b[i])));
  }
  return diff / scale;
}

struct AttentionRun {
  std::vector<float> out, grad;
};

// The attention of qkv's heads (fused or composed), its loss sum(out * w) and qkv's gradient.
AttentionRun attention_run(const Tensor& qkv, const Tensor& w, int64_t H, bool causal, bool fused) {
  qkv.mark_grad_stale();
  const std::vector<Tensor> h = heads(qkv, H);
  const Tensor out =
      fused ? ops::scaled_dot_product_attention(h[0], h[1], h[2], causal) : composition(h[0], h[1], h[2], causal);
  ops::sum(ops::mul(out, w)).backward();
  return {out.to_vector<float>(), qkv.grad().to_vector<float>()};
}

class AttentionTest : public DeviceTest {};
CUMULUS_INSTANTIATE_DEVICES(AttentionTest);

TEST_P(AttentionTest, MatchesTheCompositionOnQkvViews) {
  for (bool causal : {true, false})
    for (int64_t T : {1, 37, 70}) {
      SCOPED_TRACE(std::string(causal ? "causal" : "not causal") + " T " + std::to_string(T));
      const int64_t B = 2, H = 2, D = 16, C = H * D;
      Tensor qkv = random_tensor({B, T, 3 * C}, 1, device());
      qkv.set_requires_grad(true);
      const Tensor w = random_tensor({B, H, T, D}, 2, device());
      const AttentionRun fused = attention_run(qkv, w, H, causal, true);
      const AttentionRun composed = attention_run(qkv, w, H, causal, false);
      EXPECT_LT(relative_difference(fused.out, composed.out), 1e-5);
      EXPECT_LT(relative_difference(fused.grad, composed.grad), 1e-5);
    }
}

// A 4-D output is laid out [B, T, H, D], as PyTorch's: merging the heads back (transpose(1, 2) then
// reshape to [B, T, H * D]) is a view, so no copy of it is kept for the output projection.
TEST_P(AttentionTest, MergingTheOutputsHeadsIsAView) {
  const int64_t B = 2, H = 3, T = 5, D = 4;
  const std::vector<Tensor> h = heads(random_tensor({B, T, 3 * H * D}, 3, device()), H);
  const Tensor y = ops::scaled_dot_product_attention(h[0], h[1], h[2], true);
  EXPECT_EQ(y.shape(), (Shape{B, H, T, D}));
  EXPECT_FALSE(y.is_contiguous());
  EXPECT_TRUE(y.transpose(1, 2).is_contiguous());
}

// Self-attention of one tensor: three gradients into one sink.
TEST_P(AttentionTest, OneTensorAsQKAndV) {
  Tensor x = random_tensor({2, 3, 9, 8}, 3, device());
  x.set_requires_grad(true);
  const Tensor w = random_tensor({2, 3, 9, 8}, 4, device());
  std::vector<float> out[2], grad[2];
  for (int fused = 0; fused < 2; ++fused) {
    x.mark_grad_stale();
    const Tensor y = fused ? ops::scaled_dot_product_attention(x, x, x, true) : composition(x, x, x, true);
    ops::sum(ops::mul(y, w)).backward();
    out[fused] = y.to_vector<float>();
    grad[fused] = x.grad().to_vector<float>();
  }
  EXPECT_LT(relative_difference(out[1], out[0]), 1e-5);
  EXPECT_LT(relative_difference(grad[1], grad[0]), 1e-5);
}

// A last dimension that is not dense (k transposed twice over) is copied first, with the same result.
TEST_P(AttentionTest, ALastDimensionThatIsNotDense) {
  const Tensor q = random_tensor({2, 7, 4}, 5, device()), v = random_tensor({2, 6, 4}, 6, device());
  const Tensor k = random_tensor({2, 4, 6}, 7, device());
  const Tensor kt = ops::transpose(k, -2, -1);  // [2, 6, 4], last stride 6
  ASSERT_NE(kt.stride(-1), 1);
  const Tensor got = ops::scaled_dot_product_attention(q, kt, v, false, 0.5);
  const Tensor want = ops::scaled_dot_product_attention(q, kt.contiguous(), v, false, 0.5);
  EXPECT_EQ(got.to_vector<float>(), want.to_vector<float>());
}

// No query rows (an empty decoding batch): an empty output, and k and v get zero gradients.
TEST_P(AttentionTest, NoQueryRows) {
  const Tensor q = Tensor::zeros({1, 2, 0, 4}, DType::f32, device());
  Tensor k = random_tensor({1, 2, 3, 4}, 11, device()), v = random_tensor({1, 2, 3, 4}, 12, device());
  k.set_requires_grad(true);
  v.set_requires_grad(true);
  const Tensor out = ops::scaled_dot_product_attention(q, k, v);
  EXPECT_EQ(out.shape(), Shape({1, 2, 0, 4}));
  ops::sum(out).backward();
  EXPECT_EQ(k.grad().to_vector<float>(), std::vector<float>(24, 0.0f));
  EXPECT_EQ(v.grad().to_vector<float>(), std::vector<float>(24, 0.0f));
}

// Note [CPU kernel threads]: each query block (forward) and head (backward) is one thread's.
TEST(AttentionCpu, SameBitsAtAnyThreadCount) {
  const int before = cpu_threads();
  AttentionRun runs[2];
  for (int threads : {1, 2}) {
    set_cpu_threads(threads);
    Tensor qkv = random_tensor({2, 70, 3 * 32}, 8, Device::cpu());
    qkv.set_requires_grad(true);
    runs[threads - 1] = attention_run(qkv, random_tensor({2, 2, 70, 16}, 9, Device::cpu()), 2, true, true);
  }
  set_cpu_threads(before);
  EXPECT_EQ(runs[0].out, runs[1].out);
  EXPECT_EQ(runs[0].grad, runs[1].grad);
}

// The activations a forward keeps, per token: the fused op's output and log-sum-exp (q, k and v
// are views of the projection, saved as they are), constant in T; the composition's [T, T] scores
// and probabilities per head, growing with T.
int64_t activation_bytes(Device device, int64_t T, bool fused) {
  const int64_t B = 1, H = 4, D = 32, C = H * D;
  Tensor qkv = random_tensor({B, T, 3 * C}, 10, device);
  qkv.set_requires_grad(true);
  memory::MemoryTracker::Options o;
  o.timeline_steps = 0;
  memory::MemoryTracker tracker(device, o);
  tracker.begin_micro_batch(0, 0, T);
  Tensor out;
  {
    const std::vector<Tensor> h = heads(qkv, H);
    out = fused ? ops::scaled_dot_product_attention(h[0], h[1], h[2], true) : composition(h[0], h[1], h[2], true);
  }
  tracker.end_forward();
  ops::sum(out).backward();
  out = Tensor();
  tracker.end_backward();
  const int64_t bytes = tracker.last_micro_batch().activation_bytes;
  if (fused) EXPECT_EQ(bytes, rounded(B * H * T * D * 4) + rounded(B * H * T * 4)) << "T " << T;
  return bytes;
}

TEST_P(AttentionTest, ActivationBytesPerTokenAreConstantInT) {
  const int64_t fused32 = activation_bytes(device(), 32, true), fused128 = activation_bytes(device(), 128, true);
  EXPECT_EQ(fused32 / 32, fused128 / 128);
  EXPECT_EQ(fused32 * 4, fused128);
  const int64_t composed32 = activation_bytes(device(), 32, false),
                composed128 = activation_bytes(device(), 128, false);
  EXPECT_GT(composed128 / 128, composed32 / 32 + 512);  // the [T, T] probabilities: per token linear in T
  EXPECT_GT(composed32, 4 * fused32);
  std::printf("activation bytes per token, T 32 / 128: fused %lld / %lld, composition %lld / %lld\n",
              static_cast<long long>(fused32 / 32), static_cast<long long>(fused128 / 128),
              static_cast<long long>(composed32 / 32), static_cast<long long>(composed128 / 128));
}

// `call` throws an error whose message names `op` and `needle`.
void expect_error_naming(const std::string& op, const std::function<void()>& call, const std::string& needle) {
  try {
    call();
    ADD_FAILURE() << "no error; expected one mentioning " << needle;
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(op), std::string::npos) << what;
    EXPECT_NE(what.find(needle), std::string::npos) << what;
  }
}

// What a call gets wrong, named with the op and the shapes.
TEST_P(AttentionTest, ErrorsNameTheOpAndTheShapes) {
  const Device d = device();
  const auto expect_error = [](const std::function<void()>& call, const std::string& needle) {
    expect_error_naming("scaled_dot_product_attention", call, needle);
  };
  const Tensor q = Tensor::zeros({2, 3, 5, 4}, DType::f32, d);
  const Tensor k7 = Tensor::zeros({2, 3, 7, 4}, DType::f32, d);
  expect_error([&] { ops::scaled_dot_product_attention(q, k7, k7, true); }, "[2, 3, 7, 4]");
  expect_error(
      [&] {
        ops::scaled_dot_product_attention(q, Tensor::zeros({2, 2, 7, 4}, DType::f32, d), k7);
      },
      "[2, 2, 7, 4]");
  expect_error(
      [&] {
        ops::scaled_dot_product_attention(q, Tensor::zeros({2, 3, 7, 8}, DType::f32, d), k7);
      },
      "[2, 3, 7, 8]");
  expect_error(
      [&] {
        ops::scaled_dot_product_attention(q, k7, Tensor::zeros({2, 3, 6, 4}, DType::f32, d));
      },
      "[2, 3, 6, 4]");
  expect_error([&] { ops::scaled_dot_product_attention(q, k7, Tensor::zeros({2, 3, 7, 4}, DType::bf16, d)); }, "bf16");
  expect_error([&] { ops::scaled_dot_product_attention(Tensor::zeros({4}, DType::f32, d), k7, k7); }, "[4]");
  const Tensor empty = Tensor::zeros({2, 3, 0, 4}, DType::f32, d);
  expect_error([&] { ops::scaled_dot_product_attention(q, empty, empty); }, "[2, 3, 0, 4]");
  expect_error([&] { ops::scaled_dot_product_attention(q, k7, k7, false, std::nan("")); }, "scale");
}

// ops::packed_qkv_attention: the values of the composition it replaces (split, the heads' views,
// scaled_dot_product_attention, merging the heads) to the bit, and qkv's gradient to the bit, also
// when qkv has a second use whose gradient the attention's adds to.
TEST_P(AttentionTest, PackedQkvGivesTheSplitHeadsBits) {
  for (DType dtype : {DType::f32, DType::bf16})
    for (bool causal : {true, false})
      for (int64_t T : {1, 37, 70}) {
        if (dtype == DType::bf16 && !device().is_cpu()) continue;
        SCOPED_TRACE(std::string(dtype_name(dtype)) + (causal ? " causal" : "") + " T " + std::to_string(T));
        const int64_t B = 2, H = 2, D = 16, C = H * D;
        Tensor leaf = random_tensor({B, T, 3 * C}, 21, device());
        leaf.set_requires_grad(true);
        const Tensor w = random_tensor({B, T, C}, 22, device());
        const Tensor w2 = random_tensor({B, T, 3 * C}, 23, device());
        std::vector<float> out[2], grad[2];
        for (int packed = 0; packed < 2; ++packed) {
          leaf.mark_grad_stale();
          const Tensor qkv = dtype == DType::f32 ? leaf : ops::cast(leaf, dtype);
          Tensor y;
          if (packed) {
            y = ops::packed_qkv_attention(qkv, H, causal);
          } else {
            const std::vector<Tensor> h = heads(qkv, H);
            y = ops::reshape(ops::transpose(ops::scaled_dot_product_attention(h[0], h[1], h[2], causal), 1, 2),
                             {B, T, C});
          }
          ASSERT_EQ(y.shape(), (Shape{B, T, C}));
          const auto f32 = [](const Tensor& t) { return t.dtype() == DType::f32 ? t : ops::cast(t, DType::f32); };
          (ops::sum(ops::mul(f32(y), w)) + ops::sum(ops::mul(f32(qkv), w2))).backward();  // an f32 loss
          out[packed] = y.to(DType::f32).to_vector<float>();
          grad[packed] = leaf.grad().to_vector<float>();
        }
        EXPECT_EQ(out[1], out[0]);
        EXPECT_EQ(grad[1], grad[0]);
      }
}

// A view as qkv (a slice of a wider projection) is made dense first, with the same values.
TEST_P(AttentionTest, PackedQkvOfAView) {
  const int64_t B = 2, T = 9, H = 2, C = 8;
  const Tensor wide = random_tensor({B, T, 3 * C + 5}, 24, device());
  const Tensor qkv = ops::narrow(wide, 2, 5, 3 * C);
  ASSERT_FALSE(qkv.is_contiguous());
  EXPECT_EQ(ops::packed_qkv_attention(qkv, H, true).to_vector<float>(),
            ops::packed_qkv_attention(qkv.contiguous(), H, true).to_vector<float>());
}

TEST_P(AttentionTest, PackedQkvErrorsNameTheOpAndTheShape) {
  const Device d = device();
  const auto expect_error = [](const std::function<void()>& call, const std::string& needle) {
    expect_error_naming("packed_qkv_attention", call, needle);
  };
  expect_error([&] { ops::packed_qkv_attention(Tensor::zeros({2, 5, 24}, DType::f32, d), 5); }, "[2, 5, 24]");
  expect_error([&] { ops::packed_qkv_attention(Tensor::zeros({5, 24}, DType::f32, d), 2); }, "[5, 24]");
  expect_error([&] { ops::packed_qkv_attention(Tensor::zeros({2, 5, 24}, DType::f32, d), 0); }, "heads");
  expect_error([&] { ops::packed_qkv_attention(Tensor::zeros({2, 0, 24}, DType::f32, d), 2); }, "[2, 0, 24]");
  expect_error([&] { ops::packed_qkv_attention(Tensor::zeros({2, 5, 0}, DType::f32, d), 2); }, "[2, 5, 0]");
  expect_error(
      [&] {
        ops::packed_qkv_attention(Tensor::zeros({2, 5, 24}, DType::f32, d), 2, true, INFINITY);
      },
      "scale");
}

}  // namespace
}  // namespace cumulus::testing
