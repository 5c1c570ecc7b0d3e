// 8-bit optimizer state (Note [8-bit optimizer state] in kernels/quantized_state.h): the dynamic
// maps against the paper's description computed in double, nearest rounding, an 8-bit update that
// is the fp32 update of the dequantized state (the same bits) followed by a nearest requantization,
// a few steps of training close to fp32's, frozen parameters, the state's bytes, checkpoints
// (bit-exact resume, mis-shaped or mismatched state refused with its name).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cumulus/memory/allocator.h"
#include "cumulus/nn/activation_layers.h"
#include "cumulus/nn/flat_parameters.h"
#include "cumulus/nn/layers.h"
#include "cumulus/ops/pointwise.h"
#include "cumulus/ops/reduce.h"
#include "cumulus/optim/adamw.h"
#include "cumulus/optim/sgd.h"
#include "cumulus/tensor/random.h"
#include "cumulus/train/checkpoint.h"
#include "cumulus/train/trainer.h"
#include "kernels/quantized_state.h"
#include "test_util.h"

namespace cumulus {
namespace {

using kernels::DynamicMap;
using kernels::QuantizedState;
using testing::TempDir;

// ---- the maps ---------------------------------------------------------------------------------

DynamicMap map_of(bool is_signed) {
  DynamicMap map{};
  for (int code = 0; code < DynamicMap::kCodes; ++code) kernels::rules::fill_dynamic_map_entry(map, code, is_signed);
  return map;
}

// The paper's dynamic tree map in double, from its description: the magnitudes in increasing order,
// zero first, then for each exponent E from the largest down, 2^q linear steps in (0.1, 1] x 10^-E.
std::vector<double> reference_magnitudes(int bits) {
  std::vector<double> out = {0.0};
  for (int q = 0; q < bits; ++q) {
    const int exponent = bits - 1 - q;
    for (int k = 0; k < (1 << q); ++k)
      out.push_back(std::pow(10.0, -exponent) * (0.1 + 0.9 * (k + 1) / static_cast<double>(1 << q)));
  }
  return out;
}

TEST(DynamicMap, MatchesThePapersMapInDouble) {
  for (bool is_signed : {true, false}) {
    SCOPED_TRACE(is_signed ? "signed" : "unsigned");
    const DynamicMap map = map_of(is_signed);
    const std::vector<double> ref = reference_magnitudes(is_signed ? 7 : 8);
    ASSERT_EQ(map.magnitudes, static_cast<int>(ref.size()));
    EXPECT_EQ(ref.back(), 1.0);
    EXPECT_EQ(map.values[ref.size() - 1], 1.0f) << "a block's absmax survives";
    for (std::size_t j = 0; j < ref.size(); ++j) {
      EXPECT_NEAR(map.values[j], ref[j], 2e-7 * ref[j]) << "code " << j;
      if (j > 0) EXPECT_GT(ref[j], ref[j - 1]) << "increasing";
      if (is_signed) EXPECT_EQ(map.values[j + 128], -map.values[j]) << "bit 7 is the sign";
    }
  }
}

// Round trips of values spread over six decades: each code is the map value nearest x / absmax
// (checked against every value of the double map), so the error is at most half the local gap.
TEST(DynamicMap, QuantizesToTheNearestValueWithinHalfAGap) {
  Generator gen(17);
  for (bool is_signed : {true, false}) {
    SCOPED_TRACE(is_signed ? "signed" : "unsigned");
    const DynamicMap map = map_of(is_signed);
    const std::vector<double> ref = reference_magnitudes(is_signed ? 7 : 8);
    std::vector<float> u(4096), s(4096);
    gen.fill_uniform(u.data(), 4096, -6.0f, 0.0f);
    gen.fill_uniform(s.data(), 4096, -1.0f, 1.0f);
    const double absmax = 3.5;
    double worst_gap_fraction = 0.0;
    for (std::size_t i = 0; i < u.size(); ++i) {
      const float x = static_cast<float>(std::pow(10.0, u[i]) * absmax * (is_signed && s[i] < 0 ? -1 : 1));
      const uint8_t code = kernels::rules::quantize(x, static_cast<float>(absmax), map);
      const double back = kernels::rules::dequantize(code, static_cast<float>(absmax), map);
      const double a = std::abs(static_cast<double>(x)) / absmax;
      const auto above = std::lower_bound(ref.begin(), ref.end(), a);
      ASSERT_NE(above, ref.begin());
      const double gap = (*above - *(above - 1)) * absmax;
      const double nearest = std::min(*above - a, a - *(above - 1)) * absmax;
      const double error = std::abs(back - x);
      EXPECT_LE(error, nearest + 1e-6 * std::abs(x)) << "x " << x << ": not the nearest code";
      EXPECT_EQ(back < 0, x < 0) << "x " << x;
      worst_gap_fraction = std::max(worst_gap_fraction, error / gap);
    }
    EXPECT_LE(worst_gap_fraction, 0.5 + 1e-5);
    EXPECT_GT(worst_gap_fraction, 0.4) << "the sample should reach the middle of some gap";
  }
  const DynamicMap map = map_of(true);
  EXPECT_EQ(kernels::rules::quantize(0.0f, 0.0f, map), 0) << "an all-zero block";
  EXPECT_EQ(kernels::rules::quantize(-1e-9f, 1.0f, map), 0) << "below the smallest magnitude: zero, not -0";
}

// ---- training ---------------------------------------------------------------------------------

constexpr int64_t kIn = 48, kHidden = 40, kOut = 6, kRows = 32;

// A two-layer regression net (3,000 parameters, 49 blocks) on fixed random data.
struct Net {
  explicit Net(uint64_t seed = 5) {
    Generator gen(seed);
    model.add(std::make_shared<nn::Linear>(kIn, kHidden, gen));
    model.add(std::make_shared<nn::Tanh>());
    model.add(std::make_shared<nn::Linear>(kHidden, kOut, gen));
    flat = std::make_shared<nn::FlatParameters>(model);
    Generator data(9);
    x = uniform({kRows, kIn}, -1.0f, 1.0f, data);
    y = uniform({kRows, kOut}, -1.0f, 1.0f, data);
  }
  void use(std::shared_ptr<optim::Optimizer> opt) {
    optimizer = std::move(opt);
    trainer = std::make_unique<train::Trainer>(optimizer, train::TrainerOptions{});
  }
  void step() {
    trainer->micro_batch(kRows, [&] {
      const Tensor r = model(x) - y;
      return ops::sum(r * r);
    });
    ASSERT_TRUE(trainer->step_if_ready());
  }
  std::vector<float> weights() const { return flat->values().to_vector<float>(); }

  nn::Sequential model;
  std::shared_ptr<nn::FlatParameters> flat;
  Tensor x, y;
  std::shared_ptr<optim::Optimizer> optimizer;
  std::unique_ptr<train::Trainer> trainer;
};

std::shared_ptr<optim::Optimizer> adamw(const std::shared_ptr<nn::FlatParameters>& flat, int bits) {
  optim::AdamWOptions o;
  o.lr = 0.01f;
  o.weight_decay = 0.1f;
  o.state_bits = bits;
  return std::make_shared<optim::AdamW>(flat, o);
}

std::shared_ptr<optim::Optimizer> sgd(const std::shared_ptr<nn::FlatParameters>& flat, int bits) {
  optim::SGDOptions o;
  o.lr = 0.02f;
  o.momentum = 0.9f;
  o.dampening = 0.1f;
  o.weight_decay = 0.01f;
  o.state_bits = bits;
  return std::make_shared<optim::SGD>(flat, o);
}

using MakeOptimizer = std::shared_ptr<optim::Optimizer> (*)(const std::shared_ptr<nn::FlatParameters>&, int);

// The dequantized values of 8-bit state `name` (codes `name`, scales `name`_absmax).
std::vector<float> dequantized(const optim::Optimizer& opt, const std::string& name, bool is_signed) {
  const DynamicMap map = map_of(is_signed);
  const std::vector<uint8_t> codes = opt.state_tensor(name).to_vector<uint8_t>();
  const std::vector<float> absmax = opt.state_tensor(name + "_absmax").to_vector<float>();
  std::vector<float> out(codes.size());
  for (std::size_t i = 0; i < codes.size(); ++i)
    out[i] = kernels::rules::dequantize(codes[i], absmax[i / QuantizedState::kBlock], map);
  return out;
}

struct StateName {
  const char* name;
  bool is_signed;
};

// An 8-bit update is the fp32 update of the dequantized state, then nearest requantization: after
// three 8-bit steps, an fp32 optimizer loaded with the dequantized state takes the next step from
// the same weights to the same bits, and the 8-bit state it ends with is the nearest code (within
// its block's new absmax) of the fp32 state.
TEST(Optimizer8Bit, UpdatesAsFp32OnTheDequantizedStateThenRequantizes) {
  const std::vector<std::pair<MakeOptimizer, std::vector<StateName>>> cases = {
      {adamw, {{"exp_avg", true}, {"exp_avg_sq", false}}}, {sgd, {{"momentum_buffer", true}}}};
  for (const auto& [make, states] : cases) {
    SCOPED_TRACE(states[0].name);
    Net eight, fp32;
    eight.use(make(eight.flat, 8));
    for (int s = 0; s < 3; ++s) eight.step();
    fp32.use(make(fp32.flat, 32));
    Tensor fp32_values = fp32.flat->values();  // a handle on the flat weights
    fp32_values.copy_from(eight.flat->values());
    std::vector<std::pair<std::string, Tensor>> loaded;
    for (const StateName& s : states)
      loaded.emplace_back(s.name, Tensor::from_vector(dequantized(*eight.optimizer, s.name, s.is_signed),
                                                      Shape{eight.flat->size()}));
    fp32.optimizer->load_state(loaded, eight.optimizer->updates());
    eight.step();
    fp32.step();
    EXPECT_EQ(eight.weights(), fp32.weights()) << "the same rule on the same values";
    for (const StateName& s : states) {
      const std::vector<float> exact = fp32.optimizer->state_tensor(s.name).to_vector<float>();
      const std::vector<float> absmax = eight.optimizer->state_tensor(std::string(s.name) + "_absmax").to_vector<float>();
      const std::vector<uint8_t> codes = eight.optimizer->state_tensor(s.name).to_vector<uint8_t>();
      const DynamicMap map = map_of(s.is_signed);
      for (std::size_t i = 0; i < exact.size(); ++i) {
        const float block_absmax = absmax[i / QuantizedState::kBlock];
        ASSERT_LE(std::abs(exact[i]), block_absmax) << s.name << " element " << i;
        ASSERT_EQ(codes[i], kernels::rules::quantize(exact[i], block_absmax, map)) << s.name << " element " << i;
      }
    }
  }
}

// Twenty steps from the same weights: the 8-bit run's displacement stays within 5% of fp32's (2.2%
// measured for AdamW, 1.5% for SGD with momentum: the codes' rounding, compounded); the runs differ.
TEST(Optimizer8Bit, TwentyStepsStayCloseToFp32) {
  for (MakeOptimizer make : {adamw, sgd}) {
    Net eight, fp32;
    const std::vector<float> start = eight.weights();
    eight.use(make(eight.flat, 8));
    fp32.use(make(fp32.flat, 32));
    for (int s = 0; s < 20; ++s) {
      eight.step();
      fp32.step();
    }
    const std::vector<float> a = eight.weights(), b = fp32.weights();
    double diff = 0.0, moved = 0.0;
    for (std::size_t i = 0; i < a.size(); ++i) {
      diff += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
      moved += (static_cast<double>(b[i]) - start[i]) * (static_cast<double>(b[i]) - start[i]);
    }
    const double relative = std::sqrt(diff / moved);
    std::printf("    8-bit vs fp32 after 20 steps: displacement differs by %.3g relative\n", relative);
    EXPECT_LT(relative, 0.05);
    EXPECT_GT(relative, 0.0) << "8 bits are not 32: the comparison would be vacuous";
  }
}

// The 8-bit updates on CUDA (kernels/cuda/optim.cu, compiled without contraction: Note [CUDA bit
// parity]) give the CPU loops' bits: the same model on both devices (one seed), gradients that
// are exact on both (the loss sum(p * c) has gradient c), three updates of each optimizer, then
// the weights, every code and every block's scale compared for equality. Run on a GPU by the
// checkup; skipped without one (tests/emulated runs the kernels on the CPU).
TEST(Optimizer8Bit, CudaUpdatesGiveTheCpusBits) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device" << (cuda_compiled() ? "" : " (built without CUDA)");
  struct Run {
    explicit Run(Device d) {
      Generator gen(5);
      model.add(std::make_shared<nn::Linear>(kIn, kHidden, gen, d));
      model.add(std::make_shared<nn::Linear>(kHidden, kOut, gen, d));
      flat = std::make_shared<nn::FlatParameters>(model);
      Generator g(11);
      for (const Tensor& p : model.parameters()) c.push_back(uniform(p.shape(), -1.0f, 1.0f, g, d));
    }
    void steps(const std::shared_ptr<optim::Optimizer>& opt, int n) {
      train::Trainer trainer(opt, train::TrainerOptions{});
      for (int i = 0; i < n; ++i) {
        trainer.micro_batch(1, [&] {
          const std::vector<Tensor> ps = model.parameters();
          Tensor loss = ops::sum(ps[0] * c[0]);
          for (std::size_t k = 1; k < ps.size(); ++k) loss = loss + ops::sum(ps[k] * c[k]);
          return loss;
        });
        ASSERT_TRUE(trainer.step_if_ready());
      }
    }
    nn::Sequential model;
    std::shared_ptr<nn::FlatParameters> flat;
    std::vector<Tensor> c;
  };
  auto host = [](const Tensor& t) { return t.to(Device::cpu()); };
  for (const bool use_adamw : {true, false}) {
    SCOPED_TRACE(use_adamw ? "AdamW" : "SGD with momentum");
    Run cpu(Device::cpu()), gpu(Device::cuda(0));
    ASSERT_EQ(cpu.flat->values().to_vector<float>(), host(gpu.flat->values()).to_vector<float>());
    const MakeOptimizer make = use_adamw ? adamw : sgd;
    const std::shared_ptr<optim::Optimizer> a = make(cpu.flat, 8), b = make(gpu.flat, 8);
    cpu.steps(a, 3);
    gpu.steps(b, 3);
    EXPECT_EQ(cpu.flat->values().to_vector<float>(), host(gpu.flat->values()).to_vector<float>()) << "weights";
    const std::vector<const char*> states =
        use_adamw ? std::vector<const char*>{"exp_avg", "exp_avg_sq"} : std::vector<const char*>{"momentum_buffer"};
    for (const char* name : states) {
      EXPECT_EQ(a->state_tensor(name).to_vector<uint8_t>(), host(b->state_tensor(name)).to_vector<uint8_t>()) << name;
      const std::string scales = std::string(name) + "_absmax";
      EXPECT_EQ(a->state_tensor(scales).to_vector<float>(), host(b->state_tensor(scales)).to_vector<float>()) << scales;
    }
  }
}

TEST(Optimizer8Bit, FrozenParametersKeepTheirWeightsCodesAndScales) {
  Net net;
  net.use(adamw(net.flat, 8));
  net.step();
  Tensor first_weight = net.model.parameters()[0];
  first_weight.set_requires_grad(false);
  const int64_t chunks = (kIn * kHidden) / QuantizedState::kBlock;  // the first weight's whole blocks
  const auto state_part = [&](const std::string& name) {
    const Tensor& t = net.optimizer->state_tensor(name);
    if (t.dtype() == DType::u8) {
      std::vector<uint8_t> v = t.to_vector<uint8_t>();
      return std::vector<float>(v.begin(), v.begin() + chunks * QuantizedState::kBlock);
    }
    std::vector<float> v = t.to_vector<float>();
    return std::vector<float>(v.begin(), v.begin() + chunks);
  };
  const std::vector<std::string> names = {"exp_avg", "exp_avg_absmax", "exp_avg_sq", "exp_avg_sq_absmax"};
  std::vector<std::vector<float>> before;
  for (const std::string& n : names) before.push_back(state_part(n));
  const std::vector<float> w_before = first_weight.to_vector<float>();
  const std::vector<float> all_before = net.weights();
  net.step();
  net.step();
  EXPECT_EQ(first_weight.to_vector<float>(), w_before);
  for (std::size_t i = 0; i < names.size(); ++i) EXPECT_EQ(state_part(names[i]), before[i]) << names[i];
  EXPECT_NE(net.weights(), all_before) << "the other parameters trained";
}

int64_t round_up(int64_t n) {
  const int64_t r = static_cast<int64_t>(CachingAllocator::kRounding);
  return (n + r - 1) / r * r;
}

// The planner and the tracker count state through state_to_allocate() and state_bytes(): both
// exact for the 8-bit arrays, and with the scales included at most 27% of the fp32 moments.
TEST(Optimizer8Bit, StateBytesAreExactAndAtMost27PercentOfFp32) {
  Generator gen(1);
  nn::Linear layer(256, 255, gen);  // 65,535 parameters, 65,536 flat elements
  auto flat = std::make_shared<nn::FlatParameters>(layer);
  const int64_t n = flat->size(), blocks = n / QuantizedState::kBlock;
  optim::AdamWOptions o;
  optim::AdamW fp32(flat, o);
  o.state_bits = 8;
  optim::AdamW eight(flat, o);
  EXPECT_EQ(eight.state_to_allocate(), (std::vector<int64_t>{n, blocks * 4, n, blocks * 4}));
  EXPECT_EQ(fp32.state_to_allocate(), (std::vector<int64_t>{n * 4, n * 4}));
  for (optim::AdamW* opt : {&fp32, &eight}) opt->step();
  EXPECT_TRUE(eight.state_to_allocate().empty());
  EXPECT_EQ(eight.state_bytes(), 2 * (round_up(n) + round_up(blocks * 4)));
  EXPECT_EQ(fp32.state_bytes(), 2 * round_up(n * 4));
  const double ratio = static_cast<double>(eight.state_bytes()) / static_cast<double>(fp32.state_bytes());
  std::printf("    8-bit AdamW state: %lld bytes, %.4f of fp32's\n", static_cast<long long>(eight.state_bytes()), ratio);
  EXPECT_LE(ratio, 0.27);
  EXPECT_EQ(eight.exp_avg().dtype(), DType::u8);
  EXPECT_EQ(eight.state_tensor("exp_avg_sq_absmax").numel(), blocks);
}

std::vector<train::RecordedSetting> settings() { return {{"optimizer-bits", "state_bits", "8"}}; }

// Saved to a training checkpoint mid-run and resumed in new objects, the 8-bit run continues with
// the bits of one never stopped, its codes and scales restored exactly.
TEST(Optimizer8Bit, ACheckpointResumesBitExactly) {
  TempDir dir;
  Net whole, first, second;
  for (Net* net : {&whole, &first, &second}) net->use(adamw(net->flat, 8));
  for (int s = 0; s < 6; ++s) whole.step();
  for (int s = 0; s < 3; ++s) first.step();
  const train::TrainingCounters c = first.trainer->counters();
  train::save_training_checkpoint(dir.file("ck.st"), first.model, *first.optimizer,
                                  {c, first.optimizer->updates(), c.epoch_loss_sum, 0}, settings());
  train::ResumeOptions resume;
  resume.settings = settings();
  resume.micro_batches_per_epoch = 100;
  resume.units_per_epoch = 100 * kRows;
  const train::ResumedCheckpoint r =
      train::load_training_checkpoint(dir.file("ck.st"), second.model, *second.optimizer, resume);
  second.trainer->restore(r.state.counters);
  for (const auto& [name, t] : first.optimizer->state()) {
    const Tensor& restored = second.optimizer->state_tensor(name);
    ASSERT_EQ(restored.dtype(), t.dtype()) << name;
    ASSERT_EQ(restored.numel(), t.numel()) << name;
  }
  EXPECT_EQ(second.optimizer->state_tensor("exp_avg").to_vector<uint8_t>(),
            first.optimizer->state_tensor("exp_avg").to_vector<uint8_t>());
  EXPECT_EQ(second.optimizer->state_tensor("exp_avg_sq_absmax").to_vector<float>(),
            first.optimizer->state_tensor("exp_avg_sq_absmax").to_vector<float>());
  for (int s = 0; s < 3; ++s) second.step();
  EXPECT_EQ(second.weights(), whole.weights());
  EXPECT_EQ(second.optimizer->state_tensor("exp_avg_sq").to_vector<uint8_t>(),
            whole.optimizer->state_tensor("exp_avg_sq").to_vector<uint8_t>());
}

std::string refusal(optim::Optimizer& opt, const std::vector<std::pair<std::string, Tensor>>& state) {
  try {
    opt.load_state(state, 3);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// A forged or mismatched state is refused before it is used, naming the tensor: scales one block
// short, codes stored as f32, and an fp32 checkpoint's moments given to an 8-bit optimizer.
TEST(Optimizer8Bit, MisShapedStateIsRefusedByName) {
  Net saved, target;
  saved.use(adamw(saved.flat, 8));
  saved.step();
  target.use(adamw(target.flat, 8));
  auto with = [&](const std::string& name, Tensor t) {
    std::vector<std::pair<std::string, Tensor>> state = saved.optimizer->state();
    for (auto& [n, tensor] : state)
      if (n == name) tensor = std::move(t);
    return state;
  };
  const int64_t n = saved.flat->size(), blocks = n / QuantizedState::kBlock;
  const std::string short_scales =
      refusal(*target.optimizer, with("exp_avg_absmax", Tensor::zeros(Shape{blocks - 1}, DType::f32, Device::cpu())));
  EXPECT_NE(short_scales.find("'exp_avg_absmax' has " + std::to_string(blocks - 1) + " elements"), std::string::npos)
      << short_scales;
  const std::string float_codes =
      refusal(*target.optimizer, with("exp_avg_sq", Tensor::zeros(Shape{n}, DType::f32, Device::cpu())));
  EXPECT_NE(float_codes.find("'exp_avg_sq'"), std::string::npos) << float_codes;
  EXPECT_NE(float_codes.find("u8"), std::string::npos) << float_codes;

  Net fp32;
  fp32.use(adamw(fp32.flat, 32));
  fp32.step();
  const std::string mismatched = refusal(*target.optimizer, fp32.optimizer->state());
  EXPECT_NE(mismatched.find("'exp_avg'"), std::string::npos) << mismatched;
  EXPECT_EQ(target.optimizer->state_bytes(), 0) << "nothing was loaded";

  optim::AdamWOptions bad;
  bad.state_bits = 16;
  try {
    optim::AdamW opt(target.flat, bad);
    ADD_FAILURE() << "16-bit state accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("state_bits must be 32 or 8, got 16"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace cumulus
