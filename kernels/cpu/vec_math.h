// The CPU's vectorized activations, softmax and layer norm rows, and fused attention's tile
// products: f32 arrays through AVX2 (vec_math_avx2.cpp, the one file compiled for AVX2 and FMA),
// used by the CPU kernels when the CPU has both. tanh, sigmoid, silu, gelu, exp and log compute
// kernels/pointwise_rules.h's formula with the same operations in the same order, only the
// transcendental (tanhf, expf, erff, logf) replaced: tanh, exp and log by SLEEF's u10 variant (at
// most 1.0 ulp from the exact result; glibc's are within 1-2 ulp), sigmoid's, silu's and GELU's exp by a
// Cephes-style one (within 1.3 ulp: SLEEF's expf8_u10 costs several times as much), GELU's erf by
// a table of polynomials (Note [Vector erf]), so an element may differ from the scalar rule's in
// its last bit or two. gelu_tanh computes the same function in another form, x / (1 + exp(-2u)),
// the exp as a power of two with log2 e folded into the cubic's constants: one exp instead of a
// tanh (a third of its cost), within 2 ulp of max(|exact|, 1) forward and backward over [-12, 12]
// (the tanh form: 1.4 forward, 8.7 backward, where 1 - t t amplified tanh's error). softmax and
// log_softmax use a Cephes-style exp within 1.3 ulp for their arguments, never above 0. The
// softmax and layer norm rows are the AVX-512 ones 8 lanes at a time (their sums, outputs and
// prefetches: the Notes in vec_math_avx512.cpp). A vector of 8 at a time; a tail of under 8 is
// padded or masked, so every element goes through the same function wherever it sits.
// Declared with no engine types, so the AVX2 file includes nothing that could emit an AVX2 copy of
// an inline function the rest of the library shares.
#pragma once

#include <cstdint>

namespace cumulus::kernels::vec {

// Whether the functions below are built: x86-64 only (elsewhere the scalar rules run).
#if defined(__x86_64__)
inline constexpr bool kBuilt = true;
#else
inline constexpr bool kBuilt = false;
#endif

// Whether the kernels run the functions below: an x86-64 build on a CPU with AVX2 and FMA, unless
// CUMULUS_CPU_CAPABILITY=scalar caps them (kernels/cpu/capability.cpp); checked once.
bool available();

// y[i] = f(x[i]) for n elements (y may be x).
void tanh_f32(const float* x, float* y, int64_t n);
void sigmoid_f32(const float* x, float* y, int64_t n);
void silu_f32(const float* x, float* y, int64_t n);
void gelu_f32(const float* x, float* y, int64_t n);
void gelu_tanh_f32(const float* x, float* y, int64_t n);
void exp_f32(const float* x, float* y, int64_t n);
void log_f32(const float* x, float* y, int64_t n);

// y[i] = a[i a_step] op b[i b_step] for i < n, op BinaryOp's add, sub, mul or div (0-3: an int, as
// no engine type is declared here), each step 0 (one value for the row) or 1 (y may be a or b):
// one IEEE operation an element, the scalar rule's bits (kernels/cpu/binary_vec_rows.h).
void binary_f32(int op, const float* a, int64_t a_step, const float* b, int64_t b_step, float* y, int64_t n);

// out[c] += sum of x[r ld + c] over r < rows for c < n, each column's float adds in row order (a
// bias gradient's sum over the batch: sum_rows_cpu's scalar loop, the same bits).
void column_sums_f32(const float* x, int64_t rows, int64_t ld, float* out, int64_t n);

// y[i] = x[i] <= 0 ? 0 : x[i] (ReLU's rule: -0 gives +0, NaN stays) for n elements.
void relu_f32(const float* x, float* y, int64_t n);
// g[i] = y[i] <= 0 ? 0 : dy[i], ReLU's gradient from its output (a NaN output passes dy on); g may
// be y or dy.
void relu_grad_f32(const float* y, const float* dy, float* g, int64_t n);

// g[i] = dy[i] * f'(x[i]) for the gelus and silu, from the input (g may be dy or x).
void gelu_grad_f32(const float* x, const float* dy, float* g, int64_t n);
void silu_grad_f32(const float* x, const float* dy, float* g, int64_t n);
void gelu_tanh_grad_f32(const float* x, const float* dy, float* g, int64_t n);

// Note [Vector erf]
// GELU's erf(z) (gelu_f32, gelu_grad_f32, and vec512's) from a table rather than SLEEF's erff8_u10,
// which measured 1.3 ms for 176k floats (7 ns each, more than the rest of a GELU's forward and
// backward together). |z| is cut into 8 intervals of width 1/2 over [0, 4); on interval i,
// erf(i / 2 + u) for u = |z| - i / 2 in [0, 1/2) (exact: Sterbenz) is a degree-7 polynomial in u,
// fitted in double by least squares at Chebyshev nodes (interval 0's with no constant term, so
// erf(0) = 0 and small z keep their relative precision), its 8 coefficients picked per lane by one
// permute each. Past 4, |z| is clamped to 4, where the last polynomial gives 1 (float's erf is 1
// from 3.92 on). The sign is copied back. Within 1.4 * 2^-24 of erf absolutely (1.05 past 1/2,
// where erf is above 0.52), and 2.8 ulp relatively near 0: GELU adds erf to 1, so its error is the
// absolute one, about the size of glibc erff's (the scalar rule's) and SLEEF's. NaN stays NaN,
// erf(+-inf) = +-1. The same operations at both widths, so AVX2 and AVX-512 give the same bits.
// kErfPoly[k][i]: the coefficient of u^k on interval i.
inline constexpr float kErfPoly[8][8] = {
    {0.0f, 0.520499885f, 0.842700779f, 0.966105163f, 0.995322287f, 0.999593019f, 0.999977887f, 0.999999285f},
    {1.12837923f, 0.87878269f, 0.41510731f, 0.118930303f, 0.0206670184f, 0.00217828224f, 0.00013925042f,
     5.39904249e-06f},
    {-1.56721114e-06f, -0.439395279f, -0.415100187f, -0.178396031f, -0.0413353406f, -0.00544562936f,
     -0.000417647476f, -1.88814647e-05f},
    {-0.376077622f, -0.146395549f, 0.138251558f, 0.138760328f, 0.0482452735f, 0.00834890362f, 0.000787283527f,
     4.20224096e-05f},
    {-0.000563501206f, 0.182494462f, 0.0701134279f, -0.0446500517f, -0.0346245877f, -0.00861439575f,
     -0.00102978956f, -6.54731411e-05f},
    {0.115874603f, 0.0101318685f, -0.073167704f, -0.0147429621f, 0.0138824033f, 0.00609257445f, 0.000952111906f,
     7.18711162e-05f},
    {-0.00800161995f, -0.0578824468f, 0.0140437931f, 0.019432418f, -0.00151689292f, -0.00278052757f,
     -0.000577552244f, -5.0695653e-05f},
    {-0.0179786645f, 0.017885495f, 0.00374511071f, -0.00593309943f, -0.000721527031f, 0.000635815377f,
     0.000173596462f, 1.71447009e-05f},
};

// One row of n: y = softmax(x), or log_softmax when `log`, around the row's maximum, the sum of
// exp in float blocks then double (kernels/cpu/pointwise.cpp's softmax_forward_cpu with the vector
// exp; Note [Blocked float sums] in vec_math_avx512.cpp).
void softmax_row_f32(bool log, const float* x, float* y, int64_t n);
// One row's gradient from the saved output y: softmax dx = y (dy - sum(dy y)), log_softmax
// dx = dy - exp(y) sum(dy), blended into dx with beta (dx not read when beta is 0).
void softmax_grad_row_f32(bool log, const float* y, const float* dy, float beta, float* dx, int64_t n);

// One row of layer norm (kernels/cpu/structural.cpp's layer_norm_forward_cpu): y, the row's mean
// and rstd, the sums in double from one pass (Note [Layer norm's row in one pass and a float
// output] in vec_math_avx512.cpp).
void layer_norm_row_f32(const float* x, const float* weight, const float* bias, int64_t n, float eps, float* y,
                        float* mean, float* rstd);
// One row of layer norm's dx (layer_norm_backward_dx_cpu), blended into dx with beta, and with pw
// and pb (else null) the row's share of the parameter gradients, as vec512's below.
void layer_norm_grad_row_f32(const float* x, const float* dy, const float* weight, float mean, float rstd, int64_t n,
                             float beta, float* dx, float* pw, float* pb);
// sums[c] += partial[c] in double, then partial[c] = 0, for c < n.
void add_float_sums(float* partial, int64_t n, double* sums);

// vec512's fused-attention tile functions below, 8 lanes at a time (kernels/cpu/attention.cpp's
// tiled path on a CPU without AVX-512): gemm_f32 sums each output in the same order, with FMA,
// so it gives the same bits.
void gemm_f32(int64_t m, int64_t n, int64_t k, const float* a, int64_t a_rs, int64_t a_cs, const float* b, int64_t ldb,
              float* c, int64_t ldc, bool accumulate);
void attention_softmax_tile_f32(float* s, int64_t lds, int64_t rows, const int64_t* valid, int64_t width, float scale,
                                float* m, double* sums, float* acc, int64_t d);
void attention_grad_tile_f32(float* s, float* dp, int64_t ld, int64_t rows, const int64_t* valid, int64_t width,
                             float scale, const float* lse, const float* delta);
// The attention's data movement and row terms, for both widths (a CPU with AVX-512 has AVX2):
// dst[c][r] = src[r][c] for r < rows, c < cols, at leading dimensions src_ld and dst_ld (exact);
// out[r] = sum_c a[r][c] b[r][c] over n columns, the products and their sums in double (8 lanes,
// then across them: within a rounding of the ordered double sum).
void transpose_f32(const float* src, int64_t src_ld, int64_t rows, int64_t cols, float* dst, int64_t dst_ld);

// A cross-entropy row's statistics and gradient (kernels/cpu/cross_entropy_row.h): the row's
// maximum m (NaN skipped, as fmax) and log sum_j exp(x_j - m), the exps from softmax's exp (within
// 1.3 ulp) added in double (in 8 lanes, then across them); dx_j = g (exp((x_j - m) - log_sum) -
// [j == label]), blended into dx with beta (dx not read when beta is 0).
void cross_entropy_row_stats_f32(const float* x, int64_t n, float* max_out, float* log_sum_out);
void cross_entropy_grad_row_f32(const float* x, int64_t n, int64_t label, float m, float log_sum, float g, float beta,
                                float* dx);

// The gradient sums of a broadcast operand (kernels/cpu/pointwise.cpp): the terms x[i] (w null)
// or x[i] w[i] (a float product), added from 0 in double in the order given below, then rounded to
// float: broadcast_grad_element's bits (kernels/pointwise_rules.h). Vectorized across the sums,
// never within one: each lane holds one sum and adds its terms in their order.
// out[r] = sum over j < n, in order, of row r's terms (x and w [rows][n]); 8 rows at a time through
// an in-register transpose.
void ordered_row_sums_f32(const float* x, const float* w, int64_t rows, int64_t n, float* out);
// out[c] = sum over r < rows, in order, of column c's terms (x and w [rows][ld], c < n).
void ordered_column_sums_f32(const float* x, const float* w, int64_t rows, int64_t n, int64_t ld, float* out);
void row_dots_f64(const float* a, int64_t a_ld, const float* b, int64_t b_ld, int64_t rows, int64_t n, float* out);

}  // namespace cumulus::kernels::vec

// AVX-512 (16 lanes) versions of GELU-tanh, softmax's and layer norm's rows and fused attention's
// tile arithmetic (vec_math_avx512.cpp, the one
// file compiled for AVX-512F and FMA), used by kernels/cpu/attention.cpp when the CPU has them
// (Note [Fused attention as tile products] there). Same declarations rule as above: no engine types.
namespace cumulus::kernels::vec512 {

// Whether the kernels run the functions below: an x86-64 build on a CPU with AVX-512F and FMA,
// unless CUMULUS_CPU_CAPABILITY=avx2 or scalar caps them (kernels/cpu/capability.cpp); checked once.
bool available();

// vec::binary_f32, vec::column_sums_f32, vec::relu_f32 and vec::relu_grad_f32 16 lanes at a time
// (the same bits).
void binary_f32(int op, const float* a, int64_t a_step, const float* b, int64_t b_step, float* y, int64_t n);
void column_sums_f32(const float* x, int64_t rows, int64_t ld, float* out, int64_t n);
void relu_f32(const float* x, float* y, int64_t n);
void relu_grad_f32(const float* y, const float* dy, float* g, int64_t n);

// vec::sigmoid_f32, vec::silu_f32, vec::gelu_f32 and their gradients 16 lanes at a time, with the
// same operations (the same bits but for results below FLT_MIN, which scalef rounds once).
void sigmoid_f32(const float* x, float* y, int64_t n);
void silu_f32(const float* x, float* y, int64_t n);
void silu_grad_f32(const float* x, const float* dy, float* g, int64_t n);
void gelu_f32(const float* x, float* y, int64_t n);
void gelu_grad_f32(const float* x, const float* dy, float* g, int64_t n);

// vec::gelu_tanh_f32 and vec::gelu_tanh_grad_f32 16 lanes at a time, with AVX-512's reciprocal
// estimate and scalef (not the same bits: within the same 2 ulp, the same special values).
void gelu_tanh_f32(const float* x, float* y, int64_t n);
void gelu_tanh_grad_f32(const float* x, const float* dy, float* g, int64_t n);

// vec::softmax_row_f32 and vec::softmax_grad_row_f32 16 lanes at a time (the same exp; the sums
// in float over blocks of 128 and in double across them: Note [Blocked float sums] in
// vec_math_avx512.cpp, within a few roundings of the double result at any width).
void softmax_row_f32(bool log, const float* x, float* y, int64_t n);
void softmax_grad_row_f32(bool log, const float* y, const float* dy, float beta, float* dx, int64_t n);

// vec::layer_norm_row_f32 and vec::layer_norm_grad_row_f32 16 lanes at a time: the forward's double
// sums (another order, within a rounding of the double result), the gradient's blocked float sums
// (Note [Blocked float sums]), and the outputs in float, x - mean included (Note [Layer norm's row
// in one pass and a float output] in vec_math_avx512.cpp; tests/emulated/vec_math_avx512_test.cpp
// bounds both).
void layer_norm_row_f32(const float* x, const float* weight, const float* bias, int64_t n, float eps, float* y,
                        float* mean, float* rstd);
// With pw and pb (else null), the row's share of the parameter gradients on the way, added in
// float: pw[c] += dy[c] xhat[c], pb[c] += dy[c], xhat = (x - mean) rstd in float as for dx. The
// caller adds a few rows so, then those partial sums into double (add_float_sums): one pass over
// x and dy for dx and both (kernels/cpu/structural.cpp's layer_norm_backward_cpu).
void layer_norm_grad_row_f32(const float* x, const float* dy, const float* weight, float mean, float rstd, int64_t n,
                             float beta, float* dx, float* pw, float* pb);
// sums[c] += partial[c] in double, then partial[c] = 0, for c < n.
void add_float_sums(float* partial, int64_t n, double* sums);
// vec::cross_entropy_row_stats_f32 and vec::cross_entropy_grad_row_f32 16 lanes at a time (the
// same exp; the double sum in 16 lanes, then across them).
void cross_entropy_row_stats_f32(const float* x, int64_t n, float* max_out, float* log_sum_out);
void cross_entropy_grad_row_f32(const float* x, int64_t n, int64_t label, float m, float log_sum, float g, float beta,
                                float* dx);
// One row's share of layer norm's parameter gradients over n columns: sw[c] += dy[c] xhat[c] and
// sb[c] += dy[c] in double, xhat = (x - mean) rstd: the scalar loop's operations (the same bits).
void layer_norm_param_grads_row_f32(const float* x, const float* dy, double mean, double rstd, int64_t n, double* sw,
                                    double* sb);

// c[i][j] (= or +=) sum_{l < k} a(i, l) b[l][j] for i < m, j < n, with a(i, l) = a[i * a_rs + l * a_cs]
// (so a transposed operand is read in place), b row-major with leading dimension ldb, c with ldc.
// Each c[i][j] is summed over l in order, with FMA: its bits depend on nothing but its operands.
// Ours rather than OpenBLAS's: the fused attention's tiles are 16-32 rows, where a BLAS call's
// packing costs more than the product, and OpenBLAS fixes no summation order, which the attention's
// same-bits-at-any-thread-count guarantee needs (Note [Fused attention as tile products]).
void gemm_f32(int64_t m, int64_t n, int64_t k, const float* a, int64_t a_rs, int64_t a_cs, const float* b, int64_t ldb,
              float* c, int64_t ldc, bool accumulate);

// The forward's online softmax over one tile of raw scores s [rows][width] (leading dimension lds):
// row r sees its first valid[r] keys (none when <= 0). Scales by `scale`, raises the row's running
// maximum m[r], rescales its sum sums[r] and accumulator acc [rows][d] by exp(m_old - m_new), adds
// the tile's sum of exp(s - m_new), and leaves those probabilities in s (zeros past valid[r]).
void attention_softmax_tile_f32(float* s, int64_t lds, int64_t rows, const int64_t* valid, int64_t width, float scale,
                                float* m, double* sums, float* acc, int64_t d);

// The backward's tile: from the raw scores s and dp = do v^T ([rows][width], leading dimension ld),
// p = exp(scale s - lse[r]) into s and ds = p (dp - delta[r]) scale into dp, both zero past valid[r].
void attention_grad_tile_f32(float* s, float* dp, int64_t ld, int64_t rows, const int64_t* valid, int64_t width,
                             float scale, const float* lse, const float* delta);

}  // namespace cumulus::kernels::vec512
