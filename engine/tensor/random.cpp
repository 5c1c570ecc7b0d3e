#include "cumulus/tensor/random.h"

#include <cmath>
#include <vector>

namespace cumulus {

namespace {
// SplitMix64 (Steele, Lea, Flood 2014): a bijective mix of a 64-bit counter, so value i depends
// only on (seed, i). Written here because it is eight lines and <random> engines are sequential
// and not specified to give the same stream on every standard library.
inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
// 24 random bits -> [0, 1) exactly representable in f32.
inline float unit_float(uint64_t bits) { return static_cast<float>(bits >> 40) * (1.0f / 16777216.0f); }
}  // namespace

uint64_t Generator::next_bits() { return splitmix64(splitmix64(seed_) ^ offset_++); }

void Generator::fill_uniform(float* out, int64_t n, float lo, float hi) {
  for (int64_t i = 0; i < n; ++i) out[i] = lo + (hi - lo) * unit_float(next_bits());
}

void Generator::fill_normal(float* out, int64_t n, float mean, float stddev) {
  // Box-Muller: one normal per pair of uniforms (the second is dropped to keep one counter
  // step pair per value, so value i does not depend on n).
  for (int64_t i = 0; i < n; ++i) {
    const double u1 = (static_cast<double>(next_bits() >> 11) + 1.0) * (1.0 / 9007199254740993.0);
    const double u2 = static_cast<double>(next_bits() >> 11) * (1.0 / 9007199254740992.0);
    out[i] = mean + stddev * static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  }
}

Tensor uniform(const Shape& shape, float lo, float hi, Generator& gen, Device device) {
  std::vector<float> host(static_cast<std::size_t>(shape.numel()));
  gen.fill_uniform(host.data(), shape.numel(), lo, hi);
  return Tensor::from_vector(host, shape, device);
}

Tensor normal(const Shape& shape, float mean, float stddev, Generator& gen, Device device) {
  std::vector<float> host(static_cast<std::size_t>(shape.numel()));
  gen.fill_normal(host.data(), shape.numel(), mean, stddev);
  return Tensor::from_vector(host, shape, device);
}

}  // namespace cumulus
