// quickstart: a training loop of one's own with the training API (optim::Trainer), as a PyTorch
// user writes one with Lightning's Trainer(accumulate_grad_batches=4): the user's own model (Net),
// 8 x 8 digit-like images made here (10 classes, as scikit-learn's digits), AdamW with gradient
// clipping and warmup + cosine, micro-batch 16 x 4 accumulation steps and 16 x 8 for the second
// half (the schedule and the step count go on), the memory tracker's table, and the weights as
// safetensors (safetensors.torch.load_file reads them). pytorch_equivalent.py is the same job.
//   quickstart [cpu|cuda|cuda:N]    (default: cuda:0 when a GPU is usable, else cpu)
#include <algorithm>
#include <cstdio>

#include <cumulus/cumulus.h>

using namespace cumulus;

namespace {

// The user's own model, written as a torch.nn.Module subclass is: 64 -> 128 -> ReLU -> 10.
class Net : public nn::Module {
 public:
  Net(Generator& gen, Device device)
      : fc1_(register_module("fc1", std::make_shared<nn::Linear>(64, 128, gen, device))),
        fc2_(register_module("fc2", std::make_shared<nn::Linear>(128, 10, gen, device))) {}
  Tensor forward(const Tensor& x) override { return (*fc2_)(ops::relu((*fc1_)(x))); }

 private:
  std::shared_ptr<nn::Linear> fc1_, fc2_;
};

// n noisy 8 x 8 images of 10 fixed random patterns (pixels 0..255), labelled by pattern.
data::ImageDataset make_digits(int64_t n, uint64_t seed, Device device) {
  std::vector<float> pattern(10 * 64), noise(static_cast<std::size_t>(n * 64));
  Generator(7).fill_uniform(pattern.data(), 10 * 64, 0.0f, 255.0f);
  Generator(seed).fill_normal(noise.data(), n * 64, 0.0f, 160.0f);
  std::vector<uint8_t> pixels(noise.size());  // image i is pattern i % 10, plus noise
  for (std::size_t p = 0; p < pixels.size(); ++p)
    pixels[p] = static_cast<uint8_t>(std::clamp(pattern[p / 64 % 10 * 64 + p % 64] + noise[p], 0.0f, 255.0f));
  std::vector<int32_t> labels(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<int32_t>(i % 10);
  MemoryCategoryScope scope(MemoryCategory::data);  // the tracker's "data" category
  return {Tensor::from_vector(pixels, {n, 8, 8}, device), Tensor::from_vector(labels, {n}, device), 10};
}

double accuracy(Net& model, const data::ImageDataset& test) {
  NoGradGuard no_grad;
  const data::Batch all = data::DataLoader(test, test.size()).batch(0);
  ops::ClassificationTally tally(all.x.device());
  const Tensor logits = model(all.x);
  tally.add(logits, all.y, ops::cross_entropy(logits, all.y));
  return 100.0 * static_cast<double>(tally.read().correct) / static_cast<double>(test.size());
}

void train(Device device) {
  constexpr int kEpochs = 10, kAccumSteps = 4, kMicroBatch = 16;
  const data::ImageDataset train_set = make_digits(1500, 1, device), test_set = make_digits(300, 2, device);
  data::DataLoader loader(train_set, kMicroBatch, /*shuffle=*/true, /*seed=*/0);
  Generator gen(0);
  Net model(gen, device);
  auto params = std::make_shared<nn::FlatParameters>(model);  // one flat buffer for weights, one for grads

  // Planner: a memory budget would choose the micro-batch and the accumulation steps here, from a
  // measured probe of `model` (the library's planner call goes in this place).
  MemoryTracker::Options report;
  report.model = "Net 64-128-10";
  report.micro_batch_size = kMicroBatch;
  report.accum_steps = kAccumSteps;
  MemoryTracker tracker(device, report);

  optim::TrainerOptions options;
  options.accum_steps = kAccumSteps;
  options.clip_grad_norm = 1.0f;
  options.use_graphs = device.is_cuda();  // the closure reads its batch through DataLoader::next
  options.tracker = &tracker;
  auto groups = [&](int64_t n) { return (loader.num_batches() + n - 1) / n; };
  const int64_t steps = kEpochs / 2 * (groups(kAccumSteps) + groups(2 * kAccumSteps));
  optim::AdamWOptions adamw;
  adamw.lr = 3e-3f;
  optim::Trainer trainer(std::make_shared<optim::AdamW>(params, adamw), options,
                         std::make_shared<optim::CosineWarmupLR>(adamw.lr, /*warmup_steps=*/10, steps));
  const optim::Accumulator& counters = trainer.accumulator();

  for (int epoch = 0; epoch < kEpochs; ++epoch) {
    if (epoch == kEpochs / 2) trainer.set_accum_steps(2 * kAccumSteps);  // effective batch 64 -> 128
    loader.set_epoch(epoch);
    loader.seek(0);
    trainer.begin_epoch(epoch, loader.num_batches());
    for (int64_t i = 0; i < loader.num_batches(); ++i) {
      trainer.micro_batch(std::min<int64_t>(kMicroBatch, train_set.size() - i * kMicroBatch), [&] {
        const data::Batch b = loader.next(i);
        return ops::cross_entropy(model(b.x), b.y, ops::Reduction::Sum);
      });
      trainer.step_if_ready();
    }
    std::printf("epoch %2d  train loss %.4f  lr %.5f  steps %3lld  test accuracy %.1f%%\n", epoch + 1,
                counters.epoch_loss_sum() / counters.epoch_samples_stepped(), counters.last_lr(),
                static_cast<long long>(counters.optimizer_steps()), accuracy(model, test_set));
  }
  print_memory_table(tracker, stdout);
  io::save_state_dict("quickstart.safetensors", model);
  std::printf("weights written to quickstart.safetensors\n");
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Device device = argc > 1 ? Device::parse(argv[1]) : cuda_available() ? Device::cuda(0) : Device::cpu();
    check_device_available(device);
    train(device);
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "quickstart: %s\n", e.what());
    return 1;
  }
}
