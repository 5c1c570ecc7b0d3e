// Launchers of cuDNN's fused scaled-dot-product attention (kernels/cuda/cudnn_attention.cpp, built
// with the cuDNN frontend's headers): the contracts of kernels/cuda/attention_kernels.h for bf16 and
// f16, queued on the stream `handle` is bound to. What they need of the engine their caller hands
// them: the device's handle, the graph cache and a source of workspace. Only for builds with the
// frontend (CUMULUS_WITH_CUDNN_FRONTEND); the host-side rules are in cudnn_sdpa_plan.h.
#pragma once

#include <cudnn.h>

#include "cumulus/tensor/dtype.h"
#include "kernels/attention_rules.h"
#include "kernels/cuda/cudnn_sdpa_plan.h"

namespace cumulus::kernels {

struct SdpaPlan;  // a built graph, its tensors' ids and its workspace (cudnn_attention.cpp)
using SdpaGraphs = cudnn_sdpa::GraphCache<SdpaPlan>;

// What cuDNN's attention takes of its caller.
struct CudnnSdpa {
  cudnnHandle_t handle;  // the device's, bound to its stream
  int device;            // the device index: part of the graphs' key
  SdpaGraphs& graphs;
  cudnn_sdpa::WorkspaceSource workspace;
  // The stream is being captured into a CUDA graph: a graph not yet built is an error then (its
  // build is not known to be capture-safe; the engine runs every step once eagerly first).
  bool capturing = false;
};

// out and lse as attention_forward_cuda writes them (lse: the natural-log log-sum-exp of each
// query row's scaled scores, [bh, tq] f32). False, with nothing written, when cuDNN has no engine
// for this graph (the caller runs its own kernel); cudnn_sdpa::unsupported_reason and aligned
// pointers are the caller's to check first.
bool sdpa_forward_cudnn(const CudnnSdpa& sdpa, const AttentionGeometry& g, DType dtype, const void* q,
                        const void* k, const void* v, void* out, float* lse);

// dq, dk, dv (dense [bh, t, d]) from dout (dense) and the forward's q, k, v, out and lse; the same
// false as the forward's.
bool sdpa_backward_cudnn(const CudnnSdpa& sdpa, const AttentionGeometry& g, DType dtype, const void* q,
                         const void* k, const void* v, const void* out, const float* lse, const void* dout,
                         void* dq, void* dk, void* dv);

// "cuDNN <backend version> (frontend <version>)", for banners.
const char* cudnn_attention_version_text();

}  // namespace cumulus::kernels
