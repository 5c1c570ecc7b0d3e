// The data-parallel gradient buckets of a Trainer (Note [Data parallel accumulation] in
// engine/dist/communicator.cpp): the flat gradient cut into runs of whole parameter slots of about
// `bucket_bytes`, in reverse slot order (the order backward finishes them), each all-reduced as
// soon as its last slot is final during the rank's last backward of a group, the rest at the step.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

#include "cumulus/dist/communicator.h"
#include "cumulus/nn/flat_parameters.h"

namespace cumulus::dist {

// A run of whole parameter slots reduced together: slots [first_slot, end_slot), elements
// [offset, offset + count) of the flat gradient.
struct BucketRange {
  std::size_t first_slot = 0, end_slot = 0;
  int64_t offset = 0, count = 0;
};
// The flat gradient cut into buckets of about `bucket_bytes` (one slot at least), in reverse slot
// order: the order backward finishes them.
std::vector<BucketRange> bucket_layout(const nn::FlatParameters& params, int64_t bucket_bytes);

class GradientBuckets {
 public:
  GradientBuckets(const nn::FlatParameters& params, int64_t bucket_bytes, Communicator& communicator);

  // A backward's hook: `leaf`'s gradient is final. Starts every bucket now complete, in index order
  // on every rank (collectives must match across ranks: a bucket finished early waits for the ones
  // before it).
  void gradient_done(const void* leaf);
  // Starts the buckets not started yet (at the step; the caller waits for the communicator).
  void start_rest();
  // The gradient bytes a step reduces.
  int64_t bytes() const;
  // After the step: every bucket waits for its slots again.
  void rearm();

  std::size_t count() const { return buckets_.size(); }
  // Of all steps' buckets so far, those started while a backward was still running.
  int64_t started_in_backward() const { return started_in_backward_; }

 private:
  struct Bucket : BucketRange {
    int slots_pending = 0;  // slots the current backward has not finished
  };
  void start(std::size_t bucket);

  const nn::FlatParameters& params_;
  Communicator& communicator_;
  std::vector<Bucket> buckets_;
  std::size_t next_ = 0;  // buckets [0, next_) are started for this step
  int64_t started_in_backward_ = 0;
  std::vector<std::size_t> bucket_of_slot_;
  std::map<const void*, std::size_t> slot_of_leaf_;
};

}  // namespace cumulus::dist
