// The backward engine's walk, shared by run_backward (engine/autograd/engine.cpp) and the
// recomputation of checkpointed segments (engine/autograd/checkpoint.cpp). Internal.
#pragma once

#include <memory>
#include <vector>

#include "cumulus/autograd/node.h"
#include "engine/tensor/tensor_impl.h"

namespace cumulus::detail {

// The adds a backward defers to its end (Note [Deferred gradient adds] in engine.cpp).
struct DeferredGradientAdds {
  struct Add {
    Tensor partial, target;
  };
  std::vector<Add> adds;
  // Adds every partial into its target, in the order given; on CUDA up to
  // kernels::VectorAdds::kMaxPairs with distinct targets per launch.
  void flush();
};

// A leaf whose gradient goes to `sink` instead of its own buffer: a recomputed segment's input,
// whose gradient belongs to the outer graph (Note [Recompute] in engine/autograd/checkpoint.cpp).
struct LeafRedirect {
  const TensorImpl* leaf = nullptr;
  GradSink sink = GradSink::none();
};

// Reverse mode from `root` seeded with `root_grad`: runs each node once all its consumers have
// delivered, releases its saved tensors at once, writes leaves through their sinks (Note
// [Persistent gradient buffers] in engine/autograd/engine.cpp) and calls `on_leaf_done` (may be
// empty) for each leaf once its last edge has delivered. Runs under the caller's grad mode and
// memory category.
void backward_walk(const std::shared_ptr<Node>& root, const Tensor& root_grad, const LeafRedirect& redirect,
                   const LeafGradientDone& on_leaf_done);

}  // namespace cumulus::detail
