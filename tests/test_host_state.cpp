// Optimizer state placed on the host (Optimizer::place_state, Note [Optimizer state on the host] in
// engine/optim/optimizer.cpp): the same bits as the state on the device, for every rule (f32 and
// 8-bit AdamW, SGD momentum) with parameter groups, a frozen parameter, a ZeRO shard and a
// Trainer's clipped, scheduled steps; the state in the host-state pool and nothing of it in the
// device's allocator or its planned bytes; checkpoints that move between placements.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "cumulus/core/error.h"
#include "cumulus/memory/allocator.h"
#include "cumulus/nn/activation_layers.h"
#include "cumulus/nn/flat_parameters.h"
#include "cumulus/nn/layers.h"
#include "cumulus/ops/loss.h"
#include "cumulus/ops/reduce.h"
#include "cumulus/optim/adamw.h"
#include "cumulus/optim/lr_schedule.h"
#include "cumulus/optim/sgd.h"
#include "cumulus/tensor/random.h"
#include "cumulus/train/trainer.h"
#include "test_util.h"

namespace cumulus {
namespace {

using optim::StatePlacement;
using testing::DeviceTest;

// Linear(40, 30) - ReLU - Linear(30, 20): flat parameters of 31 chunks, every gradient slot current.
struct Net {
  explicit Net(Device device) : device(device) {
    Generator gen(5);
    model.add(std::make_shared<nn::Linear>(40, 30, gen, device));
    model.add(std::make_shared<nn::ReLU>());
    model.add(std::make_shared<nn::Linear>(30, 20, gen, device));
    flat = std::make_shared<nn::FlatParameters>(model);
    ops::sum(model(Tensor::ones(Shape{1, 40}, DType::f32, device))).backward();
  }
  // Step k's gradient: fixed values, different per element and step.
  void set_gradients(int k) {
    std::vector<float> values(static_cast<std::size_t>(flat->size()));
    for (std::size_t i = 0; i < values.size(); ++i)
      values[i] = std::sin(0.37f * static_cast<float>(i) + 1.3f * static_cast<float>(k)) * 0.5f;
    Tensor g = flat->gradients();
    g.copy_from(Tensor::from_vector(values, g.shape(), device));
  }
  Device device;
  nn::Sequential model;
  std::shared_ptr<nn::FlatParameters> flat;
};

std::shared_ptr<optim::Optimizer> make(const std::string& kind, const std::shared_ptr<nn::FlatParameters>& flat) {
  if (kind == "sgd") return std::make_shared<optim::SGD>(flat, optim::SGDOptions{0.05f, 0.9f, 0.0f, true, 0.01f});
  optim::AdamWOptions o;
  o.lr = 0.01f;
  o.state_bits = kind == "adamw8" ? 8 : 32;
  return std::make_shared<optim::AdamW>(flat, o);
}

bool same_bits(const Tensor& a, const Tensor& b) {
  const Tensor ha = a.to(Device::cpu()), hb = b.to(Device::cpu());
  return ha.dtype() == hb.dtype() && ha.nbytes() == hb.nbytes() &&
         std::memcmp(ha.raw_data(), hb.raw_data(), ha.nbytes()) == 0;
}

// Six steps of both placements side by side: groups, the second Linear's weight frozen for steps
// 2-3, and optionally a ZeRO shard kept.
void expect_same_training(Device device, const std::string& kind, bool shard) {
  Net on_device(device), on_host(device);
  auto a = make(kind, on_device.flat), b = make(kind, on_host.flat);
  b->place_state(StatePlacement::host);
  if (shard) {
    a->keep_shard(64, 1024);
    b->keep_shard(64, 1024);
  }
  a->set_param_groups(optim::decay_matrices_only(on_device.model.named_parameters(), 0.1f));
  b->set_param_groups(optim::decay_matrices_only(on_host.model.named_parameters(), 0.1f));
  for (int k = 0; k < 6; ++k) {
    for (Net* net : {&on_device, &on_host}) {
      net->model.named_parameters()[2].second.set_requires_grad(k < 2 || k > 3);
      net->set_gradients(k);
    }
    a->step();
    b->step();
    ASSERT_TRUE(same_bits(on_device.flat->values(), on_host.flat->values())) << kind << ", step " << k;
  }
  const auto sa = a->state(), sb = b->state();
  ASSERT_EQ(sa.size(), sb.size());
  for (std::size_t i = 0; i < sa.size(); ++i) {
    EXPECT_TRUE(same_bits(sa[i].second, sb[i].second)) << kind << ": " << sa[i].first;
    EXPECT_TRUE(sb[i].second.device().is_cpu()) << sb[i].first << " lives on the host";
  }
}

class HostStateTest : public DeviceTest {};

TEST_P(HostStateTest, UpdatesWithTheBitsOfTheStateOnTheDevice) {
  for (const std::string kind : {"adamw", "adamw8", "sgd"}) {
    expect_same_training(device(), kind, false);
    expect_same_training(device(), kind, true);
  }
}

TEST_P(HostStateTest, TheStateIsInTheHostPoolAndNotInTheDevicesBudget) {
  Net net(device());
  auto adamw = make("adamw", net.flat);
  const std::vector<int64_t> planned = adamw->state_to_allocate();
  ASSERT_EQ(planned.size(), 2u);
  adamw->place_state(StatePlacement::host);
  EXPECT_TRUE(adamw->state_to_allocate().empty()) << "nothing for the device's budget";
  const auto kState = MemoryCategory::optimizer_state;
  const int64_t device_before = allocator_for(device()).stats()[kState].current;
  const int64_t host_before = host_state_allocator().stats()[kState].current;
  net.set_gradients(0);
  adamw->step();
  EXPECT_EQ(allocator_for(device()).stats()[kState].current, device_before);
  const int64_t host_bytes = host_state_allocator().stats()[kState].current - host_before;
  EXPECT_EQ(host_bytes, adamw->state_bytes());
  // The moments, and the host copies of the values and gradients.
  auto rounded = [](int64_t b) { return (b + 511) / 512 * 512; };  // as the allocator counts requests
  const int64_t moments = rounded(planned[0]) + rounded(planned[1]);
  EXPECT_EQ(host_bytes, 2 * moments);
  EXPECT_THROW(adamw->place_state(StatePlacement::device), InvalidArgument);
}

// A checkpoint of either placement resumes in the other with the same bits.
TEST_P(HostStateTest, CheckpointsMoveBetweenPlacements) {
  for (const StatePlacement saved_at : {StatePlacement::host, StatePlacement::device}) {
    Net first(device()), second(device()), reference(device());
    auto saver = make("adamw", first.flat), loader = make("adamw", second.flat), straight = make("adamw", reference.flat);
    saver->place_state(saved_at);
    loader->place_state(saved_at == StatePlacement::host ? StatePlacement::device : StatePlacement::host);
    for (int k = 0; k < 3; ++k) {
      first.set_gradients(k);
      reference.set_gradients(k);
      saver->step();
      straight->step();
    }
    Tensor into = second.flat->values();
    into.copy_from(first.flat->values());
    loader->load_state(saver->state(), saver->updates());
    second.set_gradients(3);
    reference.set_gradients(3);
    loader->step();
    straight->step();
    EXPECT_TRUE(same_bits(second.flat->values(), reference.flat->values()))
        << "saved with the state on the " << optim::state_placement_name(saved_at);
  }
}

// A Trainer's steps (clipping, a schedule, a partial last group) with the state on the host.
TEST_P(HostStateTest, ATrainerTrainsTheSameBits) {
  std::vector<float> weights[2];
  for (int placed = 0; placed < 2; ++placed) {
    Net net(device());
    auto adamw = make("adamw", net.flat);
    if (placed == 1) adamw->place_state(StatePlacement::host);
    train::TrainerOptions options;
    options.accum_steps = 3;
    options.clip_grad_norm = 0.05f;
    train::Trainer trainer(adamw, options, std::make_shared<optim::CosineWarmupLR>(0.01f, 2, 6, 0.001f));
    Generator gen(9);
    const Tensor x = uniform({40, 40}, -1.0f, 1.0f, gen, device());
    std::vector<int32_t> labels(40);
    for (int i = 0; i < 40; ++i) labels[static_cast<std::size_t>(i)] = (i * 7) % 20;
    const Tensor y = Tensor::from_vector(labels, {40}, device());
    for (int64_t i = 0; i < 10; ++i) {
      trainer.micro_batch(4, [&] {
        return ops::cross_entropy(net.model(x.narrow_rows(i * 4, 4)), y.narrow_rows(i * 4, 4), ops::Reduction::Sum);
      });
      trainer.step_if_ready();
    }
    trainer.flush();  // the partial last group
    weights[placed] = net.flat->values().to_vector<float>();
  }
  ASSERT_EQ(weights[0].size(), weights[1].size());
  EXPECT_EQ(std::memcmp(weights[0].data(), weights[1].data(), weights[0].size() * sizeof(float)), 0);
}

TEST_P(HostStateTest, CudaGraphsRefuseAStateOnTheHost) {
  if (!device().is_cuda()) GTEST_SKIP() << "graphs need a CUDA device";
  Net net(device());
  auto adamw = make("adamw", net.flat);
  adamw->place_state(StatePlacement::host);
  train::TrainerOptions options;
  options.use_graphs = true;
  EXPECT_THROW(train::Trainer(adamw, options), InvalidArgument);
}

CUMULUS_INSTANTIATE_DEVICES(HostStateTest);

}  // namespace
}  // namespace cumulus
