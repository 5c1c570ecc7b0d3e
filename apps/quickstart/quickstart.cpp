// quickstart: a training loop of one's own with the training API (train::Trainer), as a PyTorch
// user writes one with Lightning's Trainer(accumulate_grad_batches=...): the user's own model (Net),
// 8 x 8 digit-like images made here (10 classes, as scikit-learn's digits) in a TensorDataset,
// AdamW with gradient clipping and warmup + cosine, the planner choosing the micro-batch and
// accumulation steps of the effective batch 64 under a memory budget (32 x 2 under the default
// 2 MiB on the CPU), twice the steps for the second half (effective batch 128; the schedule and the
// step count go on), the memory tracker's table, and the weights as safetensors
// (safetensors.torch.load_file reads them). pytorch_equivalent.py is the same job (PyTorch has no
// planner: it takes 32 x 2 as given).
//   quickstart [cpu|cuda|cuda:N] [budget]    (default: cuda:0 when a GPU is usable, else cpu; 2MiB)
#include <algorithm>
#include <cstdio>

#include <cumulus/cumulus.h>

using namespace cumulus;

// The user's own model, written as a torch.nn.Module subclass is: 64 -> 1024 -> ReLU -> 10.
struct Net : nn::Module {
  Net(Generator& gen, Device device)
      : fc1(register_module("fc1", std::make_shared<nn::Linear>(64, 1024, gen, device))),
        fc2(register_module("fc2", std::make_shared<nn::Linear>(1024, 10, gen, device))) {}
  Tensor forward(const Tensor& x) override { return (*fc2)(ops::relu((*fc1)(x))); }
  std::shared_ptr<nn::Linear> fc1, fc2;  // public, as a torch.nn.Module's submodules are
};

// n noisy 8 x 8 images of 10 fixed random patterns (u8 pixels, batches scaled to [0, 1]), labelled by pattern.
data::TensorDataset make_digits(int64_t n, uint64_t seed, Device device) {
  std::vector<float> pattern(10 * 64), noise(static_cast<std::size_t>(n * 64));
  Generator(7).fill_uniform(pattern.data(), 10 * 64, 0.0f, 255.0f);
  Generator(seed).fill_normal(noise.data(), n * 64, 0.0f, 160.0f);
  std::vector<uint8_t> pixels(noise.size());  // image i is pattern i % 10, plus noise
  std::vector<int32_t> labels(static_cast<std::size_t>(n));
  for (std::size_t p = 0; p < pixels.size(); ++p) {
    pixels[p] = static_cast<uint8_t>(std::clamp(pattern[p / 64 % 10 * 64 + p % 64] + noise[p], 0.0f, 255.0f));
    labels[p / 64] = static_cast<int32_t>(p / 64 % 10);
  }
  MemoryCategoryScope scope(MemoryCategory::data);  // the tracker's "data" category
  return data::TensorDataset({Tensor::from_vector(pixels, {n, 64}, device), Tensor::from_vector(labels, {n}, device)})
      .to_float(0, 255.0f);
}

int main(int argc, char** argv) try {
  const Device device = argc > 1 ? Device::parse(argv[1]) : cuda_available() ? Device::cuda(0) : Device::cpu();
  check_device_available(device);
  constexpr int kEpochs = 10;
  const data::TensorDataset train_set = make_digits(1500, 1, device), test_set = make_digits(300, 2, device);
  Generator gen(0);
  Net model(gen, device);
  optim::AdamWOptions adamw;
  adamw.lr = 3e-3f;
  auto optimizer = std::make_shared<optim::AdamW>(std::make_shared<nn::FlatParameters>(model), adamw);
  auto loss = [&](const data::Batch& b) { return ops::cross_entropy(model(b.x), b.y, ops::Reduction::Sum); };

  // The planner: the micro-batch dividing the effective batch 64 predicted fastest among those
  // whose training, AdamW's state included, stays within the budget: predicted from recorded and
  // timed micro-batches, then run once (an OutOfMemory error with the reason when none fits).
  const plan::Plan plan = plan::plan_batch(
      train::plan_request(*optimizer, train_set, loss, 64, plan::parse_byte_size(argc > 2 ? argv[2] : "2MiB")));
  std::printf("planner: %s\n", plan.reason.c_str());
  data::DataLoader loader(train_set, plan.micro_batch, /*shuffle=*/true, /*seed=*/0),
      test_loader(test_set, plan.micro_batch);
  memory::MemoryTracker tracker(device, {"Net 64-1024-10", plan.micro_batch, static_cast<int>(plan.accum_steps)});

  train::TrainerOptions options;
  options.accum_steps = static_cast<int>(plan.accum_steps);
  options.clip_grad_norm = 1.0f;
  options.use_graphs = device.is_cuda();  // train_epoch's closure reads its batch through DataLoader::next
  options.tracker = &tracker;
  auto groups = [&](int64_t n) { return (loader.num_batches() + n - 1) / n; };
  const int64_t steps = kEpochs / 2 * (groups(plan.accum_steps) + groups(2 * plan.accum_steps));
  train::Trainer trainer(optimizer, options,
                         std::make_shared<optim::CosineWarmupLR>(adamw.lr, /*warmup_steps=*/10, steps));
  for (int epoch = 0; epoch < kEpochs; ++epoch) {
    if (epoch == kEpochs / 2) trainer.set_accum_steps(2 * options.accum_steps);  // effective batch 64 -> 128
    const double train_loss = trainer.train_epoch(loader, epoch, loss);
    const train::TrainingCounters counters = trainer.counters();  // one read from the device
    std::printf("epoch %2d  train loss %.4f  lr %.5f  steps %3lld  test accuracy %.1f%%\n", epoch + 1, train_loss,
                counters.last_lr, static_cast<long long>(counters.optimizer_steps),
                100.0 * train::evaluate_classifier(model, test_loader).accuracy);
  }
  memory::print_memory_table(tracker, stdout);
  io::save_state_dict("quickstart.safetensors", model);
  std::printf("weights written to quickstart.safetensors\n");
  return 0;
} catch (const Error& e) {
  std::fprintf(stderr, "quickstart: %s\n", e.what());
  return 1;
}
