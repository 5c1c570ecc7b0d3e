// Optimizer updates over one flat array (docs/ARCHITECTURE.md, "Gradients and accumulation"): one
// pass, the gradient scaled by grad_scale (normalization and clipping folded in) as it is read. The rules (PyTorch's) are in
// kernels/optim_rules.h, shared with CUDA.
#include <algorithm>
#include <cmath>

#include "kernels/cpu/kernels.h"
#include "kernels/cpu/parallel.h"
#include "kernels/optim_rules.h"
#include "kernels/quantized_state.h"

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

constexpr int64_t kQuantBlock = QuantizedState::kBlock;
static_assert(kUpdateGrain % kQuantBlock == 0, "a thread's elements are whole quantization blocks");

DynamicMap make_dynamic_map(bool is_signed) {
  DynamicMap map{};
  for (int code = 0; code < DynamicMap::kCodes; ++code) rules::fill_dynamic_map_entry(map, code, is_signed);
  return map;
}

// The two maps of Note [8-bit optimizer state], computed once per process.
const DynamicMap& dynamic_map(bool is_signed) {
  static const DynamicMap signed_map = make_dynamic_map(true), unsigned_map = make_dynamic_map(false);
  return is_signed ? signed_map : unsigned_map;
}

// Block by block across threads, each block at its own update count `own` (frozen blocks skipped:
// Note [Frozen parameters]); a block is one frozen chunk.
template <typename BlockUpdate>
void for_quantized_blocks(int64_t n, int64_t t, const FrozenChunks& frozen, BlockUpdate update) {
  for_update_chunks(n, [&](int64_t chunks_begin, int64_t chunks_end) {
    for (int64_t begin = chunks_begin; begin < chunks_end; begin += kQuantBlock) {
      const int64_t own = rules::own_updates(frozen, begin, t);
      if (own > 0) update(begin, std::min(chunks_end, begin + kQuantBlock), own);
    }
  });
}

// One block [begin, end) of an update over quantized state: each element's states dequantized into
// x[0..kStates), rule(i, x) applied, and every state's block requantized with its new absmax.
template <int kStates, typename Rule>
void update_quantized_block(int64_t begin, int64_t end, const QuantizedState (&states)[kStates],
                            const DynamicMap* const (&maps)[kStates], Rule rule) {
  const int64_t block = begin / kQuantBlock;
  float updated[kStates][kQuantBlock];
  float absmax[kStates] = {};
  for (int64_t i = begin; i < end; ++i) {
    float x[kStates];
    for (int s = 0; s < kStates; ++s) x[s] = rules::dequantize(states[s].codes[i], states[s].absmax[block], *maps[s]);
    rule(i, x);
    for (int s = 0; s < kStates; ++s) {
      updated[s][i - begin] = x[s];
      absmax[s] = rules::larger(absmax[s], std::fabs(x[s]));
    }
  }
  for (int s = 0; s < kStates; ++s) {
    states[s].absmax[block] = absmax[s];
    for (int64_t i = begin; i < end; ++i) states[s].codes[i] = rules::quantize(updated[s][i - begin], absmax[s], *maps[s]);
  }
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

void sgd_step_8bit_cpu(float* w, const float* grad, const QuantizedState& momentum_buf, int64_t n, float grad_scale,
                       float lr, float momentum, float dampening, bool nesterov, float weight_decay, int64_t t,
                       const FrozenChunks& frozen) {
  const QuantizedState states[1] = {momentum_buf};
  const DynamicMap* const maps[1] = {&dynamic_map(true)};
  for_quantized_blocks(n, t, frozen, [&](int64_t begin, int64_t end, int64_t own) {
    update_quantized_block(begin, end, states, maps, [&](int64_t i, float* x) {
      rules::sgd(w[i], grad[i], x, grad_scale, lr, momentum, dampening, nesterov, weight_decay, own == 1);
    });
  });
}

void adamw_step_8bit_cpu(float* w, const float* grad, const QuantizedState& m, const QuantizedState& v, int64_t n,
                         float grad_scale, float lr, float beta1, float beta2, float eps, float weight_decay, int64_t t,
                         const FrozenChunks& frozen) {
  const QuantizedState states[2] = {m, v};
  const DynamicMap* const maps[2] = {&dynamic_map(true), &dynamic_map(false)};
  float step_size, bc2_sqrt;
  rules::adamw_constants(lr, beta1, beta2, t, step_size, bc2_sqrt);
  for_quantized_blocks(n, t, frozen, [&](int64_t begin, int64_t end, int64_t own) {
    float s = step_size, b = bc2_sqrt;
    if (own != t) rules::adamw_constants(lr, beta1, beta2, own, s, b);  // behind after a freeze
    update_quantized_block(begin, end, states, maps, [&](int64_t i, float* x) {
      rules::adamw(w[i], grad[i], x[0], x[1], grad_scale, lr, beta1, beta2, eps, weight_decay, s, b);
    });
  });
}

}  // namespace cumulus::kernels
