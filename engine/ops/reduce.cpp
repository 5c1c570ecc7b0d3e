// sum / mean of all elements -> a scalar. Backward broadcasts the scalar gradient (times 1/n for
// mean) without reading it on the host: the kernel takes its device pointer. Nothing is saved.
// argmax: row-wise index of the maximum, no gradient.
#include <cmath>

#include "cumulus/autograd/node.h"
#include "cumulus/ops/reduce.h"
#include "cumulus/ops/shape.h"
#include "engine/ops/internal.h"

namespace cumulus::ops {

namespace {

class SumBackward final : public Node {
 public:
  SumBackward(const char* name, Shape input_shape, float scale, bool mean)
      : Node(name), input_shape_(input_shape), scale_(scale) {
    // Of one element, either is the element itself.
    set_output_reduction(input_shape.numel() == 1 ? OutputReduction::none
                         : mean                   ? OutputReduction::mean
                                                  : OutputReduction::sum);
  }
  void backward(const Tensor& dy, std::vector<GradSink>& grads) override {
    if (!grads[0].needed()) return;
    const Device device = dy.device();
    GradSink::Target dx = grads[0].begin(input_shape_, device);
    const float* g = dy.data<float>();
    float* dxp = dx.tensor.data<float>();
    const int64_t n = input_shape_.numel();
    CUMULUS_DISPATCH(device, ctx, kernels::fill_from_scalar_cpu(g, scale_, dx.beta(), dxp, n),
                     kernels::fill_from_scalar_cuda(g, scale_, dx.beta(), dxp, n, ctx.stream()));
  }

 private:
  Shape input_shape_;
  float scale_;
};

#if CUMULUS_WITH_CUDA
// sum_all_cuda with the partials a large sum needs (Note [Deterministic sum] in kernels/cuda/reduce.cu).
void sum_all_on_device(const float* x, int64_t n, float scale, float* y, Device device, cudaStream_t stream) {
  const int64_t blocks = kernels::sum_all_blocks(n);
  if (blocks == 0) return kernels::sum_all_cuda(x, n, scale, y, stream);
  const Tensor partials = detail::new_output(Shape{blocks}, DType::f32, device);  // freed on return
  kernels::sum_all_cuda(x, n, scale, y, partials.data<float>(), stream);
}
#endif

Tensor reduce_all(const char* op, const Tensor& x_in, bool mean) {
  const Tensor x = detail::contiguous(x_in);
  // 16-bit: summed in double and rounded to x's type (cumulus/ops/reduce.h).
  if (x.defined() && (x.dtype() == DType::bf16 || x.dtype() == DType::f16))
    return mean ? ops::mean(x, {}) : ops::sum(x, {});
  OpScope op_scope(op);
  detail::check_dtype(op, "input", x, DType::f32);
  const Device device = x.device();
  const int64_t n = x.numel();
  const float scale = mean ? (n > 0 ? 1.0f / static_cast<float>(n) : NAN) : 1.0f;
  Tensor y = detail::new_output(Shape{}, DType::f32, device);
  const float* xp = x.data<float>();
  float* yp = y.data<float>();
  CUMULUS_DISPATCH(device, ctx, kernels::sum_all_cpu(xp, n, scale, yp),
                   sum_all_on_device(xp, n, scale, yp, device, ctx.stream()));
  if (should_record({&x})) attach_node(y, std::make_shared<SumBackward>(op, x.shape(), scale, mean), {&x});
  return y;
}

}  // namespace

Tensor sum(const Tensor& x) { return reduce_all("sum", x, false); }
Tensor mean(const Tensor& x) { return reduce_all("mean", x, true); }

Tensor argmax(const Tensor& x_in) {
  OpScope op_scope("argmax");
  const Tensor x = detail::contiguous(x_in);
  detail::check_floating("argmax", "input", x);
  CUMULUS_CHECK(x.ndim() == 2 && x.size(1) > 0, ShapeError, "argmax: input must be [rows, cols > 0], got ",
                x.shape().str());
  const Device device = x.device();
  Tensor out = detail::new_output(Shape{x.size(0)}, DType::i32, device);
  int32_t* op = out.data<int32_t>();
  CUMULUS_DISPATCH_FLOAT(x.dtype(), T, const T* xp = x.data<T>();
                         CUMULUS_DISPATCH(device, ctx, kernels::argmax_rows_cpu(xp, x.size(0), x.size(1), op),
                                          kernels::argmax_rows_cuda(xp, x.size(0), x.size(1), op, ctx.stream())));
  return out;
}

#if CUMULUS_WITH_CUDA
namespace detail {

template <typename T>
void sum_rows_on_device(const T* x, int64_t rows, int64_t cols, float beta, float* out, const Device& device,
                        cudaStream_t stream) {
  Tensor partials;
  if (const int64_t n = kernels::sum_rows_partials(rows, cols); n > 0) {
    MemoryCategoryScope scope(MemoryCategory::workspace);
    partials = Tensor::empty(Shape{n}, DType::f32, device);
  }
  kernels::sum_rows_cuda(x, rows, cols, beta, out, partials.defined() ? partials.data<float>() : nullptr, stream);
}

template void sum_rows_on_device(const float*, int64_t, int64_t, float, float*, const Device&, cudaStream_t);
template void sum_rows_on_device(const BFloat16*, int64_t, int64_t, float, float*, const Device&, cudaStream_t);
template void sum_rows_on_device(const Half*, int64_t, int64_t, float, float*, const Device&, cudaStream_t);

}  // namespace detail
#endif

}  // namespace cumulus::ops
