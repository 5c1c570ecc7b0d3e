// Note [Training API]
// A user's loop needs, per micro-batch and step: the Accumulator's backward and step, five
// MemoryTracker calls around them, and on CUDA the graph capture and replay of both. Spread over
// the loop (as apps and tests once wrote it) that is easy to get subtly wrong: a missed
// end_forward, a replay that records nothing. The Trainer makes all of them from one call per
// micro-batch and one per step; the loop keeps its own shape (its data, its model, its closure
// returning the summed loss), as Lightning's Trainer keeps the LightningModule's training_step.
// Decisions:
//  - It owns its Accumulator. The step count, the LR schedule's position (the update count less
//    steps_offset_) and the loss scale live there; changing the accumulation steps used to mean a
//    new Accumulator, which restarted all three silently. set_accum_steps changes N on the same
//    one. The Accumulator is the policy underneath, internal to the runtime (the tests check it
//    and the benchmarks time its parts directly); the Trainer is the one public driver.
//  - set_accum_steps mid-group is deferred, not refused: the group in progress keeps the size its
//    first micro-batches were normalized for (Normalization::micro_batches seeds 1 / (samples *
//    N)), and a caller (a callback, a budget that changed) need not know where the group stands.
//    The new N then holds for the rest of the run, replacing the per-epoch schedule, which would
//    otherwise undo it silently at the next epoch; counters() carries it so a resume keeps it.
//  - The tracker is an option, attachable later (set_tracker): the app makes its tracker after a
//    checkpoint is restored. The counters a report quotes are the Accumulator's, forwarded.
//
// Note [Units]
// A loss is summed over something: a classifier's over its samples, a language model's over B x T
// tokens, a segmentation model's over pixels. The step divides by how many of them the group held
// (Note [Exact normalization]), so the count passed with each micro-batch must be the count the
// loss sums over. The runtime once assumed a row is a sample: a language model following the
// quickstart then got a per-sequence mean loss and gradients T times too large, silently. So the
// unit is the user's, said once where the data is: TensorDataset::set_units_per_row(T) (default 1,
// samples); every Batch says how many units it holds (Batch::units, DataLoader::units(i)), and the
// Trainer (train_epoch), the planner's request (plan_request: effective batch and limit in units,
// micro-batches of whole rows) and the tracker (told micro-batches of N units, it checks what it is
// fed: MemoryTracker::begin_micro_batch) count the same units. StepLog::loss and train_epoch's
// result are means per unit.
//
// Note [Captured training]
// A micro-batch of the seed MLP is ~20 kernels of a few microseconds each; launched one by one
// from the host, the launches, not the GPU, set the pace. The Trainer records each distinct
// micro-batch once as a CUDA graph and replays it with one host call; the same for the device
// part of the optimizer step (Accumulator::launch_step). What makes a replay equal to an eager run:
//  - inputs come from device state: the DataLoader's cursor, the step state's counters and the
//    learning-rate table (Note [Device-side step], Note [Learning-rate table]);
//  - the gradient sinks' modes (overwrite after a step, accumulate otherwise) are captured, so a
//    graph is keyed by the sample count and the stale pattern of the gradient slots: with 16 x 4
//    that is two graphs, "first micro-batch of a group" and "the others"; the partial last
//    micro-batch of an epoch gets its own pair; with Normalization::micro_batches the backward
//    seed 1 / (samples * N) is captured too, so N joins the key (a set_accum_steps or a new
//    epoch of the schedule makes new graphs instead of replaying the old seed);
//  - freezing or unfreezing a parameter changes which gradients a micro-batch computes, so the
//    frozen pattern is part of the key too; the step graph reads the frozen mask's memory, which
//    the host refreshes before each replay, and is captured afresh when the mask or the optimizer's
//    count of missed updates is first allocated (Note [Frozen parameters] in kernels/optim_rules.h);
//  - the host state a micro-batch changes (the Accumulator's counters, the slots' stale flags) is
//    replayed on the host too;
//  - memory: the capture allocates from the graph pool (Note [Graph pool]), so a replay allocates
//    nothing and the addresses it writes are never handed out to anything else.
// A key seen for the first time runs eagerly (that creates handles and lazily allocated state,
// which must not happen during a capture); the second time it is captured, then launched. A
// captured key costs one graph launch per call. The memory a graph uses is measured while it is
// captured (the allocations are real, only the kernels are deferred) and reported for every
// replay (MemoryTracker::add_graph_micro_batch); per-micro-batch times of replays are not taken.
// While the tracker records its timeline (the first optimizer steps) everything runs eagerly, so
// the trace shows true phases.
#include "cumulus/runtime/trainer.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "accumulator.h"
#include "cumulus/autograd/grad_mode.h"
#include "cumulus/core/error.h"
#include "cumulus/core/precision.h"
#include "cumulus/dist/communicator.h"
#include "cumulus/nn/flat_parameters.h"
#include "cumulus/nn/module.h"
#include "cumulus/ops/loss.h"
#include "cumulus/ops/metrics.h"
#include "engine/data/loader_access.h"
#include "engine/tensor/tensor_impl.h"

#if CUMULUS_WITH_CUDA
#include "engine/core/cuda_context.h"
#endif

namespace cumulus::optim {

struct Trainer::Captured {
  int64_t seen = 0;
#if CUMULUS_WITH_CUDA
  cuda::Graph graph;
#endif
  std::vector<bool> stale_after;      // the slots' stale flags after the micro-batch
  const void* frozen_mask = nullptr;  // the step graph: the frozen mask it was captured with
  memory::MicroBatchRecord memory;    // measured while capturing
  bool captured() const {
#if CUMULUS_WITH_CUDA
    return graph.valid();
#else
    return false;
#endif
  }
};

Trainer::Trainer(std::shared_ptr<Optimizer> optimizer, const TrainerOptions& options,
                 std::shared_ptr<const LRSchedule> schedule)
    : acc_(std::make_unique<Accumulator>(std::move(optimizer), options, std::move(schedule))),
      use_graphs_(options.use_graphs),
      tracker_(options.tracker),
      on_step_(options.on_step) {
  CUMULUS_CHECK(!use_graphs_ || acc_->optimizer().parameters().device().is_cuda(), InvalidArgument,
                "Trainer: CUDA graphs need the parameters on a CUDA device, they are on ",
                acc_->optimizer().parameters().device().str());
  // Not yet: the reductions across ranks would have to be captured too (NCCL allows it; untested).
  CUMULUS_CHECK(!use_graphs_ || !acc_->distributed(), InvalidArgument,
                "Trainer: CUDA graphs with data parallel training are not supported yet; run eagerly");
#if !CUMULUS_WITH_CUDA
  CUMULUS_CHECK(!use_graphs_, InvalidArgument, "Trainer: cumulus was built without CUDA");
#endif
}

Trainer::~Trainer() = default;

void Trainer::begin_epoch(int epoch, int64_t micro_batches, int64_t first) {
  acc_->begin_epoch(epoch, micro_batches, first);
  logged_loss_ = logged_units_ = 0.0;
}
void Trainer::skip_micro_batch() { acc_->skip_micro_batch(); }
void Trainer::set_accum_steps(int steps) { acc_->set_accum_steps(steps); }

TrainingCounters Trainer::counters() const { return acc_->counters(); }
void Trainer::restore(const TrainingCounters& counters) { acc_->restore(counters); }
int Trainer::epoch() const { return acc_->epoch(); }
int Trainer::accum_steps() const { return acc_->accum_steps(); }
int64_t Trainer::micro_batch_index() const { return acc_->micro_batch_index(); }
int64_t Trainer::micro_batches_total() const { return acc_->micro_batches_total(); }
int Trainer::micro_batches_in_group() const { return acc_->micro_batches_in_group(); }
int64_t Trainer::units_in_group() const { return acc_->units_in_group(); }
int64_t Trainer::attempted_steps() const { return acc_->attempted_steps(); }
int64_t Trainer::optimizer_steps() const { return acc_->optimizer_steps(); }
int64_t Trainer::skipped_steps() const { return acc_->skipped_steps(); }
float Trainer::last_grad_norm() const { return acc_->last_grad_norm(); }
float Trainer::last_clip_factor() const { return acc_->last_clip_factor(); }
float Trainer::last_lr() const { return acc_->last_lr(); }
float Trainer::loss_scale() const { return acc_->loss_scale(); }
double Trainer::epoch_loss_sum() const { return acc_->epoch_loss_sum(); }
double Trainer::epoch_units_stepped() const { return acc_->epoch_units_stepped(); }
std::size_t Trainer::gradient_buckets() const { return acc_->gradient_buckets(); }
int64_t Trainer::buckets_started_in_backward() const { return acc_->buckets_started_in_backward(); }
dist::Communicator* Trainer::communicator() const { return acc_->communicator(); }
Optimizer& Trainer::optimizer() { return acc_->optimizer(); }
std::vector<int64_t> Trainer::state_to_allocate() { return Accumulator::state_to_allocate(); }
Accumulator& accumulator_of(Trainer& trainer) { return *trainer.acc_; }

void Trainer::reset() {
  micro_batches_.clear();
  step_.reset();
}

std::vector<bool> Trainer::stale_pattern() const {
  const auto& slots = acc_->optimizer_->parameters().slots();
  std::vector<bool> stale(slots.size());
  for (std::size_t i = 0; i < slots.size(); ++i) stale[i] = slots[i].param.grad_stale();
  return stale;
}

std::vector<bool> Trainer::frozen_pattern() const {
  const auto& slots = acc_->optimizer_->parameters().slots();
  std::vector<bool> frozen(slots.size());
  for (std::size_t i = 0; i < slots.size(); ++i) frozen[i] = !slots[i].param.requires_grad();
  return frozen;
}

// Graphs stay off while the tracker records its timeline, so the trace shows true phases.
bool Trainer::graphs_now() const { return use_graphs_ && !(tracker_ && tracker_->timeline_active()); }

void Trainer::micro_batch(int64_t units, const std::function<Tensor()>& forward_loss) {
  if (!graphs_now()) return eager_micro_batch(units, forward_loss);
  const int seed_steps = acc_->options_.normalization == Normalization::micro_batches ? acc_->accum_steps() : 0;
  std::unique_ptr<Captured>& c = micro_batches_[GraphKey{units, stale_pattern(), frozen_pattern(), seed_steps}];
  if (!c) c = std::make_unique<Captured>();
  if (c->seen++ == 0) return eager_micro_batch(units, forward_loss);
  graph_micro_batch(*c, units, forward_loss);
}

void Trainer::eager_micro_batch(int64_t units, const std::function<Tensor()>& forward_loss) {
  if (tracker_) tracker_->begin_micro_batch(acc_->epoch(), acc_->micro_batch_index(), units);
  Tensor loss = forward_loss();
  if (tracker_) tracker_->end_forward();
  acc_->backward(loss, units);
  loss = Tensor();  // freed inside the record: the loss is the micro-batch's
  if (tracker_) tracker_->end_backward();
  ++stats_.eager_micro_batches;
}

// The second time a key is seen it is captured (the host runs the closure and backward: the
// allocations and the bookkeeping are real, the kernels recorded), then launched; later, the
// graph is launched after the host side of the micro-batch is replayed.
void Trainer::graph_micro_batch(Captured& c, int64_t units, const std::function<Tensor()>& forward_loss) {
#if CUMULUS_WITH_CUDA
  const int epoch = acc_->epoch();
  const int64_t index = acc_->micro_batch_index();
  if (!c.captured()) {
    CachingAllocator& alloc = allocator_for(acc_->optimizer().parameters().device());
    alloc.reset_peak();
    const int64_t activations_before = alloc.stats()[MemoryCategory::activations].current;
    memory::MicroBatchRecord& r = c.memory;
    r.units = units;
    cuda::Context& ctx = cuda::context(acc_->optimizer().parameters().device().index());
    c.graph = cuda::Graph::capture(ctx, [&] {
      Tensor loss = forward_loss();
      r.activation_bytes = alloc.stats()[MemoryCategory::activations].current - activations_before;
      acc_->backward(loss, units);
    });
    const MemoryStats st = alloc.stats();
    r.peak_bytes = st.allocated_peak;
    r.peak_by_category = st.at_peak;
    r.reserved_bytes = st.reserved;
    c.stale_after = stale_pattern();
    stats_.kernels_per_micro_batch = c.graph.kernel_nodes();
    ++stats_.captures;
  } else {
    acc_->check_micro_batch(units);
    acc_->count_micro_batch(units);
    const auto& slots = acc_->optimizer().parameters().slots();
    for (std::size_t i = 0; i < slots.size(); ++i)
      if (!c.stale_after[i]) impl_of(slots[i].param)->autograd.grad_stale = false;
  }
  c.graph.launch();
  ++stats_.replayed_micro_batches;
  if (tracker_) {
    memory::MicroBatchRecord r = c.memory;
    r.epoch = epoch;
    r.index = index;
    tracker_->add_graph_micro_batch(r);
  }
#else
  (void)c, (void)units, (void)forward_loss;  // unreachable: the constructor refuses graphs
#endif
}

bool Trainer::step_if_ready() {
  const bool stepped = step(true);
  if (stepped) log_step();
  return stepped;
}

bool Trainer::flush() {
  const bool stepped = step(false);
  if (stepped) log_step();
  return stepped;
}

// The group's loss is the difference of the epoch's sums since the last step (begin_epoch resets both).
void Trainer::log_step() {
  if (!on_step_) return;
  const double loss = acc_->epoch_loss_sum(), units = acc_->epoch_units_stepped();
  StepLog log;
  log.step = acc_->optimizer_steps();
  log.epoch = acc_->epoch();
  log.loss = (loss - logged_loss_) / std::max(units - logged_units_, 1.0);  // mean per unit
  log.lr = acc_->last_lr();
  logged_loss_ = loss;
  logged_units_ = units;
  on_step_(log);
}

bool Trainer::step(bool only_if_ready) {
  if (only_if_ready ? !acc_->ready() : acc_->micro_batches_in_group() == 0) return false;
  Optimizer& opt = acc_->optimizer();
  if (!graphs_now()) {
    if (tracker_) tracker_->begin_step();
    acc_->do_step();
    // The step's reductions, those started during the last backward included.
    dist::Communicator* comm = acc_->communicator();
    TimeSpans reductions = comm ? comm->take_recent_spans() : TimeSpans();
    if (tracker_) tracker_->end_step(acc_->attempted_steps(), opt.state_bytes(), std::move(reductions));
    ++stats_.eager_steps;
    return true;
  }
  acc_->prepare_step_host();
  // The update's arguments include the frozen mask, allocated at the first freeze (with the
  // optimizer's missed counts): a graph captured before has none.
  const void* frozen_mask = opt.parameters().frozen_chunks();
  if (step_ && step_->frozen_mask != frozen_mask) step_.reset();
  if (!step_) {
    step_ = std::make_unique<Captured>();
    step_->frozen_mask = frozen_mask;
  }
  if (step_->seen++ == 0) {
    acc_->launch_step();  // creates the optimizer state: never during a capture
    ++stats_.eager_steps;
  } else {
#if CUMULUS_WITH_CUDA
    if (!step_->captured()) {
      cuda::Context& ctx = cuda::context(opt.parameters().device().index());
      step_->graph = cuda::Graph::capture(ctx, [&] { acc_->launch_step(); });
      stats_.kernels_per_step = step_->graph.kernel_nodes();
      ++stats_.captures;
    }
    step_->graph.launch();
    ++stats_.replayed_steps;
#endif
  }
  acc_->finish_step_host();
  if (tracker_) tracker_->add_graph_step(acc_->attempted_steps(), opt.state_bytes());
  return true;
}

// ---- conveniences over a DataLoader ----------------------------------------------------------

double Trainer::train_epoch(data::DataLoader& loader, int epoch, const BatchLoss& loss) {
  return train_epoch(loader, epoch, loss, EpochOptions()).loss;
}

EpochResult Trainer::train_epoch(data::DataLoader& loader, int epoch, const BatchLoss& loss,
                                 const EpochOptions& options) {
  dist::Communicator* comm = acc_->communicator();
  const int world = comm ? comm->world_size() : 1, rank = comm ? comm->rank() : 0;
  const int64_t batches = loader.num_batches();
  CUMULUS_CHECK(options.first >= 0 && options.first <= batches, InvalidArgument, "Trainer::train_epoch: first ",
                options.first, " outside an epoch of ", batches, " micro-batches");
  loader.set_epoch(epoch);
  loader.seek(options.first);
  begin_epoch(epoch, batches, options.first);
  EpochResult result;
  result.next_micro_batch = batches;
  result.finished = true;
  MicroBatchDone done;
  for (int64_t i = options.first; i < batches; ++i) {
    if (options.stop && acc_->micro_batches_in_group() == 0 && options.stop(i)) {
      result.finished = false;
      result.next_micro_batch = i;
      break;
    }
    done.index = i;
    done.units = loader.units(i);
    done.units_done += done.units;
    done.trained_here = dist::owner_of_micro_batch(i, world) == rank;
    if (done.trained_here) {
      if (loader.position() != i) loader.seek(i);  // another rank's micro-batches in between
      // Host-resident data: batch i onto the device, this rank's next one behind it (outside the
      // closure: a replayed graph runs no host code).
      data::DataLoaderAccess::stage(loader, i, i + world);
      micro_batch(loader.units(i), [&] { return loss(loader.next(i)); });  // Batch::units of next(i)
    } else {
      skip_micro_batch();
    }
    done.stepped = step_if_ready();
    if (done.stepped && options.on_step) options.on_step(done);
    if (options.on_micro_batch) options.on_micro_batch(done);
  }
  result.loss = acc_->epoch_loss_sum() / std::max(acc_->epoch_units_stepped(), 1.0);
  return result;
}

Evaluation evaluate_classifier(nn::Module& model, data::DataLoader& loader,
                               const std::function<void(int64_t batch)>& before_batch) {
  NoGradGuard no_grad;
  struct RestoreMode {  // batch norm and dropout behave as in evaluation until this returns
    nn::Module& m;
    bool training;
    ~RestoreMode() { m.train(training); }
  } restore{model, model.is_training()};
  model.eval();
  ops::ClassificationTally tally(loader.device());
  loader.seek(0);
  for (int64_t i = 0; i < loader.num_batches(); ++i) {
    if (before_batch) before_batch(i);
    const data::Batch b = loader.next(i);
    const Tensor logits = model(b.x);
    tally.add(logits, b.y, ops::cross_entropy(logits, b.y, ops::Reduction::Mean));
  }
  const ops::ClassificationTally::Totals t = tally.read();
  Evaluation e;
  e.correct = t.correct;
  e.samples = t.samples;
  e.accuracy = t.samples > 0 ? static_cast<double>(t.correct) / static_cast<double>(t.samples) : 0.0;
  e.loss = t.batches > 0 ? t.loss_sum / static_cast<double>(t.batches) : 0.0;
  return e;
}

plan::PlanRequest plan_request(Optimizer& optimizer, const data::TensorDataset& dataset, BatchLoss loss,
                               int64_t effective_batch, int64_t budget, DType batch_dtype) {
  return plan_request(
      optimizer, [dataset] { return dataset; }, std::move(loss), effective_batch, budget, batch_dtype);
}

plan::PlanRequest plan_request(Optimizer& optimizer, std::function<data::TensorDataset()> dataset, BatchLoss loss,
                               int64_t effective_batch, int64_t budget, DType batch_dtype) {
  const data::TensorDataset now = dataset();
  plan::PlanRequest r;
  r.device = optimizer.parameters().device();
  r.effective_batch = effective_batch;
  r.budget = budget;
  r.optimizer = &optimizer;
  r.loop_state = Trainer::state_to_allocate();  // the Trainer's Accumulator
  r.units_per_row = now.units_per_row();        // whole rows: micro-batches of whole sequences
  r.unit_limit = now.units();
  r.require_fit = true;
  nn::FlatParameters* params = &optimizer.parameters();
  r.setting.precision = batch_dtype == DType::bf16  ? Precision::bf16
                        : batch_dtype == DType::f16 ? Precision::fp16
                                                    : Precision::fp32;
  auto dtype = std::make_shared<DType>(batch_dtype);  // shared by apply and the probes
  r.apply = [dtype](const plan::PlanSetting& s) { *dtype = compute_dtype(s.precision); };
  r.micro_batch = [dataset = std::move(dataset), loss = std::move(loss), device = r.device, dtype,
                   params](int64_t units) {
    // The planner asks for whole rows (units_per_row); the batch's units are the probe's.
    const data::TensorDataset rows = dataset();
    data::DataLoader loader(rows, units / rows.units_per_row(), /*shuffle=*/false, /*seed=*/0, device);
    loader.set_dtype(*dtype);
    loader.seek(0);
    // As the Trainer's closure: the batch is released before backward (only what the graph saves stays).
    Tensor probe_loss = loss(loader.next(0));
    probe_loss.backward();
    params->mark_gradients_stale();  // the probe's gradients are discarded
  };
  return r;
}

}  // namespace cumulus::optim
