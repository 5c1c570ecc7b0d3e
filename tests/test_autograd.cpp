// The backward engine: persistent gradient buffers (accumulate across backward calls at a fixed
// address, stale means overwrite without reading), saved tensors released as backward runs, grad
// mode, inputs used twice, and errors that name the op.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "cumulus/autograd/grad_mode.h"
#include "cumulus/autograd/node.h"
#include "cumulus/core/error.h"
#include "cumulus/memory/allocator.h"
#include "cumulus/nn/flat_parameters.h"
#include "cumulus/ops/linear.h"
#include "cumulus/ops/loss.h"
#include "cumulus/ops/pointwise.h"
#include "cumulus/ops/reduce.h"
#include "cumulus/ops/shape.h"
#include "cumulus/optim/sgd.h"
#include "cumulus/tensor/random.h"
#include "cumulus/tensor/tensor.h"
#include "cumulus/train/trainer.h"
#include "engine/tensor/tensor_impl.h"
#include "test_util.h"

namespace cumulus {
namespace {

using testing::DeviceTest;
using testing::max_rel_diff;

using Grads = std::vector<std::vector<float>>;

// A leaf that requires grad, uniform in [lo, hi).
Tensor leaf(const Shape& s, float lo, float hi, Generator& g, Device d) {
  Tensor t = uniform(s, lo, hi, g, d);
  t.set_requires_grad(true);
  return t;
}

// linear -> relu -> linear -> cross_entropy(Sum), on raw leaves.
struct TinyModel {
  Tensor w1, b1, w2, b2;
  TinyModel(int64_t in, int64_t hidden, int64_t classes, uint64_t seed, Device d) {
    Generator g(seed);
    const float k1 = 1.0f / std::sqrt(float(in)), k2 = 1.0f / std::sqrt(float(hidden));
    w1 = leaf({hidden, in}, -k1, k1, g, d);
    b1 = leaf({hidden}, -k1, k1, g, d);
    w2 = leaf({classes, hidden}, -k2, k2, g, d);
    b2 = leaf({classes}, -k2, k2, g, d);
  }
  std::vector<Tensor> params() const { return {w1, b1, w2, b2}; }
  Tensor loss(const Tensor& x, const Tensor& y, ops::Reduction r = ops::Reduction::Sum) const {
    Tensor logits = ops::linear(ops::relu(ops::linear(x, w1, b1)), w2, b2);
    return ops::cross_entropy(logits, y, r);
  }
  void mark_stale() const {
    for (const Tensor& p : params()) p.mark_grad_stale();
  }
};

Grads grads_of(const std::vector<Tensor>& ps) {
  Grads out;
  for (const Tensor& p : ps) {
    Tensor g = p.grad();
    EXPECT_TRUE(g.defined()) << "no gradient accumulated";
    out.push_back(g.defined() ? g.to_vector<float>() : std::vector<float>(p.numel(), 0.0f));
  }
  return out;
}

Tensor labels(const std::vector<int32_t>& v, Device d) {
  return Tensor::from_vector<int32_t>(v, {int64_t(v.size())}, d);
}

bool all_finite(const std::vector<float>& v) {
  for (float x : v)
    if (!std::isfinite(x)) return false;
  return true;
}

class AutogradTest : public DeviceTest {};

TEST_P(AutogradTest, TwoBackwardsAccumulateTheSum) {
  const Device d = device();
  TinyModel m(6, 8, 4, 1, d);
  Generator g(100);
  Tensor x1 = uniform({5, 6}, -1, 1, g, d), x2 = uniform({5, 6}, -1, 1, g, d);
  Tensor y1 = labels({0, 3, 1, 2, 3}, d), y2 = labels({2, 2, 0, 1, 3}, d);
  std::vector<Tensor> all = m.params();

  m.loss(x1, y1).backward();
  for (const Tensor& p : all) EXPECT_FALSE(p.grad_stale());
  m.loss(x2, y2).backward();
  const Grads acc = grads_of(all);

  m.mark_stale();
  m.loss(x1, y1).backward();
  const Grads g1 = grads_of(all);
  m.mark_stale();
  m.loss(x2, y2).backward();
  const Grads g2 = grads_of(all);

  const char* names[] = {"w1", "b1", "w2", "b2"};
  for (std::size_t i = 0; i < all.size(); ++i) {
    std::vector<float> sum(g1[i].size());
    for (std::size_t k = 0; k < sum.size(); ++k) sum[k] = g1[i][k] + g2[i][k];
    EXPECT_LT(max_rel_diff(acc[i], sum), 1e-6) << names[i] << ": two backwards must leave g1 + g2";
    EXPECT_GT(max_rel_diff(acc[i], g2[i]), 1e-3) << names[i] << ": the first gradient was lost";
    EXPECT_GT(max_rel_diff(g1[i], g2[i]), 1e-3) << names[i] << ": the two batches should differ";
  }
}

TEST_P(AutogradTest, InputLeafAccumulatesAcrossSeparateLosses) {
  const Device d = device();
  Generator g(5);
  Tensor x = leaf({3, 4}, -1, 1, g, d);
  Tensor w = leaf({5, 4}, -0.5f, 0.5f, g, d);
  Tensor b = leaf({5}, -0.5f, 0.5f, g, d);
  Tensor y = labels({4, 0, 2}, d);
  auto loss_a = [&] { return ops::sum(ops::linear(x, w, b)); };
  auto loss_b = [&] { return ops::cross_entropy(ops::linear(x, w, b), y, ops::Reduction::Mean); };

  loss_a().backward();
  const Grads ga = grads_of({x, w, b});
  x.mark_grad_stale(); w.mark_grad_stale(); b.mark_grad_stale();
  loss_b().backward();
  const Grads gb = grads_of({x, w, b});
  x.mark_grad_stale(); w.mark_grad_stale(); b.mark_grad_stale();
  loss_a().backward();
  loss_b().backward();
  const Grads both = grads_of({x, w, b});
  for (std::size_t i = 0; i < 3; ++i) {
    std::vector<float> sum(ga[i].size());
    for (std::size_t k = 0; k < sum.size(); ++k) sum[k] = ga[i][k] + gb[i][k];
    EXPECT_LT(max_rel_diff(both[i], sum), 1e-6) << "leaf " << i;
  }
  // d sum(x W^T + b) / db = B for every output.
  for (float v : ga[2]) EXPECT_FLOAT_EQ(v, 3.0f);
}

TEST_P(AutogradTest, GradBufferAddressNeverChanges) {
  const Device d = device();
  TinyModel m(6, 8, 4, 2, d);
  const std::vector<Tensor> ps = m.params();
  for (const Tensor& p : ps) {
    EXPECT_FALSE(p.grad_buffer().defined()) << "a raw leaf has no buffer before it needs one";
    p.allocate_grad();
    ASSERT_TRUE(p.grad_buffer().defined());
    EXPECT_EQ(p.grad_buffer().memory_category(), MemoryCategory::gradients);
    EXPECT_EQ(p.grad_buffer().shape(), p.shape());
    EXPECT_TRUE(p.grad_stale());
    EXPECT_FALSE(p.grad().defined());
  }
  // The optimizer works on flat buffers: the leaves' data and gradient buffers become views.
  const std::vector<std::vector<float>> initial = {ps[0].to_vector<float>(), ps[3].to_vector<float>()};
  auto flat = std::make_shared<nn::FlatParameters>(
      std::vector<std::pair<std::string, Tensor>>{{"w1", m.w1}, {"b1", m.b1}, {"w2", m.w2}, {"b2", m.b2}});
  EXPECT_EQ(ps[0].to_vector<float>(), initial[0]) << "flattening keeps the values";
  EXPECT_EQ(ps[3].to_vector<float>(), initial[1]);
  std::vector<void*> addr;
  for (std::size_t i = 0; i < ps.size(); ++i) {
    const auto& slot = flat->slots()[i];
    EXPECT_EQ(ps[i].grad_buffer().raw_data(),
              static_cast<char*>(flat->gradients().raw_data()) + slot.offset * 4)
        << "param " << i << "'s gradient is a view into the flat gradient buffer";
    EXPECT_TRUE(ps[i].grad_stale());
    addr.push_back(ps[i].grad_buffer().raw_data());
  }
  CachingAllocator& A = allocator_for(d);
  const int64_t grad_bytes = A.stats()[MemoryCategory::gradients].current;
  const int64_t grad_allocs = A.stats()[MemoryCategory::gradients].allocs;

  auto check_addresses = [&](const char* when) {
    for (std::size_t i = 0; i < ps.size(); ++i)
      EXPECT_EQ(ps[i].grad_buffer().raw_data(), addr[i]) << "param " << i << " " << when;
  };
  const float lr = 0.05f;
  optim::SGDOptions options;
  options.lr = lr;
  optim::SGD opt(flat, options);
  EXPECT_EQ(opt.lr(), lr);
  Generator g(7);
  for (int step = 0; step < 4; ++step) {
    for (int micro = 0; micro < 2; ++micro) {
      Tensor x = uniform({4, 6}, -1, 1, g, d);
      m.loss(x, labels({micro, 1, 2, 3}, d)).backward();
      check_addresses("after backward");
      EXPECT_EQ(ps[0].grad().raw_data(), addr[0]) << "grad() is the buffer itself";
    }
    std::vector<std::vector<float>> before, grad;
    for (const Tensor& p : ps) {
      before.push_back(p.to_vector<float>());
      grad.push_back(p.grad().to_vector<float>());
    }
    opt.step();
    check_addresses("after step");
    for (std::size_t i = 0; i < ps.size(); ++i) {
      std::vector<float> expected(before[i].size());
      for (std::size_t k = 0; k < expected.size(); ++k) expected[k] = before[i][k] - lr * grad[i][k];
      EXPECT_LT(max_rel_diff(ps[i].to_vector<float>(), expected), 1e-6) << "SGD: w -= lr * grad, param " << i;
    }
    opt.zero_grad();
    check_addresses("after zero_grad");
    for (const Tensor& p : ps) {
      EXPECT_TRUE(p.grad_stale());
      EXPECT_FALSE(p.grad().defined());
    }
    // A step with every gradient stale changes nothing.
    std::vector<std::vector<float>> frozen;
    for (const Tensor& p : ps) frozen.push_back(p.to_vector<float>());
    opt.step();
    for (std::size_t i = 0; i < ps.size(); ++i)
      EXPECT_EQ(ps[i].to_vector<float>(), frozen[i]) << "SGD stepped with a stale gradient, param " << i;
  }
  EXPECT_EQ(A.stats()[MemoryCategory::gradients].current, grad_bytes) << "no new gradient memory";
  EXPECT_EQ(A.stats()[MemoryCategory::gradients].allocs, grad_allocs) << "no gradient reallocation";
}

TEST_P(AutogradTest, StaleBufferIsOverwrittenWithoutBeingRead) {
  const Device d = device();
  TinyModel m(6, 8, 4, 3, d);
  const std::vector<Tensor> ps = m.params();
  Generator g(9);
  Tensor x1 = uniform({5, 6}, -1, 1, g, d), x2 = uniform({5, 6}, -1, 1, g, d);
  Tensor y1 = labels({1, 1, 0, 3, 2}, d), y2 = labels({3, 0, 0, 2, 1}, d);

  m.loss(x2, y2).backward();
  const Grads g2 = grads_of(ps);

  // Accumulate something else, then poison the buffers and mark them stale.
  m.loss(x1, y1).backward();
  std::vector<void*> addr;
  for (const Tensor& p : ps) {
    Tensor buf = p.grad_buffer();
    addr.push_back(buf.raw_data());
    buf.copy_from(Tensor::full(p.shape(), std::numeric_limits<float>::quiet_NaN(), d));
    p.mark_grad_stale();
    EXPECT_TRUE(p.grad_stale());
    EXPECT_FALSE(p.grad().defined()) << "grad() is undefined while stale";
    ASSERT_TRUE(p.grad_buffer().defined()) << "the buffer itself stays";
    EXPECT_EQ(p.grad_buffer().raw_data(), buf.raw_data());
  }

  m.loss(x2, y2).backward();
  const Grads again = grads_of(ps);
  for (std::size_t i = 0; i < ps.size(); ++i) {
    EXPECT_EQ(ps[i].grad_buffer().raw_data(), addr[i]);
    EXPECT_TRUE(all_finite(again[i])) << "param " << i << ": beta = 0 must not read the NaN buffer";
    EXPECT_LT(max_rel_diff(again[i], g2[i]), 1e-6) << "param " << i << ": stale means overwrite, not add";
  }
}

TEST_P(AutogradTest, ActivationMemoryIsReleasedByBackward) {
  const Device d = device();
  // A first layer much larger than any per-sample tensor, so a parameter-sized temporary shows.
  const int64_t in = 256, hidden = 64, classes = 10, batch = 4;
  TinyModel m(in, hidden, classes, 4, d);
  for (const Tensor& p : m.params()) p.allocate_grad();
  Generator g(10);
  Tensor x = uniform({batch, in}, -1, 1, g, d);
  Tensor y = labels({0, 9, 5, 5}, d);
  m.loss(x, y).backward();  // warm-up: library workspaces, caches
  m.mark_stale();

  CachingAllocator& A = allocator_for(d);
  const MemoryStats before = A.stats();
  const auto act = MemoryCategory::activations, tmp = MemoryCategory::backward_temporaries,
             grads = MemoryCategory::gradients;
  {
    Tensor loss = m.loss(x, y);
    const MemoryStats fwd = A.stats();
    EXPECT_GT(fwd[act].current, before[act].current) << "the forward holds activations for backward";
    EXPECT_GT(fwd[act].allocs, before[act].allocs);
    A.reset_peak();
    loss.backward();
    const MemoryStats bwd = A.stats();
    EXPECT_LT(bwd[act].current, fwd[act].current) << "backward releases saved tensors as it goes";
    EXPECT_EQ(bwd[tmp].current, before[tmp].current) << "backward temporaries are gone when it returns";
    EXPECT_GT(bwd[tmp].allocs, before[tmp].allocs) << "backward made some temporaries";
    EXPECT_EQ(bwd[grads].current, before[grads].current) << "gradients land in the existing buffers";
    const int64_t w1_bytes = hidden * in * 4;
    EXPECT_LT(bwd[tmp].peak - before[tmp].current, w1_bytes)
        << "no parameter-sized temporary for a weight gradient (Note [Gradient sinks])";
  }
  const MemoryStats after = A.stats();
  EXPECT_EQ(after[act].current, before[act].current) << "activations back to before the forward";
  EXPECT_EQ(after[tmp].current, before[tmp].current);
  EXPECT_EQ(after.allocated - before.allocated, 0) << "nothing leaked";

  // A forward that is dropped without backward frees everything as well (no reference cycles).
  { Tensor loss = m.loss(x, y); }
  EXPECT_EQ(A.stats()[act].current, before[act].current) << "a dropped graph frees its activations";
  EXPECT_EQ(A.stats().allocated, before.allocated);
}

TEST_P(AutogradTest, SecondBackwardThroughTheSameGraphThrows) {
  const Device d = device();
  TinyModel m(6, 8, 4, 5, d);
  Generator g(11);
  Tensor x = uniform({3, 6}, -1, 1, g, d);
  Tensor y = labels({0, 1, 2}, d);
  Tensor loss = m.loss(x, y);
  loss.backward();
  try {
    loss.backward();
    ADD_FAILURE() << "a second backward through released saved tensors must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cross_entropy"), std::string::npos) << "names the op: " << e.what();
  }

  // A new graph that reaches a consumed node names that node.
  Tensor h = ops::relu(ops::linear(x, m.w1, m.b1));
  ops::sum(h).backward();
  try {
    ops::mean(h).backward();
    ADD_FAILURE() << "the relu node was already consumed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("relu"), std::string::npos) << "names the op: " << e.what();
  }

  // The engine is fine afterwards: a fresh forward works.
  m.mark_stale();
  EXPECT_NO_THROW(m.loss(x, y).backward());
  EXPECT_TRUE(all_finite(m.w1.grad().to_vector<float>()));
}

TEST_P(AutogradTest, NoGradGuard) {
  const Device d = device();
  TinyModel m(6, 8, 4, 6, d);
  Generator g(12);
  Tensor x = uniform({3, 6}, -1, 1, g, d);
  EXPECT_TRUE(GradMode::enabled());
  {
    Tensor recorded = ops::linear(x, m.w1, m.b1);
    EXPECT_TRUE(recorded.requires_grad());
    ASSERT_NE(recorded.grad_fn(), nullptr);
    EXPECT_STREQ(recorded.grad_fn()->name(), "linear");
    EXPECT_FALSE(recorded.is_leaf());
    EXPECT_EQ(recorded.memory_category(), MemoryCategory::activations);
  }
  {
    NoGradGuard guard;
    EXPECT_FALSE(GradMode::enabled());
    Tensor h = ops::linear(x, m.w1, m.b1);
    EXPECT_FALSE(h.requires_grad());
    EXPECT_EQ(h.grad_fn(), nullptr);
    EXPECT_NE(h.memory_category(), MemoryCategory::activations) << "not held for a backward";
    Tensor r = ops::relu(h);
    Tensor s = ops::sum(r);
    EXPECT_FALSE(s.requires_grad());
    EXPECT_EQ(s.grad_fn(), nullptr);
    EXPECT_THROW(s.backward(), InvalidArgument);
    Tensor ce = ops::cross_entropy(ops::linear(r, m.w2, m.b2), labels({0, 1, 2}, d));
    EXPECT_FALSE(ce.requires_grad());
    {
      NoGradGuard nested;
      EXPECT_FALSE(GradMode::enabled());
    }
    EXPECT_FALSE(GradMode::enabled()) << "the nested guard restores the outer state";
  }
  EXPECT_TRUE(GradMode::enabled()) << "the guard restores grad mode";
  // With grad mode on, ops on tensors that need no grad record nothing either.
  Tensor plain = ops::relu(x);
  EXPECT_FALSE(plain.requires_grad());
  EXPECT_EQ(plain.grad_fn(), nullptr);
  EXPECT_THROW(ops::sum(plain).backward(), InvalidArgument);
  for (const Tensor& p : m.params()) EXPECT_FALSE(p.grad().defined()) << "nothing was accumulated";
}

// S = sum(X X^T) = sum_k (sum_a X[a,k])^2, so dS/dX[i,j] = 2 * colsum(X)[j]. linear(X, X) feeds the
// same tensor to both inputs of one op: its gradient sink is written twice in one backward.
TEST_P(AutogradTest, TensorUsedTwiceInOneOp) {
  const Device d = device();
  const int n = 4;
  Generator g(13);
  std::vector<float> xv(n * n);
  g.fill_uniform(xv.data(), n * n, -1, 1);
  for (float& v : xv)
    if (std::fabs(v) < 0.05f) v = v < 0 ? -0.3f : 0.3f;  // away from relu's kink

  // A leaf used twice; its buffer is poisoned and stale, so the first write must use beta = 0
  // and the second beta = 1.
  Tensor X = Tensor::from_vector(xv, {n, n}, d);
  X.set_requires_grad(true);
  X.allocate_grad();
  X.grad_buffer().copy_from(Tensor::full({n, n}, std::numeric_limits<float>::quiet_NaN(), d));
  X.mark_grad_stale();
  ops::sum(ops::linear(X, X, Tensor())).backward();
  std::vector<double> col(n, 0.0);
  for (int a = 0; a < n; ++a)
    for (int j = 0; j < n; ++j) col[j] += xv[a * n + j];
  std::vector<float> expected(n * n);
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) expected[i * n + j] = float(2.0 * col[j]);
  const std::vector<float> got = X.grad().to_vector<float>();
  EXPECT_TRUE(all_finite(got));
  EXPECT_LT(max_rel_diff(got, expected), 1e-5) << "a leaf used twice gets both contributions";

  // An inner tensor used twice: the engine adds the two contributions before relu's backward.
  Tensor X2 = Tensor::from_vector(xv, {n, n}, d);
  X2.set_requires_grad(true);
  Tensor H = ops::relu(X2);
  ops::sum(ops::linear(H, H, Tensor())).backward();
  std::vector<double> hcol(n, 0.0);
  for (int a = 0; a < n; ++a)
    for (int j = 0; j < n; ++j) hcol[j] += std::max(0.0f, xv[a * n + j]);
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) expected[i * n + j] = xv[i * n + j] > 0 ? float(2.0 * hcol[j]) : 0.0f;
  EXPECT_LT(max_rel_diff(X2.grad().to_vector<float>(), expected), 1e-5)
      << "an inner node used twice gets both contributions";
}

// add gives its dy to both operands as is (Note [Gradient sinks]): when one operand's pending
// gradient gets a second contribution while the other operand's still holds the shared dy, that
// add must go to a copy. h and g feed s = h + g and one more op each, so whichever of u or v the
// walk reaches after s adds into a shared gradient; every order of the loss's terms is tried.
// dloss/dh = 1 + 3, dloss/dg = 1 + 7, dx = 4 * 2 + 8 * 5 (without the copy: 62 or 63 in two orders).
TEST_P(AutogradTest, AddsSharedGradientIsCopiedBeforeAnAddIntoIt) {
  const Device d = device();
  std::vector<int> order{0, 1, 2};
  do {
    SCOPED_TRACE("terms in order " + std::to_string(order[0]) + std::to_string(order[1]) + std::to_string(order[2]));
    Tensor x = Tensor::from_vector(std::vector<float>{0.5f, -1.0f, 2.0f}, {3}, d);
    x.set_requires_grad(true);
    const Tensor h = x * 2.0f, g = x * 5.0f;
    const Tensor terms[3] = {ops::sum(h + g), ops::sum(h * 3.0f), ops::sum(g * 7.0f)};
    (terms[order[0]] + terms[order[1]] + terms[order[2]]).backward();
    EXPECT_EQ(x.grad().to_vector<float>(), std::vector<float>(3, 48.0f));
  } while (std::next_permutation(order.begin(), order.end()));
  Tensor x = Tensor::from_vector(std::vector<float>{0.5f, -1.0f}, {2}, d);  // both operands one tensor
  x.set_requires_grad(true);
  ops::sum((x * 1.0f) + (x * 1.0f) + x).backward();
  EXPECT_EQ(x.grad().to_vector<float>(), std::vector<float>(2, 3.0f));
}

TEST_P(AutogradTest, BackwardChecksItsRoot) {
  const Device d = device();
  Tensor s = Tensor::full({}, 2.0f, d);
  s.set_requires_grad(true);
  s.backward();  // a leaf scalar: its gradient is the seed
  ASSERT_TRUE(s.grad().defined());
  EXPECT_EQ(s.grad().item(), 1.0f);

  Generator g(14);
  Tensor w = leaf({3, 2}, -1, 1, g, d);
  Tensor x = uniform({4, 2}, -1, 1, g, d);
  Tensor y = ops::linear(x, w, Tensor());
  EXPECT_THROW(y.backward(), ShapeError) << "backward needs a scalar";
  EXPECT_THROW(Tensor().backward(), InvalidArgument);
}

// A seed given as a tensor is borrowed (the Trainer keeps its seeds): the engine reads it and
// never writes it, even where a node may form its gradient in place. Here the fused linear+relu
// receives a view of the seed (through reshape) and its ReLU masks everything: writing in place
// would turn the seed into 0.
TEST_P(AutogradTest, ABorrowedSeedIsNeverWritten) {
  const Device d = device();
  Generator g(15);
  Tensor w = leaf({1, 3}, -1, 1, g, d);
  const Tensor x = Tensor::full({1, 3}, 1.0f, d);
  const Tensor bias = Tensor::full({1}, -10.0f, d);  // y < 0: the ReLU passes no gradient
  auto forward = [&] { return ops::linear(x, w, bias, ops::Activation::relu).reshape({}); };
  const Tensor seed = Tensor::full({}, 2.0f, d);
  run_backward(forward(), seed);
  EXPECT_EQ(seed.item(), 2.0f);
  const std::vector<float> borrowed = w.grad().to_vector<float>();
  w.mark_grad_stale();
  run_backward(forward(), 2.0f);
  EXPECT_EQ(borrowed, w.grad().to_vector<float>());

  EXPECT_THROW(run_backward(forward(), Tensor::full({1}, 1.0f, d)), InvalidArgument) << "not the root's shape";
  EXPECT_THROW(run_backward(forward(), Tensor::zeros({}, DType::i32, d)), InvalidArgument) << "not f32";
  EXPECT_THROW(run_backward(forward(), Tensor()), InvalidArgument);
}

TEST_P(AutogradTest, ErrorsNameTheOp) {
  const Device d = device();
  Generator g(15);
  Tensor x = uniform({4, 6}, -1, 1, g, d);
  Tensor w = leaf({5, 7}, -1, 1, g, d);
  Tensor b = leaf({5}, -1, 1, g, d);
  try {
    ops::linear(x, w, b);
    ADD_FAILURE() << "in_features 6 vs 7 must throw";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("linear"), std::string::npos) << e.what();
  }
  Tensor w_ok = leaf({5, 6}, -1, 1, g, d);
  Tensor b_bad = leaf({4}, -1, 1, g, d);
  EXPECT_THROW(ops::linear(x, w_ok, b_bad), ShapeError) << "bias of the wrong length";
  EXPECT_THROW(ops::linear(ops::reshape(x, {24}), w_ok, b), ShapeError) << "1-d input";

  Tensor logits = uniform({4, 3}, -1, 1, g, d);
  Tensor float_labels = Tensor::zeros({4}, DType::f32, d);
  try {
    ops::cross_entropy(logits, float_labels);
    ADD_FAILURE() << "f32 labels must throw";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("cross_entropy"), std::string::npos) << e.what();
  }
  try {
    ops::cross_entropy(logits, labels({0, 1, 2}, d));
    ADD_FAILURE() << "3 labels for 4 rows must throw";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("cross_entropy"), std::string::npos) << e.what();
  }
  try {
    ops::relu(Tensor::zeros({3}, DType::i32, d));
    ADD_FAILURE() << "relu of i32 must throw";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("relu"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ops::argmax(Tensor::zeros({3}, DType::f32, d)), ShapeError);
}

TEST_P(AutogradTest, MixingDevicesThrowsDeviceError) {
  if (!cuda_available()) GTEST_SKIP() << "needs a CUDA device besides the CPU";
  const Device d = device();
  const Device other = d.is_cpu() ? Device::cuda(0) : Device::cpu();
  Generator g(16);
  Tensor x = uniform({4, 6}, -1, 1, g, d);
  Tensor w = uniform({5, 6}, -1, 1, g, other);
  Tensor b = uniform({5}, -1, 1, g, d);
  try {
    ops::linear(x, w, b);
    ADD_FAILURE() << "weight on another device must throw";
  } catch (const DeviceError& e) {
    EXPECT_NE(std::string(e.what()).find("linear"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ops::linear(x, uniform({5, 6}, -1, 1, g, d), uniform({5}, -1, 1, g, other)), DeviceError);
  EXPECT_THROW(ops::cross_entropy(uniform({4, 3}, -1, 1, g, d), labels({0, 1, 2, 0}, other)), DeviceError);
}

// A test node of type N made the producer of `out`, with `inputs`' edges.
template <typename N, typename... Args>
std::shared_ptr<N> record(Tensor& out, std::initializer_list<const Tensor*> inputs, Args... args) {
  auto node = std::make_shared<N>(args...);
  attach_node(out, node, inputs);
  return node;
}

// ---- the engine's side of Note [Deferred gradient adds] -------------------------------------------
// Hands its gradient to every input; an accumulating contribution goes to defer_add where the sink
// allows it (as a CUDA Linear's bias gradient does).
class DeferringPassThrough final : public Node {
 public:
  DeferringPassThrough() : Node("deferring_pass_through") {}
  void backward(const Tensor& dy, std::vector<GradSink>& grads) override {
    for (GradSink& g : grads) {
      if (!g.needed()) continue;
      if (!g.can_defer_add()) {
        g.give(dy);
        continue;
      }
      GradSink::Target t = g.begin(dy.shape(), dy.device());
      if (t.mode == GradientMode::overwrite) {
        t.tensor.copy_from(dy);
      } else {
        g.defer_add(dy.clone());
        ++deferred;
      }
    }
  }
  int deferred = 0;
};

TEST_P(AutogradTest, DeferredGradientAddsLandBeforeBackwardReturns) {
  const Device d = device();
  auto leaf = [&] {
    Tensor x = Tensor::full({3}, 0.0f, d);
    x.set_requires_grad(true);
    return x;
  };
  auto filled = [](float v) { return std::vector<float>(3, v); };
  Tensor x = leaf();
  {  // x used twice by one op: the first contribution overwrites the stale buffer, the second waits
    Tensor c = Tensor::full({3}, 1.0f, d);
    auto node = record<DeferringPassThrough>(c, {&x, &x});
    ops::sum(c).backward();
    EXPECT_EQ(node->deferred, 1);
    EXPECT_EQ(x.grad().to_vector<float>(), filled(2.0f));
  }
  {  // the next backward accumulates: both wait, and land one after the other (the same target)
    Tensor c = Tensor::full({3}, 1.0f, d);
    auto node = record<DeferringPassThrough>(c, {&x, &x});
    ops::sum(c).backward();
    EXPECT_EQ(node->deferred, 2);
    EXPECT_EQ(x.grad().to_vector<float>(), filled(4.0f));
  }
  {  // 20 leaves used twice: more targets than one launch takes, and repeated targets
    std::vector<Tensor> leaves;
    for (int i = 0; i < 20; ++i) leaves.push_back(leaf());
    for (int round = 1; round <= 2; ++round) {
      Tensor c = Tensor::full({3}, 1.0f, d);
      auto node = std::make_shared<DeferringPassThrough>();
      for (const Tensor& l : leaves)
        for (int use = 0; use < 2; ++use) node->next_edges().push_back(edge_to(l));
      attach_node(c, node, {});
      ops::sum(c).backward();
      EXPECT_EQ(node->deferred, round == 1 ? 20 : 40);
      for (const Tensor& l : leaves) EXPECT_EQ(l.grad().to_vector<float>(), filled(2.0f * round)) << "round " << round;
    }
  }
  {  // a backward that reports finished leaves defers nothing: at the report the gradient is final
    x.mark_grad_stale();
    Tensor c = Tensor::full({3}, 1.0f, d);
    auto node = record<DeferringPassThrough>(c, {&x, &x});
    int reports = 0;
    run_backward(ops::sum(c), 1.0f, [&](const TensorImpl* done) {
      EXPECT_EQ(done, impl_of(x).get());
      EXPECT_EQ(x.grad().to_vector<float>(), filled(2.0f));
      ++reports;
    });
    EXPECT_EQ(reports, 1);
    EXPECT_EQ(node->deferred, 0);
  }
}

// The reasons grad() gives for an undefined gradient (Note [Why a gradient is undefined]); the one
// after an optimizer step is tested in test_optim.cpp.
TEST_P(AutogradTest, UndefinedGradientsSayWhy) {
  Generator g(4);
  const Device d = device();
  TinyModel m(5, 4, 3, 7, d);
  const Tensor x = uniform({2, 5}, -1, 1, g, d), y = labels({0, 2}, d);
  auto use_grad = [](const Tensor& t) {
    try {
      t.grad().numel();
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(use_grad(m.w1).find("before any backward"), std::string::npos) << use_grad(m.w1);
  const Tensor loss = m.loss(x, y);
  EXPECT_NE(use_grad(loss).find("only leaves keep a gradient"), std::string::npos) << use_grad(loss);
  loss.backward();
  EXPECT_NO_THROW(m.w1.grad().numel());
  m.mark_stale();
  EXPECT_NE(use_grad(m.w1).find("after zero_grad()"), std::string::npos) << use_grad(m.w1);
  EXPECT_NE(use_grad(x).find("does not require grad"), std::string::npos) << use_grad(x);
}

CUMULUS_INSTANTIATE_DEVICES(AutogradTest);

}  // namespace
}  // namespace cumulus
