// ZeRO stage 2's gradients (Note [ZeRO stage 2] in engine/dist/sharded_gradients.cpp): every
// backward's gradients are reduce-scattered across the ranks bucket by bucket as the backward
// finishes them, each rank adding its part into its shard of the flat gradient, so no rank holds
// a whole gradient: a bucket's buffer lives from its first gradient to its reduction. Keep::whole
// runs the same rounds for data parallel that sums in stage 2's order, every rank keeping the whole.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

#include "cumulus/autograd/node.h"
#include "cumulus/dist/communicator.h"
#include "cumulus/nn/flat_parameters.h"
#include "engine/dist/gradient_buckets.h"

namespace cumulus::dist {

class ShardedGradients {
 public:
  // Keeps this rank's part of `shards` (shard_layout's, one per rank) of `params`' gradients
  // (FlatParameters::shard_gradients, or as they are where they keep it already); the destructor
  // gives them a flat gradient again, unless told to keep them sharded, or where there is no memory
  // for it (a Trainer of another stage then tries again, and says so).
  // Keep::whole: every rank keeps the whole gradient, each bucket's reduce-scatter followed by an
  // all-gather (AccumulationOptions::reduce_every_micro_batch: data parallel summing in stage 2's
  // order, Note [ZeRO stage 2]).
  enum class Keep { shard, whole };
  ShardedGradients(nn::FlatParameters& params, int64_t bucket_bytes, Communicator& communicator,
                   const std::vector<Shard>& shards, Keep keep = Keep::shard);
  ~ShardedGradients();
  ShardedGradients(const ShardedGradients&) = delete;
  ShardedGradients& operator=(const ShardedGradients&) = delete;

  // A backward's hooks, for a BackwardHooksScope around it: a parameter's gradient buffer is a view
  // of its bucket's, made with the bucket's first gradient (give_buffer); a bucket is reduced once
  // all its slots are final (gradient_done), in index order on every rank; after the walk, the
  // buckets it did not finish (a frozen or unused parameter's: finish_backward); a walk that throws
  // frees the buckets it opened and counts no round (abandon_backward: the buckets reduced before
  // stay in the shard, whose group is unusable then, as any gradient of a backward that threw).
  BackwardHooks hooks();
  void give_buffer(TensorImpl& leaf);
  void gradient_done(const void* leaf);
  void finish_backward();
  void abandon_backward();
  // A round of zeros for every bucket: a rank with fewer micro-batches in the group than another
  // reduces these at the step, so every rank makes the same reductions.
  void reduce_zeros();
  // After a step: the group's first round writes the shard, later ones add to it.
  void start_group() { rounds_ = 0; }
  // Its end leaves the parameters' gradients sharded: a planner's choice of stage 2, for the
  // Trainer that trains with it.
  void keep_sharded_at_end() { keep_sharded_ = true; }

  int rounds() const { return rounds_; }  // of this group
  // This rank's shard of the layout, which its part of the global norm sums (kept whole or not).
  const Shard& own_shard() const { return own_; }
  std::size_t count() const { return buckets_.size(); }
  int64_t round_bytes() const;  // the gradient bytes one round reduces, per rank
  // Of all rounds' buckets so far, those reduced while a backward was still running.
  int64_t reduced_in_backward() const { return reduced_in_backward_; }

 private:
  struct Bucket : BucketRange {
    int slots_pending = 0;
    std::vector<Shard> parts;  // every rank's part of the bucket, from its first element
    Tensor buffer;             // [count] f32 while a backward fills it
  };
  void reduce(Bucket& b);
  void zero_unwritten(Bucket& b) const;
  void release(Bucket& b);
  void end_round();

  nn::FlatParameters& params_;
  Communicator& communicator_;
  std::vector<Bucket> buckets_;
  std::size_t next_ = 0;  // buckets [0, next_) are reduced this round
  int rounds_ = 0;
  int64_t reduced_in_backward_ = 0;
  bool keep_sharded_ = false;
  Keep keep_;
  Shard own_;
  std::vector<std::size_t> bucket_of_slot_;
  std::map<const void*, std::size_t> slot_of_leaf_;
};

}  // namespace cumulus::dist
