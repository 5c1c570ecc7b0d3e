// The public custom-op API (cumulus/autograd/function.h, Note [Custom functions]): gradients
// accumulating across two backward calls and overwriting a stale buffer, inputs that need no
// gradient (and undefined ones), gradients passing between custom ops through pending gradients
// without aliasing, the op's name on its forward and backward, its output and saved tensors as
// activations released after backward, no recording under NoGradGuard, and the errors (wrong
// number, shape or type of returned gradients, a forward returning its input) naming the op. Its
// values and gradients against finite differences are the registry's (tests/op_cases/cases_custom_op.cpp).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cumulus/autograd/node.h"  // grad_fn()->name()
#include "cumulus/cumulus.h"
#include "test_util.h"

namespace cumulus {
namespace {

using autograd::FunctionContext;
using testing::DeviceTest;

std::vector<float> host(const Tensor& t) { return t.to(Device::cpu()).to_vector<float>(); }

Tensor like(const std::vector<float>& v, const Tensor& t) { return Tensor::from_vector(v, t.shape(), t.device()); }

// y = x^2; saves x. Records the op it ran under, forward and backward.
struct Square : autograd::Function<Square> {
  static constexpr const char* name = "square";
  static inline std::vector<std::string> seen;

  static Tensor forward(FunctionContext& ctx, const std::vector<Tensor>& in) {
    seen.push_back(op_label(current_op().name, current_op().backward));
    std::vector<float> x = host(in[0]);
    for (float& v : x) v *= v;
    ctx.save_for_backward({in[0]});
    return like(x, in[0]);
  }
  static std::vector<Tensor> backward(FunctionContext& ctx, const Tensor& dy) {
    seen.push_back(op_label(current_op().name, current_op().backward));
    std::vector<float> x = host(ctx.saved_tensors()[0]);
    const std::vector<float> d = host(dy);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = 2 * x[i] * d[i];
    return {like(x, dy)};
  }
};

// y = a + b, the gradient dy itself for both: the alias case of Note [Custom functions].
Tensor add(const Tensor& a, const Tensor& b) {
  return autograd::apply_function(
      "add2", {a, b},
      [](FunctionContext&, const std::vector<Tensor>& in) {
        std::vector<float> x = host(in[0]);
        const std::vector<float> y = host(in[1]);
        for (std::size_t i = 0; i < x.size(); ++i) x[i] += y[i];
        return like(x, in[0]);
      },
      [](FunctionContext&, const Tensor& dy) {
        return std::vector<Tensor>{dy, dy};
      });
}

// sum_i w_i y_i with w_i = i + 1: a non-uniform upstream gradient.
Tensor weighted_sum(const Tensor& y) {
  std::vector<float> w(static_cast<std::size_t>(y.numel()));
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i + 1);
  const Tensor weights = Tensor::from_vector(w, {1, y.numel()}, y.device());
  return ops::sum(ops::linear(ops::reshape(y, {1, y.numel()}), weights, Tensor()));
}

class CustomOpTest : public DeviceTest {};

TEST_P(CustomOpTest, GradientsAccumulateAcrossBackwardsAndOverwriteAStaleBuffer) {
  Tensor x = Tensor::from_vector<float>({1, -2, 3, 0.5f}, {2, 2}, device());
  x.set_requires_grad(true);
  const std::vector<float> once = {2 * 1 * 1, 2 * -2 * 2, 2 * 3 * 3, 2 * 0.5f * 4};  // 2 x w
  weighted_sum(Square::apply({x})).backward();
  EXPECT_EQ(host(x.grad()), once);
  const void* buffer = x.grad_buffer().raw_data();
  weighted_sum(Square::apply({x})).backward();
  std::vector<float> twice = once;
  for (float& v : twice) v *= 2;
  EXPECT_EQ(host(x.grad()), twice) << "the second backward adds into the buffer";
  EXPECT_EQ(x.grad_buffer().raw_data(), buffer);
  x.grad_buffer().copy_from(Tensor::full({2, 2}, NAN));
  x.mark_grad_stale();
  weighted_sum(Square::apply({x})).backward();
  EXPECT_EQ(host(x.grad()), once) << "a stale buffer is overwritten, not read";
}

TEST_P(CustomOpTest, InputsThatNeedNoGradientGetNone) {
  Tensor x = Tensor::from_vector<float>({1, 2, 3}, {3}, device());  // needs no gradient
  Tensor g = Tensor::from_vector<float>({2}, {1}, device());
  g.set_requires_grad(true);
  std::vector<bool> needs;
  auto scale = [&](const Tensor& in, const Tensor& gain, const Tensor& unused) {
    return autograd::apply_function(
        "scale", {in, gain, unused},
        [](FunctionContext& ctx, const std::vector<Tensor>& t) {
          EXPECT_FALSE(t[2].defined());
          ctx.save_for_backward({t[0], t[1]});
          std::vector<float> y = host(t[0]);
          for (float& v : y) v *= host(t[1])[0];
          return like(y, t[0]);
        },
        [&](FunctionContext& ctx, const Tensor& dy) {
          needs = {ctx.needs_input_grad(0), ctx.needs_input_grad(1), ctx.needs_input_grad(2)};
          const std::vector<float> xv = host(ctx.saved_tensors()[0]), d = host(dy);
          float dg = 0;
          for (std::size_t i = 0; i < xv.size(); ++i) dg += xv[i] * d[i];
          return std::vector<Tensor>{Tensor(), Tensor::from_vector<float>({dg}, {1}, dy.device()), Tensor()};
        });
  };
  weighted_sum(scale(x, g, Tensor())).backward();
  EXPECT_EQ(needs, (std::vector<bool>{false, true, false}));
  EXPECT_FALSE(x.grad_buffer().defined()) << "an input that needs no gradient gets no buffer";
  EXPECT_EQ(host(g.grad()), std::vector<float>{1 * 1 + 2 * 2 + 3 * 3});
}

// Gradients between custom ops go through the engine's pending gradients; add2 returns the
// incoming gradient itself for both inputs, and a's pending gradient is added into later: without
// the copy of Note [Custom functions], that add would also change b's gradient.
TEST_P(CustomOpTest, PendingGradientsAreNotAliased) {
  Tensor x1 = Tensor::from_vector<float>({1, 2}, {2}, device()), x2 = Tensor::from_vector<float>({3, 4}, {2}, device());
  x1.set_requires_grad(true);
  x2.set_requires_grad(true);
  const Tensor a = ops::relu(x1), b = ops::relu(x2);  // inner nodes, identity on these values
  weighted_sum(add(add(a, b), a)).backward();         // d/da = 2 w, d/db = w
  EXPECT_EQ(host(x1.grad()), (std::vector<float>{2, 4}));
  EXPECT_EQ(host(x2.grad()), (std::vector<float>{1, 2}));
}

TEST_P(CustomOpTest, NamedOutputAndSavedTensorsAreActivationsReleasedAfterBackward) {
  CachingAllocator& allocator = allocator_for(device());
  const int64_t before = allocator.stats()[MemoryCategory::activations].current;
  Tensor x = Tensor::from_vector<float>({1, 2, 3}, {3}, device());
  x.set_requires_grad(true);
  Square::seen.clear();
  Tensor y = Square::apply({x});
  EXPECT_EQ(y.memory_category(), MemoryCategory::activations);
  EXPECT_STREQ(y.grad_fn()->name(), "square");
  EXPECT_GT(allocator.stats()[MemoryCategory::activations].current, before);
  ops::sum(y).backward();
  y = Tensor();
  EXPECT_EQ(allocator.stats()[MemoryCategory::activations].current, before) << "saved tensors released";
  EXPECT_EQ(Square::seen, (std::vector<std::string>{"square", "square backward"}));
  {
    NoGradGuard no_grad;
    const Tensor z = Square::apply({x});
    EXPECT_EQ(z.grad_fn(), nullptr) << "nothing is recorded without grad mode";
    EXPECT_FALSE(z.requires_grad());
    EXPECT_EQ(z.memory_category(), MemoryCategory::other);
  }
}

template <typename E>
void expect_error(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no error";
  } catch (const E& e) {
    for (const std::string& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

// An op whose backward returns `grads(dy)`.
Tensor returning(const char* name, const Tensor& x, std::function<std::vector<Tensor>(const Tensor&)> grads) {
  return autograd::apply_function(
      name, {x}, [](FunctionContext&, const std::vector<Tensor>& in) { return in[0].clone(); },
      [grads](FunctionContext&, const Tensor& dy) { return grads(dy); });
}

TEST_P(CustomOpTest, ErrorsNameTheOp) {
  Tensor x = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3}, device());
  x.set_requires_grad(true);
  expect_error<InvalidArgument>(
      [&] {
        ops::sum(returning("two_grads", x, [](const Tensor& dy) { return std::vector<Tensor>{dy, dy}; })).backward();
      },
      {"custom op two_grads", "returned 2 gradient(s) for 1 input(s)"});
  expect_error<ShapeError>(
      [&] {
        ops::sum(returning("flat_grad", x, [](const Tensor& dy) {
          return std::vector<Tensor>{ops::reshape(dy, {6})};
        })).backward();
      },
      {"custom op flat_grad", "gradient of input 0 is [6]", "the input is [2, 3]"});
  expect_error<InvalidArgument>(
      [&] {
        ops::sum(returning("no_grad", x, [](const Tensor&) { return std::vector<Tensor>{Tensor()}; })).backward();
      },
      {"custom op no_grad", "no gradient for input 0"});
  expect_error<InvalidArgument>(
      [&] {
        ops::sum(returning("half_grad", x, [](const Tensor& dy) {
          return std::vector<Tensor>{ops::cast(dy, DType::f16)};
        })).backward();
      },
      {"custom op half_grad", "is f16 but the input is f32"});
  expect_error<InvalidArgument>(
      [&] {
        autograd::apply_function(
            "passthrough", {x}, [](FunctionContext&, const std::vector<Tensor>& in) { return in[0]; },
            [](FunctionContext&, const Tensor& dy) { return std::vector<Tensor>{dy}; });
      },
      {"custom op passthrough", "returned input 0 itself"});
}

CUMULUS_INSTANTIATE_DEVICES(CustomOpTest);

}  // namespace
}  // namespace cumulus
