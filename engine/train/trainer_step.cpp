// Note [Exact normalization]
// Each micro-batch's loss is a sum over its units (samples for a classifier, tokens for a language
// model: whatever the caller's loss sums over, and the count it passes with the micro-batch), and backward
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
// step state's loss_scale itself (a view: StepStateMemory::view), so the device decides S
// and no host synchronization or fill is needed, captured graphs included. With accumulation:
// - S changes only in the step (kernels::prepare_step), never inside a group, so every micro-batch of a group
//   adds gradients of the same scale.
// - A non-finite value anywhere in the group makes the accumulated gradient's norm non-finite: the
//   group is skipped (weights and optimizer state untouched, counted), S is multiplied by the
//   backoff (0.5), and the count of clean groups restarts; growth_interval clean groups in a row
//   multiply S by the growth factor (2).
// - S holds at a floor, LossScaling::min_scale (default 1), rather than stopping the run: without
//   one, repeated overflow would back it off to 0, and from there every group would be skipped for
//   good (a zero seed, then 1 / 0 in the unscaling), silently. A group that still overflows at the
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
// Note [ZeRO]
// Data parallel ranks hold the same weights and, once reduced, the same gradient, so each would
// apply the same update to every element. With zero_stage 1 (ZeRO stage 1, Rajbhandari et al.,
// 2020) each rank keeps the optimizer state of, and updates, only its shard of the flat parameters
// (dist::shard_layout, about 1/N of the elements: Optimizer::keep_shard), and the step ends with an
// all-gather of the updated shards. The gradient is still all-reduced whole (stage 2 would
// reduce-scatter it), so the norm, the clipping, the non-finite guard and the loss scale are
// decided as before, alike on every rank; the update is elementwise, so every element gets the
// bits the unsharded update gives it: ZeRO-1 trains bit for bit as plain data parallel (tested). A
// skipped step updates nothing, and the gather hands back the values every rank already has.
// zero_stage 2 also shards the gradient (Note [ZeRO stage 2] in engine/dist/sharded_gradients.cpp):
// the norm is then the ranks' shards' together, and the numbers data parallel's to float rounding.
//
// Note [Learning-rate table]
// The schedule is host code (LRSchedule::lr_at), but whether a step is taken, and so which step
// index the next one has, is known only on the device. The device therefore reads the rate from
// a table of lr_at(k) for a window of update counts starting at the count the host last read.
// Every attempt raises the count by at most one, so the host knows when the window could run out
// and only then reads the count and refills (once per kLrTableSize steps at most; both are
// ordinary stream-ordered work, never inside a captured step). Without a schedule the table is
// the optimizer's lr, rewritten when set_lr changes it.
#include <algorithm>
#include <utility>

#include "cumulus/autograd/grad_mode.h"
#include "cumulus/dist/communicator.h"
#include "cumulus/memory/category.h"
#include "cumulus/train/trainer.h"
#include "engine/ops/internal.h"
#include "engine/tensor/host_reads.h"
#include "trainer_parts.h"

namespace cumulus::train {

using optim::LRSchedule;
using optim::Optimizer;
using optim::UpdateScalars;

bool Trainer::step_if_ready() {
  const bool stepped = step(true);
  if (stepped) parts_->log_step();
  return stepped;
}

bool Trainer::flush() {
  const bool stepped = step(false);
  if (stepped) parts_->log_step();
  return stepped;
}

// A step attempt with the tracker's records around it: eager steps are timed (with the reductions
// they waited for), replayed ones recorded as graph steps.
bool Trainer::step(bool only_if_ready) {
  const Parts& p = *parts_;
  const GroupPosition& pos = p.position;
  if (only_if_ready ? !pos.ready() : pos.group_micro_batches == 0) return false;
  const bool eager = !p.graphs_now();
  if (p.tracker && eager) p.tracker->begin_step();
  run_step();
  if (p.tracker && eager) {
    // The step's reductions, those started during the last backward included.
    dist::Communicator* comm = p.options.communicator.get();
    p.tracker->end_step(pos.attempted_steps, p.optimizer->state_bytes(),
                        comm ? comm->take_recent_spans() : TimeSpans());
  } else if (p.tracker) {
    memory::MemoryTrackerAccess::add_graph_step(*p.tracker, pos.attempted_steps, p.optimizer->state_bytes());
  }
  return true;
}

// One optimizer step over the group accumulated so far.
void Trainer::run_step() {
  NoGradGuard no_grad;
  Parts& p = *parts_;
  Optimizer& opt = *p.optimizer;
  // Stale gradient slots read as zeros; frozen parameters are read (host work, never captured).
  opt.prepare_update();
  // The learning-rate table covers the update this step may make.
  p.lr_window.prepare(p.state, p.steps_offset);
  // Each part that does work runs in an OpScope of its own ("reduce gradients", "step decision",
  // "optimizer update", "gather shards"): out-of-memory reports and op time profiles name it.
  const Parts::Ran ran = p.run_or_replay(p.step_graph(), [&] {
    // Data parallel: the gradient, the group's units and its loss summed across ranks.
    p.reduce_across_ranks();
    {  // The norm, the skip decision, the clip factor and the learning rate, decided on the device.
      OpScope op("step decision");
      p.decide_step();
    }
    {  // The optimizer's update with the decided scalars (nothing moves where the step is skipped).
      OpScope op("optimizer update");
      opt.apply_update();
    }
    // ZeRO: every rank's updated shard to every rank (Note [ZeRO]).
    p.gather_shards();
  });
  ++(ran == Parts::Ran::eagerly ? p.stats.eager_steps : p.stats.replayed_steps);
#if CUMULUS_WITH_CUDA
  if (ran == Parts::Ran::captured) p.stats.kernels_per_step = p.captured_step->graph.kernel_nodes();
#endif
  // The gradients are consumed; the next micro-batch starts a group.
  p.end_group();
}

Trainer::Parts::Ran Trainer::Parts::run_or_replay(Captured* graph, const std::function<void()>& work) {
  if (graph == nullptr || graph->seen++ == 0) {
    work();
    return Ran::eagerly;
  }
#if CUMULUS_WITH_CUDA
  const bool capturing = !graph->captured();
  if (capturing) {
    const Device device = optimizer->parameters().device();
    graph->graph = cuda::Graph::capture(cuda::context(device.index()), work);
    ++stats.captures;
  }
  graph->graph.launch();
  return capturing ? Ran::captured : Ran::replayed;
#else
  work();  // unreachable: the constructor refuses graphs
  return Ran::eagerly;
#endif
}

// The step graph, or null when the step runs eagerly. Its update reads the frozen mask, allocated
// at the first freeze (with the optimizer's missed counts): a graph captured before has none.
Trainer::Captured* Trainer::Parts::step_graph() {
  if (!graphs_now()) return nullptr;
  check_graphs_allowed();
  const void* frozen_mask = optimizer->parameters().frozen_chunks();
  if (captured_step && captured_step->frozen_mask != frozen_mask) captured_step.reset();
  if (!captured_step) {
    captured_step = std::make_unique<Captured>();
    captured_step->frozen_mask = frozen_mask;
  }
  return captured_step.get();
}

// An update on the host waits for its copies (Note [Optimizer state on the host]): no graph holds it.
void Trainer::Parts::check_graphs_allowed() const {
  CUMULUS_CHECK(!use_graphs || optimizer->state_placement() == optim::StatePlacement::device, InvalidArgument,
                "Trainer: CUDA graphs cannot replay an optimizer whose state is placed on the host (its update waits "
                "for the copies to the host); run eagerly or keep the state on the device");
}

void Trainer::Parts::reduce_across_ranks() {
  if (!buckets && !sharded) return;
  OpScope op("reduce gradients");
  dist::Communicator& comm = *options.communicator;
  if (buckets) buckets->start_rest();
  else reduce_missing_rounds();
  // The group's units and loss: the normalization is global.
  static_assert(sizeof(kernels::UnitsAndLoss) == 2 * sizeof(double), "two adjacent doubles");
  comm.start_all_reduce_sum(&state.state()->group, 2, dist::Element::f64, optimizer->parameters().device());
  comm.wait_all();
  comm.count_gradient_reduction(buckets ? buckets->bytes() : sharded->round_bytes() * sharded->rounds());
}

// Each rank's micro-batches of the group are its rounds; in a short group some ranks have one
// fewer than others (dist::owner_of_micro_batch), which they make up with zeros.
void Trainer::Parts::reduce_missing_rounds() {
  const int world = options.communicator->world_size();
  std::vector<int> per_rank(static_cast<std::size_t>(world), 0);
  for (int64_t i = position.in_epoch - position.group_micro_batches; i < position.in_epoch; ++i)
    ++per_rank[static_cast<std::size_t>(dist::owner_of_micro_batch(i, world))];
  const int most = *std::max_element(per_rank.begin(), per_rank.end());
  while (sharded->rounds() < most) sharded->reduce_zeros();
}

void Trainer::Parts::keep_shard() {
  nn::FlatParameters& params = optimizer->parameters();
  const dist::Communicator& comm = *options.communicator;
  shards = dist::shard_layout(params.size(), comm.world_size(), nn::FlatParameters::kAlignElements);
  const dist::Shard& own = shards[static_cast<std::size_t>(comm.rank())];
  optimizer->keep_shard(own.offset, own.count);
}

void Trainer::Parts::gather_shards() {
  if (shards.empty()) return;
  OpScope op("gather shards");
  nn::FlatParameters& params = optimizer->parameters();
  options.communicator->all_gather(params.values().data<float>(), shards, params.device());
}

namespace {
// A state array gathered whole at the root from every rank's `held` part (Note [ZeRO]): `whole`
// elements, one per size / whole parameter elements; shards of the flat parameters. `held` is the
// shard's part, or the whole array of which this rank's part counts (the frozen chunks' missed
// updates). Moved as 4-byte words: every shard's bytes start and end on one (64-element shards).
Tensor gather_state_array(const Tensor& held, int64_t whole, int64_t size, const std::vector<dist::Shard>& shards,
                          dist::Communicator& comm) {
  const int64_t block = size / whole, bytes = static_cast<int64_t>(dtype_size(held.dtype()));
  std::vector<dist::Shard> words;
  for (const dist::Shard& s : shards) {
    CUMULUS_CHECK((s.offset / block * bytes) % 4 == 0 && (s.count / block * bytes) % 4 == 0, Error,
                  "Trainer::optimizer_state: a shard of ", dtype_name(held.dtype()),
                  " state does not fill 4-byte words");
    words.push_back({s.offset / block * bytes / 4, s.count / block * bytes / 4});
  }
  const dist::Shard& own = words[static_cast<std::size_t>(comm.rank())];
  const char* own_bytes = static_cast<const char*>(held.raw_data()) + (held.numel() == whole ? own.offset * 4 : 0);
  if (!comm.is_root()) {  // sent, never written
    comm.gather_to_root(reinterpret_cast<float*>(const_cast<char*>(own_bytes)), words, held.device());
    return Tensor();
  }
  MemoryCategoryScope scope(MemoryCategory::other);
  Tensor out = Tensor::empty(Shape{whole}, held.dtype(), held.device());
  char* into = static_cast<char*>(out.raw_data());
  copy_bytes(into + own.offset * 4, out.device(), own_bytes, held.device(), static_cast<std::size_t>(own.count * 4));
  comm.gather_to_root(reinterpret_cast<float*>(into), words, out.device());
  return out;
}
}  // namespace

std::vector<std::pair<std::string, Tensor>> Trainer::optimizer_state() const {
  const Parts& p = *parts_;
  if (p.shards.empty()) return p.optimizer->state();
  std::vector<std::pair<std::string, Tensor>> out;
  const int64_t size = p.optimizer->parameters().size();
  const std::vector<optim::Optimizer::StateTensorInfo> layout = p.optimizer->state_layout();
  for (const auto& entry : p.optimizer->state()) {
    const std::string& name = entry.first;  // a named variable: a lambda may not capture a structured binding
    auto info = std::find_if(layout.begin(), layout.end(), [&](const auto& i) { return i.name == name; });
    CUMULUS_CHECK(info != layout.end(), Error, "Trainer::optimizer_state: no layout for '", name, "'");
    Tensor whole = gather_state_array(entry.second, info->shape.numel(), size, p.shards, *p.options.communicator);
    if (whole.defined()) out.emplace_back(name, std::move(whole));
  }
  return out;
}

// The norm of the accumulated gradient and kernels::prepare_step, one launch on CUDA.
void Trainer::Parts::decide_step() {
  const kernels::StepConfig config = step_config();
  const Tensor& grad = optimizer->parameters().gradients();
  UpdateScalars* scalars = optimizer->update_scalars();
  if (sharded && config.need_norm && grad.device().is_cuda()) return decide_sharded_step_cuda(config);
  CUMULUS_DISPATCH(grad.device(), ctx,
                   kernels::prepare_step(state.buffers()->state, *scalars,
                                         config.need_norm ? gradient_sum_of_squares() : 0.0, config, lr_window.table()),
                   kernels::grad_norm_and_prepare_step_cuda(grad.data<float>(), grad.numel(), state.buffers(), scalars,
                                                            config, lr_window.table(), ctx.stream()));
}

// ZeRO-2 on CUDA: this rank's shard's squared norm, summed across the ranks in place (NCCL, on the
// stream), then the decision from the sum: three launches where data parallel takes one. Written
// without a GPU at hand: it has not run on one.
void Trainer::Parts::decide_sharded_step_cuda([[maybe_unused]] const kernels::StepConfig& config) {
  const Tensor& grad = optimizer->parameters().gradients();
  kernels::StepBuffers* buffers = state.buffers();
  CUMULUS_DISPATCH(
      grad.device(), ctx, (void)0,
      kernels::grad_sum_squares_cuda(own_shard_gradient(), sharded->own_shard().count, buffers, ctx.stream()));
  options.communicator->all_reduce_sum(&buffers->sum_squares, 1, dist::Element::f64, grad.device());
  CUMULUS_DISPATCH(
      grad.device(), ctx, (void)0,
      kernels::prepare_step_cuda(buffers, optimizer->update_scalars(), config, lr_window.table(), ctx.stream()));
}

kernels::StepConfig Trainer::Parts::step_config() const {
  const AccumulationOptions& o = options;
  kernels::StepConfig config;
  config.divide_by_units = o.normalization == Normalization::units ? 1 : 0;
  config.need_norm = o.clip_grad_norm > 0.0f || o.skip_non_finite ? 1 : 0;
  config.skip_non_finite = o.skip_non_finite ? 1 : 0;
  config.clip_grad_norm = o.clip_grad_norm;
  config.lr_table_size = lr_window.size();
  config.dynamic_loss_scale = o.loss_scaling.dynamic ? 1 : 0;
  config.loss_scale_growth_interval = o.loss_scaling.growth_interval;
  config.loss_scale_growth = o.loss_scaling.growth_factor;
  config.loss_scale_backoff = o.loss_scaling.backoff_factor;
  config.loss_scale_min = o.loss_scaling.min_scale;
  return config;
}

// On the CPU. Reduced every micro-batch (ZeRO-2): every rank's shard's sum, the same on every rank
// (Note [ZeRO stage 2]).
double Trainer::Parts::gradient_sum_of_squares() const {
  const Tensor& grad = optimizer->parameters().gradients();
  if (!sharded) return kernels::sum_squares_cpu(grad.data<float>(), grad.numel());
  double sum = kernels::sum_squares_cpu(own_shard_gradient(), sharded->own_shard().count);
  options.communicator->all_reduce_sum(&sum, 1, dist::Element::f64, Device::cpu());
  return sum;
}

// Reduced every micro-batch: this rank's shard of the layout in the gradient it keeps (the shard
// itself under ZeRO-2, the whole gradient otherwise).
const float* Trainer::Parts::own_shard_gradient() const {
  const nn::FlatParameters& params = optimizer->parameters();
  return params.gradients().data<float>() + (sharded->own_shard().offset - params.gradients_offset());
}

// grad() now says the step released the gradient (Note [Why a gradient is undefined]).
void Trainer::Parts::end_group() {
  optimizer->parameters().mark_gradients_stale(StaleReason::optimizer_step);
  if (buckets) buckets->rearm();
  if (sharded) sharded->start_group();
  lr_window.count_attempt();
  position.end_group();
}

Trainer::Parts::Readings Trainer::Parts::read_step() const {
  Readings r;
  read_to_host(optimizer->parameters().device(), {{&r.state, state.state(), sizeof(r.state)},
                                                  {&r.scalars, optimizer->update_scalars(), sizeof(r.scalars)}});
  return r;
}

// The group's loss is the difference of the epoch's sums since the last step (begin_epoch resets both).
void Trainer::Parts::log_step() {
  if (!on_step) return;
  const Readings now = read_step();
  const kernels::StepState& st = now.state;
  const UpdateScalars& u = now.scalars;
  StepLog log;
  log.step = u.updates - steps_offset;
  log.epoch = position.epoch;
  log.loss = (st.epoch.loss - logged_loss) / std::max(st.epoch.units - logged_units, 1.0);  // mean per unit
  log.lr = u.lr;
  logged_loss = st.epoch.loss;
  logged_units = st.epoch.units;
  on_step(log);
}

}  // namespace cumulus::train
