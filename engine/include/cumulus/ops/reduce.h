// Reductions over dimensions, as PyTorch's: sum, mean, amax and amin over a set of dimensions,
// max / min / argmax / argmin along one, topk, and multinomial sampling; the sum and mean of all
// elements and the row-wise argmax. A dimension d may be negative (d + ndim); a 0-d tensor
// takes dimension 0 or -1 as a dimension of size 1, as torch does. keepdim keeps each reduced
// dimension with size 1, else it is removed.
#pragma once

#include <cstdint>
#include <type_traits>
#include <vector>

#include "cumulus/tensor/tensor.h"

namespace cumulus::ops {

// Sum / mean of all elements -> a scalar (0-d) of x's type (f32, bf16 or f16; a 16-bit x is summed
// as sum(x, {}) of cumulus/ops/reduce.h). The mean of an empty tensor is NaN.
Tensor sum(const Tensor& x);
Tensor mean(const Tensor& x);

// x: [B, C] -> [B] i32, the index of each row's maximum (the first one on ties; as torch.argmax, a
// NaN counts as the maximum, so the row's first NaN wins). No gradient.
Tensor argmax(const Tensor& x);

// Sum / mean over `dims` (each at most once; empty: every dimension, as torch.sum(x, dim=[])).
// x: f32, bf16 or f16; the result has x's type, summed in double and rounded once. A dimension of
// size 0 sums to 0 (its mean is NaN). Gradient: dy broadcast back (times 1 / terms for mean).
Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false);
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false);
// One dimension: sum(x, 1), sum(x, -1, true). (A template so that sum(x, {}) means every dimension
// rather than dimension 0.)
template <typename I, std::enable_if_t<std::is_integral<I>::value && !std::is_same<I, bool>::value, int> = 0>
Tensor sum(const Tensor& x, I dim, bool keepdim = false) {
  return sum(x, std::vector<int64_t>{static_cast<int64_t>(dim)}, keepdim);
}
template <typename I, std::enable_if_t<std::is_integral<I>::value && !std::is_same<I, bool>::value, int> = 0>
Tensor mean(const Tensor& x, I dim, bool keepdim = false) {
  return mean(x, std::vector<int64_t>{static_cast<int64_t>(dim)}, keepdim);
}

// The largest (smallest) element over `dims` (as sum's dims), NaN where any of them is NaN, as
// torch.amax / torch.amin. x: f32, bf16 or f16; a reduction over no elements is an InvalidArgument.
// Gradient (torch's, unlike max's): dy shared evenly among the elements equal to the result.
Tensor amax(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false);
Tensor amin(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false);
template <typename I, std::enable_if_t<std::is_integral<I>::value && !std::is_same<I, bool>::value, int> = 0>
Tensor amax(const Tensor& x, I dim, bool keepdim = false) {
  return amax(x, std::vector<int64_t>{static_cast<int64_t>(dim)}, keepdim);
}
template <typename I, std::enable_if_t<std::is_integral<I>::value && !std::is_same<I, bool>::value, int> = 0>
Tensor amin(const Tensor& x, I dim, bool keepdim = false) {
  return amin(x, std::vector<int64_t>{static_cast<int64_t>(dim)}, keepdim);
}

// What max, min and topk return: the selected values (x's type) and their indices along the
// dimension (i64), of the same shape.
struct ValuesAndIndices {
  Tensor values;
  Tensor indices;
};

// The largest (smallest) element along `dim` and its index: the first on ties, and the first NaN
// where there is one (torch.max and torch.min propagate NaN). x: f32, bf16 or f16; the dimension
// must not be empty (an InvalidArgument, as torch). Gradient: dy to the selected element alone.
ValuesAndIndices max(const Tensor& x, int64_t dim, bool keepdim = false);
ValuesAndIndices min(const Tensor& x, int64_t dim, bool keepdim = false);
// Only the indices of max / min (i64, no gradient).
Tensor argmax(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor argmin(const Tensor& x, int64_t dim, bool keepdim = false);

// The k largest (smallest) elements along `dim` (k in [0, size(dim)]), dimension `dim` of the result
// having size k: sorted, the first-ranking first, ties to the lower index; NaN ranks as the largest
// value (first for largest, last otherwise). `sorted` = false is accepted and returns them sorted
// (torch leaves that order unspecified). Gradient: dy scattered back to the selected elements.
ValuesAndIndices topk(const Tensor& x, int64_t k, int64_t dim = -1, bool largest = true, bool sorted = true);

// num_samples category indices (i64) drawn from each row of `probs` ([n] -> [num_samples],
// [rows, n] -> [rows, num_samples]), category c with probability probs[c] / sum(row) (rows need not
// sum to 1), with or without replacement (without: num_samples <= n and at least that many
// positive weights per row). Computed on probs' device: both devices give the same draws for the
// same seed (Note [Multinomial draw] in kernels/reduce_dims_rules.h). probs: f32, bf16 or f16,
// finite and non-negative, each row summing above 0 (an InvalidArgument otherwise: checked on the
// host, so a CUDA probs is copied back, which waits for its stream). No gradient.
Tensor multinomial(const Tensor& probs, int64_t num_samples, bool replacement, uint64_t seed);

// The draw multinomial's sample `sample` of row `row` uses with `seed`: a uniform double in [0, 1).
double multinomial_uniform(uint64_t seed, int64_t row, int64_t sample);

}  // namespace cumulus::ops
