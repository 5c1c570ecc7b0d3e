// The optimizer step on CUDA over the flat arrays, in two launches and without the host
// (Note [Device-side step] in kernels/optim_rules.h):
//   grad_norm_and_prepare: StepBuffers::kNormPartials blocks each reduce a strided slice of the
//       gradient's squares (in double) into partials[b]; the last block to finish (a counter,
//       after a memory fence) sums the partials in block order and runs prepare_step. Fixed
//       order throughout: deterministic.
//   sgd_update / adamw_update: one grid-stride pass over the flat arrays reading the decision
//       (skip, grad_scale, lr, update count) from the UpdateScalars and skipping frozen parameters
//       (Note [Frozen parameters]); the per-element rules are kernels/optim_rules.h, shared with
//       the CPU.
//   sgd_update_8bit / adamw_update_8bit: the same with the state in 8 bits, a block of 64 per
//       quantization scale (Note [8-bit optimizer state] in kernels/quantized_state.h).
// One launch updates every parameter of the model (PyTorch's multi-tensor apply, made trivial by
// the flat layout of FlatParameters).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.h"
#include "kernels/optim_rules.h"
#include "kernels/quantized_state.h"

namespace cumulus::kernels {

namespace {

using cuda_common::block_sum;
using cuda_common::blocks_for;
using cuda_common::kThreads;
using cuda_common::launch;

// The gradient's squared norm over a fixed grid (deterministic): each block's partial, then the last
// block to arrive sums them in block order. True in the last block's threads, total its sum. The
// fence makes a block's partial visible before its arrival is counted; the last block then sees
// every partial, and resets the counter for the next step.
__device__ bool squared_norm_last_block(const float* grad, int64_t n, bool need_norm, StepBuffers* buf, double& total) {
  if (need_norm) {
    double s = 0.0;
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<int64_t>(blockDim.x) * gridDim.x) {
      const double x = grad[i];
      s += x * x;
    }
    s = block_sum(s);
    if (threadIdx.x == 0) buf->partials[blockIdx.x] = s;
  }
  __shared__ bool last;
  if (threadIdx.x == 0) {
    __threadfence();
    last = atomicAdd(&buf->blocks_done, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (!last) return false;
  __threadfence();
  total = 0.0;
  if (need_norm) {
    double p = 0.0;
    for (int b = threadIdx.x; b < static_cast<int>(gridDim.x); b += blockDim.x) p += buf->partials[b];
    total = block_sum(p);
  }
  if (threadIdx.x == 0) buf->blocks_done = 0;
  return true;
}

__global__ void grad_norm_and_prepare_kernel(const float* grad, int64_t n, StepBuffers* buf, UpdateScalars* scalars,
                                             StepConfig config, const float* lr_table) {
  double total = 0.0;
  if (squared_norm_last_block(grad, n, config.need_norm, buf, total) && threadIdx.x == 0)
    prepare_step(buf->state, *scalars, total, config, lr_table);
}

__global__ void grad_sum_squares_kernel(const float* grad, int64_t n, StepBuffers* buf) {
  double total = 0.0;
  if (squared_norm_last_block(grad, n, true, buf, total) && threadIdx.x == 0) buf->sum_squares = total;
}

__global__ void prepare_step_kernel(StepBuffers* buf, UpdateScalars* scalars, StepConfig config,
                                    const float* lr_table) {
  prepare_step(buf->state, *scalars, config.need_norm ? buf->sum_squares : 0.0, config, lr_table);
}

__global__ void set_step_kernel(UpdateScalars* scalars, float grad_scale, float lr) {
  set_step(*scalars, grad_scale, lr);
}

__global__ void record_micro_batch_kernel(StepState* state, const float* loss, double units) {
  record_micro_batch(*state, units, static_cast<double>(loss[0]));
}

// Frozen chunks are skipped and others use their own update count (Note [Frozen parameters]).
__global__ void sgd_update_kernel(float* w, const float* grad, float* momentum_buf, int64_t n,
                                  const UpdateScalars* scalars, float momentum, float dampening, bool nesterov,
                                  float weight_decay, FrozenChunks frozen, float lr_scale) {
  if (scalars->skip) return;
  const float grad_scale = scalars->grad_scale, lr = scalars->lr * lr_scale;
  const int64_t updates = scalars->updates;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(blockDim.x) * gridDim.x) {
    const int64_t own = rules::own_updates(frozen, i, updates);
    if (own == 0) continue;
    // own == 1: no momentum yet, the buffer takes the gradient.
    rules::sgd(w[i], grad[i], momentum_buf ? momentum_buf + i : nullptr, grad_scale, lr, momentum, dampening, nesterov,
               weight_decay, own == 1);
  }
}

__global__ void adamw_update_kernel(float* w, const float* grad, float* m, float* v, int64_t n,
                                    const UpdateScalars* scalars, float beta1, float beta2, float eps,
                                    float weight_decay, FrozenChunks frozen, float lr_scale) {
  if (scalars->skip) return;
  __shared__ float step_size, bc2_sqrt;
  const float grad_scale = scalars->grad_scale, lr = scalars->lr * lr_scale;
  const int64_t updates = scalars->updates;
  if (threadIdx.x == 0) rules::adamw_constants(lr, beta1, beta2, updates, step_size, bc2_sqrt);
  __syncthreads();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(blockDim.x) * gridDim.x) {
    const int64_t own = rules::own_updates(frozen, i, updates);
    if (own == 0) continue;
    float s = step_size, b = bc2_sqrt;
    if (own != updates) rules::adamw_constants(lr, beta1, beta2, own, s, b);  // behind after a freeze
    rules::adamw(w[i], grad[i], m[i], v[i], grad_scale, lr, beta1, beta2, eps, weight_decay, s, b);
  }
}

// ---- 8-bit state (Note [8-bit optimizer state] in kernels/quantized_state.h) ----
// Each CUDA block fills the maps in shared memory, then walks tiles of kThreads elements, one per
// thread: a tile holds kThreads / kBlock quantization blocks, each one frozen chunk, so a block's
// threads share their update count (all idle when frozen).
constexpr int kQuantBlock = static_cast<int>(QuantizedState::kBlock);
static_assert(kThreads % kQuantBlock == 0, "a tile holds whole quantization blocks");

__device__ void fill_dynamic_map(DynamicMap& map, bool is_signed) {
  for (int code = threadIdx.x; code < DynamicMap::kCodes; code += blockDim.x)
    rules::fill_dynamic_map_entry(map, code, is_signed);
}

// The largest |x| over the threads of this thread's quantization block (an idle thread gives 0),
// through `scratch` (kThreads shared floats). Every thread of the CUDA block calls it.
__device__ float quantization_block_absmax(float x, float* scratch) {
  const int lane = static_cast<int>(threadIdx.x) % kQuantBlock;
  scratch[threadIdx.x] = fabsf(x);
  __syncthreads();
  for (int half = kQuantBlock / 2; half > 0; half >>= 1) {
    if (lane < half) scratch[threadIdx.x] = rules::larger(scratch[threadIdx.x], scratch[threadIdx.x + half]);
    __syncthreads();
  }
  const float absmax = scratch[threadIdx.x - lane];
  __syncthreads();  // read before the next call overwrites it
  return absmax;
}

// Requantizes element i's new value x of a trained block: the block's first thread writes the scale.
__device__ void requantize(const QuantizedState& state, int64_t i, float x, float absmax, const DynamicMap& map) {
  if (i % kQuantBlock == 0) state.absmax[i / kQuantBlock] = absmax;
  state.codes[i] = rules::quantize(x, absmax, map);
}

__global__ void sgd_update_8bit_kernel(float* w, const float* grad, QuantizedState buf, int64_t n,
                                       const UpdateScalars* scalars, float momentum, float dampening, bool nesterov,
                                       float weight_decay, FrozenChunks frozen, float lr_scale) {
  if (scalars->skip) return;
  __shared__ DynamicMap signed_map;
  __shared__ float scratch[kThreads];
  fill_dynamic_map(signed_map, true);
  __syncthreads();
  const float grad_scale = scalars->grad_scale, lr = scalars->lr * lr_scale;
  const int64_t updates = scalars->updates;
  for (int64_t tile = blockIdx.x * static_cast<int64_t>(kThreads); tile < n;
       tile += static_cast<int64_t>(kThreads) * gridDim.x) {
    const int64_t i = tile + threadIdx.x;
    const int64_t own = i < n ? rules::own_updates(frozen, i, updates) : 0;
    float b = 0.0f;
    if (own > 0) {
      b = rules::dequantize(buf.codes[i], buf.absmax[i / kQuantBlock], signed_map);
      rules::sgd(w[i], grad[i], &b, grad_scale, lr, momentum, dampening, nesterov, weight_decay, own == 1);
    }
    const float absmax = quantization_block_absmax(b, scratch);
    if (own > 0) requantize(buf, i, b, absmax, signed_map);
  }
}

__global__ void adamw_update_8bit_kernel(float* w, const float* grad, QuantizedState m_state, QuantizedState v_state,
                                         int64_t n, const UpdateScalars* scalars, float beta1, float beta2, float eps,
                                         float weight_decay, FrozenChunks frozen, float lr_scale) {
  if (scalars->skip) return;
  __shared__ DynamicMap signed_map;
  __shared__ DynamicMap unsigned_map;
  __shared__ float scratch[kThreads];
  __shared__ float step_size, bc2_sqrt;
  const float grad_scale = scalars->grad_scale, lr = scalars->lr * lr_scale;
  const int64_t updates = scalars->updates;
  fill_dynamic_map(signed_map, true);
  fill_dynamic_map(unsigned_map, false);
  if (threadIdx.x == 0) rules::adamw_constants(lr, beta1, beta2, updates, step_size, bc2_sqrt);
  __syncthreads();
  for (int64_t tile = blockIdx.x * static_cast<int64_t>(kThreads); tile < n;
       tile += static_cast<int64_t>(kThreads) * gridDim.x) {
    const int64_t i = tile + threadIdx.x;
    const int64_t own = i < n ? rules::own_updates(frozen, i, updates) : 0;
    float m = 0.0f, v = 0.0f;
    if (own > 0) {
      m = rules::dequantize(m_state.codes[i], m_state.absmax[i / kQuantBlock], signed_map);
      v = rules::dequantize(v_state.codes[i], v_state.absmax[i / kQuantBlock], unsigned_map);
      float s = step_size, b = bc2_sqrt;
      if (own != updates) rules::adamw_constants(lr, beta1, beta2, own, s, b);  // behind after a freeze
      rules::adamw(w[i], grad[i], m, v, grad_scale, lr, beta1, beta2, eps, weight_decay, s, b);
    }
    const float m_absmax = quantization_block_absmax(m, scratch);
    const float v_absmax = quantization_block_absmax(v, scratch);
    if (own > 0) {
      requantize(m_state, i, m, m_absmax, signed_map);
      requantize(v_state, i, v, v_absmax, unsigned_map);
    }
  }
}

__global__ void sum_squares_stage1(const float* x, int64_t n, float* partials) {
  float s = 0.0f;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(blockDim.x) * gridDim.x)
    s += x[i] * x[i];
  s = block_sum(s);
  if (threadIdx.x == 0) partials[blockIdx.x] = s;
}

__global__ void sum_squares_stage2(const float* partials, int count, float* out) {
  float s = 0.0f;
  for (int i = threadIdx.x; i < count; i += blockDim.x) s += partials[i];
  s = block_sum(s);
  if (threadIdx.x == 0) out[0] = s;
}

constexpr int kSumSquaresPartials = 256;

}  // namespace

int sum_squares_partials() { return kSumSquaresPartials; }

void sum_squares_cuda(const float* x, int64_t n, float* partials, float* out, cudaStream_t stream) {
  launch<sum_squares_stage1>(kSumSquaresPartials, kThreads, stream, x, n, partials);
  launch<sum_squares_stage2>(1, kThreads, stream, partials, kSumSquaresPartials, out);
}

void grad_norm_and_prepare_step_cuda(const float* grad, int64_t n, StepBuffers* buffers, UpdateScalars* scalars,
                                     const StepConfig& config, const float* lr_table, cudaStream_t stream) {
  const unsigned blocks = config.need_norm ? StepBuffers::kNormPartials : 1;
  launch<grad_norm_and_prepare_kernel>(blocks, kThreads, stream, grad, n, buffers, scalars, config, lr_table);
}

void grad_sum_squares_cuda(const float* grad, int64_t n, StepBuffers* buffers, cudaStream_t stream) {
  launch<grad_sum_squares_kernel>(StepBuffers::kNormPartials, kThreads, stream, grad, n, buffers);
}

void prepare_step_cuda(StepBuffers* buffers, UpdateScalars* scalars, const StepConfig& config, const float* lr_table,
                       cudaStream_t stream) {
  launch<prepare_step_kernel>(1, 1, stream, buffers, scalars, config, lr_table);
}

void set_step_cuda(UpdateScalars* scalars, float grad_scale, float lr, cudaStream_t stream) {
  launch<set_step_kernel>(1, 1, stream, scalars, grad_scale, lr);
}

void record_micro_batch_cuda(StepBuffers* buffers, const float* loss, double units, cudaStream_t stream) {
  launch<record_micro_batch_kernel>(1, 1, stream, &buffers->state, loss, units);
}

void sgd_update_cuda(float* w, const float* grad, float* momentum_buf, int64_t n, const UpdateScalars* scalars,
                     float momentum, float dampening, bool nesterov, float weight_decay, const FrozenChunks& frozen,
                     cudaStream_t stream, float lr_scale) {
  if (n == 0) return;
  launch<sgd_update_kernel>(blocks_for(n), kThreads, stream, w, grad, momentum_buf, n, scalars, momentum, dampening,
                            nesterov, weight_decay, frozen, lr_scale);
}

void adamw_update_cuda(float* w, const float* grad, float* m, float* v, int64_t n, const UpdateScalars* scalars,
                       float beta1, float beta2, float eps, float weight_decay, const FrozenChunks& frozen,
                       cudaStream_t stream, float lr_scale) {
  if (n == 0) return;
  launch<adamw_update_kernel>(blocks_for(n), kThreads, stream, w, grad, m, v, n, scalars, beta1, beta2, eps,
                              weight_decay, frozen, lr_scale);
}

void sgd_update_8bit_cuda(float* w, const float* grad, const QuantizedState& momentum_buf, int64_t n,
                          const UpdateScalars* scalars, float momentum, float dampening, bool nesterov,
                          float weight_decay, const FrozenChunks& frozen, cudaStream_t stream, float lr_scale) {
  if (n == 0) return;
  launch<sgd_update_8bit_kernel>(blocks_for(n), kThreads, stream, w, grad, momentum_buf, n, scalars, momentum,
                                 dampening, nesterov, weight_decay, frozen, lr_scale);
}

void adamw_update_8bit_cuda(float* w, const float* grad, const QuantizedState& m, const QuantizedState& v, int64_t n,
                            const UpdateScalars* scalars, float beta1, float beta2, float eps, float weight_decay,
                            const FrozenChunks& frozen, cudaStream_t stream, float lr_scale) {
  if (n == 0) return;
  launch<adamw_update_8bit_kernel>(blocks_for(n), kThreads, stream, w, grad, m, v, n, scalars, beta1, beta2, eps,
                                   weight_decay, frozen, lr_scale);
}

}  // namespace cumulus::kernels
