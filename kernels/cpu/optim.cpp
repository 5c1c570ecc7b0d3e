// Optimizer updates over one flat array (docs/ARCHITECTURE.md, "Gradients and accumulation"): one
// pass, the gradient scaled by grad_scale (normalization and clipping folded in) as it is read. The rules (PyTorch's)
// are in kernels/optim_rules.h, shared with CUDA.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "cumulus/core/error.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/optim_8bit_blocks.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vec_math.h"
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

float float_from_bits(uint32_t bits) {
  float x;
  std::memcpy(&x, &bits, sizeof x);
  return x;
}

// The index of Note [Nearest code by exponent] (optim_8bit_blocks.h) for `map` with buckets of
// `bits` mantissa bits, or false when one of them would hold two midpoints.
bool fill_vector_code_map(const DynamicMap& map, int bits, VectorCodeMap& v) {
  const int midpoints = map.magnitudes - 1;
  int octaves = 0;  // bucket 0 starts at 2^-octaves, at or under the first midpoint
  while (std::ldexp(1.0f, -octaves) > map.midpoints[0]) ++octaves;
  CUMULUS_CHECK(octaves <= VectorCodeMap::kMaxOctaves, Error, "8-bit state: the map's first midpoint ",
                map.midpoints[0], " is below the vector index's range");
  v.map = &map;
  v.shift = 23 - bits;
  v.first_bucket = (127 - octaves) << bits;
  v.last_bucket = octaves << bits;
  int below = 0;
  for (int32_t bucket = 0; bucket <= v.last_bucket; ++bucket) {
    const uint32_t start_bits = static_cast<uint32_t>(v.first_bucket + bucket) << v.shift;
    const float end = float_from_bits(start_bits + (1u << v.shift));
    while (below < midpoints && map.midpoints[below] < float_from_bits(start_bits)) ++below;
    if (below + 1 < midpoints && map.midpoints[below + 1] < end) return false;
    const bool inside = below < midpoints && map.midpoints[below] < end;
    uint32_t next_bits = start_bits + (1u << v.shift) - 1;  // the bucket's largest float: a > it never holds
    if (inside) std::memcpy(&next_bits, &map.midpoints[below], sizeof next_bits);
    v.entries[bucket] = static_cast<uint32_t>(below) << 24 | (next_bits & ((1u << v.shift) - 1));
  }
  return true;
}

// The index with the coarsest buckets that hold at most one midpoint each, its map's midpoints
// checked to increase (the scalar search's premise).
VectorCodeMap make_vector_code_map(const DynamicMap& map) {
  for (int k = 0; k + 2 < map.magnitudes; ++k)
    CUMULUS_CHECK(map.midpoints[k] < map.midpoints[k + 1], Error,
                  "8-bit state: the map's midpoints do not increase at ", k);
  VectorCodeMap v;
  for (int bits = 1; bits <= VectorCodeMap::kMaxBits; ++bits)
    if (fill_vector_code_map(map, bits, v)) return v;
  CUMULUS_CHECK(false, Error, "8-bit state: the map's midpoints are closer than the vector index's finest buckets");
  return v;
}

const VectorCodeMap& vector_code_map(bool is_signed) {
  static const VectorCodeMap signed_map = make_vector_code_map(dynamic_map(true)),
                             unsigned_map = make_vector_code_map(dynamic_map(false));
  return is_signed ? signed_map : unsigned_map;
}

// The vector block functions `code` names (null: the scalar loop), refusing a width the CPU does not run.
struct VectorBlocks {
  decltype(&vec::sgd_8bit_blocks) sgd = nullptr;
  decltype(&vec::adamw_8bit_blocks) adamw = nullptr;
};

VectorBlocks vector_blocks(CpuCode code) {
  if constexpr (vec::kBuilt) {
    const bool wide = vec512::available(), narrow = vec::available();
    CUMULUS_CHECK(code != CpuCode::avx512 || wide, InvalidArgument, "the AVX-512 code does not run on this CPU");
    CUMULUS_CHECK(code != CpuCode::avx2 || narrow, InvalidArgument, "the AVX2 code does not run on this CPU");
    if (code == CpuCode::avx512 || (code == CpuCode::best && wide))
      return {vec512::sgd_8bit_blocks, vec512::adamw_8bit_blocks};
    if (code == CpuCode::avx2 || (code == CpuCode::best && narrow))
      return {vec::sgd_8bit_blocks, vec::adamw_8bit_blocks};
  }
  CUMULUS_CHECK(code == CpuCode::best || code == CpuCode::scalar, InvalidArgument,
                "vector code requested on a build without it");
  return {};
}

// The f32 updates' whole vectors at the widest code this CPU runs (null: none built or runnable).
struct DenseVectorUpdates {
  decltype(&vec::sgd_f32_vectors) sgd = nullptr;
  decltype(&vec::adamw_f32_vectors) adamw = nullptr;
  decltype(&vec::sum_squares_f32_vectors) sum_squares = nullptr;
};

DenseVectorUpdates dense_vector_updates() {
  if constexpr (vec::kBuilt) {
    if (vec512::available()) return {vec512::sgd_f32_vectors, vec512::adamw_f32_vectors, vec::sum_squares_f32_vectors};
    if (vec::available()) return {vec::sgd_f32_vectors, vec::adamw_f32_vectors, vec::sum_squares_f32_vectors};
  }
  return {};
}

// Runs [begin, end) of consecutive trained blocks at one update count `own`, across threads
// (frozen blocks skipped: Note [Frozen parameters]); a block is one frozen chunk.
template <typename RunUpdate>
void for_quantized_runs(int64_t n, int64_t t, const FrozenChunks& frozen, RunUpdate update) {
  for_update_chunks(n, [&](int64_t chunks_begin, int64_t chunks_end) {
    int64_t run_begin = chunks_begin, run_own = 0;
    for (int64_t begin = chunks_begin; begin < chunks_end; begin += kQuantBlock) {
      const int64_t own = rules::own_updates(frozen, begin, t);
      if (own == run_own) continue;
      if (run_own > 0) update(run_begin, begin, run_own);
      run_begin = begin;
      run_own = own;
    }
    if (run_own > 0) update(run_begin, chunks_end, run_own);
  });
}

// A run's blocks [begin, end): the whole ones through vector_run(first_block, blocks) when `vector`,
// the rest (all of them, or a partial last block) one at a time through scalar_block(begin, end).
template <typename VectorRun, typename ScalarBlock>
void update_run(int64_t begin, int64_t end, bool vector, VectorRun vector_run, ScalarBlock scalar_block) {
  const int64_t whole = vector ? (end - begin) / kQuantBlock : 0;
  if (whole > 0) vector_run(begin / kQuantBlock, whole);
  for (int64_t b = begin + whole * kQuantBlock; b < end; b += kQuantBlock)
    scalar_block(b, std::min(end, b + kQuantBlock));
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
    for (int64_t i = begin; i < end; ++i)
      states[s].codes[i] = rules::quantize(updated[s][i - begin], absmax[s], *maps[s]);
  }
}
}  // namespace

double sum_squares_cpu(const float* x, int64_t n) {
  // kSquareLanes independent partial sums (element i in lane i mod kSquareLanes, each in order),
  // then the lanes in order: one chain of dependent double adds would bound this pass by the add's
  // latency, and it is on the step's critical path (the global norm for clipping and the non-finite
  // guard). The vector loops keep the same lanes, so every path gives these bits.
  double lane[kSquareLanes] = {};
  int64_t i = 0;
  if (const auto vector = dense_vector_updates().sum_squares) i = vector(x, n, lane);
  for (; i + kSquareLanes <= n; i += kSquareLanes)
    for (int k = 0; k < kSquareLanes; ++k) lane[k] += static_cast<double>(x[i + k]) * x[i + k];
  for (int k = 0; i < n; ++i, ++k) lane[k] += static_cast<double>(x[i]) * x[i];
  double s = 0.0;
  for (double v : lane) s += v;
  return s;
}

void sgd_step_cpu(float* w, const float* grad, float* buf, int64_t n, float grad_scale, float lr, float momentum,
                  float dampening, bool nesterov, float weight_decay, int64_t t, const FrozenChunks& frozen) {
  const auto vector = dense_vector_updates().sgd;
  auto run = [&](int64_t begin, int64_t end, bool first) {
    const SgdBlockArgs a{grad_scale, lr, momentum, dampening, weight_decay, nesterov, first};
    if (vector != nullptr) begin += vector(w + begin, grad + begin, buf ? buf + begin : nullptr, end - begin, a);
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
  const auto vector = dense_vector_updates().adamw;
  auto run = [&](int64_t begin, int64_t end, float s, float b) {
    const AdamWBlockArgs a{grad_scale, lr, beta1, beta2, eps, weight_decay, s, b};
    if (vector != nullptr) begin += vector(w + begin, grad + begin, m + begin, v + begin, end - begin, a);
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
                       const FrozenChunks& frozen, CpuCode code) {
  const QuantizedState states[1] = {momentum_buf};
  const DynamicMap* const maps[1] = {&dynamic_map(true)};
  const auto vector = vector_blocks(code).sgd;
  for_quantized_runs(n, t, frozen, [&](int64_t begin, int64_t end, int64_t own) {
    const SgdBlockArgs a{grad_scale, lr, momentum, dampening, weight_decay, nesterov, own == 1};
    update_run(
        begin, end, vector != nullptr,
        [&](int64_t first, int64_t blocks) { vector(w, grad, momentum_buf, vector_code_map(true), first, blocks, a); },
        [&](int64_t b, int64_t e) {
          update_quantized_block(b, e, states, maps, [&](int64_t i, float* x) {
            rules::sgd(w[i], grad[i], x, a.grad_scale, a.lr, a.momentum, a.dampening, a.nesterov, a.weight_decay,
                       a.first);
          });
        });
  });
}

void adamw_step_8bit_cpu(float* w, const float* grad, const QuantizedState& m, const QuantizedState& v, int64_t n,
                         float grad_scale, float lr, float beta1, float beta2, float eps, float weight_decay, int64_t t,
                         const FrozenChunks& frozen, CpuCode code) {
  const QuantizedState states[2] = {m, v};
  const DynamicMap* const maps[2] = {&dynamic_map(true), &dynamic_map(false)};
  const auto vector = vector_blocks(code).adamw;
  float step_size, bc2_sqrt;
  rules::adamw_constants(lr, beta1, beta2, t, step_size, bc2_sqrt);
  for_quantized_runs(n, t, frozen, [&](int64_t begin, int64_t end, int64_t own) {
    AdamWBlockArgs a{grad_scale, lr, beta1, beta2, eps, weight_decay, step_size, bc2_sqrt};
    if (own != t) rules::adamw_constants(lr, beta1, beta2, own, a.step_size, a.bc2_sqrt);  // behind after a freeze
    update_run(
        begin, end, vector != nullptr,
        [&](int64_t first, int64_t blocks) {
          vector(w, grad, m, v, vector_code_map(true), vector_code_map(false), first, blocks, a);
        },
        [&](int64_t b, int64_t e) {
          update_quantized_block(b, e, states, maps, [&](int64_t i, float* x) {
            rules::adamw(w[i], grad[i], x[0], x[1], a.grad_scale, a.lr, a.beta1, a.beta2, a.eps, a.weight_decay,
                         a.step_size, a.bc2_sqrt);
          });
        });
  });
}

}  // namespace cumulus::kernels
