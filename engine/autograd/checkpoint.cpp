// Activation checkpointing.
//
// Note [Recompute]
// checkpoint(segment, x, parameters) runs the segment with grad mode off, so its ops record no
// nodes and every intermediate tensor is freed as soon as the next op has read it; only x (held by
// one CheckpointNode) and the output stay. The node's edges are x's and each parameter's, so the
// backward engine schedules it like any op and counts the parameters' gradients as written when
// it has run (what the data-parallel hook on finished leaves relies on).
//
// When backward reaches the node it runs the segment again from x with grad mode on, in category
// activations (these are activations, held for the segment's backward as a stored run would hold
// them), then walks the recomputed graph from its output with the incoming gradient as the seed.
// The walk writes parameter gradients through the usual leaf sinks (Note [Gradient sinks]), so
// they land in the same persistent buffers with the same overwrite/accumulate mode as without
// recompute; x's gradient goes to the sink the outer engine gave the node. Saved tensors of the
// recomputed graph are released node by node as usual, so at most one segment's activations are
// alive again at a time (plus whatever stored activations the outer graph still holds).
//
// Exactness. The recomputed forward performs the same ops on the same inputs with the same
// kernels, so every saved tensor is bit for bit the first run's, and the backward after it is the
// stored run's backward: the gradients are identical, not merely close. Two things would break
// that and are handled here:
//  - State updated by a training forward. Batch norm's running statistics (and
//    num_batches_tracked) were updated by the first run; while recomputing() is true it normalizes
//    with the batch's statistics as before but leaves the running ones alone, so they too equal the
//    stored run's.
//  - Randomness. ops::dropout draws its mask from (seed, offset) given by its caller, so a
//    recomputation must pass the first run's: nn::Dropout counts its calls for the offset and,
//    while recomputing(), reuses its last one without counting (engine/nn/activation_layers.cpp).
// Nesting works: a checkpoint inside a recomputed segment records its own node during the
// recompute and recomputes its part again when reached.
//
// Accounting: the RecomputeLog counts, per thread, what each recomputation held at the end of its
// forward (the bytes a stored run would have kept for that segment), what the checkpointed forward
// kept (its output) and the recomputation's time; MemoryTracker drains it per micro-batch.
//
// The recomputed graph is walked by the backward engine's own walk (engine/autograd/walk.h), with
// one redirect: the gradient meant for the recomputed graph's input leaf goes to the outer sink.
#include "cumulus/autograd/checkpoint.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "cumulus/autograd/grad_mode.h"
#include "cumulus/autograd/node.h"
#include "cumulus/memory/allocator.h"
#include "engine/autograd/walk.h"
#include "engine/ops/internal.h"
#include "engine/tensor/tensor_impl.h"

namespace cumulus {

namespace {

thread_local bool tls_recomputing = false;
thread_local RecomputeLog tls_log;

// Collapses pending device time points now and then, so a long run without a tracker holds a
// bounded list.
constexpr std::size_t kMaxPendingTimes = 256;

class RecomputingScope {
 public:
  RecomputingScope() : previous_(tls_recomputing) { tls_recomputing = true; }
  ~RecomputingScope() { tls_recomputing = previous_; }
  RecomputingScope(const RecomputingScope&) = delete;
  RecomputingScope& operator=(const RecomputingScope&) = delete;

 private:
  bool previous_;
};

class GradModeScope {
 public:
  explicit GradModeScope(bool on) : previous_(GradMode::enabled()) { GradMode::set_enabled(on); }
  ~GradModeScope() { GradMode::set_enabled(previous_); }
  GradModeScope(const GradModeScope&) = delete;
  GradModeScope& operator=(const GradModeScope&) = delete;

 private:
  bool previous_;
};

double host_now_ms() {
  using namespace std::chrono;
  return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

// Bytes of category `c` held on `device`: the category the checkpoint's tensors are made in, so
// that a library workspace growing meanwhile (cuDNN's) does not count as activations.
int64_t held_bytes(const Device& device, MemoryCategory c) { return allocator_for(device).stats()[c].current; }

// Whether a device time point may be taken now (not while a CUDA graph is being captured).
bool can_time(const Device& device) { return !ops::detail::graph_capturing(device); }

class CheckpointNode final : public Node {
 public:
  CheckpointNode(SegmentFunction segment, Tensor input)
      : Node("checkpoint"), segment_(std::move(segment)), input_(std::move(input)) {}

  // grads[0]: the input's sink; grads[1..]: the parameters', written by the recomputed graph's own
  // leaf sinks (the same buffers, the same modes), so they are not used here.
  void backward(const Tensor& grad_output, std::vector<GradSink>& grads) override {
    const Device device = input_.device();
    RecomputingScope recomputing_scope;
    // The recomputed graph starts at a fresh leaf sharing the input's storage: its gradient is
    // redirected to grads[0], never into a buffer of its own.
    Tensor leaf = input_.detach();
    if (grads[0].needed()) leaf.set_requires_grad(true);

    std::shared_ptr<Node> root;
    Tensor output;
    const bool timed = can_time(device);
    TimePoint start, end;
    if (timed) start = TimePoint::now(device);
    const double host_start = host_now_ms();
    int64_t held = 0;
    {
      GradModeScope grad_on(true);
      MemoryCategoryScope category(MemoryCategory::activations);
      OpScope op_scope("checkpoint recompute");
      const int64_t before = held_bytes(device, MemoryCategory::activations);
      output = segment_(leaf);
      held = held_bytes(device, MemoryCategory::activations) - before;
      tls_log.segments_recomputed += 1;
      tls_log.recomputed_bytes += held;
      tls_log.largest_recomputed_bytes = std::max(tls_log.largest_recomputed_bytes, held);
    }
    if (tls_log.intervals.size() < RecomputeLog::kMaxIntervals)
      tls_log.intervals.push_back({host_start, host_now_ms(), held});
    if (timed) {
      end = TimePoint::now(device);
      if (device.is_cpu()) {
        tls_log.resolved_ms += end.ms_since(start);
      } else {
        tls_log.pending.emplace_back(start, end);
        if (tls_log.pending.size() >= kMaxPendingTimes) tls_log.recompute_ms();
      }
    }
    CUMULUS_CHECK(output.defined() && output.shape() == grad_output.shape(), ShapeError,
                  "checkpoint: the recomputed segment returned ", output.defined() ? output.shape().str() : "nothing",
                  " where the first run returned ", grad_output.shape().str(),
                  " (a checkpointed segment must compute the same thing twice)");

    if (!output.grad_fn()) {
      // The segment passed its input through (or computed nothing that needs a gradient).
      if (impl_of(output) == impl_of(leaf) && grads[0].needed()) grads[0].give(grad_output);
      return;
    }
    root = output.grad_fn();
    output = Tensor();  // the output's storage goes unless an op of the segment saved it
    detail::backward_walk(root, grad_output, {impl_of(leaf).get(), grads[0]}, nullptr);
  }

  void release_saved() override {
    input_ = Tensor();
    segment_ = nullptr;  // the segment may hold the model's modules; the graph must not
  }

 private:
  SegmentFunction segment_;
  Tensor input_;
};

}  // namespace

bool recomputing() { return tls_recomputing; }

double RecomputeLog::recompute_ms() {
  for (const auto& [start, end] : pending) resolved_ms += end.ms_since(start);
  pending.clear();
  return resolved_ms;
}

RecomputeLog take_recompute_log() { return std::exchange(tls_log, RecomputeLog()); }

Tensor checkpoint(const SegmentFunction& segment, const Tensor& input, const std::vector<Tensor>& parameters) {
  CUMULUS_CHECK(segment != nullptr, InvalidArgument, "checkpoint: no segment to run");
  CUMULUS_CHECK(input.defined(), InvalidArgument, "checkpoint: the input is undefined");
  bool record = GradMode::enabled() && input.requires_grad();
  if (GradMode::enabled())
    for (const Tensor& p : parameters) record = record || (p.defined() && p.requires_grad());
  if (!record) return segment(input);

  const Device device = input.device();
  Tensor output;
  {
    // Outputs of a recording forward are activations; keep that category for what this forward
    // keeps (its output), though grad mode is off while it runs.
    const MemoryCategory kept_category = current_memory_category(MemoryCategory::activations);
    MemoryCategoryScope category(kept_category);
    NoGradGuard no_grad;
    const int64_t before = held_bytes(device, kept_category);
    output = segment(input);
    tls_log.kept_bytes += held_bytes(device, kept_category) - before;
  }
  CUMULUS_CHECK(output.defined(), InvalidArgument, "checkpoint: the segment returned an undefined tensor");
  // A new handle: the segment may return its input (or a view sharing its handle), whose autograd
  // state must not change.
  output = output.detach();
  auto node = std::make_shared<CheckpointNode>(segment, input.detach());
  attach_node(output, node, {&input});
  for (const Tensor& p : parameters)
    if (p.defined() && p.requires_grad()) node->next_edges().push_back(edge_to(p));
  tls_log.segments_recorded += 1;
  return output;
}

}  // namespace cumulus
