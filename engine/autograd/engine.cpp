// The backward engine.
//
// Note [Persistent gradient buffers]
// Each leaf that requires grad owns one gradient buffer (category gradients), allocated once
// (parameters allocate it at creation; other leaves at their first backward) and never freed or
// moved: every backward writes into it at the same address. Its `grad_stale` flag says the
// contents are logically zero. mark_grad_stale() (the optimizer's zero_grad) only sets the flag;
// the next backward then writes with beta = 0 instead of 1. See Note [Gradient sinks].
//
// The walk: count, for every node reachable from the root, how many edges point at it; run a node
// when all its consumers have delivered their gradient; release its saved tensors at once, so
// activation memory falls during backward, not after it.
//
// Note [Deferred gradient adds]
// A Linear's bias gradient on CUDA comes free with the weight-gradient GEMM (BGRADB epilogue), but
// cuBLASLt writes it and cannot add it. When the sink accumulates (every micro-batch of a group but
// the first) that would cost a reduction kernel per Linear. Instead the GEMM writes the
// micro-batch's bias gradient into a temporary, the op hands it to the leaf's sink
// (GradSink::defer_add), and the engine adds all of them into their buffers at the end of the
// backward in one launch (kernels::VectorAdds: per device, distinct targets per launch, in the
// order they were handed over).
// - Only leaf sinks defer, and only in a backward without on_leaf_done: that hook declares a leaf's
//   gradient final when its last edge has delivered (data parallel reduction starts there), which a
//   pending add would contradict. A recomputed segment's inner walk shares the backward's list.
// - The buffers are complete when run_backward returns, as without deferral. An exception drops
//   the pending adds with the rest of that backward's (unusable) gradients.
// - The CPU defers nothing (a loop costs no launch); the protocol is tested there with test nodes.
#include <algorithm>
#include <unordered_map>
#include <vector>

#include "cumulus/autograd/grad_mode.h"
#include "cumulus/autograd/node.h"
#include "engine/autograd/walk.h"
#include "engine/ops/internal.h"
#include "engine/tensor/tensor_impl.h"

namespace cumulus {

namespace {
thread_local bool tls_grad_enabled = true;
// The running backward's deferred adds, or null where it allows none (Note [Deferred gradient adds]).
thread_local detail::DeferredGradientAdds* tls_deferred_adds = nullptr;
// The running backward's LeafGradientBuffer, or null (a leaf then gets a buffer of its own).
thread_local const LeafGradientBuffer* tls_buffer_for_leaf = nullptr;
// The innermost BackwardHooksScope's hooks, or null.
thread_local const BackwardHooks* tls_scope_hooks = nullptr;
}  // namespace

bool GradMode::enabled() { return tls_grad_enabled; }
void GradMode::set_enabled(bool on) { tls_grad_enabled = on; }

// ---- sinks -----------------------------------------------------------------------------------

GradSink::Target GradSink::begin(const Shape& shape, const Device& device, DType dtype) {
  if (leaf_ != nullptr) {
    AutogradMeta& meta = leaf_->autograd;
    if (!meta.grad.defined()) {
      if (tls_buffer_for_leaf != nullptr) (*tls_buffer_for_leaf)(*leaf_);
      else ops::detail::allocate_grad_buffer(*leaf_);
    }
    CUMULUS_CHECK(meta.grad.shape() == shape, ShapeError, "backward: gradient of shape ", shape.str(),
                  " for a leaf of shape ", meta.grad.shape().str());
    CUMULUS_CHECK(meta.grad.dtype() == dtype, InvalidArgument, "backward: a ", dtype_name(dtype),
                  " gradient for a leaf whose gradient buffer is ", dtype_name(meta.grad.dtype()));
    const GradientMode mode = meta.grad_stale ? GradientMode::overwrite : GradientMode::accumulate;
    meta.grad_stale = false;
    return {meta.grad, mode};
  }
  CUMULUS_CHECK(slot_ != nullptr, Error, "GradSink::begin on a sink that needs no gradient");
  if (slot_->defined()) {
    CUMULUS_CHECK(slot_->shape() == shape, ShapeError, "backward: gradients of shapes ", shape.str(), " and ",
                  slot_->shape().str(), " for the same tensor");
    CUMULUS_CHECK(slot_->dtype() == dtype, InvalidArgument, "backward: gradients of types ", dtype_name(dtype), " and ",
                  dtype_name(slot_->dtype()), " for the same tensor");
    // A gradient handed on by reference (add's dy, given to both operands) may be another pending
    // gradient too: the first add into it gets its own copy (Note [Gradient sinks]).
    if (!sole_owner(*slot_)) *slot_ = slot_->clone();
    return {*slot_, GradientMode::accumulate};
  }
  *slot_ = Tensor::empty(shape, dtype, device);
  return {*slot_, GradientMode::overwrite};
}

void GradSink::give(const Tensor& given) {
  const Tensor grad = given.is_contiguous() ? given : given.detach().contiguous();  // a node's dy is dense
  if (slot_ != nullptr && !slot_->defined()) {
    *slot_ = grad;  // first contribution to an inner node: take it, no copy
    return;
  }
  Target t = begin(grad.shape(), grad.device(), grad.dtype());
  ops::detail::accumulate_into(t.tensor, grad, t.beta());
}

void GradSink::defer_add(Tensor partial) {
  CUMULUS_CHECK(deferred_ != nullptr && leaf_ != nullptr, Error, "GradSink::defer_add on a sink that cannot defer");
  const AutogradMeta& meta = leaf_->autograd;
  CUMULUS_CHECK(meta.grad.defined() && !meta.grad_stale, Error,
                "GradSink::defer_add before begin() (a deferred add accumulates into a written buffer)");
  CUMULUS_CHECK(
      partial.shape() == meta.grad.shape() && partial.device() == meta.grad.device() && partial.dtype() == DType::f32,
      ShapeError, "GradSink::defer_add: a partial gradient ", partial.str(), " for a buffer ", meta.grad.str());
  deferred_->adds.push_back({std::move(partial), meta.grad});
}

namespace detail {

void DeferredGradientAdds::flush() {
  constexpr std::size_t kMaxPerLaunch = 16;
  std::size_t next = 0;
  while (next < adds.size()) {
    // One launch: consecutive adds on one device, with distinct targets, at most kMaxPerLaunch.
    const Device device = adds[next].target.device();
    std::size_t end = next;
    std::vector<const float*> targets;
    while (end < adds.size() && end - next < kMaxPerLaunch && adds[end].target.device() == device &&
           std::find(targets.begin(), targets.end(), adds[end].target.data<float>()) == targets.end())
      targets.push_back(adds[end++].target.data<float>());
    auto add_on_cpu = [&] {
      for (std::size_t i = next; i < end; ++i)
        kernels::accumulate_cpu(adds[i].partial.data<float>(), 1.0f, adds[i].target.data<float>(),
                                adds[i].target.numel());
    };
#if CUMULUS_WITH_CUDA
    static_assert(kernels::VectorAdds::kMaxPairs == kMaxPerLaunch);
    kernels::VectorAdds launch;
    for (std::size_t i = next; i < end; ++i, ++launch.count) {
      launch.x[launch.count] = adds[i].partial.data<float>();
      launch.y[launch.count] = adds[i].target.data<float>();
      launch.n[launch.count] = adds[i].target.numel();
    }
#endif
    CUMULUS_DISPATCH(device, ctx, add_on_cpu(), kernels::add_vectors_cuda(launch, ctx.stream()));
    next = end;
  }
  adds.clear();
}

}  // namespace detail

// ---- recording -------------------------------------------------------------------------------

Edge edge_to(const Tensor& t) {
  Edge e;
  if (!t.defined() || !t.requires_grad()) return e;
  if (t.grad_fn()) e.node = t.grad_fn();
  else e.leaf = impl_of(t);
  return e;
}

namespace {

template <typename Inputs>
bool any_requires_grad(const Inputs& inputs) {
  if (!GradMode::enabled()) return false;
  for (const Tensor* t : inputs)
    if (t->defined() && t->requires_grad()) return true;
  return false;
}

// Note [Custom op outputs are activations]
// Built-in ops allocate their outputs under the category of docs/ARCHITECTURE.md, "Memory
// accounting" (detail::new_output: activations while a graph is recorded). A custom op, written
// against the public headers, allocates with Tensor::empty and no scope, so its output would count
// as `other` unless its author opened a MemoryCategoryScope. attach_node is where an output becomes
// what a graph holds for backward, so there a block allocated with no scope open
// (Storage::category_by_default) moves to activations (Allocation::recategorize). Nothing else
// moves: a block allocated under any scope (every built-in op's, so their numbers stand) and a
// block shared with an input (a view of it: a reshaped input keeps its own category).
template <typename Inputs>
void count_output_as_activation(const Tensor& out, const Inputs& inputs) {
  if (impl_of(out)->storage == nullptr || !impl_of(out)->storage->category_by_default) return;
  Storage& storage = *impl_of(out)->storage;
  for (const Tensor* t : inputs)
    if (t->defined() && impl_of(*t)->storage.get() == &storage) return;
  storage.memory.recategorize(MemoryCategory::activations);
  storage.category_by_default = false;
}

template <typename Inputs>
void attach_with_edges(Tensor& out, std::shared_ptr<Node> node, const Inputs& inputs) {
  count_output_as_activation(out, inputs);
  for (const Tensor* t : inputs) node->next_edges().push_back(edge_to(*t));
  AutogradMeta& meta = impl_of(out)->autograd;
  meta.requires_grad = true;
  meta.grad_fn = std::move(node);
}

}  // namespace

bool should_record(std::initializer_list<const Tensor*> inputs) { return any_requires_grad(inputs); }
bool should_record(const std::vector<const Tensor*>& inputs) { return any_requires_grad(inputs); }

void attach_node(Tensor& out, std::shared_ptr<Node> node, std::initializer_list<const Tensor*> inputs) {
  attach_with_edges(out, std::move(node), inputs);
}
void attach_node(Tensor& out, std::shared_ptr<Node> node, const std::vector<const Tensor*>& inputs) {
  attach_with_edges(out, std::move(node), inputs);
}

// ---- the walk --------------------------------------------------------------------------------

namespace detail {

namespace {

// Every node the walk reaches from root with the number of edges pointing at it, and (for the
// leaf hook) every leaf with its own count; a node a backward already consumed is an error.
struct EdgeCounts {
  std::unordered_map<Node*, int> dependencies;
  std::unordered_map<const TensorImpl*, int> leaf_edges;
};

EdgeCounts count_edges(Node* root, bool count_leaves) {
  EdgeCounts counts;
  std::vector<Node*> stack{root};
  counts.dependencies[root] = 0;
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    CUMULUS_CHECK(!n->consumed(), Error, "backward: the graph through op '", n->name(),
                  "' was already used by a backward call and its saved tensors are released; "
                  "run the forward again");
    for (Edge& e : n->next_edges()) {
      if (e.leaf && count_leaves) counts.leaf_edges[e.leaf.get()] += 1;
      if (!e.node) continue;
      auto [it, first] = counts.dependencies.try_emplace(e.node.get(), 0);
      it->second += 1;
      if (first) stack.push_back(e.node.get());
    }
  }
  return counts;
}

// Where each of node's input gradients goes: the next node's pending gradient, the redirected
// leaf's sink, a leaf's buffer, or nowhere.
void fill_sinks(Node& node, std::unordered_map<Node*, Tensor>& pending, const LeafRedirect& redirect,
                std::vector<GradSink>& sinks) {
  sinks.clear();
  for (Edge& e : node.next_edges()) {
    if (e.node) sinks.push_back(GradSink::pending(&pending[e.node.get()]));
    else if (e.leaf && e.leaf.get() == redirect.leaf) sinks.push_back(redirect.sink);
    else if (e.leaf) sinks.push_back(GradSink::leaf(e.leaf.get(), tls_deferred_adds));
    else sinks.push_back(GradSink::none());
  }
}

}  // namespace

void backward_walk(const std::shared_ptr<Node>& root, const Tensor& root_grad, const LeafRedirect& redirect,
                   const LeafGradientDone& on_leaf_done) {
  EdgeCounts counts = count_edges(root.get(), static_cast<bool>(on_leaf_done));
  auto& dependencies = counts.dependencies;
  auto& leaf_edges = counts.leaf_edges;

  // Pending output gradients of nodes still waiting for consumers. unordered_map keeps element
  // addresses stable, which GradSink::pending relies on.
  std::unordered_map<Node*, Tensor> pending;
  pending[root.get()] = root_grad;
  std::vector<Node*> ready{root.get()};
  std::vector<GradSink> sinks;
  while (!ready.empty()) {
    Node* node = ready.back();
    ready.pop_back();
    Tensor grad_output = std::move(pending[node]);
    pending.erase(node);
    CUMULUS_CHECK(grad_output.defined(), Error, "backward: op '", node->name(),
                  "' received no gradient (an op before it skipped an input that needs one)");

    fill_sinks(*node, pending, redirect, sinks);
    {
      OpScope op_scope(node->name(), /*backward=*/true);  // its allocations read "<op> backward"
      node->backward(grad_output, sinks);
    }
    node->release_saved();
    node->set_consumed();

    for (Edge& e : node->next_edges()) {
      if (e.leaf && on_leaf_done && --leaf_edges[e.leaf.get()] == 0) on_leaf_done(e.leaf.get());
      if (!e.node) continue;
      if (--dependencies[e.node.get()] == 0) ready.push_back(e.node.get());
    }
  }
}

}  // namespace detail

BackwardHooksScope::BackwardHooksScope(BackwardHooks hooks) : hooks_(std::move(hooks)), outer_(tls_scope_hooks) {
  tls_scope_hooks = &hooks_;
}
BackwardHooksScope::~BackwardHooksScope() { tls_scope_hooks = outer_; }

namespace {
// The walk from a non-leaf root, its deferred adds flushed at the end (Note [Deferred gradient adds]).
void walk_and_flush(const Tensor& root, const Tensor& seed, const LeafGradientDone& on_leaf_done) {
  detail::DeferredGradientAdds deferred;
  detail::DeferredGradientAdds* const outer = tls_deferred_adds;
  tls_deferred_adds = on_leaf_done ? nullptr : &deferred;
  try {
    detail::backward_walk(root.grad_fn(), seed, {}, on_leaf_done);
  } catch (...) {
    tls_deferred_adds = outer;
    throw;
  }
  tls_deferred_adds = outer;
  deferred.flush();
}
}  // namespace

void run_backward(const Tensor& root, const Tensor& seed, const LeafGradientDone& given_on_leaf_done) {
  CUMULUS_CHECK(root.defined(), InvalidArgument, "backward: undefined tensor");
  CUMULUS_CHECK(root.requires_grad(), InvalidArgument,
                "backward: the tensor does not require grad (no parameter or input that requires "
                "grad took part in computing it, or it was computed under NoGradGuard)");
  CUMULUS_CHECK(
      seed.defined() && seed.dtype() == DType::f32 && seed.shape() == root.shape() && seed.device() == root.device(),
      InvalidArgument, "backward: the seed must be an f32 tensor of the root's shape ", root.shape().str(), " on ",
      root.device().str());

  NoGradGuard no_grad;
  MemoryCategoryScope category(MemoryCategory::backward_temporaries);
  // A scope's hooks, where the caller gives none.
  const BackwardHooks* const scoped = given_on_leaf_done ? nullptr : tls_scope_hooks;
  const LeafGradientDone& on_leaf_done = scoped != nullptr ? scoped->on_leaf_done : given_on_leaf_done;
  const LeafGradientBuffer* const outer_buffer = tls_buffer_for_leaf;
  tls_buffer_for_leaf = scoped != nullptr && scoped->buffer_for_leaf ? &scoped->buffer_for_leaf : nullptr;
  struct RestoreBuffer {
    const LeafGradientBuffer* outer;
    ~RestoreBuffer() { tls_buffer_for_leaf = outer; }
  } restore_buffer{outer_buffer};
  try {
    if (root.is_leaf()) {
      GradSink::leaf(impl_of(root).get()).give(seed);  // copied into the leaf's buffer
      if (on_leaf_done) on_leaf_done(impl_of(root).get());
    } else {
      // The seed is borrowed: the walk's references keep it from ever being the sole owner of its
      // storage, so no node overwrites it in place (sole_owner in engine/ops/linear.cpp).
      walk_and_flush(root, seed, on_leaf_done);
    }
  } catch (...) {
    if (scoped != nullptr && scoped->abandoned) scoped->abandoned();
    throw;
  }
  if (scoped != nullptr && scoped->after) scoped->after();
}

void run_backward(const Tensor& root, float seed_value, const LeafGradientDone& on_leaf_done) {
  CUMULUS_CHECK(root.defined(), InvalidArgument, "backward: undefined tensor");
  // After the tensor version's own checks: a root that requires no grad is reported as such.
  CUMULUS_CHECK(!root.requires_grad() || root.numel() == 1, ShapeError, "backward: needs a scalar, got ",
                root.shape().str());
  Tensor seed;
  {
    MemoryCategoryScope category(MemoryCategory::backward_temporaries);
    seed = Tensor::full(root.shape(), seed_value, root.device());
  }
  run_backward(root, seed, on_leaf_done);
}

}  // namespace cumulus
