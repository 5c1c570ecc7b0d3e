// Double-precision references the op-case files share (Note [Op cases] in op_case.h): plain loops
// over flat, row-major values, written from the ops' definitions (PyTorch's semantics), never from
// the engine's kernels.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace cumulus::testing::ref {

using Vec = std::vector<double>;

// x: [B, in], w: [out, in], b: [out] or empty -> [B, out]
inline Vec linear(const Vec& x, const Vec& w, const Vec& b, int64_t B, int64_t in, int64_t out) {
  Vec y(static_cast<std::size_t>(B * out));
  for (int64_t i = 0; i < B; ++i)
    for (int64_t o = 0; o < out; ++o) {
      double s = b.empty() ? 0.0 : b[o];
      for (int64_t k = 0; k < in; ++k) s += x[i * in + k] * w[o * in + k];
      y[i * out + o] = s;
    }
  return y;
}

inline Vec relu(Vec x) {
  for (double& v : x) v = std::max(v, 0.0);
  return x;
}

inline double sum(const Vec& x) {
  double s = 0;
  for (double v : x) s += v;
  return s;
}

// logits: [B, C], labels: B values in [0, C) -> sum (or mean) over rows of logsumexp - logit[label].
inline double cross_entropy(const Vec& logits, const Vec& labels, int64_t C, bool mean) {
  const int64_t B = static_cast<int64_t>(labels.size());
  double total = 0;
  for (int64_t i = 0; i < B; ++i) {
    double m = -INFINITY, s = 0;
    for (int64_t c = 0; c < C; ++c) m = std::max(m, logits[i * C + c]);
    for (int64_t c = 0; c < C; ++c) s += std::exp(logits[i * C + c] - m);
    total += m + std::log(s) - logits[i * C + static_cast<int64_t>(labels[i])];
  }
  return mean ? total / static_cast<double>(B) : total;
}

struct ConvDims {
  int64_t n, c, h, w, k, r, s, sh, sw, ph, pw;
  int64_t oh() const { return (h + 2 * ph - r) / sh + 1; }
  int64_t ow() const { return (w + 2 * pw - s) / sw + 1; }
  double flops() const { return 2.0 * n * k * oh() * ow() * c * r * s; }
};

// Cross-correlation with zero padding: x [n, c, h, w], wt [k, c, r, s], b [k] or empty.
inline Vec conv2d(const Vec& x, const Vec& wt, const Vec& b, const ConvDims& d) {
  const int64_t oh = d.oh(), ow = d.ow();
  Vec y(static_cast<std::size_t>(d.n * d.k * oh * ow));
  for (int64_t n = 0; n < d.n; ++n)
    for (int64_t k = 0; k < d.k; ++k)
      for (int64_t i = 0; i < oh; ++i)
        for (int64_t j = 0; j < ow; ++j) {
          double s = b.empty() ? 0.0 : b[k];
          for (int64_t c = 0; c < d.c; ++c)
            for (int64_t u = 0; u < d.r; ++u)
              for (int64_t v = 0; v < d.s; ++v) {
                const int64_t hi = i * d.sh - d.ph + u, wi = j * d.sw - d.pw + v;
                if (hi < 0 || hi >= d.h || wi < 0 || wi >= d.w) continue;
                s += x[((n * d.c + c) * d.h + hi) * d.w + wi] * wt[((k * d.c + c) * d.r + u) * d.s + v];
              }
          y[((n * d.k + k) * oh + i) * ow + j] = s;
        }
  return y;
}

// Per channel over [n, c, hw]: the batch statistics (biased variance) when running_mean is empty,
// else the running ones.
inline Vec batch_norm(const Vec& x, const Vec& g, const Vec& b, int64_t n, int64_t c, int64_t hw, double eps,
                      const Vec& running_mean = {}, const Vec& running_var = {}) {
  Vec y(x.size());
  for (int64_t ch = 0; ch < c; ++ch) {
    double mean = 0, var = 0;
    if (running_mean.empty()) {
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < hw; ++j) mean += x[(i * c + ch) * hw + j];
      mean /= static_cast<double>(n * hw);
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < hw; ++j) var += std::pow(x[(i * c + ch) * hw + j] - mean, 2);
      var /= static_cast<double>(n * hw);
    } else {
      mean = running_mean[ch];
      var = running_var[ch];
    }
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < hw; ++j) {
        const std::size_t k = static_cast<std::size_t>((i * c + ch) * hw + j);
        y[k] = g[ch] * (x[k] - mean) / std::sqrt(var + eps) + b[ch];
      }
  }
  return y;
}

struct PoolDims {
  int64_t n, c, h, w, k, s, p;
  int64_t oh() const { return (h + 2 * p - k) / s + 1; }
  int64_t ow() const { return (w + 2 * p - k) / s + 1; }
};

// The maximum of each window; padding never wins.
inline Vec max_pool2d(const Vec& x, const PoolDims& d) {
  Vec y(static_cast<std::size_t>(d.n * d.c * d.oh() * d.ow()));
  for (int64_t pl = 0; pl < d.n * d.c; ++pl)
    for (int64_t i = 0; i < d.oh(); ++i)
      for (int64_t j = 0; j < d.ow(); ++j) {
        double m = -INFINITY;
        for (int64_t u = 0; u < d.k; ++u)
          for (int64_t v = 0; v < d.k; ++v) {
            const int64_t hi = i * d.s - d.p + u, wi = j * d.s - d.p + v;
            if (hi >= 0 && hi < d.h && wi >= 0 && wi < d.w) m = std::max(m, x[(pl * d.h + hi) * d.w + wi]);
          }
        y[(pl * d.oh() + i) * d.ow() + j] = m;
      }
  return y;
}

}  // namespace cumulus::testing::ref
