// A planning's ZeRO stage in place (Note [Plan levers] in engine/plan/planner.cpp). Internal.
#pragma once

#include <memory>

#include "cumulus/autograd/node.h"
#include "cumulus/dist/communicator.h"
#include "cumulus/plan/planner.h"
#include "engine/dist/sharded_gradients.h"

namespace cumulus::plan {

// InvalidArgument for a request whose ZeRO settings cannot be planned: a stage outside 0-2, a
// stage or weigh_zero without several ranks, a rank outside the world.
void check_zero_request(const PlanRequest& request);

// The request's ZeRO stage for the probes: from stage 1 the optimizer keeps rank `request.rank`'s
// shard; at stage 2 the parameters keep only that shard of the gradients too, every backward on
// this thread reducing its buckets into it as a Trainer's would, over a world whose collectives
// move nothing, so the probes measure that rank's memory in one process.
class ZeroInPlace {
 public:
  explicit ZeroInPlace(const PlanRequest& request) : request_(request) {}
  // Puts `stage` in place (stages only rise within a planning).
  void set(int stage);
  // The optimizer updates the whole parameters again, and the parameters get a flat gradient
  // again unless `keep_sharded_gradients` (a plan of stage 2: its Trainer takes them as they are).
  // Outside the planner's memory limit: the flat gradient is not the plan's memory.
  void finish(bool keep_sharded_gradients);
  ~ZeroInPlace();  // finish(false) on an exception's way out (the parameters stay sharded without memory)
  ZeroInPlace(const ZeroInPlace&) = delete;
  ZeroInPlace& operator=(const ZeroInPlace&) = delete;

 private:
  const PlanRequest& request_;
  int stage_ = 0;
  std::shared_ptr<dist::Communicator> world_;
  std::unique_ptr<dist::ShardedGradients> sharded_;
  std::unique_ptr<BackwardHooksScope> hooks_;
};

}  // namespace cumulus::plan
