// The helpers ops use for 16-bit storage (declared in engine/ops/internal.h; Note [Mixed precision]
// in engine/ops/linear.cpp).
#include <type_traits>

#include "engine/ops/internal.h"
#include "engine/tensor/tensor_impl.h"

namespace cumulus::ops::detail {

Tensor converted(const Tensor& t, DType dtype, MemoryCategory category) {
  MemoryCategoryScope scope(category);
  return t.to(dtype);
}

Tensor f32_scratch(const Shape& shape, const Device& device) {
  MemoryCategoryScope scope(MemoryCategory::workspace);
  return Tensor::empty(shape, DType::f32, device);
}

void convert_into(const Tensor& src, const Tensor& dst) {
  CUMULUS_CHECK(src.numel() == dst.numel() && src.device() == dst.device(), ShapeError, "convert_into: ",
                src.str(), " into ", dst.str());
  const int64_t n = src.numel();
  CUMULUS_DISPATCH_FLOAT(src.dtype(), From, CUMULUS_DISPATCH_FLOAT(dst.dtype(), To, {
    if constexpr (std::is_same_v<From, To>) {
      copy_bytes(dst.raw_data(), dst.device(), src.raw_data(), src.device(), src.nbytes());
    } else {
      const From* s = src.data<From>();
      To* d = dst.data<To>();
      CUMULUS_DISPATCH(src.device(), ctx, kernels::convert_cpu(s, d, n), kernels::convert_cuda(s, d, n, ctx.stream()));
    }
  }));
}

Tensor f32_stand_in(const Tensor& target, float beta) {
  if (target.dtype() == DType::f32) return target;
  return beta != 0.0f ? converted(target, DType::f32, MemoryCategory::workspace)
                      : f32_scratch(target.shape(), target.device());
}

void store_stand_in(const Tensor& stand_in, const Tensor& target) {
  if (impl_of(stand_in) != impl_of(target)) convert_into(stand_in, target);
}

}  // namespace cumulus::ops::detail
