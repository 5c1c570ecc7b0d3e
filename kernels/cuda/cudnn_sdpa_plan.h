// The host-side rules of cuDNN's fused attention (kernels/cuda/cudnn_attention.cpp) that need no
// GPU and no cuDNN: which geometries it is asked to take, the tensors it is handed (dimensions and
// strides, in cuDNN's [batch, heads, time, head size] order), the key its graphs are cached under,
// the cache itself and how a run takes its workspace. Plain C++ (no cuDNN, no CUDA header), so that
// tests/test_cudnn_sdpa.cpp checks all of it on any machine, against a fake plan; the frontend calls
// that use it have never run in this repository's CI (no GPU there). Note [cuDNN attention] in
// cudnn_attention.cpp says what runs on the GPU.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>

#include "cumulus/tensor/dtype.h"
#include "kernels/attention_rules.h"

namespace cumulus::kernels::cudnn_sdpa {

// The head sizes handed to cuDNN: a multiple of 8 up to this (cuDNN's support matrix lists d <= 128
// for the backward on Ampere and Ada, more on Hopper and Blackwell; one limit for every GPU).
inline constexpr int64_t kMaxHeadDim = 128;

// One tensor as cuDNN's graph sees it: logical [batch, heads, time, last] and element strides.
struct Layout {
  std::array<int64_t, 4> dim{}, stride{};
  bool operator==(const Layout& o) const { return dim == o.dim && stride == o.stride; }
};

// Every tensor of the forward and the backward at the geometry's strides: q, k and v (views into a
// [B, T, 3C] projection read where they lie), o, dout (the output's layout, or dense), and dq, dk
// and dv (dense, or at q's, k's and v's places in one gradient of the projection); the statistics
// (the log-sum-exp, [bh, tq] f32) dense.
struct Layouts {
  Layout q, k, v, o, stats, dq, dk, dv, dout;
};

// A batch or head dimension of size 1 (merged away: stride 0 in the geometry) is given the span
// of the dimensions inside it (the largest stride times size among them), the stride it would have
// as the outermost dimension of its storage: never used to address, but cuDNN then sees an
// ordinary layout.
inline Layout strided(const AttentionGeometry& g, int64_t t, const int64_t (&s)[3]) {
  Layout l{{g.batch, g.heads, t, g.d}, {s[0], s[1], s[2], 1}};
  for (std::size_t i = 2; i-- > 0;) {  // heads, then batch: the batch spans the heads as they end up
    if (l.dim[i] != 1) continue;
    l.stride[i] = 1;
    for (std::size_t j = i + 1; j < 4; ++j) l.stride[i] = std::max(l.stride[i], l.stride[j] * l.dim[j]);
  }
  return l;
}

inline Layout dense(const AttentionGeometry& g, int64_t t, int64_t last) {
  return Layout{{g.batch, g.heads, t, last}, {g.heads * t * last, t * last, last, 1}};
}

inline Layouts layouts(const AttentionGeometry& g) {
  Layouts l;
  l.q = strided(g, g.tq, g.q_stride);
  l.k = strided(g, g.tk, g.k_stride);
  l.v = strided(g, g.tk, g.v_stride);
  l.o = strided(g, g.tq, g.o_stride);
  l.stats = dense(g, g.tq, 1);
  l.dq = strided(g, g.tq, g.dq_stride);
  l.dk = strided(g, g.tk, g.dk_stride);
  l.dv = strided(g, g.tk, g.dv_stride);
  l.dout = strided(g, g.tq, g.do_stride);
  return l;
}

// Why the geometry is not handed to cuDNN (the op then runs its own kernel), or empty. 16-bit only;
// d a multiple of 8 up to kMaxHeadDim; every stride but the last a multiple of 8 elements (16
// bytes: cuDNN's attention loads rows with 16-byte accesses); more than one key (cuDNN 9's release
// notes: no backward when k and v have sequence length 1).
inline std::string unsupported_reason(const AttentionGeometry& g, DType dtype) {
  if (dtype != DType::bf16 && dtype != DType::f16) return "cuDNN's attention is for bf16 and f16";
  if (g.d % 8 != 0 || g.d > kMaxHeadDim) return "the head size is not a multiple of 8 up to 128";
  if (g.tk < 2) return "a single key";
  for (const int64_t* s :
       {g.q_stride, g.k_stride, g.v_stride, g.o_stride, g.do_stride, g.dq_stride, g.dk_stride, g.dv_stride})
    for (int i = 0; i < 3; ++i)
      if (s[i] % 8 != 0) return "a stride that is not a multiple of 8 elements";
  return "";
}

// The pointers cuDNN is handed: 16-byte aligned (a view into a projection starts C elements in).
inline bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

enum class Pass : uint8_t { forward, backward };

// A graph's identity: everything it was built for. The scale by its bits (a graph bakes it in).
struct GraphKey {
  int device = 0;
  Pass pass = Pass::forward;
  DType dtype = DType::bf16;
  bool causal = false;
  uint32_t scale_bits = 0;
  std::array<int64_t, 5> sizes{};     // batch, heads, tq, tk, d
  std::array<int64_t, 24> strides{};  // q, k, v, o, then the backward's dout, dq, dk, dv: batch, head, time
  auto tied() const { return std::tie(device, pass, dtype, causal, scale_bits, sizes, strides); }
  bool operator<(const GraphKey& o) const { return tied() < o.tied(); }
  bool operator==(const GraphKey& o) const { return tied() == o.tied(); }
};

inline GraphKey graph_key(int device, Pass pass, DType dtype, const AttentionGeometry& g) {
  GraphKey key;
  key.device = device;
  key.pass = pass;
  key.dtype = dtype;
  key.causal = g.causal;
  std::memcpy(&key.scale_bits, &g.scale, sizeof key.scale_bits);
  key.sizes = {g.batch, g.heads, g.tq, g.tk, g.d};
  const int64_t* strides[8] = {g.q_stride,  g.k_stride,  g.v_stride,  g.o_stride,
                               g.do_stride, g.dq_stride, g.dk_stride, g.dv_stride};
  const std::size_t tensors = pass == Pass::backward ? 8 : 4;  // the forward's graph has no gradients
  for (std::size_t t = 0; t < tensors; ++t)
    for (std::size_t i = 0; i < 3; ++i) key.strides[t * 3 + i] = strides[t][i];
  return key;
}

// Graphs built so far, by key, thread-safe. Plan is cudnn_attention.cpp's built graph (or a test's
// fake); a key whose build said "not supported" is kept as a null plan, so it is asked once.
template <typename Plan>
class GraphCache {
 public:
  using Build = std::function<std::shared_ptr<const Plan>()>;
  std::shared_ptr<const Plan> get(const GraphKey& key, const Build& build) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = plans_.find(key);
    if (it != plans_.end()) return it->second;
    ++builds_;
    std::shared_ptr<const Plan> plan = build();  // under the lock: one build per key
    plans_.emplace(key, plan);
    return plan;
  }
  bool contains(const GraphKey& key) const {
    std::lock_guard<std::mutex> lock(mutex_);
    return plans_.count(key) != 0;
  }
  std::size_t size() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return plans_.size();
  }
  int64_t builds() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return builds_;
  }

 private:
  mutable std::mutex mutex_;
  std::map<GraphKey, std::shared_ptr<const Plan>> plans_;
  int64_t builds_ = 0;
};

// Device memory of at least `bytes` for one call, usable on the handle's stream while the returned
// owner lives (the engine's comes from the caching allocator in category workspace).
using WorkspaceSource = std::function<std::shared_ptr<void>(std::size_t bytes)>;

// Runs a plan with the workspace it asks for: plan.workspace_bytes() taken from `workspace` for the
// call, handed to plan.execute(pointer), and given back once the call is queued (stream-ordered
// reuse on the device's one stream, as cuDNN's convolutions do: Note [cuDNN algorithm cache]).
template <typename Plan, typename Execute>
void run_with_workspace(const Plan& plan, const WorkspaceSource& workspace, Execute&& execute) {
  const std::size_t bytes = static_cast<std::size_t>(plan.workspace_bytes());
  const std::shared_ptr<void> memory = bytes > 0 ? workspace(bytes) : nullptr;
  execute(memory.get());
}

}  // namespace cumulus::kernels::cudnn_sdpa
