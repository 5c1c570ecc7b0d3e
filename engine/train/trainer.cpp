// Note [Training API]
// A user's loop needs, per micro-batch and step: backward into the accumulated gradient, the step
// (normalization, clipping, the schedule, loss scaling), five MemoryTracker calls around them, and
// on CUDA the graph capture and replay of both. Spread over the loop that is easy to get subtly
// wrong: a missed end_forward, a replay that records nothing. The Trainer makes all of them from
// one call per micro-batch and one per step; the loop keeps its own shape (its data, its model,
// its closure returning the summed loss), as Lightning's Trainer keeps the LightningModule's
// training_step. Decisions:
//  - One object holds the whole run's state: the step count, the LR schedule's position (the
//    update count less Parts::steps_offset) and the loss scale, so set_accum_steps changes N
//    without restarting any of them. backward(loss, units) is the same micro-batch for a caller
//    that computes its loss itself (no tracker record, no graph).
//  - set_accum_steps mid-group is deferred, not refused: the group in progress keeps the size its
//    first micro-batches were normalized for (Normalization::micro_batches seeds 1 / (units *
//    N)), and a caller (a callback, a budget that changed) need not know where the group stands.
//    The new N then holds for the rest of the run, replacing the per-epoch schedule, which would
//    otherwise undo it silently at the next epoch; counters() carries it so a resume keeps it.
//  - The tracker is an option, attachable later (set_tracker): the app makes its tracker after a
//    checkpoint is restored.
//
// Note [Units]
// A loss is summed over something: a classifier's over its samples, a language model's over B x T
// tokens, a segmentation model's over pixels. The step divides by how many of them the group held
// (Note [Exact normalization] in engine/train/trainer_step.cpp), so the count passed with each
// micro-batch must be the count the loss sums over. Were a row always a sample, a language model
// would get a per-sequence mean loss and gradients T times too large, silently. So the unit is the
// user's, said once where the data is: TensorDataset::set_units_per_row(T) (default 1,
// samples); every Batch says how many units it holds (Batch::units, DataLoader::units(i)), and the
// Trainer (train_epoch), the planner's request (plan_request: effective batch and limit in units,
// micro-batches of whole rows) and the tracker (told micro-batches of N units, it checks what it is
// fed: MemoryTracker::begin_micro_batch) count the same units. Where the loss's op knows how many
// positions it summed, the Trainer checks the units against them at the micro-batch (Note [Units
// checked against the loss] in loss_checks.cpp). StepLog::loss and train_epoch's result are means
// per unit.
//
// Note [Captured training]
// A micro-batch of the seed MLP is ~20 kernels of a few microseconds each; launched one by one
// from the host, the launches, not the GPU, set the pace. The Trainer records each distinct
// micro-batch once as a CUDA graph and replays it with one host call; the same for the device
// part of the optimizer step (Trainer::run_step's run_or_replay). What makes a replay equal to an eager run:
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
//  - the host state a micro-batch changes (the Trainer's counters, the slots' stale flags) is
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
#include "cumulus/train/trainer.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "trainer_parts.h"
#include "cumulus/autograd/grad_mode.h"
#include "cumulus/core/error.h"
#include "cumulus/core/precision.h"
#include "cumulus/dist/communicator.h"
#include "cumulus/memory/category.h"
#include "cumulus/nn/flat_parameters.h"
#include "cumulus/nn/module.h"
#include "cumulus/ops/loss.h"
#include "cumulus/ops/metrics.h"
#include "engine/data/loader_access.h"
#include "engine/tensor/tensor_impl.h"

#if CUMULUS_WITH_CUDA
#include "engine/core/cuda_context.h"
#endif

namespace cumulus::train {

using optim::LRSchedule;
using optim::Optimizer;
using optim::UpdateScalars;

// ---- accessors -----------------------------------------------------------------------------------

Optimizer& Trainer::optimizer() { return *parts_->optimizer; }
void Trainer::set_tracker(memory::MemoryTracker* tracker) { parts_->tracker = tracker; }
const Trainer::Stats& Trainer::stats() const { return parts_->stats; }
std::vector<int64_t> Trainer::state_to_allocate() {
  return {LearningRateWindow::kSize * static_cast<int64_t>(sizeof(float)),
          static_cast<int64_t>(sizeof(kernels::StepBuffers))};
}

// ---- micro-batches -------------------------------------------------------------------------------

namespace {
// The closure's loss, the tensors it makes itself counted as data (Note [A user's tensors in a
// micro-batch]).
Tensor forward_under_data_category(const std::function<Tensor()>& forward_loss) {
  const UnscopedMemoryCategory inputs(MemoryCategory::data);
  return forward_loss();
}
}  // namespace

void Trainer::reset() {
  parts_->micro_batch_graphs.clear();
  parts_->captured_step.reset();
}

std::vector<bool> Trainer::Parts::stale_pattern() const {
  const auto& slots = optimizer->parameters().slots();
  std::vector<bool> stale(slots.size());
  for (std::size_t i = 0; i < slots.size(); ++i) stale[i] = slots[i].param.grad_stale();
  return stale;
}

std::vector<bool> Trainer::Parts::frozen_pattern() const {
  const auto& slots = optimizer->parameters().slots();
  std::vector<bool> frozen(slots.size());
  for (std::size_t i = 0; i < slots.size(); ++i) frozen[i] = !slots[i].param.requires_grad();
  return frozen;
}

void Trainer::micro_batch(int64_t units, const std::function<Tensor()>& forward_loss) {
  const EntryPoint entry(parts_->caller, "micro_batch");
  Parts& p = *parts_;
  if (!p.graphs_now()) return eager_micro_batch(units, forward_loss);
  const int seed_steps = p.options.normalization == Normalization::micro_batches ? p.position.accum_steps : 0;
  std::unique_ptr<Captured>& c =
      p.micro_batch_graphs[Parts::GraphKey{units, p.stale_pattern(), p.frozen_pattern(), seed_steps}];
  if (!c) c = std::make_unique<Captured>();
  if (c->seen == 0) {
    ++c->seen;
    return eager_micro_batch(units, forward_loss);
  }
  graph_micro_batch(*c, units, forward_loss);
}

// Note [A user's tensors in a micro-batch]
// A caller's closure builds its batch itself as often as it takes one from a DataLoader:
// Tensor::from_vector of the token windows, x.to(device). Allocated outside any op with no scope
// open, those blocks would count as other, so the tracker reported "data 0 B" and took them for
// growth of unknown kind. The forward therefore runs under UnscopedMemoryCategory(data): a tensor
// the closure makes itself counts as data (an input of this micro-batch), an op's output as an
// activation (the ops' own scopes, attach_node for a custom op's), and what ops make for
// themselves stays theirs. Tensors made before the call (a batch built outside the closure, a
// table made once) are the caller's state: they count where they were made, other unless a scope
// said so, and the tracker counts them as live when the micro-batch began (Note [One batch's
// peak] in engine/memory/tracker.cpp). The DataLoader's batches are data already.
void Trainer::eager_micro_batch(int64_t units, const std::function<Tensor()>& forward_loss) {
  memory::MemoryTracker* tracker = parts_->tracker;
  if (tracker) tracker->begin_micro_batch(parts_->position.epoch, parts_->position.in_epoch, units);
  Tensor loss = forward_under_data_category(forward_loss);
  if (tracker) tracker->end_forward();
  backward(loss, units);
  loss = Tensor();  // freed inside the record: the loss is the micro-batch's
  if (tracker) tracker->end_backward();
  ++parts_->stats.eager_micro_batches;
}

// The second time a key is seen it is captured (the host runs the closure and backward: the
// allocations and the bookkeeping are real, the kernels recorded), then launched; later, the
// graph is launched after the host side of the micro-batch is replayed. The memory a captured
// micro-batch uses is measured around its capture.
void Trainer::graph_micro_batch(Captured& c, int64_t units, const std::function<Tensor()>& forward_loss) {
#if CUMULUS_WITH_CUDA
  const int epoch = parts_->position.epoch;
  const int64_t index = parts_->position.in_epoch;
  CachingAllocator& alloc = allocator_for(parts_->optimizer->parameters().device());
  memory::MicroBatchRecord& r = c.memory;
  const bool capturing = !c.captured();
  int64_t activations_before = 0;
  if (capturing) {
    alloc.reset_peak();
    activations_before = alloc.stats()[MemoryCategory::activations].current;
    r.start_by_category = alloc.stats().current_by_category();
    r.units = units;
  } else {
    check_micro_batch(units, "micro_batch");
    count_micro_batch(units);
    const auto& slots = parts_->optimizer->parameters().slots();
    for (std::size_t i = 0; i < slots.size(); ++i)
      if (!c.stale_after[i]) impl_of(slots[i].param)->autograd.grad_stale = false;
  }
  parts_->run_or_replay(&c, [&] {
    Tensor loss = forward_under_data_category(forward_loss);
    r.activation_bytes = alloc.stats()[MemoryCategory::activations].current - activations_before;
    backward(loss, units);
  });
  if (capturing) {
    const MemoryStats st = alloc.stats();
    r.peak_bytes = st.allocated_peak;
    r.peak_by_category = st.at_peak;
    r.reserved_bytes = st.reserved;
    c.stale_after = parts_->stale_pattern();
    parts_->stats.kernels_per_micro_batch = c.graph.kernel_nodes();
  }
  ++parts_->stats.replayed_micro_batches;
  if (parts_->tracker) {
    memory::MicroBatchRecord record = c.memory;
    record.epoch = epoch;
    record.index = index;
    memory::MemoryTrackerAccess::add_graph_micro_batch(*parts_->tracker, record);
  }
#else
  (void)c, (void)units, (void)forward_loss;  // unreachable: the constructor refuses graphs
#endif
}

// ---- conveniences over a DataLoader ----------------------------------------------------------

double Trainer::train_epoch(data::DataLoader& loader, int epoch, const BatchLoss& loss) {
  return train_epoch(loader, epoch, loss, EpochOptions()).loss;
}

EpochResult Trainer::train_epoch(data::DataLoader& loader, int epoch, const BatchLoss& loss,
                                 const EpochOptions& options) {
  const dist::Communicator* comm = parts_->options.communicator.get();
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
    if (options.stop && parts_->position.group_micro_batches == 0 && options.stop(i)) {
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
  const kernels::StepState st = parts_->state.read();
  result.loss = st.epoch.loss / std::max(st.epoch.units, 1.0);
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
  r.loop_state = Trainer::state_to_allocate();  // the Trainer's learning-rate table and step state
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

}  // namespace cumulus::train
