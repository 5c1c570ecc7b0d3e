#include "cumulus/ops/rotary.h"

#include <cmath>
#include <vector>

#include "cumulus/core/error.h"
#include "cumulus/memory/category.h"
#include "cumulus/ops/pointwise.h"
#include "cumulus/ops/shape.h"

namespace cumulus::ops {

RotaryTables rotary_tables(int64_t context, int64_t head_dim, double base, Device device) {
  CUMULUS_CHECK(context >= 1, InvalidArgument, "rotary_tables: context must be >= 1, got ", context);
  CUMULUS_CHECK(head_dim >= 2 && head_dim % 2 == 0, InvalidArgument,
                "rotary_tables: head_dim must be even and >= 2 (its halves rotate together), got ", head_dim);
  CUMULUS_CHECK(base > 0.0 && std::isfinite(base), InvalidArgument, "rotary_tables: base must be > 0, got ", base);
  const int64_t half = head_dim / 2;
  std::vector<float> cos_v(static_cast<std::size_t>(context * head_dim)), sin_v(cos_v.size());
  for (int64_t t = 0; t < context; ++t)
    for (int64_t j = 0; j < head_dim; ++j) {
      const double angle = static_cast<double>(t) * std::pow(base, -2.0 * static_cast<double>(j % half) / head_dim);
      cos_v[static_cast<std::size_t>(t * head_dim + j)] = static_cast<float>(std::cos(angle));
      sin_v[static_cast<std::size_t>(t * head_dim + j)] = static_cast<float>(std::sin(angle));
    }
  OpScope op_scope("rotary_tables");
  MemoryCategoryScope scope(MemoryCategory::parameters);
  return {Tensor::from_vector(cos_v, {context, head_dim}, device), Tensor::from_vector(sin_v, {context, head_dim}, device)};
}

Tensor apply_rotary(const Tensor& x, const Tensor& cos, const Tensor& sin) {
  CUMULUS_CHECK(x.ndim() >= 2, ShapeError, "apply_rotary: x must be [..., T, head_dim], got ", x.shape().str());
  const int64_t T = x.size(-2), D = x.size(-1);
  for (const Tensor* table : {&cos, &sin})
    CUMULUS_CHECK(table->ndim() == 2 && table->size(0) >= T && table->size(1) == D, ShapeError,
                  "apply_rotary: the tables must be [T' >= ", T, ", ", D, "] for x ", x.shape().str(), ", got ",
                  table->shape().str());
  CUMULUS_CHECK(D % 2 == 0, ShapeError, "apply_rotary: the last dimension of x must be even, got ", x.shape().str());
  auto rows = [&](const Tensor& table) {
    const Tensor t = table.size(0) == T ? table : narrow(table, 0, 0, T);
    return t.dtype() == x.dtype() ? t : cast(t, x.dtype());
  };
  const std::vector<Tensor> halves = chunk(x, 2, -1);
  return add(mul(x, rows(cos)), mul(cat({neg(halves[1]), halves[0]}, -1), rows(sin)));
}

}  // namespace cumulus::ops
