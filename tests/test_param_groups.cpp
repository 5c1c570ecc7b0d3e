// Optimizer parameter groups (optim::ParamGroup, Optimizer::set_param_groups), torch.optim's
// param_groups: per-group lr multiplier and weight decay. AdamW with decay on the weights and none
// on the biases (optim::decay_matrices_only) matches a hand-written AdamW bit for bit on the CPU; a
// group's lr applies; frozen parameters stay untouched; the state saves and loads as before.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cumulus/core/error.h"
#include "cumulus/nn/activation_layers.h"
#include "cumulus/nn/flat_parameters.h"
#include "cumulus/nn/layers.h"
#include "cumulus/ops/reduce.h"
#include "cumulus/optim/adamw.h"
#include "cumulus/optim/sgd.h"
#include "cumulus/tensor/random.h"

namespace cumulus {
namespace {

struct Net {
  Net() {
    Generator gen(3);
    model.add(std::make_shared<nn::Linear>(4, 3, gen, Device::cpu()));
    model.add(std::make_shared<nn::ReLU>());
    model.add(std::make_shared<nn::Linear>(3, 2, gen, Device::cpu()));
    flat = std::make_shared<nn::FlatParameters>(model);
    // One backward makes every gradient slot current; the steps then write their own gradients.
    const Tensor x = Tensor::from_vector(std::vector<float>{0.5f, -1.0f, 2.0f, 0.25f}, Shape{1, 4});
    ops::sum(model(x)).backward();
  }
  // Step k's gradient: fixed values, different per element and step.
  void set_gradients(int k) {
    Tensor g = flat->gradients();
    std::vector<float> values(static_cast<std::size_t>(g.numel()));
    for (std::size_t i = 0; i < values.size(); ++i)
      values[i] = std::sin(0.7f * static_cast<float>(i) + 1.3f * static_cast<float>(k)) * 0.5f;
    g.copy_from(Tensor::from_vector(values, g.shape()));
  }
  nn::Sequential model;
  std::shared_ptr<nn::FlatParameters> flat;
};

// torch.optim.AdamW on one element, as kernels/optim_rules.h states it.
void adamw_by_hand(float& w, float g, float& m, float& v, float lr, float wd, int64_t t, const optim::AdamWOptions& o) {
  const float bc1 = static_cast<float>(1.0 - std::pow(static_cast<double>(o.beta1), static_cast<double>(t)));
  const float bc2 = static_cast<float>(1.0 - std::pow(static_cast<double>(o.beta2), static_cast<double>(t)));
  const float step_size = lr / bc1, bc2_sqrt = std::sqrt(bc2);
  const float ge = 1.0f * g;
  w *= 1.0f - lr * wd;
  m = o.beta1 * m + (1.0f - o.beta1) * ge;
  v = o.beta2 * v + (1.0f - o.beta2) * ge * ge;
  w -= step_size * m / (sqrtf(v) / bc2_sqrt + o.eps);
}

TEST(ParamGroups, DecayMatricesOnlySplitsWeightsFromBiases) {
  Net net;
  const std::vector<optim::ParamGroup> groups = optim::decay_matrices_only(net.model.named_parameters(), 0.1f);
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].params, (std::vector<std::string>{"0.weight", "2.weight"}));
  EXPECT_EQ(groups[0].weight_decay, 0.1f);
  EXPECT_EQ(groups[1].params, (std::vector<std::string>{"0.bias", "2.bias"}));
  EXPECT_EQ(groups[1].weight_decay, 0.0f);
}

// Two groups, decay on the weights and none on the biases, against AdamW written out by hand.
TEST(ParamGroups, AdamWWithTwoGroupsMatchesAHandWrittenReference) {
  Net net;
  optim::AdamWOptions o;
  o.lr = 0.01f;
  o.weight_decay = 0.5f;  // the groups' own decays replace it
  optim::AdamW adamw(net.flat, o);
  adamw.set_param_groups(optim::decay_matrices_only(net.model.named_parameters(), 0.1f));
  std::vector<float> w = net.flat->values().to_vector<float>();
  std::vector<float> m(w.size(), 0.0f), v(w.size(), 0.0f);
  for (int k = 1; k <= 4; ++k) {
    net.set_gradients(k);
    const std::vector<float> g = net.flat->gradients().to_vector<float>();
    adamw.step();
    for (const nn::FlatParameters::Slot& s : net.flat->slots()) {
      const float wd = s.param.ndim() >= 2 ? 0.1f : 0.0f;
      for (int64_t i = s.offset; i < s.offset + s.numel; ++i) {
        const auto j = static_cast<std::size_t>(i);
        adamw_by_hand(w[j], g[j], m[j], v[j], o.lr, wd, k, o);
      }
    }
    const std::vector<float> got = net.flat->values().to_vector<float>();
    for (const nn::FlatParameters::Slot& s : net.flat->slots())
      for (int64_t i = s.offset; i < s.offset + s.numel; ++i)
        ASSERT_EQ(got[static_cast<std::size_t>(i)], w[static_cast<std::size_t>(i)]) << s.name << " step " << k;
  }
}

// A group's lr multiplier applies (SGD: w -= lr * scale * (g + wd * w)); frozen parameters are left
// alone whatever their group.
TEST(ParamGroups, AGroupsLrAppliesAndFrozenParametersStayUntouched) {
  Net net;
  optim::SGDOptions o;
  o.lr = 0.1f;
  o.weight_decay = 0.01f;
  optim::SGD sgd(net.flat, o);
  optim::ParamGroup slow;
  slow.params = {"0.bias", "2.weight"};
  slow.lr_scale = 0.25f;
  slow.weight_decay = 0.0f;
  sgd.set_param_groups({slow});
  const nn::FlatParameters::Slot* frozen = nullptr;
  for (const auto& s : net.flat->slots())
    if (s.name == "2.bias") frozen = &s;
  ASSERT_NE(frozen, nullptr);
  Tensor frozen_param = frozen->param;
  frozen_param.set_requires_grad(false);
  std::vector<float> w = net.flat->values().to_vector<float>();
  for (int k = 1; k <= 3; ++k) {
    net.set_gradients(k);
    const std::vector<float> g = net.flat->gradients().to_vector<float>();
    sgd.step();
    for (const nn::FlatParameters::Slot& s : net.flat->slots()) {
      if (s.name == "2.bias") continue;
      const bool in_slow = s.name == "0.bias" || s.name == "2.weight";
      const float lr = in_slow ? o.lr * 0.25f : o.lr, wd = in_slow ? 0.0f : o.weight_decay;
      for (int64_t i = s.offset; i < s.offset + s.numel; ++i) {
        const auto j = static_cast<std::size_t>(i);
        const float d = 1.0f * g[j] + wd * w[j];
        w[j] -= lr * d;
      }
    }
    const std::vector<float> got = net.flat->values().to_vector<float>();
    for (const nn::FlatParameters::Slot& s : net.flat->slots())
      for (int64_t i = s.offset; i < s.offset + s.numel; ++i)
        ASSERT_EQ(got[static_cast<std::size_t>(i)], w[static_cast<std::size_t>(i)]) << s.name << " step " << k;
  }
}

TEST(ParamGroups, RejectsUnknownAndRepeatedNames) {
  Net net;
  optim::AdamW adamw(net.flat, optim::AdamWOptions{});
  optim::ParamGroup a;
  a.params = {"0.weight", "no.such"};
  EXPECT_THROW(adamw.set_param_groups({a}), InvalidArgument);
  a.params = {"0.weight"};
  optim::ParamGroup b;
  b.params = {"0.weight"};
  EXPECT_THROW(adamw.set_param_groups({a, b}), InvalidArgument);
  a.lr_scale = -1.0f;
  EXPECT_THROW(adamw.set_param_groups({a}), InvalidArgument);
}

// The state is what it was without groups ("exp_avg", "exp_avg_sq"): a run saved after 2 steps and
// resumed into a fresh optimizer with the same groups continues bit for bit.
TEST(ParamGroups, StateSavesAndLoadsWithGroups) {
  optim::AdamWOptions o;
  o.lr = 0.02f;
  auto run = [&](int steps, const std::vector<std::pair<std::string, Tensor>>* resume,
                 const std::vector<float>* weights, std::vector<std::pair<std::string, Tensor>>* saved) {
    Net net;
    optim::AdamW adamw(net.flat, o);
    adamw.set_param_groups(optim::decay_matrices_only(net.model.named_parameters(), 0.2f));
    int first = 1;
    if (resume) {
      Tensor values = net.flat->values();
      values.copy_from(Tensor::from_vector(*weights, values.shape()));
      adamw.load_state(*resume, 2);
      first = 3;
    }
    for (int k = first; k < first + steps; ++k) {
      net.set_gradients(k);
      adamw.step();
    }
    if (saved)
      for (const auto& [name, t] : adamw.state()) saved->emplace_back(name, t.clone());
    return net.flat->values().to_vector<float>();
  };
  const std::vector<float> straight = run(4, nullptr, nullptr, nullptr);
  std::vector<std::pair<std::string, Tensor>> state;
  const std::vector<float> half = run(2, nullptr, nullptr, &state);
  ASSERT_EQ(state.size(), 2u);
  EXPECT_EQ(state[0].first, "exp_avg");
  EXPECT_EQ(state[1].first, "exp_avg_sq");
  const std::vector<float> resumed = run(2, &state, &half, nullptr);
  EXPECT_EQ(resumed, straight);
}

}  // namespace
}  // namespace cumulus
