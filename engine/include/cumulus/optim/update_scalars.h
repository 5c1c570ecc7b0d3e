// What one optimizer update reads besides the flat arrays: the scalars the step decided and the
// chunks of frozen parameters. Plain structs, shared by the host, the CPU loops and the CUDA
// kernels (Note [Device-side step] in kernels/optim_rules.h), so an update on CUDA reads them from
// device memory and never waits for the host.
#pragma once

#include <cstdint>

namespace cumulus::optim {

// The step's decision for one update, in the parameters' memory (device memory on CUDA).
struct UpdateScalars {
  float grad_scale;  // multiplies every gradient element (the normalization, clipping, unscaling)
  float lr;          // the learning rate; a parameter group's lr_scale multiplies it
  int32_t skip;      // 1: the step was skipped (a non-finite gradient): change nothing
  int32_t reserved;
  int64_t updates;   // updates applied so far, this one included: Adam's t, SGD's first update at 1
};

// Which chunks of kChunk elements belong to frozen parameters (Note [Frozen parameters] in
// kernels/optim_rules.h): an update leaves their elements and state alone and counts the update
// they missed. Both pointers are null until a parameter was first frozen.
struct FrozenChunks {
  static constexpr int64_t kChunk = 64;  // nn::FlatParameters::kAlignElements
  const uint8_t* frozen = nullptr;       // per chunk, 1: frozen
  int32_t* missed = nullptr;             // per chunk: updates it sat out while frozen
};

}  // namespace cumulus::optim
