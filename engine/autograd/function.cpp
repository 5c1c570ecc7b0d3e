// Custom ops with their own backward (cumulus/autograd/function.h).
//
// Note [Custom functions]
// apply_function is what every built-in op does, done once for ops written outside the engine:
//  - the name: an OpScope(name) around the forward, so everything it allocates is "<name>" in the
//    tracker and the out-of-memory report; the engine opens OpScope(name, true) around the node's
//    backward ("<name> backward"). Names are interned (kept for the process) because OpScope and
//    Node hold a const char*.
//  - memory: the forward runs under the category a built-in op's output gets
//    (detail::output_category: activations while a graph is recorded), so its output and whatever
//    it saves are activations; temporaries it frees on the way are too while they live. Gradient
//    recording is off inside it (as PyTorch's): the function is one node, not the ops within.
//  - gradients: the backward returns plain tensors, one per input; each one an input needs is
//    checked against the input's shape, type and device and handed to the input's GradSink, which
//    overwrites a stale leaf buffer, accumulates into a fresh one (beta 1), or becomes an inner
//    node's pending gradient (Note [Gradient sinks]). A gradient that shares storage with the
//    incoming gradient or with another returned gradient is copied first: a pending gradient is
//    later added into in place, and must not be an alias of another.
//  - inputs that need no gradient get no sink: the backward may return an undefined tensor for
//    them, and FunctionContext::needs_input_grad tells it which.
#include "cumulus/autograd/function.h"

#include <mutex>
#include <set>

#include "cumulus/autograd/grad_mode.h"
#include "cumulus/autograd/node.h"
#include "cumulus/core/error.h"
#include "cumulus/memory/category.h"
#include "engine/ops/internal.h"
#include "engine/tensor/tensor_impl.h"

namespace cumulus::autograd {

namespace {

const char* interned(const std::string& name) {
  static std::mutex mutex;
  static std::set<std::string> names;
  std::lock_guard<std::mutex> lock(mutex);
  return names.insert(name).first->c_str();
}

struct InputInfo {
  Shape shape;
  DType dtype = DType::f32;
  Device device;
};

bool shares_storage(const Tensor& a, const Tensor& b) {
  return a.defined() && b.defined() && impl_of(a)->storage != nullptr && impl_of(a)->storage == impl_of(b)->storage;
}

}  // namespace

void FunctionContext::save_for_backward(std::vector<Tensor> tensors) {
  saved_.clear();
  for (const Tensor& t : tensors) saved_.push_back(t.defined() ? t.detach() : Tensor());
}

class FunctionNode final : public Node {
 public:
  FunctionNode(std::shared_ptr<FunctionContext> ctx, std::vector<InputInfo> inputs, BackwardFunction backward)
      : Node(ctx->name_), ctx_(std::move(ctx)), inputs_(std::move(inputs)), backward_(std::move(backward)) {}

  void backward(const Tensor& dy, std::vector<GradSink>& sinks) override {
    for (std::size_t i = 0; i < sinks.size(); ++i) ctx_->needs_grad_[i] = sinks[i].needed();
    const std::vector<Tensor> grads = backward_(*ctx_, dy);
    CUMULUS_CHECK(grads.size() == inputs_.size(), InvalidArgument, "custom op ", name(), ": backward returned ",
                  grads.size(), " gradient(s) for ", inputs_.size(),
                  " input(s); return one per input (an "
                  "undefined Tensor for an input that needs none)");
    std::vector<Tensor> given;
    for (std::size_t i = 0; i < grads.size(); ++i) {
      if (!sinks[i].needed()) continue;
      Tensor g = grads[i];
      check_gradient(i, g);
      bool aliased = shares_storage(g, dy);
      for (const Tensor& other : given) aliased = aliased || shares_storage(g, other);
      if (aliased) g = g.clone();
      sinks[i].give(g);
      given.push_back(g);
    }
  }
  void release_saved() override {
    ctx_->saved_.clear();
    ctx_->saved_data.clear();
  }

 private:
  void check_gradient(std::size_t i, const Tensor& g) const {
    const InputInfo& in = inputs_[i];
    CUMULUS_CHECK(g.defined(), InvalidArgument, "custom op ", name(), ": backward returned no gradient for input ", i,
                  ", which requires one");
    CUMULUS_CHECK(g.shape() == in.shape, ShapeError, "custom op ", name(), ": the gradient of input ", i, " is ",
                  g.shape().str(), " but the input is ", in.shape.str());
    CUMULUS_CHECK(g.dtype() == in.dtype, InvalidArgument, "custom op ", name(), ": the gradient of input ", i, " is ",
                  dtype_name(g.dtype()), " but the input is ", dtype_name(in.dtype));
    CUMULUS_CHECK(g.device() == in.device, DeviceError, "custom op ", name(), ": the gradient of input ", i, " is on ",
                  g.device().str(), " but the input is on ", in.device.str());
  }

  std::shared_ptr<FunctionContext> ctx_;
  std::vector<InputInfo> inputs_;
  BackwardFunction backward_;
};

namespace {

void check_output(const char* op, const Tensor& out, const std::vector<Tensor>& inputs, bool record) {
  CUMULUS_CHECK(out.defined(), InvalidArgument, "custom op ", op, ": forward returned an undefined tensor");
  for (std::size_t i = 0; i < inputs.size(); ++i)
    CUMULUS_CHECK(!inputs[i].defined() || impl_of(out) != impl_of(inputs[i]), InvalidArgument, "custom op ", op,
                  ": forward returned input ", i,
                  " itself; return a new tensor (a copy, or a view through "
                  "ops::reshape)");
  CUMULUS_CHECK(!out.requires_grad(), InvalidArgument, "custom op ", op,
                ": forward returned a tensor that is already part of a graph (made outside the forward)");
  CUMULUS_CHECK(!record || is_floating(out.dtype()), InvalidArgument, "custom op ", op,
                ": an output that takes a gradient must be f32, bf16 or f16, got ", dtype_name(out.dtype()));
}

}  // namespace

Tensor apply_function(const std::string& name, const std::vector<Tensor>& inputs, const ForwardFunction& forward,
                      BackwardFunction backward) {
  const char* op = interned(name);
  OpScope op_scope(op);
  CUMULUS_CHECK(!name.empty(), InvalidArgument, "custom op: the name is empty");
  CUMULUS_CHECK(forward && backward, InvalidArgument, "custom op ", op, ": needs a forward and a backward");
  std::vector<const Tensor*> pointers;
  for (const Tensor& t : inputs) pointers.push_back(&t);
  const bool record = should_record(pointers);
  auto ctx = std::make_shared<FunctionContext>();
  ctx->name_ = op;
  std::vector<InputInfo> info;
  for (const Tensor& t : inputs) {
    ctx->needs_grad_.push_back(record && t.defined() && t.requires_grad());
    info.push_back(t.defined() ? InputInfo{t.shape(), t.dtype(), t.device()} : InputInfo{});
  }
  Tensor out;
  {
    MemoryCategoryScope category(ops::detail::output_category());
    NoGradGuard no_grad;
    out = forward(*ctx, inputs);
  }
  check_output(op, out, inputs, record);
  if (record) attach_node(out, std::make_shared<FunctionNode>(ctx, std::move(info), std::move(backward)), pointers);
  return out;
}

}  // namespace cumulus::autograd
