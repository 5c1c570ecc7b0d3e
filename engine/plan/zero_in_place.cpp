#include "engine/plan/zero_in_place.h"

#include "cumulus/core/error.h"
#include "cumulus/nn/flat_parameters.h"

namespace cumulus::plan {

void check_zero_request(const PlanRequest& request) {
  const int stage = request.setting.zero_stage;
  CUMULUS_CHECK(stage >= 0 && stage <= 2, InvalidArgument, "plan_batch: ZeRO stage ", stage, " (0, 1 or 2)");
  CUMULUS_CHECK(request.world_size >= 1 && request.rank >= 0 && request.rank < request.world_size, InvalidArgument,
                "plan_batch: rank ", request.rank, " of a world of ", request.world_size);
  CUMULUS_CHECK((stage == 0 && !request.weigh_zero) || request.world_size > 1, InvalidArgument,
                "plan_batch: ZeRO shards over several ranks; the world has ", request.world_size);
  CUMULUS_CHECK(request.bucket_bytes > 0, InvalidArgument, "plan_batch: bucket_bytes must be > 0");
}

void ZeroInPlace::set(int stage) {
  CUMULUS_CHECK(stage >= stage_, Error, "ZeroInPlace: stage ", stage, " after ", stage_);
  if (stage == stage_) return;
  optim::Optimizer& optimizer = *request_.optimizer;
  nn::FlatParameters& params = optimizer.parameters();
  const std::vector<dist::Shard> shards =
      dist::shard_layout(params.size(), request_.world_size, nn::FlatParameters::kAlignElements);
  const dist::Shard& own = shards[static_cast<std::size_t>(request_.rank)];
  if (stage_ == 0) optimizer.keep_shard(own.offset, own.count);
  if (stage == 2) {
    world_ = dist::Communicator::alone(request_.rank, request_.world_size);
    sharded_ = std::make_unique<dist::ShardedGradients>(params, request_.bucket_bytes, *world_, shards);
    hooks_ = std::make_unique<BackwardHooksScope>(sharded_->hooks());
  }
  stage_ = stage;
}

void ZeroInPlace::finish(bool keep_sharded_gradients) {
  hooks_.reset();
  if (sharded_ && keep_sharded_gradients) sharded_->keep_sharded_at_end();
  sharded_.reset();
  optim::Optimizer& optimizer = *request_.optimizer;
  // The planner discards the state it probed the step with; one that stayed keeps its shard.
  if (stage_ > 0 && optimizer.state().empty()) optimizer.keep_shard(0, optimizer.parameters().size());
  stage_ = 0;
}

ZeroInPlace::~ZeroInPlace() {
  try {
    finish(false);
  } catch (const Error&) {
    // On an exception's way out: the parameters keep what they have.
  }
}

}  // namespace cumulus::plan
