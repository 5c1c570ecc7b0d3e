// CUDA launchers: the same ops and contracts as kernels/cpu/kernels.h (beta 0 never reads the
// destination), queued on `stream`. Pointers are device pointers, including scalar inputs such as
// grad_loss, so no launcher synchronizes with the host. A launcher templated over T (float,
// BFloat16, Half) stores T and computes in f32, as its CPU twin (Note [Mixed precision] in
// engine/ops/linear.cpp); it is instantiated for those three types.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "cumulus/optim/update_scalars.h"
#include "cumulus/tensor/dtype.h"
#include "kernels/float16.h"
#include "kernels/gather.h"
#include "kernels/metrics.h"
#include "kernels/quantized_state.h"

namespace cumulus::kernels {

// Row-major c[m, n] = alpha * op(a) * op(b) + beta * c, through cuBLAS (FP32, no TF32).
void gemm_cuda(cublasHandle_t handle, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
               const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// The storage types of a GEMM's operands: a and b in `ab`, c in `cd` (f32, or ab's type). Products
// are accumulated and scaled in f32 whatever they are (tensor cores for 16-bit a and b); a 16-bit c
// is rounded once, after alpha and beta.
struct GemmTypes {
  DType ab = DType::f32;
  DType cd = DType::f32;
};

// gemm_cuda with any GemmTypes, through cublasGemmEx (CUBLAS_COMPUTE_32F).
void gemm_ex_cuda(cublasHandle_t handle, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                  const void* a, int64_t lda, const void* b, int64_t ldb, float beta, void* c, int64_t ldc,
                  GemmTypes types);

// What a cuBLASLt GEMM does to its result besides alpha * op(a) op(b) + beta * c (row-major, as gemm_cuda).
// No ReLU epilogues: cuBLASLt does not document what they do with NaN (Note [ReLU epilogues and NaN]
// in engine/ops/linear.cpp).
enum class GemmEpilogue : uint8_t {
  none,
  bias,       // + bias[j] on every row of c (bias: n floats; c must be f32)
  bias_grad,  // c as none, and bias_grad[i] = sum_k op(a)[i, k] (m floats), overwritten: no beta
};
constexpr int kGemmEpilogues = 3;

struct GemmEpilogueArgs {
  GemmEpilogue kind = GemmEpilogue::none;
  // bias: in c's type, as cuBLASLt reads it (Note [Epilogue bias type] in gemm.cu).
  const void* bias = nullptr;
  float* bias_grad = nullptr;  // bias_grad: f32 (c must be f32)
};

// The plans gemm_lt_cuda made (Note [cuBLASLt plan cache] in gemm.cu), owned by the caller: the
// execution context keeps one per device (cuda::Context::gemm_lt_plans). Its destructor destroys
// the descriptors and layouts it holds.
class GemmLtPlans {
 public:
  GemmLtPlans();
  ~GemmLtPlans();
  GemmLtPlans(const GemmLtPlans&) = delete;
  GemmLtPlans& operator=(const GemmLtPlans&) = delete;
  struct Impl;  // gemm.cu
  Impl& impl() { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

// The same GEMM through cuBLASLt (FP32 compute, no TF32) with an epilogue, queued on `stream`.
// `plans` (the shapes planned so far), `handle` and `workspace` (workspace_bytes) are the caller's,
// its execution context's, and nothing is allocated, so the call may be captured in a CUDA graph
// (Note [cuBLASLt plan cache] in gemm.cu).
// Returns false, having queued nothing, when cuBLASLt has no algorithm for this epilogue and shape
// (Note [No fused algorithm] in gemm.cu) or a size is 0; the caller then runs the unfused
// equivalent (gemm_cuda and kernels).
bool gemm_lt_cuda(GemmLtPlans& plans, cublasLtHandle_t handle, void* workspace, std::size_t workspace_bytes,
                  bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                  const float* b, int64_t ldb, float beta, float* c, int64_t ldc, const GemmEpilogueArgs& epilogue,
                  cudaStream_t stream);
// The same with any GemmTypes (the f32 overload above is this with the default types). The types
// are part of the plan's key.
bool gemm_lt_cuda(GemmLtPlans& plans, cublasLtHandle_t handle, void* workspace, std::size_t workspace_bytes,
                  bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const void* a, int64_t lda,
                  const void* b, int64_t ldb, float beta, void* c, int64_t ldc, GemmTypes types,
                  const GemmEpilogueArgs& epilogue, cudaStream_t stream);

// Whether an answer of cublasLtMatmulAlgoGetHeuristic names an algorithm to run: its status, how
// many results it returned and the first result's state. Anything but success with a successful
// first result means "no fused algorithm" (Note [No fused algorithm] in gemm.cu).
bool lt_heuristic_found(cublasStatus_t status, int returned, cublasStatus_t first_state);
// Whether a status of cublasLtMatmul means it refused the plan's algorithm, having queued nothing
// (the next algorithm is tried, then the unfused kernels: Note [Rejected algorithm] in gemm.cu),
// rather than an error to throw.
bool lt_matmul_rejected(cublasStatus_t status);

// gemm_lt_cuda's calls with `kind` so far in this process: `fused` queued the GEMM with the epilogue,
// `declined` returned false (the caller ran the unfused kernels). Tests predict launch counts from
// them (cumulus::cuda_epilogue_calls).
struct GemmLtOutcomes {
  int64_t fused = 0;
  int64_t declined = 0;
};
GemmLtOutcomes gemm_lt_outcomes(GemmEpilogue kind);

// out[r, :] = row (f32) for every row r, stored as T.
template <typename T>
void broadcast_rows_cuda(const float* row, int64_t rows, int64_t cols, T* out, cudaStream_t stream);
// out[c] = sum_r x[r, c] + beta * out[c], summed and stored in f32 whatever x's type, in an order
// fixed by the shape (Note [Column sums] in reduce.cu): the same bits run to run. `partials` holds
// sum_rows_partials(rows, cols) floats of device scratch (none where that is 0), for a grid over
// chunks of rows as well as columns; the form without partials sums all rows in one chunk (the
// same bits as with partials up to 256 rows, fewer blocks above).
int64_t sum_rows_partials(int64_t rows, int64_t cols);
template <typename T>
void sum_rows_cuda(const T* x, int64_t rows, int64_t cols, float beta, float* out, float* partials,
                   cudaStream_t stream);
template <typename T>
void sum_rows_cuda(const T* x, int64_t rows, int64_t cols, float beta, float* out, cudaStream_t stream);
// out[0] = scale * sum_i x[i], in an order fixed by n (Note [Deterministic sum] in reduce.cu): the
// same bits run to run. Up to kSumAllOneBlock terms one block (block_sum_all's order) and no
// partials; above, `partials` holds sum_all_blocks(n) floats of scratch (the second form throws
// InvalidArgument without them).
constexpr int64_t kSumAllOneBlock = int64_t{1} << 16;
int64_t sum_all_blocks(int64_t n);
void sum_all_cuda(const float* x, int64_t n, float scale, float* out, float* partials, cudaStream_t stream);
void sum_all_cuda(const float* x, int64_t n, float scale, float* out, cudaStream_t stream);

template <typename T>
void relu_forward_cuda(const T* x, T* y, int64_t n, cudaStream_t stream);
template <typename T>
void relu_backward_cuda(const T* y, const T* dy, float beta, T* dx, int64_t n, cudaStream_t stream);

void fill_cuda(float* out, float value, int64_t n, cudaStream_t stream);
void fill_from_scalar_cuda(const float* scalar, float scale, float beta, float* out, int64_t n, cudaStream_t stream);
template <typename T>
void accumulate_cuda(const T* x, float beta, T* y, int64_t n, cudaStream_t stream);
// y = x converted, among float, BFloat16 and Half (convert_cpu's bits: Note [Half-precision
// conversions] in kernels/float16.h). Instantiated for the pairs convert_cpu is.
template <typename From, typename To>
void convert_cuda(const From* x, To* y, int64_t n, cudaStream_t stream);
// y[p] += x[p] for several vectors in one launch, one block per pair; the y[p] must be distinct
// (the engine's deferred gradient adds: Note [Deferred gradient adds] in engine/autograd/engine.cpp).
struct VectorAdds {
  static constexpr int kMaxPairs = 16;
  const float* x[kMaxPairs];
  float* y[kMaxPairs];
  int64_t n[kMaxPairs];
  int count = 0;
};
void add_vectors_cuda(const VectorAdds& adds, cudaStream_t stream);

// row_loss: scratch of batch + sum_all_blocks(batch) floats (the partials of the loss's sum, none up
// to kSumAllOneBlock rows). A label outside [0, C) makes that row's loss NaN. The loss and row_loss
// are f32 whatever the logits' type.
template <typename T>
void cross_entropy_forward_cuda(const T* logits, const int32_t* labels, int64_t batch, int64_t classes, float scale,
                                float* row_loss, float* loss, cudaStream_t stream);
template <typename T>
void cross_entropy_backward_cuda(const T* logits, const int32_t* labels, int64_t batch, int64_t classes,
                                 const float* grad_loss, float scale, float beta, T* dlogits, cudaStream_t stream);

template <typename T>
void argmax_rows_cuda(const T* x, int64_t rows, int64_t cols, int32_t* out, cudaStream_t stream);
// classification_tally_cpu's update in one launch (one block), queued: no host read.
template <typename T>
void classification_tally_cuda(const T* logits, const int32_t* labels, int64_t rows, int64_t cols,
                               const float* batch_loss, ClassificationTotals* totals, cudaStream_t stream);

// ---- the fused MLP training path (kernels/cuda/fused_mlp.cu; Note [Fused MLP] in engine/ops/fused_mlp.cpp) ----
// A stack of Linear layers with ReLU between them, ending in softmax cross-entropy, trained with a
// few kernels of our own per micro-batch instead of library calls. f32, row-major, weights in
// PyTorch's [out, in] layout, any batch >= 1 and widths >= 1. Every sum runs in a fixed order (no
// atomics on values), so two runs give the same bits.

// The head supports at most this many classes (one warp lane per class).
constexpr int64_t kFusedMaxClasses = 32;

// y [batch, out] = act(x W^T + b): x [batch, in], w [out, in], b [out]; act is ReLU or nothing.
void fused_linear_forward_cuda(const float* x, const float* w, const float* b, int64_t batch, int64_t in, int64_t out,
                               bool relu, float* y, cudaStream_t stream);

// The head's forward: logits = h W^T + b ([batch, classes], classes <= kFusedMaxClasses), then per
// row probs = softmax(logits) and row_loss = logsumexp(logits) - logits[label] (NaN for a label
// outside [0, classes)); loss[0] = scale * sum of row_loss, summed in cross_entropy_forward_cuda's
// order. probs: [batch, classes] (kept for backward), row_loss: scratch of `batch` floats.
// arrival_counter: a device counter that is 0 on entry and left 0 (cuda::Context::arrival_counter).
void fused_head_forward_cuda(const float* h, const float* w, const float* b, const int32_t* labels, int64_t batch,
                             int64_t in, int64_t classes, float scale, float* probs, float* row_loss, float* loss,
                             unsigned* arrival_counter, cudaStream_t stream);

// Where a fused backward writes, each with its GradientMode as beta (0 overwrites without reading,
// 1 adds); a null pointer skips that gradient. dx is the gradient of the layer's input x, times
// (x > 0) when mask_relu (x is a ReLU's output).
struct FusedGradients {
  float* dw = nullptr;
  float beta_w = 0.0f;
  float* db = nullptr;
  float beta_b = 0.0f;
  float* dx = nullptr;
  float beta_x = 0.0f;
  bool mask_relu = false;
};

// The head's backward, one launch: dlogits = grad_loss[0] * scale * (probs - onehot(labels)), then
//   dw [classes, in] (+)= dlogits^T h, db [classes] (+)= sum_rows dlogits, dx [batch, in] (+)= dlogits W.
void fused_head_backward_cuda(const float* probs, const int32_t* labels, const float* grad_loss, float scale,
                              const float* h, const float* w, int64_t batch, int64_t in, int64_t classes,
                              const FusedGradients& grads, cudaStream_t stream);

// A hidden layer's backward, one launch: dz [batch, out] is the gradient of its output (already
// masked by its ReLU), x [batch, in] its input, w [out, in]:
//   dw (+)= dz^T x, db (+)= sum_rows dz, dx (+)= dz W.
void fused_linear_backward_cuda(const float* dz, const float* x, const float* w, int64_t batch, int64_t in, int64_t out,
                                const FusedGradients& grads, cudaStream_t stream);

}  // namespace cumulus::kernels

namespace cumulus::kernels {

struct StepBuffers;
struct StepConfig;
using optim::FrozenChunks;
using optim::UpdateScalars;

// ---- optimizer step (kernels/cuda/optim.cu; Note [Device-side step] in kernels/optim_rules.h) ----

// out[0] = sum_i x[i]^2 in two fixed-order stages (deterministic). partials: scratch of
// sum_squares_partials() floats.
int sum_squares_partials();
void sum_squares_cuda(const float* x, int64_t n, float* partials, float* out, cudaStream_t stream);
// The gradient's squared norm (when config.need_norm) and prepare_step, in one launch: the decision
// goes into `scalars`, which the update kernels read.
void grad_norm_and_prepare_step_cuda(const float* grad, int64_t n, StepBuffers* buffers, UpdateScalars* scalars,
                                     const StepConfig& config, const float* lr_table, cudaStream_t stream);
// The same in two launches, for a norm over several ranks' shards (ZeRO stage 2): this rank's
// squared norm into buffers->sum_squares (the same fixed-order sum), which the caller may then
// all-reduce in place, and prepare_step from it (0 unless config.need_norm).
void grad_sum_squares_cuda(const float* grad, int64_t n, StepBuffers* buffers, cudaStream_t stream);
void prepare_step_cuda(StepBuffers* buffers, UpdateScalars* scalars, const StepConfig& config, const float* lr_table,
                       cudaStream_t stream);
void set_step_cuda(UpdateScalars* scalars, float grad_scale, float lr, cudaStream_t stream);
// group.units += units, group.loss += loss[0].
void record_micro_batch_cuda(StepBuffers* buffers, const float* loss, double units, cudaStream_t stream);
// The updates leave frozen chunks alone (Note [Frozen parameters] in kernels/optim_rules.h).
// `lr_scale`: a parameter group's multiplier on the scalars' lr (optim::ParamGroup; 1 is exact).
void sgd_update_cuda(float* w, const float* grad, float* momentum_buf, int64_t n, const UpdateScalars* scalars,
                     float momentum, float dampening, bool nesterov, float weight_decay, const FrozenChunks& frozen,
                     cudaStream_t stream, float lr_scale = 1.0f);
void adamw_update_cuda(float* w, const float* grad, float* m, float* v, int64_t n, const UpdateScalars* scalars,
                       float beta1, float beta2, float eps, float weight_decay, const FrozenChunks& frozen,
                       cudaStream_t stream, float lr_scale = 1.0f);
// The same with the state in 8 bits (Note [8-bit optimizer state] in kernels/quantized_state.h):
// the CPU's codes and scales, bit for bit.
void sgd_update_8bit_cuda(float* w, const float* grad, const QuantizedState& momentum_buf, int64_t n,
                          const UpdateScalars* scalars, float momentum, float dampening, bool nesterov,
                          float weight_decay, const FrozenChunks& frozen, cudaStream_t stream, float lr_scale = 1.0f);
void adamw_update_8bit_cuda(float* w, const float* grad, const QuantizedState& m, const QuantizedState& v, int64_t n,
                            const UpdateScalars* scalars, float beta1, float beta2, float eps, float weight_decay,
                            const FrozenChunks& frozen, cudaStream_t stream, float lr_scale = 1.0f);

}  // namespace cumulus::kernels

namespace cumulus::kernels {

// ---- data (see kernels/cuda/data.cu) ----

// gather_rows_cpu (kernels/cpu/kernels.h) in one launch for all columns; the same bits.
void gather_rows_cuda(const GatherColumns& columns, const int32_t* order, int64_t start, int64_t count,
                      cudaStream_t stream);
// The same for the batch at cursor->position, then position += 1, in the one launch (also for an
// empty batch). ring 0: the batch starts at sample position * batch_size of the columns' sources.
// ring k > 0: every column's source is a staging ring of k slots of batch_size samples each
// (host-resident data, Note [Host-resident data] in engine/data/dataset.cpp), order must be null,
// the batch is slot cursor->ring_slot, which the host sets (set_gather_cursor_cuda) and the launch
// leaves as it is.
void gather_rows_at_cursor_cuda(const GatherColumns& columns, const int32_t* order, GatherCursor* cursor,
                                int64_t batch_size, int64_t ring, int64_t count, cudaStream_t stream);
// Writes cursor->position, cursor->ring_slot or both (a negative value leaves that field) in one
// launch, ordered on the stream like a copy. The values travel as kernel arguments, so no host
// buffer has to outlive the call (a pageable copy would be staged by the driver on every call).
void set_gather_cursor_cuda(GatherCursor* cursor, int64_t position, int64_t ring_slot, cudaStream_t stream);

}  // namespace cumulus::kernels

namespace cumulus::kernels {

struct Pool2dGeometry;  // kernels/cpu/conv_kernels.h

// ---- kernels of our own beside cuDNN's convolution, batch norm and pooling (kernels/cuda/conv.cu,
// kernels/cuda/batch_norm.cu, kernels/cuda/pool.cu; the cuDNN calls are declared in
// kernels/cuda/cudnn_kernels.h) ----

// y [n, k, hw] += bias[k] (f32 bias), stored as T: the 16-bit conv's bias, which cuDNN adds only in
// the data's type.
template <typename T>
void conv2d_add_bias_cuda(const float* bias, int64_t n, int64_t k, int64_t hw, T* y, cudaStream_t stream);
// dbias[k] = sum over n, hw of dy + beta * dbias[k], summed in f32 in a fixed order.
template <typename T>
void conv2d_bias_grad_cuda(const T* dy, int64_t n, int64_t k, int64_t hw, float beta, float* dbias,
                           cudaStream_t stream);

// Evaluation mode: save_mean = running_mean, save_invstd = 1 / sqrt(running_var + eps).
void batch_norm_save_running_stats_cuda(const float* running_mean, const float* running_var, int64_t c, float eps,
                                        float* save_mean, float* save_invstd, cudaStream_t stream);
// Evaluation mode's backward with the running statistics (cuDNN has none): x, dy, dx [n, c, hw] in
// `dtype`; any of dx, dgamma, dbeta may be null. batch_norm_backward_cpu with training false.
void batch_norm_backward_inference_cuda(DType dtype, const void* x, const void* dy, const float* gamma,
                                        const float* save_mean, const float* save_invstd, int64_t n, int64_t c,
                                        int64_t hw, float beta_dx, void* dx, float beta_dgamma, float* dgamma,
                                        float beta_dbeta, float* dbeta, cudaStream_t stream);
// counter[0] += 1 (BatchNorm2d's num_batches_tracked, i32), without a host round trip.
void increment_i32_cuda(int32_t* counter, cudaStream_t stream);

// batch_norm2d without cuDNN, for bf16 (Note [bf16 on cuDNN] in kernels/cuda/cudnn_kernels.h), with
// the contracts of batch_norm_forward_training_cpu, batch_norm_forward_inference_cpu and
// batch_norm_backward_cpu (training true): x, y, dy, dx [n, c, hw] stored as T, everything per
// channel f32, each channel's sums in a fixed order (one block per channel), the variance from a
// second pass over the channel. Null running statistics are left alone; any of dx, dgamma, dbeta
// may be null.
template <typename T>
void batch_norm_forward_training_cuda(const T* x, const float* gamma, const float* beta, int64_t n, int64_t c,
                                      int64_t hw, float eps, float momentum, float* running_mean, float* running_var,
                                      T* y, float* save_mean, float* save_invstd, cudaStream_t stream);
template <typename T>
void batch_norm_forward_inference_cuda(const T* x, const float* gamma, const float* beta, const float* running_mean,
                                       const float* running_var, int64_t n, int64_t c, int64_t hw, float eps, T* y,
                                       float* save_mean, float* save_invstd, cudaStream_t stream);
template <typename T>
void batch_norm_backward_training_cuda(const T* x, const T* dy, const float* gamma, const float* save_mean,
                                       const float* save_invstd, int64_t n, int64_t c, int64_t hw, float beta_dx, T* dx,
                                       float beta_dgamma, float* dgamma, float beta_dbeta, float* dbeta,
                                       cudaStream_t stream);

// max_pool2d without cuDNN, for bf16 (the same Note): max_pool2d_forward_cpu's and
// max_pool2d_backward_cpu's contracts and results (the same element per window, the same additions
// in the same order), without atomics (a gather per input element).
template <typename T>
void max_pool2d_forward_cuda(const Pool2dGeometry& g, const T* x, T* y, cudaStream_t stream);
template <typename T>
void max_pool2d_backward_cuda(const Pool2dGeometry& g, const T* x, const T* dy, float beta, T* dx, cudaStream_t stream);

}  // namespace cumulus::kernels
