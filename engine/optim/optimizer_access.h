// The optimizer's step plumbing, for in-tree code that checks or times it in parts: tests (a
// hand-written reference that scales the gradient itself) and benchmarks (the update alone). Not
// installed; a training program uses Optimizer::step() or optim::Trainer.
#pragma once

#include "cumulus/optim/optimizer.h"

namespace cumulus::optim {

struct OptimizerAccess {
  // One update with g_eff = grad_scale * gradient at learning rate `lr` (Optimizer::update).
  static void update(Optimizer& optimizer, float grad_scale, float lr) { optimizer.update(grad_scale, lr); }
};

}  // namespace cumulus::optim
