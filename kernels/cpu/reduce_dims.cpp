// CPU kernels of the reductions over dimensions (kernels/cpu/reduce_dims_kernels.h).
#include "kernels/cpu/reduce_dims_kernels.h"

namespace cumulus::kernels {

// Each output's terms in order, the innermost reduced dimension as a strided run: the offsets'
// divisions once per run, not per term.
template <typename T>
void sum_dims_cpu(const ReduceGeometry& g, const T* x, int64_t divisor, T* y) {
  const int last = g.reduced_ndim - 1;
  const int64_t run = last >= 0 ? g.reduced_size[last] : 1, step = last >= 0 ? g.reduced_stride[last] : 0;
  for (int64_t o = 0; o < g.outputs; ++o) {
    const T* xo = x + kept_offset(g, o);
    double s = 0.0;
    for (int64_t r = 0; r < g.terms; r += run) {
      const T* xr = xo + reduced_offset(g, r);
      for (int64_t j = 0; j < run; ++j) s += static_cast<double>(to_f32(xr[j * step]));
    }
    y[o] = from_f32<T>(static_cast<float>(s / static_cast<double>(divisor)));
  }
}

template <typename T>
void sum_dims_backward_cpu(const ReduceGeometry& g, const T* dy, float scale, float beta, T* dx) {
  for (int64_t o = 0; o < g.outputs; ++o) {
    const float v = scale * to_f32(dy[o]);
    T* dxo = dx + kept_offset(g, o);
    for (int64_t r = 0; r < g.terms; ++r) {
      T* target = dxo + reduced_offset(g, r);
      *target = from_f32<T>(beta == 0.0f ? v : v + beta * to_f32(*target));
    }
  }
}

template <typename T>
void extreme_dims_cpu(const ReduceGeometry& g, const T* x, bool largest, T* y) {
  for (int64_t o = 0; o < g.outputs; ++o) y[o] = from_f32<T>(extreme_of(g, x, o, largest));
}

template <typename T>
void extreme_dims_backward_cpu(const ReduceGeometry& g, const T* x, const T* y, const T* dy, float beta, T* dx) {
  for (int64_t o = 0; o < g.outputs; ++o) extreme_backward_of(g, x, y, dy, o, beta, dx);
}

template <typename T>
void select_along_dim_cpu(const T* x, int64_t outer, int64_t dim, int64_t inner, int64_t k, bool largest,
                          bool nan_first, T* values, int64_t* indices) {
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      const int64_t out = o * k * inner + i;
      select_row(x + o * dim * inner + i, dim, inner, k, largest, nan_first, values ? values + out : nullptr,
                 indices + out);
    }
}

template <typename T>
void scatter_along_dim_cpu(const T* dy, const int64_t* indices, int64_t outer, int64_t dim, int64_t inner, int64_t k,
                           float beta, T* dx) {
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      const int64_t in = o * k * inner + i;
      scatter_row(dy + in, indices + in, dim, inner, k, beta, dx + o * dim * inner + i);
    }
}

template <typename T>
void multinomial_cpu(const T* w, int64_t rows, int64_t n, int64_t samples, bool replacement, uint64_t seed,
                     int64_t* out) {
  for (int64_t r = 0; r < rows; ++r) multinomial_row(w + r * n, n, samples, replacement, seed, r, out + r * samples);
}

#define CUMULUS_INSTANTIATE(T)                                                                                  \
  template void sum_dims_cpu(const ReduceGeometry&, const T*, int64_t, T*);                                     \
  template void sum_dims_backward_cpu(const ReduceGeometry&, const T*, float, float, T*);                       \
  template void extreme_dims_cpu(const ReduceGeometry&, const T*, bool, T*);                                    \
  template void extreme_dims_backward_cpu(const ReduceGeometry&, const T*, const T*, const T*, float, T*);      \
  template void select_along_dim_cpu(const T*, int64_t, int64_t, int64_t, int64_t, bool, bool, T*, int64_t*);   \
  template void scatter_along_dim_cpu(const T*, const int64_t*, int64_t, int64_t, int64_t, int64_t, float, T*); \
  template void multinomial_cpu(const T*, int64_t, int64_t, int64_t, bool, uint64_t, int64_t*);
CUMULUS_INSTANTIATE(float)
CUMULUS_INSTANTIATE(BFloat16)
CUMULUS_INSTANTIATE(Half)
#undef CUMULUS_INSTANTIATE

}  // namespace cumulus::kernels
