// Attention on CUDA through cuDNN's fused scaled-dot-product attention, built with the cuDNN
// frontend's graph API (header-only; CMakeLists.txt finds the pinned release that
// scripts/install-deps.sh fetches). Compiled only when the frontend was found.
//
// Note [cuDNN attention]
// - What runs: one frontend graph per pass, its single node cuDNN's flash-attention SDPA (forward
//   with statistics for training; the backward from q, k, v, o, dout and the statistics), in bf16
//   or f16 with f32 intermediates and compute. The statistics are each query row's natural-log
//   log-sum-exp of the scaled scores, the same quantity our own kernels save, so a backward cuDNN
//   declines can run on our kernel from cuDNN's forward.
// - Where it reads: q, k and v at the strides the op found (views into the qkv projection's
//   [B, T, 3C], handed to cuDNN as [B, H, T, D] with strides [T*3C, D, 3C, 1]: no copy), the output
//   at its own strides ([B, T, H, D] storage), the rest dense (cudnn_sdpa_plan.h).
// - Graphs: built once per (device, pass, dtype, sizes, strides, causal, scale) and kept for the
//   process (cudnn_sdpa::GraphCache, owned by the engine: cudnn::attention_graphs()); a graph cuDNN
//   declines is kept as declined, said once on stderr, and our own kernel runs it. Under a CUDA
//   graph capture (Note [CUDA graphs]) only built graphs run: the trainer's eager first step builds
//   them, and a new one then is an error, as a new cuBLAS handle is.
// - Workspace: each plan's size, taken from the caller for the call (the engine: the caching
//   allocator, category workspace) and given back once the call is queued.
// - Determinism: the backward asks for cuDNN's deterministic algorithm (set_deterministic_algorithm).
//   cuDNN's determinism page defines it as bitwise repeatability: identical result bytes for
//   repeated calls with fixed inputs and shapes, on one GPU and one software version, not equal
//   bytes across GPU architectures or cuDNN versions; its support matrix lists deterministic
//   backward for fp16 and bf16 on Ampere, Ada and Hopper (Blackwell: from cuDNN 9.18, which the
//   frontend checks, declining the graph otherwise). The forward is not promised more than that.
// - Where it is tested: everything in this file needs a GPU, which CI has not; there the host-side
//   rules (cudnn_sdpa_plan.h) are tested (tests/test_cudnn_sdpa.cpp). On a GPU the op cases in
//   tests/op_cases compare it with the CPU (first passed on an H200, bench/results/2026-11-29-h200).
#if CUMULUS_WITH_CUDNN_FRONTEND
#include <cstring>  // first: the frontend's shim uses std::strlen and, without its JSON library, misses the include

#include <cudnn_frontend.h>

#include <cstdio>
#include <string>
#include <unordered_map>
#include <vector>

#include "cumulus/core/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cudnn_attention.h"

namespace fe = cudnn_frontend;

namespace cumulus::kernels {

// The tensors' ids in a graph's variant pack.
enum SdpaUid : int64_t { kQ = 1, kK, kV, kO, kStats, kDout, kDq, kDk, kDv };

struct SdpaPlan {
  std::shared_ptr<fe::graph::Graph> graph;
  int64_t workspace = 0;
  int64_t workspace_bytes() const { return workspace; }
};

namespace {

using FeTensor = std::shared_ptr<fe::graph::Tensor_attributes>;

std::vector<int64_t> vec(const std::array<int64_t, 4>& a) { return {a[0], a[1], a[2], a[3]}; }

fe::graph::Tensor_attributes attributes(const char* name, SdpaUid uid, const cudnn_sdpa::Layout& l) {
  return fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(vec(l.dim)).set_stride(vec(l.stride));
}

void mark_output(const FeTensor& t, const char* name, SdpaUid uid, const cudnn_sdpa::Layout& l) {
  t->set_output(true).set_name(name).set_uid(uid).set_dim(vec(l.dim)).set_stride(vec(l.stride));
}

std::shared_ptr<fe::graph::Graph> new_graph(DType dtype) {
  auto graph = std::make_shared<fe::graph::Graph>();
  graph->set_io_data_type(dtype == DType::bf16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return graph;
}

std::string shape_text(const AttentionGeometry& g) {
  return detail::concat("[", g.batch, ", ", g.heads, ", ", g.tq, "/", g.tk, ", ", g.d, "]", g.causal ? " causal" : "");
}

// Validates, builds and sizes the graph; null (said once, on stderr) when cuDNN declines it.
std::shared_ptr<const SdpaPlan> finish(std::shared_ptr<fe::graph::Graph> graph, cudnnHandle_t handle,
                                       const AttentionGeometry& g, const char* pass) {
  fe::error_t status = graph->build(handle, {fe::HeurMode_t::A});
  int64_t workspace = 0;
  if (status.is_good()) status = graph->get_workspace_size(workspace);
  if (!status.is_good()) {
    std::fprintf(stderr, "cumulus: cuDNN declines the attention %s of %s (%s); our own kernel runs it\n", pass,
                 shape_text(g).c_str(), status.get_message().c_str());
    return nullptr;
  }
  auto plan = std::make_shared<SdpaPlan>();
  plan->graph = std::move(graph);
  plan->workspace = workspace;
  return plan;
}

std::shared_ptr<const SdpaPlan> build_forward(cudnnHandle_t handle, const AttentionGeometry& g, DType dtype) {
  const cudnn_sdpa::Layouts l = cudnn_sdpa::layouts(g);
  auto graph = new_graph(dtype);
  const FeTensor q = graph->tensor(attributes("q", kQ, l.q));
  const FeTensor k = graph->tensor(attributes("k", kK, l.k));
  const FeTensor v = graph->tensor(attributes("v", kV, l.v));
  auto options = fe::graph::SDPA_attributes().set_name("sdpa").set_generate_stats(true).set_attn_scale(g.scale);
  if (g.causal) options.set_causal_mask(true);
  auto [o, stats] = graph->sdpa(q, k, v, options);
  mark_output(o, "o", kO, l.o);
  mark_output(stats, "stats", kStats, l.stats);
  stats->set_data_type(fe::DataType_t::FLOAT);
  return finish(std::move(graph), handle, g, "forward");
}

std::shared_ptr<const SdpaPlan> build_backward(cudnnHandle_t handle, const AttentionGeometry& g, DType dtype) {
  const cudnn_sdpa::Layouts l = cudnn_sdpa::layouts(g);
  auto graph = new_graph(dtype);
  const FeTensor q = graph->tensor(attributes("q", kQ, l.q));
  const FeTensor k = graph->tensor(attributes("k", kK, l.k));
  const FeTensor v = graph->tensor(attributes("v", kV, l.v));
  const FeTensor o = graph->tensor(attributes("o", kO, l.o));
  const FeTensor dout = graph->tensor(attributes("dout", kDout, l.dout));
  const FeTensor stats = graph->tensor(attributes("stats", kStats, l.stats).set_data_type(fe::DataType_t::FLOAT));
  auto options = fe::graph::SDPA_backward_attributes()
                     .set_name("sdpa_backward")
                     .set_attn_scale(g.scale)
                     .set_deterministic_algorithm(true);
  if (g.causal) options.set_causal_mask(true);
  auto [dq, dk, dv] = graph->sdpa_backward(q, k, v, o, dout, stats, options);
  mark_output(dq, "dq", kDq, l.dq);
  mark_output(dk, "dk", kDk, l.dk);
  mark_output(dv, "dv", kDv, l.dv);
  return finish(std::move(graph), handle, g, "backward");
}

// The plan of the key (built on a miss), run with its workspace on the handle's stream.
bool run(const CudnnSdpa& sdpa, const AttentionGeometry& g, DType dtype, cudnn_sdpa::Pass pass,
         std::unordered_map<int64_t, void*>& pack) {
  const cudnn_sdpa::GraphKey key = cudnn_sdpa::graph_key(sdpa.device, pass, dtype, g);
  CUMULUS_CHECK(!sdpa.capturing || sdpa.graphs.contains(key), CudaError, "cuDNN attention graph for ",
                shape_text(g), " built during a CUDA graph capture: run the work once eagerly before capturing it");
  const std::shared_ptr<const SdpaPlan> plan =
      sdpa.graphs.get(key, [&] {
        return pass == cudnn_sdpa::Pass::forward ? build_forward(sdpa.handle, g, dtype)
                                                 : build_backward(sdpa.handle, g, dtype);
      });
  if (plan == nullptr) return false;
  cudnn_sdpa::run_with_workspace(*plan, sdpa.workspace, [&](void* workspace) {
    detail::count_launch();
    fe::error_t status = plan->graph->execute(sdpa.handle, pack, workspace);
    CUMULUS_CHECK(status.is_good(), CudaError, "cuDNN attention ",
                  pass == cudnn_sdpa::Pass::forward ? "forward" : "backward", " of ", shape_text(g), ": ",
                  status.get_message());
  });
  return true;
}

void* mutable_pointer(const void* p) { return const_cast<void*>(p); }  // cuDNN's variant pack is void*

}  // namespace

bool sdpa_forward_cudnn(const CudnnSdpa& sdpa, const AttentionGeometry& g, DType dtype, const void* q,
                        const void* k, const void* v, void* out, float* lse) {
  std::unordered_map<int64_t, void*> pack = {
      {kQ, mutable_pointer(q)}, {kK, mutable_pointer(k)}, {kV, mutable_pointer(v)}, {kO, out}, {kStats, lse}};
  return run(sdpa, g, dtype, cudnn_sdpa::Pass::forward, pack);
}

bool sdpa_backward_cudnn(const CudnnSdpa& sdpa, const AttentionGeometry& g, DType dtype, const void* q,
                         const void* k, const void* v, const void* out, const float* lse, const void* dout,
                         void* dq, void* dk, void* dv) {
  std::unordered_map<int64_t, void*> pack = {
      {kQ, mutable_pointer(q)},    {kK, mutable_pointer(k)},       {kV, mutable_pointer(v)},
      {kO, mutable_pointer(out)},  {kStats, mutable_pointer(lse)}, {kDout, mutable_pointer(dout)},
      {kDq, dq},                   {kDk, dk},                      {kDv, dv}};
  return run(sdpa, g, dtype, cudnn_sdpa::Pass::backward, pack);
}

const char* cudnn_attention_version_text() {
  static const std::string text = [] {
    const std::size_t v = cudnnGetVersion();  // e.g. 91900 for 9.19.0
    return detail::concat("cuDNN ", v / 10000, ".", v / 100 % 100, ".", v % 100, " fused SDPA (frontend ",
                          CUMULUS_CUDNN_FRONTEND_VERSION_TEXT, ")");
  }();
  return text.c_str();
}

}  // namespace cumulus::kernels
#endif  // CUMULUS_WITH_CUDNN_FRONTEND
