#include "engine/plan/communication.h"

#include "engine/dist/gradient_buckets.h"

namespace cumulus::plan {

namespace {
constexpr int64_t kStepSumsBytes = 16;  // the group's units and loss, two f64
constexpr int64_t kNormSumBytes = 8;    // stage 2: the shards' sums of squares, one f64
}  // namespace

ReductionLayout reduction_layout(const nn::FlatParameters& params, int64_t bucket_bytes) {
  ReductionLayout layout;
  for (const dist::BucketRange& b : dist::bucket_layout(params, bucket_bytes))
    layout.bucket_bytes.push_back(b.count * static_cast<int64_t>(sizeof(float)));
  layout.parameter_bytes = params.size() * static_cast<int64_t>(sizeof(float));
  return layout;
}

double communication_seconds(const dist::CollectiveTimes& times, const ReductionLayout& layout, int stage,
                             int64_t accum_steps) {
  if (times.world_size <= 1) return 0.0;
  double all_reduced = 0.0, reduce_scattered = 0.0;  // one round of every bucket
  for (int64_t bytes : layout.bucket_bytes) {
    all_reduced += times.all_reduce.predict(bytes);
    reduce_scattered += times.reduce_scatter.predict(bytes);
  }
  double seconds = times.all_reduce.predict(kStepSumsBytes);
  if (stage < 2) seconds += all_reduced;
  else seconds += static_cast<double>(accum_steps) * reduce_scattered + times.all_reduce.predict(kNormSumBytes);
  if (stage >= 1) seconds += times.all_gather.predict(layout.parameter_bytes);
  return seconds;
}

}  // namespace cumulus::plan
