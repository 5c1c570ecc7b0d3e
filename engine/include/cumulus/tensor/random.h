// Seeded random numbers that are identical on every device: values come from a counter-based
// generator (SplitMix64 of seed and element index), are computed on the host and copied, so a
// model initialized on CPU and on CUDA starts from the same weights bit for bit.
#pragma once

#include <cstdint>

#include "cumulus/tensor/tensor.h"

namespace cumulus {

class Generator {
 public:
  explicit Generator(uint64_t seed = 0) : seed_(seed) {}
  uint64_t seed() const { return seed_; }
  uint64_t offset() const { return offset_; }  // values drawn so far; with seed, the full state
  void set_state(uint64_t seed, uint64_t offset) {
    seed_ = seed;
    offset_ = offset;
  }
  // The next `n` values, uniform in [lo, hi), advancing the counter by n.
  void fill_uniform(float* out, int64_t n, float lo, float hi);
  void fill_normal(float* out, int64_t n, float mean, float stddev);

 private:
  uint64_t next_bits();
  uint64_t seed_;
  uint64_t offset_ = 0;
};

// New f32 tensors filled from `gen`.
Tensor uniform(const Shape& shape, float lo, float hi, Generator& gen, Device device = Device::cpu());
Tensor normal(const Shape& shape, float mean, float stddev, Generator& gen,
              Device device = Device::cpu());

}  // namespace cumulus
