// ZeRO's optimizer side (Note [ZeRO] in engine/train/trainer_step.cpp, Optimizer::keep_shard) in
// one process: optimizers that each keep one shard of the same flat parameters update exactly
// their shard, with the bits the unsharded optimizer gives it, and hold only its state (f32 and
// 8-bit, parameter groups cut across the shards). The ranks' all-gather and the apps' --zero run
// under mpirun in test_dist.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "cumulus/core/error.h"
#include "cumulus/dist/communicator.h"
#include "cumulus/nn/activation_layers.h"
#include "cumulus/nn/flat_parameters.h"
#include "cumulus/nn/layers.h"
#include "cumulus/ops/reduce.h"
#include "cumulus/optim/adamw.h"
#include "cumulus/optim/sgd.h"
#include "cumulus/tensor/random.h"

namespace cumulus {
namespace {

// Two Linear layers whose flat parameters span 31 chunks: [1216 | 64 | 640 | 64] elements.
struct Net {
  Net() {
    Generator gen(5);
    model.add(std::make_shared<nn::Linear>(40, 30, gen, Device::cpu()));
    model.add(std::make_shared<nn::ReLU>());
    model.add(std::make_shared<nn::Linear>(30, 20, gen, Device::cpu()));
    flat = std::make_shared<nn::FlatParameters>(model);
    ops::sum(model(Tensor::ones(Shape{1, 40}))).backward();  // every gradient slot current
  }
  // Step k's gradient: fixed values, different per element and step.
  void set_gradients(int k) {
    std::vector<float> values(static_cast<std::size_t>(flat->size()));
    for (std::size_t i = 0; i < values.size(); ++i)
      values[i] = std::sin(0.37f * static_cast<float>(i) + 1.3f * static_cast<float>(k)) * 0.5f;
    Tensor g = flat->gradients();
    g.copy_from(Tensor::from_vector(values, g.shape()));
  }
  nn::Sequential model;
  std::shared_ptr<nn::FlatParameters> flat;
};

std::shared_ptr<optim::Optimizer> make(const std::string& kind, const std::shared_ptr<nn::FlatParameters>& flat) {
  if (kind == "sgd") return std::make_shared<optim::SGD>(flat, optim::SGDOptions{0.05f, 0.9f, 0.0f, false, 0.01f});
  optim::AdamWOptions o;
  o.lr = 0.01f;
  o.state_bits = kind == "adamw8" ? 8 : 32;
  return std::make_shared<optim::AdamW>(flat, o);
}

// Bytes of the optimizer's state tensors (allocated_bytes would add the allocator's rounding).
int64_t state_nbytes(const optim::Optimizer& o) {
  int64_t bytes = 0;
  for (const auto& [name, t] : o.state()) bytes += static_cast<int64_t>(t.nbytes());
  return bytes;
}

class ZeroShardTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ZeroShardTest, EachShardGetsTheUnshardedBitsAndKeepsOnlyItsState) {
  Net whole_net;
  auto whole = make(GetParam(), whole_net.flat);
  const std::vector<dist::Shard> shards = dist::shard_layout(whole_net.flat->size(), 2);
  ASSERT_EQ(shards[0].count, 1024);
  std::vector<Net> nets(2);
  std::vector<std::shared_ptr<optim::Optimizer>> parts;
  for (int r = 0; r < 2; ++r) {
    parts.push_back(make(GetParam(), nets[r].flat));
    parts[r]->keep_shard(shards[r].offset, shards[r].count);
  }
  // Groups whose runs the shard boundary cuts: the first Linear's weight decays, its bias not.
  whole->set_param_groups(optim::decay_matrices_only(whole_net.model.named_parameters(), 0.1f));
  for (int r = 0; r < 2; ++r)
    parts[r]->set_param_groups(optim::decay_matrices_only(nets[r].model.named_parameters(), 0.1f));
  const std::vector<float> initial = whole_net.flat->values().to_vector<float>();
  for (int k = 0; k < 3; ++k) {
    whole_net.set_gradients(k);
    whole->step();
    for (int r = 0; r < 2; ++r) {
      nets[r].set_gradients(k);
      parts[r]->step();
    }
  }
  const std::vector<float> expected = whole_net.flat->values().to_vector<float>();
  for (int r = 0; r < 2; ++r) {
    const std::vector<float> got = nets[r].flat->values().to_vector<float>();
    for (int64_t i = 0; i < whole_net.flat->size(); ++i) {
      const bool own = i >= shards[r].offset && i < shards[r].offset + shards[r].count;
      ASSERT_EQ(got[i], own ? expected[i] : initial[i]) << "rank " << r << ", element " << i;
    }
    EXPECT_EQ(state_nbytes(*parts[r]) * whole_net.flat->size(), state_nbytes(*whole) * shards[r].count)
        << "rank " << r << "'s state is its shard's share";
  }
}

INSTANTIATE_TEST_SUITE_P(Optimizers, ZeroShardTest, ::testing::Values("adamw", "adamw8", "sgd"));

TEST(ZeroShard, IsRefusedAfterTheFirstUpdateAndOffChunks) {
  Net net;
  auto adamw = make("adamw", net.flat);
  EXPECT_THROW(adamw->keep_shard(32, 64), InvalidArgument);  // not on a chunk
  EXPECT_THROW(adamw->keep_shard(0, net.flat->size() + 64), InvalidArgument);
  adamw->keep_shard(64, 128);
  net.set_gradients(0);
  adamw->step();
  EXPECT_THROW(adamw->keep_shard(0, 64), InvalidArgument);  // the state is sized already
  EXPECT_EQ(adamw->state()[0].second.numel(), 128);                         // the shard held
  EXPECT_EQ(adamw->state_layout()[0].shape, Shape({net.flat->size()}));      // a checkpoint's: whole
}

}  // namespace
}  // namespace cumulus
