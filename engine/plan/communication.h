// The communication a plan row's setting costs its rank in one effective batch (Note [Predicting
// time] in engine/plan/planner.cpp), from the collectives' measured lines. Internal to the planner.
#pragma once

#include <cstdint>
#include <vector>

#include "cumulus/dist/collective_times.h"
#include "cumulus/nn/flat_parameters.h"

namespace cumulus::plan {

// What the ranks' collectives move: each gradient bucket's bytes (dist::bucket_layout, as the
// Trainer cuts them) and the flat parameters' (the all-gather of the updated weights).
struct ReductionLayout {
  std::vector<int64_t> bucket_bytes;
  int64_t parameter_bytes = 0;
};
ReductionLayout reduction_layout(const nn::FlatParameters& params, int64_t bucket_bytes);

// Seconds of one effective batch's collectives at ZeRO `stage` with `accum_steps` micro-batches
// of this rank: stages 0 and 1 all-reduce every bucket once a step, stage 2 reduce-scatters every
// bucket after each micro-batch's backward and sums the shards' norms; stages 1 and 2 all-gather
// the weights; every stage sums the step's units and loss. 0 when `times` measured no world.
double communication_seconds(const dist::CollectiveTimes& times, const ReductionLayout& layout, int stage,
                             int64_t accum_steps);

}  // namespace cumulus::plan
