// cuDNN's fused attention (Note [cuDNN attention] in kernels/cuda/cudnn_attention.cpp): what a CPU
// can check of it, on every build. The tensors cuDNN is handed for the heads of a qkv projection
// (views into [B, T, 3C]: their strides, and that nothing was copied), the graph cache's key and
// the cache itself against a fake plan, the geometries handed to cuDNN, the workspace's accounting
// in the caching allocator, and the choice between cuDNN and our kernels. The GPU cases (skipped
// without one) compare cuDNN's attention with our kernel and the CPU, and check the backward's bits
// repeat; they have never run in this repository's CI, which has no GPU.
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "cumulus/cumulus.h"
#include "cumulus/memory/allocator.h"
#include "engine/ops/attention_internal.h"
#include "engine/ops/internal.h"
#include "kernels/cuda/cudnn_sdpa_plan.h"
#include "test_util.h"

namespace cumulus::testing {
namespace {

namespace sdpa = kernels::cudnn_sdpa;
using Strides = std::array<int64_t, 4>;

// The heads of qkv [B, T, 3C] as [B, H, T, D] views, as a GPT block makes them.
std::vector<Tensor> heads(const Tensor& qkv, int64_t H) {
  const int64_t B = qkv.size(0), T = qkv.size(1), C = qkv.size(2) / 3;
  std::vector<Tensor> parts = ops::split(qkv, C, -1);
  for (Tensor& p : parts) p = ops::permute(ops::reshape(p, {B, T, H, C / H}), {0, 2, 1, 3});
  return parts;
}

// The geometry the op finds for the heads of a [B, T, 3C] projection with H heads.
kernels::AttentionGeometry projection_geometry(int64_t B, int64_t T, int64_t C, int64_t H,
                                               std::vector<Tensor>* qkv_out = nullptr) {
  const Tensor qkv = Tensor::zeros({B, T, 3 * C}, DType::bf16);
  std::vector<Tensor> p = heads(qkv, H);
  const Tensor out = ops::detail::new_attention_output(p[0]);
  const auto g = ops::detail::attention_geometry(p[0], p[1], p[2], out);
  EXPECT_TRUE(g.has_value());
  if (qkv_out != nullptr) *qkv_out = {qkv, p[0], p[1], p[2], out};
  return g.value_or(kernels::AttentionGeometry{});
}

TEST(CudnnSdpaLayouts, TheHeadsOfAProjectionAreHandedWhereTheyLie) {
  const int64_t B = 2, T = 5, C = 32, H = 4, D = 8;
  std::vector<Tensor> t;
  const kernels::AttentionGeometry g = projection_geometry(B, T, C, H, &t);
  const sdpa::Layouts l = sdpa::layouts(g);
  const std::array<int64_t, 4> dims{B, H, T, D};
  EXPECT_EQ(l.q, (sdpa::Layout{dims, Strides{T * 3 * C, D, 3 * C, 1}}));
  EXPECT_EQ(l.k, l.q);
  EXPECT_EQ(l.v, l.q);
  // The output: [B, T, H, D] storage, so merging the heads back is a view.
  EXPECT_EQ(l.o, (sdpa::Layout{dims, Strides{T * C, D, C, 1}}));
  EXPECT_EQ(l.stats, (sdpa::Layout{{B, H, T, 1}, Strides{H * T, T, 1, 1}}));
  // The backward's tensors as the geometry is found: dense, until the op says otherwise (below).
  for (const sdpa::Layout* dense : {&l.dout, &l.dq, &l.dk, &l.dv})
    EXPECT_EQ(*dense, (sdpa::Layout{dims, Strides{H * T * D, T * D, D, 1}}));
  // No copy: q, k and v start 0, C and 2C elements into the projection's storage.
  const auto* base = static_cast<const char*>(ops::detail::element_data(t[0]));
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(static_cast<const char*>(ops::detail::element_data(t[static_cast<std::size_t>(i) + 1])) - base,
              i * C * 2);
}

TEST(CudnnSdpaLayouts, ABatchOrHeadOfOneSpansTheRest) {
  const int64_t T = 6, C = 16;
  // One sample: the batch is merged away (stride 0 in the geometry) and spans its heads and rows.
  const sdpa::Layouts one_sample = sdpa::layouts(projection_geometry(1, T, C, 2));
  EXPECT_EQ(one_sample.q, (sdpa::Layout{{1, 2, T, 8}, Strides{T * 3 * C, 8, 3 * C, 1}}));
  EXPECT_EQ(one_sample.o, (sdpa::Layout{{1, 2, T, 8}, Strides{T * C, 8, C, 1}}));
  // One head: the geometry keeps the samples as its heads, and a batch of one spans them all.
  const sdpa::Layouts one_head = sdpa::layouts(projection_geometry(3, T, C, 1));
  EXPECT_EQ(one_head.q, (sdpa::Layout{{1, 3, T, C}, Strides{3 * T * 3 * C, T * 3 * C, 3 * C, 1}}));
  EXPECT_EQ(one_head.stats, (sdpa::Layout{{1, 3, T, 1}, Strides{3 * T, T, 1, 1}}));
}

// The packed op's backward: the upstream gradient in the output's layout (its [B, T, C] output),
// dq, dk and dv at q's, k's and v's places in one [B, T, 3C] gradient of the projection.
TEST(CudnnSdpaLayouts, ThePackedBackwardWritesIntoTheProjectionsGradient) {
  const int64_t B = 2, T = 5, C = 32, H = 4;
  kernels::AttentionGeometry g = projection_geometry(B, T, C, H);
  std::copy(g.o_stride, g.o_stride + 3, g.do_stride);
  std::copy(g.q_stride, g.q_stride + 3, g.dq_stride);
  std::copy(g.k_stride, g.k_stride + 3, g.dk_stride);
  std::copy(g.v_stride, g.v_stride + 3, g.dv_stride);
  const sdpa::Layouts l = sdpa::layouts(g);
  EXPECT_EQ(l.dout, l.o);
  EXPECT_EQ(l.dq, l.q);
  EXPECT_EQ(l.dk, l.k);
  EXPECT_EQ(l.dv, l.v);
  EXPECT_EQ(sdpa::unsupported_reason(g, DType::bf16), "");
  // The backward's graph is another one; the forward's is the same (it has no gradients).
  const kernels::AttentionGeometry separate = projection_geometry(B, T, C, H);
  EXPECT_FALSE(sdpa::graph_key(0, sdpa::Pass::backward, DType::bf16, g) ==
               sdpa::graph_key(0, sdpa::Pass::backward, DType::bf16, separate));
  EXPECT_EQ(sdpa::graph_key(0, sdpa::Pass::forward, DType::bf16, g),
            sdpa::graph_key(0, sdpa::Pass::forward, DType::bf16, separate));
  g.dk_stride[2] = 3 * C + 4;  // 16-byte rows: cuDNN declines, our kernel runs
  EXPECT_EQ(sdpa::unsupported_reason(g, DType::bf16), "a stride that is not a multiple of 8 elements");
}

TEST(CudnnSdpaKey, NamesEverythingTheGraphIsBuiltFor) {
  kernels::AttentionGeometry g = projection_geometry(2, 16, 64, 4);
  g.causal = true;
  g.scale = 0.25f;
  const sdpa::GraphKey key = sdpa::graph_key(0, sdpa::Pass::forward, DType::bf16, g);
  EXPECT_EQ(key, sdpa::graph_key(0, sdpa::Pass::forward, DType::bf16, g));
  EXPECT_FALSE(key < sdpa::graph_key(0, sdpa::Pass::forward, DType::bf16, g));
  std::vector<sdpa::GraphKey> others = {sdpa::graph_key(1, sdpa::Pass::forward, DType::bf16, g),
                                        sdpa::graph_key(0, sdpa::Pass::backward, DType::bf16, g),
                                        sdpa::graph_key(0, sdpa::Pass::forward, DType::f16, g)};
  const auto changed = [&](auto&& edit) {
    kernels::AttentionGeometry h = g;
    edit(h);
    others.push_back(sdpa::graph_key(0, sdpa::Pass::forward, DType::bf16, h));
  };
  changed([](kernels::AttentionGeometry& h) { h.causal = false; });
  changed([](kernels::AttentionGeometry& h) { h.scale = std::nextafter(h.scale, 1.0f); });
  changed([](kernels::AttentionGeometry& h) { std::swap(h.batch, h.heads); });
  changed([](kernels::AttentionGeometry& h) { h.tk = h.tq + 1; });
  changed([](kernels::AttentionGeometry& h) { h.d = 8; });
  changed([](kernels::AttentionGeometry& h) { h.q_stride[2] = 64; });  // the same sizes, dense q
  changed([](kernels::AttentionGeometry& h) { h.o_stride[0] += 8; });
  changed([](kernels::AttentionGeometry& h) { h.v_stride[1] = 0; });
  using Geometry = kernels::AttentionGeometry;
  for (int64_t(Geometry::*strides)[3] :
       {&Geometry::do_stride, &Geometry::dq_stride, &Geometry::dk_stride, &Geometry::dv_stride}) {
    Geometry h = g;
    (h.*strides)[0] += 8;
    EXPECT_FALSE(sdpa::graph_key(0, sdpa::Pass::backward, DType::bf16, h) ==
                 sdpa::graph_key(0, sdpa::Pass::backward, DType::bf16, g));
    EXPECT_EQ(sdpa::graph_key(0, sdpa::Pass::forward, DType::bf16, h), key);
  }
  for (const sdpa::GraphKey& other : others) {
    EXPECT_FALSE(other == key);
    EXPECT_TRUE(other < key || key < other);
  }
}

TEST(CudnnSdpaSupport, TakesSixteenBitHeadsOfMultiplesOfEight) {
  const kernels::AttentionGeometry gpt2 = projection_geometry(2, 16, 768, 12);  // D = 64
  EXPECT_EQ(sdpa::unsupported_reason(gpt2, DType::bf16), "");
  EXPECT_EQ(sdpa::unsupported_reason(gpt2, DType::f16), "");
  EXPECT_NE(sdpa::unsupported_reason(gpt2, DType::f32), "");
  EXPECT_EQ(sdpa::unsupported_reason(projection_geometry(2, 16, 512, 4), DType::bf16), "");  // D = 128
  EXPECT_NE(sdpa::unsupported_reason(projection_geometry(2, 16, 544, 4), DType::bf16), "");  // D = 136
  EXPECT_NE(sdpa::unsupported_reason(projection_geometry(2, 16, 48, 4), DType::bf16), "");   // D = 12
  // Rows 60 elements apart (a projection of width 20): 120 bytes, not a multiple of 16.
  kernels::AttentionGeometry odd = projection_geometry(2, 16, 16, 2);
  EXPECT_EQ(sdpa::unsupported_reason(odd, DType::bf16), "");
  odd.q_stride[2] = 60;
  EXPECT_NE(sdpa::unsupported_reason(odd, DType::bf16), "");
  kernels::AttentionGeometry one_key = gpt2;
  one_key.tk = 1;
  EXPECT_NE(sdpa::unsupported_reason(one_key, DType::bf16), "");
  alignas(16) char buffer[32];
  EXPECT_TRUE(sdpa::aligned16(buffer));
  EXPECT_FALSE(sdpa::aligned16(buffer + 2));
}

struct FakePlan {
  int64_t bytes = 0;
  int64_t workspace_bytes() const { return bytes; }
};

TEST(CudnnSdpaCache, BuildsOncePerKeyAndRemembersADecline) {
  sdpa::GraphCache<FakePlan> cache;
  const kernels::AttentionGeometry g = projection_geometry(2, 16, 64, 4);
  const sdpa::GraphKey forward = sdpa::graph_key(0, sdpa::Pass::forward, DType::bf16, g);
  const sdpa::GraphKey backward = sdpa::graph_key(0, sdpa::Pass::backward, DType::bf16, g);
  int built = 0;
  auto build = [&] {
    ++built;
    return std::make_shared<const FakePlan>(FakePlan{1000 * built});
  };
  EXPECT_FALSE(cache.contains(forward));
  const auto first = cache.get(forward, build);
  EXPECT_TRUE(cache.contains(forward));
  EXPECT_FALSE(cache.contains(backward));
  EXPECT_EQ(cache.get(forward, build), first);
  EXPECT_EQ(first->bytes, 1000);
  EXPECT_EQ(cache.get(backward, build)->bytes, 2000);
  int declined = 0;
  auto decline = [&] {
    ++declined;
    return std::shared_ptr<const FakePlan>();
  };
  const sdpa::GraphKey f16 = sdpa::graph_key(0, sdpa::Pass::forward, DType::f16, g);
  EXPECT_EQ(cache.get(f16, decline), nullptr);
  EXPECT_EQ(cache.get(f16, decline), nullptr);
  EXPECT_EQ(built, 2);
  EXPECT_EQ(declined, 1);
  EXPECT_EQ(cache.size(), 3u);
  EXPECT_EQ(cache.builds(), 3);
}

TEST(CudnnSdpaWorkspace, ComesFromTheCachingAllocatorInCategoryWorkspace) {
  CachingAllocator& allocator = allocator_for(Device::cpu());
  const int64_t before = allocator.stats()[MemoryCategory::workspace].current;
  const sdpa::WorkspaceSource source = ops::detail::workspace_source(Device::cpu());
  int64_t during = -1;
  void* seen = nullptr;
  sdpa::run_with_workspace(FakePlan{3000}, source, [&](void* workspace) {
    seen = workspace;
    during = allocator.stats()[MemoryCategory::workspace].current;
  });
  EXPECT_NE(seen, nullptr);
  EXPECT_EQ(during - before, 3072);  // 3000 bytes rounded up to the allocator's 512
  EXPECT_EQ(allocator.stats()[MemoryCategory::workspace].current, before);  // given back after the call
  int asked = 0;
  sdpa::run_with_workspace(
      FakePlan{0}, [&](std::size_t) { return ++asked, std::shared_ptr<void>(); },
      [&](void* workspace) { EXPECT_EQ(workspace, nullptr); });
  EXPECT_EQ(asked, 0);  // no workspace: none asked for
}

TEST(CudaAttentionChoice, CudnnByDefaultWhereBuiltOursOneCallAway) {
  const ops::CudaAttention initial = ops::cuda_attention();
  if (std::getenv("CUMULUS_CUDA_ATTENTION") == nullptr)
    EXPECT_EQ(initial, ops::cudnn_attention_compiled() ? ops::CudaAttention::cudnn : ops::CudaAttention::own);
  ops::set_cuda_attention(ops::CudaAttention::own);
  EXPECT_EQ(ops::cuda_attention(), ops::CudaAttention::own);
  EXPECT_EQ(ops::cuda_attention_description(DType::bf16), "cumulus's own kernels");
  if (ops::cudnn_attention_compiled()) {
    ops::set_cuda_attention(ops::CudaAttention::cudnn);
    EXPECT_NE(ops::cuda_attention_description(DType::bf16).find("fused SDPA (frontend 1."), std::string::npos);
    EXPECT_EQ(ops::cuda_attention_description(DType::f32), "cumulus's own kernels");
  } else {
    EXPECT_THROW(ops::set_cuda_attention(ops::CudaAttention::cudnn), InvalidArgument);
  }
  ops::set_cuda_attention(initial);
  // CPU calls are no CUDA attention of either kind.
  const ops::CudaAttentionCalls calls = ops::cuda_attention_calls();
  const Tensor x = Tensor::ones({1, 2, 4, 8});
  ops::scaled_dot_product_attention(x, x, x, true);
  EXPECT_EQ(ops::cuda_attention_calls().cudnn, calls.cudnn);
  EXPECT_EQ(ops::cuda_attention_calls().own, calls.own);
}

// ---- on a GPU (skipped without one; never run in this repository's CI) ----

struct GpuRun {
  std::vector<float> out, grad;
};

// bf16 attention of a [B, T, 3C] projection's heads on `device` under `choice`, the loss
// sum(out * w) and the projection's gradient, in f32.
GpuRun bf16_run(const Tensor& qkv32, const Tensor& w32, int64_t H, Device device, ops::CudaAttention choice) {
  ops::set_cuda_attention(choice);
  Tensor qkv = qkv32.to(DType::bf16).to(device);
  qkv.set_requires_grad(true);
  const std::vector<Tensor> h = heads(qkv, H);
  const Tensor out = ops::scaled_dot_product_attention(h[0], h[1], h[2], true);
  ops::sum(ops::mul(ops::cast(out, DType::f32), w32.to(device))).backward();
  return {ops::cast(out, DType::f32).to(Device::cpu()).to_vector<float>(),
          ops::cast(qkv.grad(), DType::f32).to(Device::cpu()).to_vector<float>()};
}

double max_difference(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(double(a[i]) - double(b[i])));
  return m;
}

TEST(CudnnSdpaGpu, MatchesOurKernelAndTheCpuAndRepeatsItsBits) {
  if (!cuda_available() || !ops::cudnn_attention_compiled())
    GTEST_SKIP() << "needs a GPU and a build with cuDNN's attention";
  const int64_t B = 2, T = 64, H = 2, C = 128;
  std::vector<float> values(static_cast<std::size_t>(B * T * 3 * C)), weights(static_cast<std::size_t>(B * T * C));
  Generator gen(7);
  gen.fill_uniform(values.data(), B * T * 3 * C, -1.0f, 1.0f);
  gen.fill_uniform(weights.data(), B * T * C, -1.0f, 1.0f);
  const Tensor qkv = Tensor::from_vector(values, {B, T, 3 * C});
  const Tensor w = Tensor::from_vector(weights, {B, H, T, C / H});
  const ops::CudaAttention initial = ops::cuda_attention();
  const int64_t cudnn_before = ops::cuda_attention_calls().cudnn;
  const GpuRun cudnn = bf16_run(qkv, w, H, Device::cuda(0), ops::CudaAttention::cudnn);
  EXPECT_EQ(ops::cuda_attention_calls().cudnn, cudnn_before + 1);
  const GpuRun again = bf16_run(qkv, w, H, Device::cuda(0), ops::CudaAttention::cudnn);
  const GpuRun own = bf16_run(qkv, w, H, Device::cuda(0), ops::CudaAttention::own);
  const GpuRun cpu = bf16_run(qkv, w, H, Device::cpu(), ops::CudaAttention::own);
  ops::set_cuda_attention(initial);
  EXPECT_EQ(again.out, cudnn.out);    // the forward, run twice
  EXPECT_EQ(again.grad, cudnn.grad);  // the deterministic backward, run twice
  // bf16 outputs and gradients: a few units of bf16's last place (2^-8 relative) at these magnitudes.
  EXPECT_LT(max_difference(cudnn.out, own.out), 2e-2);
  EXPECT_LT(max_difference(cudnn.out, cpu.out), 2e-2);
  EXPECT_LT(max_difference(cudnn.grad, own.grad), 5e-2);
  EXPECT_LT(max_difference(cudnn.grad, cpu.grad), 5e-2);
}

}  // namespace
}  // namespace cumulus::testing
