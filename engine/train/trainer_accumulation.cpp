// The Trainer's accumulation bookkeeping: its options checked, epochs and micro-batches counted,
// backward into the gradient buffers, the counters a checkpoint carries and their restoration.
//
// Note [Mean-reduced losses]
// A mean-reduced loss (cross_entropy's default Reduction::Mean) is a quiet disaster here: the step
// divides by the group's units again (Normalization::units; micro_batches by the micro-batch's
// units), so the gradient is 1/B of the right one and training just crawls. backward() therefore
// refuses a loss known to be a mean, except under Normalization::none, which divides by nothing.
// Each autograd node says how its output reduces its input (OutputReduction in
// cumulus/autograd/node.h): cross_entropy and mlp_cross_entropy say sum or mean by their Reduction,
// ops::sum and ops::mean say so over more than one element; reshape, flatten, cast, and a sum or
// mean of one element pass the values on (none). The check follows the loss's grad_fn through
// pass-on nodes and refuses when it arrives at a mean; it also walks through sums of losses and
// constant scalings, where a mean term is refused too unless the loss is weighted on purpose, and
// a scaled sum is refused as well (Note [Loss normalized once] in loss_checks.cpp, beside the
// units check, Note [Units checked against the loss]). Anything else is accepted: a sum, a leaf,
// and any node whose relation to a per-unit sum is unknown (a custom op, a recomputed segment), so
// a correct summed loss is never refused; a custom loss op can declare itself with
// Node::set_output_reduction. Every entry point runs it: backward() and the Trainer's eager and
// captured micro-batches; a replayed graph sees no loss, but it replays a closure whose loss was
// checked when the key ran eagerly.
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <string>

#include "cumulus/autograd/node.h"
#include "cumulus/dist/communicator.h"
#include "engine/ops/internal.h"
#include "engine/tensor/tensor_impl.h"
#include "loss_checks.h"
#include "trainer_parts.h"

namespace cumulus::train {

using optim::LRSchedule;
using optim::Optimizer;
using optim::UpdateScalars;

namespace {

bool power_of_two(float v) {
  int e = 0;
  return std::isfinite(v) && v > 0.0f && std::frexp(v, &e) == 0.5f;
}

void check_loss_scaling(const AccumulationOptions& options) {
  const LossScaling& ls = options.loss_scaling;
  CUMULUS_CHECK(power_of_two(ls.initial_scale) && power_of_two(ls.growth_factor) && ls.growth_factor >= 1.0f &&
                    power_of_two(ls.backoff_factor) && ls.backoff_factor < 1.0f,
                InvalidArgument, "Trainer: loss scaling needs powers of two (initial scale ", ls.initial_scale,
                ", growth factor >= 1: ", ls.growth_factor, ", backoff factor < 1: ", ls.backoff_factor,
                "), so that unscaling is exact");
  CUMULUS_CHECK(power_of_two(ls.min_scale) && ls.min_scale >= std::numeric_limits<float>::min() &&
                    ls.min_scale <= ls.initial_scale,
                InvalidArgument, "Trainer: loss scaling's floor ", ls.min_scale,
                " must be a power of two from 2^-126 to the initial scale ", ls.initial_scale);
  CUMULUS_CHECK(ls.growth_interval > 0, InvalidArgument, "Trainer: loss scaling's growth interval must be > 0, got ",
                ls.growth_interval);
  CUMULUS_CHECK(options.normalization == Normalization::units && options.skip_non_finite, InvalidArgument,
                "Trainer: dynamic loss scaling needs Normalization::units and skip_non_finite (a group "
                "that overflows must be skipped)");
}

void check_options(const AccumulationOptions& options) {
  CUMULUS_CHECK(options.accum_steps > 0, InvalidArgument, "Trainer: accum_steps must be > 0, got ",
                options.accum_steps);
  if (!options.schedule.empty()) {
    CUMULUS_CHECK(options.schedule.begin()->first == 0, InvalidArgument,
                  "Trainer: the accumulation schedule must start at epoch 0");
    for (const auto& [epoch, steps] : options.schedule)
      CUMULUS_CHECK(epoch >= 0 && steps > 0, InvalidArgument, "Trainer: bad schedule entry ", epoch, ":", steps,
                    " (epochs >= 0, steps > 0)");
  }
  CUMULUS_CHECK(options.clip_grad_norm >= 0.0f && std::isfinite(options.clip_grad_norm), InvalidArgument,
                "Trainer: clip_grad_norm must be finite and >= 0, got ", options.clip_grad_norm);
  if (options.loss_scaling.dynamic) check_loss_scaling(options);
  CUMULUS_CHECK(options.zero_stage >= 0 && options.zero_stage <= 2, InvalidArgument,
                "Trainer: zero_stage must be 0, 1 or 2, got ", options.zero_stage);
}

}  // namespace

Trainer::Trainer(std::shared_ptr<Optimizer> optimizer, const TrainerOptions& options,
                 std::shared_ptr<const LRSchedule> schedule) {
  CUMULUS_CHECK(optimizer != nullptr, InvalidArgument, "Trainer: no optimizer");
  check_options(options);
  parts_ = std::make_unique<Parts>(std::move(optimizer), options, std::move(schedule));
  Parts& p = *parts_;
  const Device device = p.optimizer->parameters().device();
  if (distributed()) {
    std::map<int, int> steps = options.schedule;
    if (steps.empty()) steps[0] = options.accum_steps;
    for (const auto& [epoch, n] : steps) check_accum_steps(n, "Trainer");
    if (options.zero_stage >= 1) p.keep_shard();
    if (options.zero_stage == 2) {
      p.sharded = std::make_unique<dist::ShardedGradients>(p.optimizer->parameters(), options.bucket_bytes,
                                                           *options.communicator, p.shards);
    } else if (options.reduce_every_micro_batch) {
      nn::FlatParameters& params = p.optimizer->parameters();
      p.sharded = std::make_unique<dist::ShardedGradients>(
          params, options.bucket_bytes, *options.communicator,
          dist::shard_layout(params.size(), options.communicator->world_size(), nn::FlatParameters::kAlignElements),
          dist::ShardedGradients::Keep::whole);
    } else {
      p.buckets = std::make_unique<dist::GradientBuckets>(p.optimizer->parameters(), options.bucket_bytes,
                                                          *options.communicator);
    }
  }
  // Gradients a plan of stage 2 left sharded, for a Trainer that keeps them whole.
  if (!p.sharded) p.optimizer->parameters().unshard_gradients();
  CUMULUS_CHECK(!p.use_graphs || device.is_cuda(), InvalidArgument,
                "Trainer: CUDA graphs need the parameters on a CUDA device, they are on ", device.str());
  // The reductions across ranks would have to be captured too (NCCL allows it; untested).
  CUMULUS_CHECK(!p.use_graphs || !distributed(), InvalidArgument,
                "Trainer: CUDA graphs with data parallel training are not supported; run eagerly");
  p.check_graphs_allowed();
#if !CUMULUS_WITH_CUDA
  CUMULUS_CHECK(!p.use_graphs, InvalidArgument, "Trainer: cumulus was built without CUDA");
#endif
  p.steps_offset = p.optimizer->updates();
  const LossScaling& ls = options.loss_scaling;
  p.state.write(&kernels::StepState::loss_scale, ls.dynamic ? ls.initial_scale : 1.0f);
  p.state.write(&kernels::StepState::loss_scale_clean_steps, int32_t{0});
  begin_epoch(0, 0);
}

Trainer::~Trainer() = default;

bool Trainer::distributed() const {
  const auto& comm = parts_->options.communicator;
  return comm && comm->world_size() > 1;
}

// `caller`: the call a user made, which the message names.
void Trainer::check_accum_steps(int steps, const char* caller) const {
  CUMULUS_CHECK(steps > 0, InvalidArgument, caller, ": accumulation steps must be > 0, got ", steps);
  if (!distributed()) return;
  const int world = parts_->options.communicator->world_size();
  CUMULUS_CHECK(steps % world == 0, InvalidArgument, caller, ": ", steps,
                " accumulation steps (micro-batches of all ranks per step) do not divide over ", world,
                " ranks; give a multiple of the world size");
}

void Trainer::begin_epoch(int epoch, int64_t micro_batches, int64_t first) {
  GroupPosition& pos = parts_->position;
  CUMULUS_CHECK(micro_batches >= 0, InvalidArgument, "Trainer::begin_epoch: negative epoch length");
  CUMULUS_CHECK(first >= 0 && (micro_batches == 0 || first <= micro_batches), InvalidArgument,
                "Trainer::begin_epoch: first micro-batch ", first, " outside an epoch of ", micro_batches);
  CUMULUS_CHECK(pos.group_micro_batches == 0, InvalidArgument, "Trainer::begin_epoch(", epoch, ") with ",
                pos.group_micro_batches, " micro-batch(es) of the previous epoch not stepped; call flush() first");
  const AccumulationOptions& o = parts_->options;
  pos.epoch = epoch;
  if (pos.accum_override > 0) pos.accum_steps = pos.accum_override;
  else pos.accum_steps = o.schedule.empty() ? o.accum_steps : accum_steps_for_epoch(o.schedule, epoch);
  pos.in_epoch = first;
  pos.epoch_length = micro_batches;
  parts_->state.write(&kernels::StepState::epoch, kernels::UnitsAndLoss{0.0, 0.0});
  parts_->logged_loss = parts_->logged_units = 0.0;
}

void Trainer::check_micro_batch(int64_t units, const char* caller) const {
  const GroupPosition& pos = parts_->position;
  const dist::Communicator* comm = parts_->options.communicator.get();
  CUMULUS_CHECK(units > 0, InvalidArgument, "Trainer::", caller, ": the unit count must be > 0, got ", units);
  const int owner = dist::owner_of_micro_batch(pos.in_epoch, comm ? comm->world_size() : 1);
  CUMULUS_CHECK(!distributed() || owner == comm->rank(), InvalidArgument, "Trainer::", caller, ": micro-batch ",
                pos.in_epoch, " of the epoch belongs to rank ", owner,
                " (dist::owner_of_micro_batch); call skip_micro_batch() for it");
  CUMULUS_CHECK(pos.epoch_length == 0 || pos.in_epoch < pos.epoch_length, InvalidArgument, "Trainer::", caller,
                ": more micro-batches than the ", pos.epoch_length, " announced for epoch ", pos.epoch);
}

void Trainer::count_micro_batch(int64_t units) { parts_->position.count(units); }

void Trainer::skip_micro_batch() {
  GroupPosition& pos = parts_->position;
  CUMULUS_CHECK(distributed(), InvalidArgument,
                "Trainer::skip_micro_batch: only for data parallel training (a communicator of several ranks)");
  const dist::Communicator& comm = *parts_->options.communicator;
  CUMULUS_CHECK(dist::owner_of_micro_batch(pos.in_epoch, comm.world_size()) != comm.rank(), InvalidArgument,
                "Trainer::skip_micro_batch: micro-batch ", pos.in_epoch, " of the epoch is rank ", comm.rank(),
                "'s own");
  CUMULUS_CHECK(pos.epoch_length == 0 || pos.in_epoch < pos.epoch_length, InvalidArgument,
                "Trainer::skip_micro_batch: more micro-batches than the ", pos.epoch_length, " announced for epoch ",
                pos.epoch);
  pos.count(0);
}

namespace {
// Whether the micro-batch being counted next is this rank's last in its group.
bool last_own_micro_batch_in_group(const GroupPosition& pos, const dist::Communicator& comm) {
  const int world = comm.world_size();
  const int64_t start = pos.in_epoch - pos.group_micro_batches;
  int64_t end = start + pos.accum_steps;
  if (pos.epoch_length > 0) end = std::min(end, pos.epoch_length);
  const int64_t last = end - 1 - (((end - 1 - comm.rank()) % world) + world) % world;
  return pos.in_epoch == last;
}
}  // namespace

void Trainer::backward(const Tensor& loss, int64_t units) {
  Parts& p = *parts_;
  check_micro_batch(units, "backward");
  // micro_batches: each micro-batch contributes mean loss / N, whatever the group turns out to be.
  const float seed = p.options.normalization == Normalization::micro_batches
                         ? 1.0f / (static_cast<float>(units) * static_cast<float>(p.position.accum_steps))
                         : 1.0f;
  const Device device = p.optimizer->parameters().device();
  CUMULUS_CHECK(loss.defined(), InvalidArgument, "Trainer::backward: undefined loss");
  CUMULUS_CHECK(loss.device() == device, DeviceError, "Trainer::backward: loss on ", loss.device().str(),
                ", parameters on ", device.str());
  // Normalization::none divides by nothing: any loss is what the caller wants.
  if (p.options.normalization != Normalization::none) {
    // The device is read for a unit count not checked before, never while a graph is captured
    // (Note [Units checked against the loss]).
    const bool may_read = p.units_checked.count(units) == 0 && !ops::detail::graph_capturing(device);
    check_loss(loss, LossCheck{p.caller, units, p.options.weighted_loss, may_read});
    if (may_read) p.units_checked.insert(units);
  }
  // With loss scaling the seed is the device's current scale (Note [Loss scaling]).
  const Tensor seed_tensor = p.options.loss_scaling.dynamic && loss.numel() == 1
                                 ? p.state.view(&kernels::StepState::loss_scale, loss.shape())
                                 : p.seeds.get(seed, loss);
  if (p.sharded) {
    // Every backward is a round of ZeRO-2's reductions (Note [ZeRO stage 2]).
    const BackwardHooksScope hooks(p.sharded->hooks());
    run_backward(loss, seed_tensor);
  } else if (distributed() && last_own_micro_batch_in_group(p.position, *p.options.communicator)) {
    // The rank's last backward before the step: each bucket is reduced as soon as it is final.
    run_backward(loss, seed_tensor, [&p](const TensorImpl* leaf) { p.buckets->gradient_done(leaf); });
  } else {
    run_backward(loss, seed_tensor);
  }
  kernels::StepBuffers* buf = p.state.buffers();
  CUMULUS_DISPATCH(device, ctx, kernels::record_micro_batch(buf->state, static_cast<double>(units), loss.item()),
                   kernels::record_micro_batch_cuda(buf, loss.data<float>(), static_cast<double>(units), ctx.stream()));
  count_micro_batch(units);
}

Tensor BackwardSeeds::get(float value, const Tensor& loss) {
  for (const auto& [v, t] : seeds_)
    if (v == value && t.shape() == loss.shape() && t.device() == loss.device()) return t;
  if (seeds_.size() >= kMax) {
    MemoryCategoryScope scope(MemoryCategory::backward_temporaries);
    return Tensor::full(loss.shape(), value, loss.device());
  }
  MemoryCategoryScope scope(MemoryCategory::other);
  seeds_.emplace_back(value, Tensor::full(loss.shape(), value, loss.device()));
  return seeds_.back().second;
}

bool Trainer::ready() const { return parts_->position.ready(); }

void Trainer::set_accum_steps(int steps) {
  check_accum_steps(steps, "Trainer::set_accum_steps");
  GroupPosition& pos = parts_->position;
  pos.accum_override = steps;
  if (pos.group_micro_batches == 0) pos.accum_steps = steps;  // else end_group applies it after this group's step
}

TrainingPosition Trainer::position() const {
  const GroupPosition& pos = parts_->position;
  TrainingPosition t;
  t.epoch = pos.epoch;
  t.micro_batch_index = pos.in_epoch;
  t.micro_batches_total = pos.total;
  t.accum_steps_override = pos.accum_override;
  t.accum_steps = pos.accum_steps;
  t.micro_batches_in_group = pos.group_micro_batches;
  t.units_in_group = pos.group_units;
  t.attempted_steps = pos.attempted_steps;
  return t;
}

TrainingCounters Trainer::counters() const {
  const Parts& p = *parts_;
  const Parts::Readings now = p.read_step();  // one wait for the device
  const kernels::StepState& st = now.state;
  const UpdateScalars& u = now.scalars;
  TrainingCounters c;
  static_cast<TrainingPosition&>(c) = position();
  c.optimizer_steps = u.updates - p.steps_offset;
  c.skipped_steps = st.skipped;
  c.loss_scale = st.loss_scale;
  c.loss_scale_clean_steps = st.loss_scale_clean_steps;
  c.last_lr = u.lr;
  c.last_grad_norm = st.grad_norm;
  c.last_clip_factor = st.clip;
  c.epoch_loss_sum = st.epoch.loss;
  c.epoch_units_stepped = st.epoch.units;
  c.gradient_buckets = p.buckets   ? static_cast<int64_t>(p.buckets->count())
                       : p.sharded ? static_cast<int64_t>(p.sharded->count())
                                   : 0;
  c.buckets_started_in_backward = p.buckets   ? p.buckets->started_in_backward()
                                  : p.sharded ? p.sharded->reduced_in_backward()
                                              : 0;
  return c;
}

void Trainer::restore(const TrainingCounters& c) {
  Parts& p = *parts_;
  const LossScaling& ls = p.options.loss_scaling;
  CUMULUS_CHECK(p.position.group_micro_batches == 0, InvalidArgument,
                "Trainer::restore with micro-batches accumulated");
  CUMULUS_CHECK(c.epoch >= 0 && c.micro_batch_index >= 0 && c.micro_batches_total >= 0 && c.optimizer_steps >= 0 &&
                    c.skipped_steps >= 0 && c.accum_steps_override >= 0,
                InvalidArgument, "Trainer::restore: negative counter");
  if (c.accum_steps_override > 0) check_accum_steps(c.accum_steps_override, "Trainer::restore");
  CUMULUS_CHECK(!ls.dynamic || (std::isfinite(c.loss_scale) && c.loss_scale > 0.0f && c.loss_scale_clean_steps >= 0 &&
                                c.loss_scale_clean_steps < ls.growth_interval),
                InvalidArgument, "Trainer::restore: loss scale ", c.loss_scale, " with ", c.loss_scale_clean_steps,
                " clean steps (growth interval ", ls.growth_interval, ")");
  CUMULUS_CHECK(std::isfinite(c.last_lr), InvalidArgument, "Trainer::restore: last learning rate ", c.last_lr);
  p.position.epoch = c.epoch;
  p.position.in_epoch = c.micro_batch_index;
  p.position.total = c.micro_batches_total;
  p.position.accum_override = c.accum_steps_override;  // begin_epoch() applies it
  p.position.attempted_steps = c.optimizer_steps + c.skipped_steps;
  p.state.write(&kernels::StepState::skipped, c.skipped_steps);
  if (ls.dynamic) {
    // Saved under a lower floor: resumed where the floor holds it.
    p.state.write(&kernels::StepState::loss_scale, std::max(c.loss_scale, ls.min_scale));
    p.state.write(&kernels::StepState::loss_scale_clean_steps, c.loss_scale_clean_steps);
  }
  UpdateScalars scalars = p.optimizer->read_update_scalars();
  scalars.lr = c.last_lr;  // the next step writes its own
  p.optimizer->write_update_scalars(scalars);
  p.steps_offset = scalars.updates - c.optimizer_steps;
  p.lr_window.saw_updates(scalars.updates);
  p.lr_window.invalidate();  // refilled at the next step
}

}  // namespace cumulus::train
