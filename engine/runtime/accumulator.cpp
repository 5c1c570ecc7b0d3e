// Note [Exact normalization]
// Each micro-batch's loss is a sum over its units (samples for a classifier, tokens for a language
// model: whatever the caller's loss sums over, and the count it passes to backward), and backward
// adds its gradient into the persistent buffers unscaled. At a group boundary the update multiplies
// the accumulated gradient by 1 / (units in the group), inside the fused optimizer pass. So a group
// of any shape (16 x 4, 64 x 1, 8 + 8 + 16 + 32, or the 40-sample tail of an epoch) is exactly the
// mean gradient per unit over its units, and 16 x 4 reproduces 64 x 1 up to float rounding.
// Lightning and Accelerate divide every micro-batch by N instead, which under-weights a short last
// group by (its micro-batches) / N; Normalization::micro_batches reproduces that convention for
// comparison.
//
// Clipping uses the global L2 norm of the normalized, accumulated gradient, computed once at step
// time (never per micro-batch) and folded into the same scale: g_eff = g * (1/units) * clip.
// A non-finite norm means a NaN/Inf somewhere in the gradient: the step is skipped and counted,
// the gradients are discarded (marked stale) and training goes on with the next group.
//
// All of this is decided on the device (Note [Device-side step] in kernels/optim_rules.h): the
// host never reads the norm, so a CUDA step costs two launches and no synchronization.
//
// Note [Loss scaling]
// 16-bit gradients underflow where f32 ones do not, so with dynamic loss scaling backward is seeded
// with a scale S (initially 2^16) instead of 1, and the update divides by S again. The seed is the
// step state's loss_scale itself (a view: Optimizer::step_state_scalar), so the device decides S
// and no host synchronization or fill is needed, captured graphs included. With accumulation:
// - S changes only in the step (prepare_step), never inside a group, so every micro-batch of a group
//   adds gradients of the same scale.
// - A non-finite value anywhere in the group makes the accumulated gradient's norm non-finite: the
//   group is skipped (weights and optimizer state untouched, counted), S is multiplied by the
//   backoff (0.5), and the count of clean groups restarts; growth_interval clean groups in a row
//   multiply S by the growth factor (2).
// - S holds at a floor, LossScaling::min_scale (default 1), rather than stopping the run: without
//   one, repeated overflow backed it off to 0, and from there every group was skipped for good
//   (a zero seed, then 1 / 0 in the unscaling), silently. A group that still overflows at the
//   floor is skipped and counted like any other (the app says so at the epoch's end, naming the
//   floor), and the first group that is finite there steps: the run recovers by itself if the
//   overflow passes. The default floor is 1 because below it the scale protects nothing from
//   underflow; it only shrinks gradients that overflow unscaled, which a diverging run has, and a
//   scale driven far below 1 would flush small gradients to zero for growth_interval steps per
//   doubling on the way back. Growth likewise stops at the largest finite power of two.
// - Every factor is a power of two, so scaling and unscaling are exact: away from overflow and
//   underflow, a run with loss scaling gives the same bits as one without (tested).
// The reported loss is the true loss: only the seed is scaled.
//
// Note [Mean-reduced losses]
// A mean-reduced loss (cross_entropy's default Reduction::Mean) is a quiet disaster here: the step
// divides by the group's units again (Normalization::units; micro_batches by the micro-batch's
// samples), so the gradient is 1/B of the right one and training just crawls. backward() therefore
// refuses a loss known to be a mean, except under Normalization::none, which divides by nothing. Each autograd node
// says how its output reduces its input (OutputReduction in cumulus/autograd/node.h): cross_entropy and
// mlp_cross_entropy say sum or mean by their Reduction, ops::sum and ops::mean say so over more than
// one element; reshape, flatten, cast, and a sum or mean of one element pass the values on (none).
// The check follows the loss's grad_fn through pass-on nodes and refuses only when it arrives at a
// mean. Anything else is accepted: a sum, a leaf, and any node whose relation to a per-sample sum
// is unknown (a custom op, a recomputed segment), so a correct summed loss is never refused; a
// custom loss op can declare itself with Node::set_output_reduction. Every entry point runs it:
// eager and data parallel micro-batches come through backward(), and the Trainer's eager and
// captured calls do; a replayed graph sees no loss, but it replays a closure whose loss was
// checked when the key ran eagerly.
//
// Note [Learning-rate table]
// The schedule is host code (LRSchedule::lr_at), but whether a step is taken, and so which step
// index the next one has, is known only on the device. The device therefore reads the rate from
// a table of lr_at(k) for a window of update counts starting at the count the host last read.
// Every attempt raises the count by at most one, so the host knows when the window could run out
// and only then reads the count and refills (once per kLrTableSize steps at most; both are
// ordinary stream-ordered work, never inside a captured step). Without a schedule the table is
// the optimizer's lr, rewritten when set_lr changes it.
#include "accumulator.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "cumulus/autograd/grad_mode.h"
#include "cumulus/autograd/node.h"
#include "cumulus/dist/communicator.h"
#include "engine/ops/internal.h"
#include "engine/tensor/tensor_impl.h"
#include "kernels/optim_rules.h"

namespace cumulus::optim {

Accumulator::Accumulator(std::shared_ptr<Optimizer> optimizer, const AccumulationOptions& options,
                         std::shared_ptr<const LRSchedule> schedule)
    : optimizer_(std::move(optimizer)), options_(options), schedule_(std::move(schedule)) {
  CUMULUS_CHECK(optimizer_ != nullptr, InvalidArgument, "Accumulator: no optimizer");
  CUMULUS_CHECK(options.accum_steps > 0, InvalidArgument, "Accumulator: accum_steps must be > 0, got ",
                options.accum_steps);
  if (!options.schedule.empty()) {
    CUMULUS_CHECK(options.schedule.begin()->first == 0, InvalidArgument,
                  "Accumulator: the accumulation schedule must start at epoch 0");
    for (const auto& [epoch, steps] : options.schedule)
      CUMULUS_CHECK(epoch >= 0 && steps > 0, InvalidArgument, "Accumulator: bad schedule entry ", epoch, ":", steps,
                    " (epochs >= 0, steps > 0)");
  }
  CUMULUS_CHECK(options.clip_grad_norm >= 0.0f && std::isfinite(options.clip_grad_norm), InvalidArgument,
                "Accumulator: clip_grad_norm must be finite and >= 0, got ", options.clip_grad_norm);
  const LossScaling& ls = options.loss_scaling;
  if (ls.dynamic) {
    auto power_of_two = [](float v) {
      int e = 0;
      return std::isfinite(v) && v > 0.0f && std::frexp(v, &e) == 0.5f;
    };
    CUMULUS_CHECK(power_of_two(ls.initial_scale) && power_of_two(ls.growth_factor) && ls.growth_factor >= 1.0f &&
                      power_of_two(ls.backoff_factor) && ls.backoff_factor < 1.0f,
                  InvalidArgument, "Accumulator: loss scaling needs powers of two (initial scale ", ls.initial_scale,
                  ", growth factor >= 1: ", ls.growth_factor, ", backoff factor < 1: ", ls.backoff_factor,
                  "), so that unscaling is exact");
    CUMULUS_CHECK(power_of_two(ls.min_scale) && ls.min_scale >= std::numeric_limits<float>::min() &&
                      ls.min_scale <= ls.initial_scale,
                  InvalidArgument, "Accumulator: loss scaling's floor ", ls.min_scale,
                  " must be a power of two from 2^-126 to the initial scale ", ls.initial_scale);
    CUMULUS_CHECK(ls.growth_interval > 0, InvalidArgument,
                  "Accumulator: loss scaling's growth interval must be > 0, got ", ls.growth_interval);
    CUMULUS_CHECK(options.normalization == Normalization::units && options.skip_non_finite, InvalidArgument,
                  "Accumulator: dynamic loss scaling needs Normalization::units and skip_non_finite (a group "
                  "that overflows must be skipped)");
  }
  if (distributed()) {
    const int world = options.communicator->world_size();
    std::map<int, int> steps = options.schedule;
    if (steps.empty()) steps[0] = options.accum_steps;
    for (const auto& [epoch, n] : steps)
      CUMULUS_CHECK(n % world == 0, InvalidArgument, "Accumulator: ", n,
                    " accumulation steps (micro-batches of all ranks per step) do not divide over ", world,
                    " ranks; give a multiple of the world size");
    plan_buckets();
  }
  known_updates_ = optimizer_->updates();
  steps_offset_ = known_updates_;
  const float scale = ls.dynamic ? ls.initial_scale : 1.0f;
  const int32_t no_clean_steps = 0;
  optimizer_->write_step_state(offsetof(kernels::StepState, loss_scale), &scale, sizeof(scale));
  optimizer_->write_step_state(offsetof(kernels::StepState, loss_scale_clean_steps), &no_clean_steps,
                               sizeof(no_clean_steps));
  begin_epoch(0, 0);
}

bool Accumulator::distributed() const { return options_.communicator && options_.communicator->world_size() > 1; }

void Accumulator::plan_buckets() {
  CUMULUS_CHECK(options_.bucket_bytes > 0, InvalidArgument, "Accumulator: bucket_bytes must be > 0");
  const auto& slots = optimizer_->parameters().slots();
  bucket_of_slot_.assign(slots.size(), 0);
  // Reverse slot order: backward finishes the last layers first.
  for (std::size_t end = slots.size(); end > 0;) {
    Bucket b;
    b.end_slot = end;
    int64_t bytes = 0;
    std::size_t first = end;
    while (first > 0 && (bytes == 0 || bytes + slots[first - 1].numel * 4 <= options_.bucket_bytes)) {
      --first;
      bytes += slots[first].numel * 4;
    }
    b.first_slot = first;
    b.offset = slots[first].offset;
    b.count = slots[end - 1].offset + slots[end - 1].numel - b.offset;
    b.slots_pending = static_cast<int>(end - first);
    for (std::size_t i = first; i < end; ++i) {
      bucket_of_slot_[i] = buckets_.size();
      slot_of_leaf_[impl_of(slots[i].param).get()] = i;
    }
    buckets_.push_back(b);
    end = first;
  }
}

void Accumulator::start_bucket(std::size_t index) {
  Bucket& b = buckets_[index];
  const nn::FlatParameters& params = optimizer_->parameters();
  float* grad = static_cast<float*>(params.gradients().raw_data()) + b.offset;
  options_.communicator->start_all_reduce_sum(grad, b.count, dist::Element::f32, params.device());
}

bool Accumulator::last_own_micro_batch_in_group() const {
  const int world = options_.communicator->world_size();
  const int rank = options_.communicator->rank();
  const int64_t start = mb_in_epoch_ - group_mbs_;
  int64_t end = start + accum_steps_;
  if (mb_epoch_len_ > 0) end = std::min(end, mb_epoch_len_);
  const int64_t last = end - 1 - (((end - 1 - rank) % world) + world) % world;
  return mb_in_epoch_ == last;
}

void Accumulator::reduce_across_ranks() {
  dist::Communicator& comm = *options_.communicator;
  const nn::FlatParameters& params = optimizer_->parameters();
  int64_t elements = 0;
  while (next_bucket_ < buckets_.size()) start_bucket(next_bucket_++);
  for (const Bucket& b : buckets_) elements += b.count;
  // The group's sample and loss sums (adjacent in the step state): the normalization is global.
  static_assert(offsetof(kernels::StepState, group_loss) ==
                offsetof(kernels::StepState, group_samples) + sizeof(double));
  kernels::StepBuffers* buf = optimizer_->step_buffers();
  comm.start_all_reduce_sum(&buf->state.group_samples, 2, dist::Element::f64, params.device());
  comm.wait_all();
  comm.count_gradient_reduction(elements * static_cast<int64_t>(sizeof(float)));
}

namespace {
constexpr int64_t kLrTableSize = 4096;
}  // namespace

kernels::StepState Accumulator::read_state() const {
  const kernels::StepState s = optimizer_->read_step_state();
  known_updates_ = s.updates;
  attempts_since_read_ = 0;
  return s;
}

int64_t Accumulator::optimizer_steps() const { return read_state().updates - steps_offset_; }
int64_t Accumulator::skipped_steps() const { return read_state().skipped; }
float Accumulator::last_grad_norm() const { return read_state().grad_norm; }
float Accumulator::last_clip_factor() const { return read_state().clip; }
float Accumulator::last_lr() const { return read_state().lr; }
float Accumulator::loss_scale() const { return read_state().loss_scale; }
double Accumulator::epoch_loss_sum() const { return read_state().loss_sum; }
double Accumulator::epoch_units_stepped() const { return read_state().samples_sum; }

void Accumulator::write_lr_table(int64_t base_update) {
  const int64_t size = schedule_ ? kLrTableSize : 1;
  std::vector<float> lr(static_cast<std::size_t>(size));
  for (int64_t j = 0; j < size; ++j)
    lr[static_cast<std::size_t>(j)] = schedule_ ? schedule_->lr_at(base_update - steps_offset_ + j) : optimizer_->lr();
  if (!lr_table_.defined()) {
    MemoryCategoryScope scope(MemoryCategory::other);
    lr_table_ = Tensor::empty(Shape{kLrTableSize}, DType::f32, optimizer_->parameters().device());
  }
  copy_bytes(lr_table_.raw_data(), lr_table_.device(), lr.data(), Device::cpu(), lr.size() * sizeof(float));
  optimizer_->write_step_state(offsetof(kernels::StepState, lr_base), &base_update, sizeof(base_update));
  lr_table_size_ = size;
  lr_table_base_ = base_update;
  lr_table_constant_ = schedule_ ? -1.0f : optimizer_->lr();
}

std::vector<int64_t> Accumulator::state_to_allocate() { return {kLrTableSize * static_cast<int64_t>(sizeof(float))}; }

int accum_steps_for_epoch(const std::map<int, int>& schedule, int epoch) {
  auto it = schedule.upper_bound(epoch);  // first entry after `epoch`; the one before applies
  return it == schedule.begin() ? 1 : std::prev(it)->second;
}

std::map<int, int> parse_accum_schedule(const std::string& text) {
  std::map<int, int> out;
  auto bad = [&](const std::string& why) {
    return InvalidArgument("'" + text + "': " + why + " (expected EPOCH:STEPS,... starting at 0, e.g. 0:8,4:2)");
  };
  for (std::size_t pos = 0; pos <= text.size();) {
    const std::size_t comma = text.find(',', pos);
    const std::string item = text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    const std::size_t colon = item.find(':');
    if (colon == std::string::npos) throw bad("'" + item + "' has no ':'");
    char* end = nullptr;
    const long epoch = std::strtol(item.c_str(), &end, 10);
    if (end != item.c_str() + colon || epoch < 0 || epoch > 1000000) throw bad("bad epoch in '" + item + "'");
    const char* steps_text = item.c_str() + colon + 1;
    const long steps = std::strtol(steps_text, &end, 10);
    if (*steps_text == '\0' || *end != '\0' || steps <= 0 || steps > 1000000) throw bad("bad steps in '" + item + "'");
    if (!out.emplace(static_cast<int>(epoch), static_cast<int>(steps)).second)
      throw bad("epoch " + std::to_string(epoch) + " given twice");
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  if (out.empty() || out.begin()->first != 0) throw bad("the schedule must start at epoch 0");
  return out;
}

std::string accum_schedule_text(const std::map<int, int>& schedule) {
  std::string text;
  for (const auto& [epoch, steps] : schedule)
    text += (text.empty() ? "" : ",") + std::to_string(epoch) + ":" + std::to_string(steps);
  return text;
}

int64_t optimizer_steps_in_epochs(const std::map<int, int>& schedule, int64_t micro_batches, int epochs) {
  int64_t steps = 0;
  for (int e = 0; e < epochs; ++e) {
    const int n = accum_steps_for_epoch(schedule, e);
    steps += (micro_batches + n - 1) / n;
  }
  return steps;
}

void Accumulator::begin_epoch(int epoch, int64_t micro_batches, int64_t first) {
  CUMULUS_CHECK(micro_batches >= 0, InvalidArgument, "Accumulator: negative epoch length");
  CUMULUS_CHECK(first >= 0 && (micro_batches == 0 || first <= micro_batches), InvalidArgument,
                "Accumulator: first micro-batch ", first, " outside an epoch of ", micro_batches);
  CUMULUS_CHECK(group_mbs_ == 0, InvalidArgument, "Accumulator: begin_epoch(", epoch, ") with ", group_mbs_,
                " micro-batch(es) of the previous epoch not stepped; call flush() first");
  epoch_ = epoch;
  if (accum_override_ > 0) accum_steps_ = accum_override_;
  else
    accum_steps_ = options_.schedule.empty() ? options_.accum_steps : accum_steps_for_epoch(options_.schedule, epoch);
  mb_in_epoch_ = first;
  mb_epoch_len_ = micro_batches;
  const double zeros[2] = {0.0, 0.0};  // loss_sum, samples_sum
  static_assert(offsetof(kernels::StepState, samples_sum) == offsetof(kernels::StepState, loss_sum) + sizeof(double));
  optimizer_->write_step_state(offsetof(kernels::StepState, loss_sum), zeros, sizeof(zeros));
}

void Accumulator::check_micro_batch(int64_t units) const {
  CUMULUS_CHECK(units > 0, InvalidArgument, "Accumulator::backward: the unit count must be > 0, got ", units);
  CUMULUS_CHECK(
      !distributed() || dist::owner_of_micro_batch(mb_in_epoch_, options_.communicator->world_size()) ==
                            options_.communicator->rank(),
      InvalidArgument, "Accumulator::backward: micro-batch ", mb_in_epoch_, " of the epoch belongs to rank ",
      dist::owner_of_micro_batch(mb_in_epoch_, options_.communicator ? options_.communicator->world_size() : 1),
      " (dist::owner_of_micro_batch); call skip_micro_batch() for it");
  CUMULUS_CHECK(mb_epoch_len_ == 0 || mb_in_epoch_ < mb_epoch_len_, InvalidArgument,
                "Accumulator::backward: more micro-batches than the ", mb_epoch_len_, " announced for epoch ", epoch_);
}

void Accumulator::count_micro_batch(int64_t units) {
  group_samples_ += units;
  group_mbs_ += 1;
  mb_in_epoch_ += 1;
  mb_total_ += 1;
}

namespace {
bool takes_reduction(const std::string& op) { return op == "cross_entropy" || op == "mlp_cross_entropy"; }
// The fix for a mean-reduced loss made by `op`.
std::string summed_instead(const std::string& op) {
  if (op == "mean") return "ops::sum instead of ops::mean";
  if (takes_reduction(op)) return "ops::" + op + "(..., ops::Reduction::Sum)";
  return "the sum over the samples instead";
}
}  // namespace

void Accumulator::check_summed_loss(const Tensor& loss) {
  Node* node = loss.grad_fn().get();
  while (node != nullptr && node->output_reduction() == OutputReduction::none && node->next_edges().size() == 1)
    node = node->next_edges().front().node.get();
  if (node == nullptr || node->output_reduction() != OutputReduction::mean) return;
  const std::string op = node->name();
  throw InvalidArgument("Accumulator::backward: the loss is a mean (made by op '" + op + "'" +
                        (takes_reduction(op) ? " with Reduction::Mean" : "") +
                        "), so its gradient would be 1/B of the right one: the step divides by the group's "
                        "units itself. Pass the summed loss: " +
                        summed_instead(op));
}

void Accumulator::skip_micro_batch() {
  CUMULUS_CHECK(distributed(), InvalidArgument,
                "Accumulator::skip_micro_batch: only for data parallel training (a communicator of several ranks)");
  CUMULUS_CHECK(
      dist::owner_of_micro_batch(mb_in_epoch_, options_.communicator->world_size()) != options_.communicator->rank(),
      InvalidArgument, "Accumulator::skip_micro_batch: micro-batch ", mb_in_epoch_, " of the epoch is rank ",
      options_.communicator->rank(), "'s own");
  CUMULUS_CHECK(mb_epoch_len_ == 0 || mb_in_epoch_ < mb_epoch_len_, InvalidArgument,
                "Accumulator::skip_micro_batch: more micro-batches than the ", mb_epoch_len_, " announced for epoch ",
                epoch_);
  group_mbs_ += 1;
  mb_in_epoch_ += 1;
  mb_total_ += 1;
}

void Accumulator::backward(const Tensor& loss, int64_t units) {
  check_micro_batch(units);
  // micro_batches: each micro-batch contributes mean loss / N, whatever the group turns out to be.
  const float seed = options_.normalization == Normalization::micro_batches
                         ? 1.0f / (static_cast<float>(units) * static_cast<float>(accum_steps_))
                         : 1.0f;
  const Device device = optimizer_->parameters().device();
  CUMULUS_CHECK(loss.defined(), InvalidArgument, "Accumulator::backward: undefined loss");
  CUMULUS_CHECK(loss.device() == device, DeviceError, "Accumulator::backward: loss on ", loss.device().str(),
                ", parameters on ", device.str());
  // Normalization::none divides by nothing: any loss is what the caller wants.
  if (options_.normalization != Normalization::none) check_summed_loss(loss);
  // With loss scaling the seed is the device's current scale (Note [Loss scaling]).
  const Tensor seed_tensor = options_.loss_scaling.dynamic && loss.numel() == 1
                                 ? optimizer_->step_state_scalar(offsetof(kernels::StepState, loss_scale), loss.shape())
                                 : backward_seed(seed, loss);
  if (distributed() && last_own_micro_batch_in_group()) {
    // The rank's last backward before the step: each bucket is reduced as soon as it is final.
    run_backward(loss, seed_tensor, [this](const TensorImpl* leaf) {
      auto it = slot_of_leaf_.find(leaf);
      if (it == slot_of_leaf_.end()) return;
      // Buckets start in index order on every rank (collectives must match across ranks): a bucket
      // finished early waits for the ones before it.
      --buckets_[bucket_of_slot_[it->second]].slots_pending;
      while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].slots_pending == 0) {
        start_bucket(next_bucket_++);
        ++buckets_in_backward_;
      }
      options_.communicator->progress();
    });
  } else {
    run_backward(loss, seed_tensor);
  }
  kernels::StepBuffers* buf = optimizer_->step_buffers();
  CUMULUS_DISPATCH(device, ctx, kernels::record_micro_batch(buf->state, static_cast<double>(units), loss.item()),
                   kernels::record_micro_batch_cuda(buf, loss.data<float>(), static_cast<double>(units), ctx.stream()));
  count_micro_batch(units);
}

// Each kept seed is made once and never written again (a graph captured with it reads the right
// value at every replay, and it is never freed under one). Normalization::units uses 1 only;
// micro_batches one value per micro-batch size (the full one and an epoch's partial last one, in
// practice). Past kMaxSeeds values a seed is made per call, as run_backward(loss, value) would.
Tensor Accumulator::backward_seed(float value, const Tensor& loss) {
  for (const auto& [v, t] : seeds_)
    if (v == value && t.shape() == loss.shape() && t.device() == loss.device()) return t;
  if (seeds_.size() >= kMaxSeeds) {
    MemoryCategoryScope scope(MemoryCategory::backward_temporaries);
    return Tensor::full(loss.shape(), value, loss.device());
  }
  MemoryCategoryScope scope(MemoryCategory::other);
  seeds_.emplace_back(value, Tensor::full(loss.shape(), value, loss.device()));
  return seeds_.back().second;
}

bool Accumulator::ready() const {
  const bool group_full = group_mbs_ >= accum_steps_;
  const bool epoch_done = mb_epoch_len_ > 0 && mb_in_epoch_ == mb_epoch_len_;
  return group_mbs_ > 0 && (group_full || epoch_done);
}

bool Accumulator::step_if_ready() { return ready() && do_step(); }

TrainingCounters Accumulator::counters() const {
  const kernels::StepState st = read_state();
  TrainingCounters c;
  c.epoch = epoch_;
  c.micro_batch_index = mb_in_epoch_;
  c.micro_batches_total = mb_total_;
  c.optimizer_steps = st.updates - steps_offset_;
  c.skipped_steps = st.skipped;
  c.loss_scale = st.loss_scale;
  c.loss_scale_clean_steps = st.loss_scale_clean_steps;
  c.last_lr = st.lr;
  c.accum_steps_override = accum_override_;
  return c;
}

void Accumulator::check_accum_steps(int steps, const char* caller) const {
  CUMULUS_CHECK(steps > 0, InvalidArgument, "Accumulator::", caller, ": accumulation steps must be > 0, got ", steps);
  CUMULUS_CHECK(!distributed() || steps % options_.communicator->world_size() == 0, InvalidArgument,
                "Accumulator::", caller, ": ", steps,
                " accumulation steps (micro-batches of all ranks per step) do not divide over ",
                options_.communicator->world_size(), " ranks; give a multiple of the world size");
}

void Accumulator::set_accum_steps(int steps) {
  check_accum_steps(steps, "set_accum_steps");
  accum_override_ = steps;
  if (group_mbs_ == 0) accum_steps_ = steps;  // else finish_step_host applies it after this group's step
}

void Accumulator::restore(const TrainingCounters& c) {
  CUMULUS_CHECK(group_mbs_ == 0, InvalidArgument, "Accumulator::restore with micro-batches accumulated");
  CUMULUS_CHECK(c.epoch >= 0 && c.micro_batch_index >= 0 && c.micro_batches_total >= 0 && c.optimizer_steps >= 0 &&
                    c.skipped_steps >= 0 && c.accum_steps_override >= 0,
                InvalidArgument, "Accumulator::restore: negative counter");
  if (c.accum_steps_override > 0) check_accum_steps(c.accum_steps_override, "restore");
  epoch_ = c.epoch;
  mb_in_epoch_ = c.micro_batch_index;
  mb_total_ = c.micro_batches_total;
  optimizer_->write_step_state(offsetof(kernels::StepState, skipped), &c.skipped_steps, sizeof(c.skipped_steps));
  if (options_.loss_scaling.dynamic) {
    CUMULUS_CHECK(std::isfinite(c.loss_scale) && c.loss_scale > 0.0f && c.loss_scale_clean_steps >= 0 &&
                      c.loss_scale_clean_steps < options_.loss_scaling.growth_interval,
                  InvalidArgument, "Accumulator::restore: loss scale ", c.loss_scale, " with ",
                  c.loss_scale_clean_steps, " clean steps (growth interval ", options_.loss_scaling.growth_interval,
                  ")");
    // Saved before the floor existed (or under a lower one): resumed where the rule now holds it.
    const float scale = std::max(c.loss_scale, options_.loss_scaling.min_scale);
    optimizer_->write_step_state(offsetof(kernels::StepState, loss_scale), &scale, sizeof(scale));
    optimizer_->write_step_state(offsetof(kernels::StepState, loss_scale_clean_steps), &c.loss_scale_clean_steps,
                                 sizeof(c.loss_scale_clean_steps));
  }
  CUMULUS_CHECK(std::isfinite(c.last_lr), InvalidArgument, "Accumulator::restore: last learning rate ", c.last_lr);
  optimizer_->write_step_state(offsetof(kernels::StepState, lr), &c.last_lr, sizeof(c.last_lr));  // the next step's own
  accum_override_ = c.accum_steps_override;  // begin_epoch() applies it
  steps_offset_ = read_state().updates - c.optimizer_steps;
  attempted_ = c.optimizer_steps + c.skipped_steps;
  lr_table_size_ = 0;  // rewritten at the next step
}

bool Accumulator::flush() { return group_mbs_ > 0 && do_step(); }

void Accumulator::prepare_step_host() {
  NoGradGuard no_grad;
  optimizer_->parameters().zero_stale_gradients();
  optimizer_->prepare_frozen();  // Note [Frozen parameters]
  if (!schedule_) {
    if (lr_table_size_ != 1 || lr_table_constant_ != optimizer_->lr()) write_lr_table(0);
    return;
  }
  // The update count is now at most known_updates_ + attempts_since_read_ (Note [Learning-rate table]).
  if (lr_table_size_ == 0 || known_updates_ + attempts_since_read_ >= lr_table_base_ + lr_table_size_) {
    read_state();
    write_lr_table(known_updates_);
  }
}

void Accumulator::launch_step() {
  NoGradGuard no_grad;
  kernels::StepConfig config;
  config.divide_by_samples = options_.normalization == Normalization::units ? 1 : 0;
  config.need_norm = options_.clip_grad_norm > 0.0f || options_.skip_non_finite ? 1 : 0;
  config.skip_non_finite = options_.skip_non_finite ? 1 : 0;
  config.clip_grad_norm = options_.clip_grad_norm;
  config.lr_table_size = static_cast<int32_t>(lr_table_size_);
  const LossScaling& ls = options_.loss_scaling;
  config.dynamic_loss_scale = ls.dynamic ? 1 : 0;
  config.loss_scale_growth_interval = ls.growth_interval;
  config.loss_scale_growth = ls.growth_factor;
  config.loss_scale_backoff = ls.backoff_factor;
  config.loss_scale_min = ls.min_scale;
  const nn::FlatParameters& params = optimizer_->parameters();
  kernels::StepBuffers* buf = optimizer_->step_buffers();
  const float* grad = params.gradients().data<float>();
  const float* table = lr_table_.data<float>();
  const int64_t n = params.size();
  if (distributed()) reduce_across_ranks();
  CUMULUS_DISPATCH(
      params.device(), ctx,
      kernels::prepare_step(buf->state, config.need_norm ? kernels::sum_squares_cpu(grad, n) : 0.0, config, table),
      kernels::grad_norm_and_prepare_step_cuda(grad, n, buf, config, table, ctx.stream()));
  optimizer_->apply_prepared_update();
}

void Accumulator::finish_step_host() {
  // grad() now says the step released the gradient (Note [Why a gradient is undefined]).
  optimizer_->parameters().mark_gradients_stale(StaleReason::optimizer_step);
  for (Bucket& b : buckets_) b.slots_pending = static_cast<int>(b.end_slot - b.first_slot);
  next_bucket_ = 0;
  ++attempted_;
  ++attempts_since_read_;
  group_samples_ = 0;
  group_mbs_ = 0;
  if (accum_override_ > 0) accum_steps_ = accum_override_;  // a set_accum_steps made mid-group
}

bool Accumulator::do_step() {
  prepare_step_host();
  launch_step();
  finish_step_host();
  return true;
}

}  // namespace cumulus::optim
