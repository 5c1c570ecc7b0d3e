// What the Trainer checks of a micro-batch's loss before its backward: a loss the step would
// normalize twice, and units that are not what the loss summed over. Internal to the runtime.
#pragma once

#include <cstdint>

#include "cumulus/tensor/tensor.h"

namespace cumulus::train {

struct LossCheck {
  const char* caller = "backward";  // the Trainer's call the message names
  int64_t units = 0;                // the units that call was given
  // AccumulationOptions::weighted_loss: only a loss that is a mean as a whole is refused.
  bool weighted = false;
  // The units check may read the device for the loss's count (a wait): false inside a graph
  // capture and wherever a count of these units was checked already.
  bool read_device = false;
};

// Throws InvalidArgument naming `check.caller` for a loss that is a mean, a sum scaled by a
// constant, or a sum over a count of positions other than check.units (Note [Mean-reduced losses]
// in trainer_accumulation.cpp, Note [Loss normalized once] and Note [Units checked against the
// loss] in loss_checks.cpp). Normalization::none takes any loss: its caller does not call this.
void check_loss(const Tensor& loss, const LossCheck& check);

}  // namespace cumulus::train
