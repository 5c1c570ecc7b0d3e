// Optimizer updates over one flat array (docs/ARCHITECTURE.md, "Gradients and accumulation"): one
// pass, the gradient scaled by grad_scale (normalization and clipping folded in) as it is read. The rules (PyTorch's) are in
// kernels/optim_rules.h, shared with CUDA.
#include <algorithm>
#include <cmath>

#include "kernels/cpu/kernels.h"
#include "kernels/cpu/parallel.h"
#include "kernels/optim_rules.h"

namespace cumulus::kernels {

namespace {
// Elements of an update per thread's chunk: a whole number of frozen chunks (each chunk's missed
// count is one thread's), and about 20 us of AdamW's arithmetic and memory traffic.
constexpr int64_t kUpdateGrain = 256 * FrozenChunks::kChunk;

// run(begin, end) over [0, n) across threads; every element's update reads and writes only its own
// slots, so the bits are the same at any thread count.
template <typename Run>
void for_update_chunks(int64_t n, Run run) {
  parallel_for(n, kUpdateGrain, [&](int64_t begin, int64_t end) { run(begin, end); });
}
}  // namespace

double sum_squares_cpu(const float* x, int64_t n) {
  // Eight independent partial sums: one chain of dependent double adds runs ~5x slower, and this
  // pass is on the step's critical path (the global norm for clipping and the non-finite guard).
  constexpr int kLanes = 8;
  double lane[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int k = 0; k < kLanes; ++k) lane[k] += static_cast<double>(x[i + k]) * x[i + k];
  for (; i < n; ++i) lane[0] += static_cast<double>(x[i]) * x[i];
  double s = 0.0;
  for (double v : lane) s += v;
  return s;
}

void sgd_step_cpu(float* w, const float* grad, float* buf, int64_t n, float grad_scale, float lr, float momentum,
                  float dampening, bool nesterov, float weight_decay, int64_t t, const FrozenChunks& frozen) {
  auto run = [&](int64_t begin, int64_t end, bool first) {
    for (int64_t i = begin; i < end; ++i)
      rules::sgd(w[i], grad[i], buf ? buf + i : nullptr, grad_scale, lr, momentum, dampening, nesterov, weight_decay,
                 first);
  };
  if (frozen.frozen == nullptr) return for_update_chunks(n, [&](int64_t b, int64_t e) { run(b, e, t == 1); });
  // Chunk by chunk (Note [Frozen parameters]), with each chunk's own update count.
  for_update_chunks(n, [&](int64_t b, int64_t e) {
    for (int64_t begin = b; begin < e; begin += FrozenChunks::kChunk) {
      const int64_t own = rules::own_updates(frozen, begin, t);
      if (own > 0) run(begin, std::min(e, begin + FrozenChunks::kChunk), own == 1);
    }
  });
}

void adamw_step_cpu(float* w, const float* grad, float* m, float* v, int64_t n, float grad_scale, float lr, float beta1,
                    float beta2, float eps, float weight_decay, int64_t t, const FrozenChunks& frozen) {
  float step_size, bc2_sqrt;
  rules::adamw_constants(lr, beta1, beta2, t, step_size, bc2_sqrt);
  auto run = [&](int64_t begin, int64_t end, float s, float b) {
    for (int64_t i = begin; i < end; ++i)
      rules::adamw(w[i], grad[i], m[i], v[i], grad_scale, lr, beta1, beta2, eps, weight_decay, s, b);
  };
  if (frozen.frozen == nullptr)
    return for_update_chunks(n, [&](int64_t b, int64_t e) { run(b, e, step_size, bc2_sqrt); });
  // Chunk by chunk (Note [Frozen parameters]): a chunk behind the optimizer's count computes its own
  // constants, kept while the next chunks (the rest of its parameter) share its count.
  for_update_chunks(n, [&](int64_t chunks_begin, int64_t chunks_end) {
    int64_t constants_for = t;
    float s = step_size, b = bc2_sqrt;
    for (int64_t begin = chunks_begin; begin < chunks_end; begin += FrozenChunks::kChunk) {
      const int64_t own = rules::own_updates(frozen, begin, t);
      if (own == 0) continue;
      if (own != constants_for) {
        rules::adamw_constants(lr, beta1, beta2, own, s, b);
        constants_for = own;
      }
      run(begin, std::min(chunks_end, begin + FrozenChunks::kChunk), s, b);
    }
  });
}

}  // namespace cumulus::kernels
