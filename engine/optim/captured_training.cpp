// Note [Captured training]
// A micro-batch of the seed MLP is ~20 kernels of a few microseconds each; launched one by one
// from the host, the launches, not the GPU, set the pace. CapturedTraining records each distinct
// micro-batch once as a CUDA graph and replays it with one host call; the same for the device
// part of the optimizer step (Accumulator::launch_step). What makes a replay equal to an eager run:
//  - inputs come from device state: the DataLoader's cursor, the step state's counters and the
//    learning-rate table (Note [Device-side step], Note [Learning-rate table]);
//  - the gradient sinks' modes (overwrite after a step, accumulate otherwise) are captured, so a
//    graph is keyed by the sample count and the stale pattern of the gradient slots: with 16 x 4
//    that is two graphs, "first micro-batch of a group" and "the others"; the partial last
//    micro-batch of an epoch gets its own pair;
//  - the host state a micro-batch changes (the Accumulator's counters, the slots' stale flags) is
//    replayed on the host too;
//  - freezing or unfreezing a parameter changes which gradients a micro-batch computes, so the
//    frozen pattern is part of the key too; the step graph reads the frozen mask's memory, which
//    the host refreshes before each replay, and is captured afresh when the mask or the optimizer's
//    count of missed updates is first allocated (Note [Frozen parameters] in kernels/optim_rules.h);
//  - memory: the capture allocates from the graph pool (Note [Graph pool]), so a replay allocates
//    nothing and the addresses it writes are never handed out to anything else.
// A key seen for the first time runs eagerly (that creates handles and lazily allocated state,
// which must not happen during a capture); the second time it is captured, then launched. A
// captured key costs one graph launch per call. The memory a graph uses is measured while it is
// captured (the allocations are real, only the kernels are deferred) and reported for every
// replay (MemoryTracker::add_graph_micro_batch); per-micro-batch times of replays are not taken.
// While the tracker records its timeline (the first optimizer steps) everything runs eagerly, so
// the trace shows true phases.
#include "cumulus/optim/captured_training.h"

#include <utility>

#include "cumulus/core/error.h"
#include "cumulus/dist/communicator.h"
#include "cumulus/nn/flat_parameters.h"

#if CUMULUS_WITH_CUDA
#include "cumulus/core/cuda_context.h"
#endif

namespace cumulus::optim {

struct CapturedTraining::Captured {
  int64_t seen = 0;
#if CUMULUS_WITH_CUDA
  cuda::Graph graph;
#endif
  std::vector<bool> stale_after;  // the slots' stale flags after the micro-batch
  const void* frozen_mask = nullptr;  // the step graph: the frozen mask it was captured with
  MicroBatchRecord memory;        // measured while capturing
  bool captured() const {
#if CUMULUS_WITH_CUDA
    return graph.valid();
#else
    return false;
#endif
  }
};

CapturedTraining::CapturedTraining(Accumulator& accumulator, bool use_graphs, MemoryTracker* tracker)
    : acc_(accumulator), use_graphs_(use_graphs), tracker_(tracker) {
  CUMULUS_CHECK(!use_graphs || acc_.optimizer().parameters().device().is_cuda(), InvalidArgument,
                "CapturedTraining: CUDA graphs need the parameters on a CUDA device, they are on ",
                acc_.optimizer().parameters().device().str());
  // Not yet: the reductions across ranks would have to be captured too (NCCL allows it; untested).
  CUMULUS_CHECK(!use_graphs || !acc_.distributed(), InvalidArgument,
                "CapturedTraining: CUDA graphs with data parallel training are not supported yet; run eagerly");
#if !CUMULUS_WITH_CUDA
  CUMULUS_CHECK(!use_graphs, InvalidArgument, "CapturedTraining: cumulus was built without CUDA");
#endif
}

CapturedTraining::~CapturedTraining() = default;

void CapturedTraining::reset() {
  micro_batches_.clear();
  step_.reset();
}

std::vector<bool> CapturedTraining::stale_pattern() const {
  const auto& slots = acc_.optimizer().parameters().slots();
  std::vector<bool> stale(slots.size());
  for (std::size_t i = 0; i < slots.size(); ++i) stale[i] = slots[i].param.grad_stale();
  return stale;
}

std::vector<bool> CapturedTraining::frozen_pattern() const {
  const auto& slots = acc_.optimizer().parameters().slots();
  std::vector<bool> frozen(slots.size());
  for (std::size_t i = 0; i < slots.size(); ++i) frozen[i] = !slots[i].param.requires_grad();
  return frozen;
}

void CapturedTraining::micro_batch(int64_t samples, const std::function<Tensor()>& forward_loss) {
  const bool graphs = use_graphs_ && !(tracker_ && tracker_->timeline_active());
  auto eager = [&] {
    if (tracker_) tracker_->begin_micro_batch(acc_.epoch(), acc_.micro_batch_index(), samples);
    Tensor loss = forward_loss();
    if (tracker_) tracker_->end_forward();
    acc_.backward(loss, samples);
    loss = Tensor();
    if (tracker_) tracker_->end_backward();
    ++stats_.eager_micro_batches;
  };
  if (!graphs) return eager();
  std::unique_ptr<Captured>& c = micro_batches_[{samples, stale_pattern(), frozen_pattern()}];
  if (!c) c = std::make_unique<Captured>();
  if (c->seen++ == 0) return eager();
#if CUMULUS_WITH_CUDA
  const int epoch = acc_.epoch();
  const int64_t index = acc_.micro_batch_index();
  if (!c->captured()) {
    // Capture: the host runs the closure and backward (allocations and bookkeeping are real, the
    // kernels are recorded), then the graph is launched once for this micro-batch.
    CachingAllocator& alloc = allocator_for(acc_.optimizer().parameters().device());
    alloc.reset_peak();
    const int64_t activations_before = alloc.stats()[MemoryCategory::activations].current;
    MicroBatchRecord& r = c->memory;
    r.samples = samples;
    cuda::Context& ctx = cuda::context(acc_.optimizer().parameters().device().index());
    c->graph = cuda::Graph::capture(ctx, [&] {
      Tensor loss = forward_loss();
      r.activation_bytes = alloc.stats()[MemoryCategory::activations].current - activations_before;
      acc_.backward(loss, samples);
    });
    const MemoryStats st = alloc.stats();
    r.peak_bytes = st.allocated_peak;
    r.peak_by_category = st.at_peak;
    r.reserved_bytes = st.reserved;
    c->stale_after = stale_pattern();
    stats_.kernels_per_micro_batch = c->graph.kernel_nodes();
    ++stats_.captures;
  } else {
    // Replay: the host side of the micro-batch (the accumulator's counters, the stale flags).
    acc_.check_micro_batch(samples);
    acc_.count_micro_batch(samples);
    const auto& slots = acc_.optimizer().parameters().slots();
    for (std::size_t i = 0; i < slots.size(); ++i)
      if (!c->stale_after[i]) slots[i].param.impl()->autograd.grad_stale = false;
  }
  c->graph.launch();
  ++stats_.replayed_micro_batches;
  if (tracker_) {
    MicroBatchRecord r = c->memory;
    r.epoch = epoch;
    r.index = index;
    tracker_->add_graph_micro_batch(r);
  }
#endif
}

bool CapturedTraining::step_if_ready() { return step(true); }
bool CapturedTraining::flush() { return step(false); }

bool CapturedTraining::step(bool only_if_ready) {
  if (only_if_ready ? !acc_.ready() : acc_.micro_batches_in_group() == 0) return false;
  const bool graphs = use_graphs_ && !(tracker_ && tracker_->timeline_active());
  Optimizer& opt = acc_.optimizer();
  if (!graphs) {
    if (tracker_) tracker_->begin_step();
    acc_.do_step();
    // The step's reductions, those started during the last backward included.
    dist::Communicator* comm = acc_.communicator();
    TimeSpans reductions = comm ? comm->take_recent_spans() : TimeSpans();
    if (tracker_) tracker_->end_step(acc_.attempted_steps(), opt.state_bytes(), std::move(reductions));
    ++stats_.eager_steps;
    return true;
  }
  acc_.prepare_step_host();
  // The update's arguments include the frozen mask, allocated at the first freeze (with the
  // optimizer's missed counts): a graph captured before has none.
  const void* frozen_mask = opt.parameters().frozen_chunks();
  if (step_ && step_->frozen_mask != frozen_mask) step_.reset();
  if (!step_) {
    step_ = std::make_unique<Captured>();
    step_->frozen_mask = frozen_mask;
  }
  if (step_->seen++ == 0) {
    acc_.launch_step();  // creates the optimizer state: never during a capture
    ++stats_.eager_steps;
  } else {
#if CUMULUS_WITH_CUDA
    if (!step_->captured()) {
      cuda::Context& ctx = cuda::context(opt.parameters().device().index());
      step_->graph = cuda::Graph::capture(ctx, [&] { acc_.launch_step(); });
      stats_.kernels_per_step = step_->graph.kernel_nodes();
      ++stats_.captures;
    }
    step_->graph.launch();
    ++stats_.replayed_steps;
#endif
  }
  acc_.finish_step_host();
  if (tracker_) tracker_->add_graph_step(acc_.attempted_steps(), opt.state_bytes());
  return true;
}

}  // namespace cumulus::optim
