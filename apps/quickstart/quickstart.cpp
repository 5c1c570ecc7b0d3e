// quickstart: a training loop of one's own with the training API (optim::Trainer), as a PyTorch
// user writes one with Lightning's Trainer(accumulate_grad_batches=...): the user's own model (Net),
// 8 x 8 digit-like images made here (10 classes, as scikit-learn's digits), AdamW with gradient
// clipping and warmup + cosine, the planner choosing the micro-batch and accumulation steps of the
// effective batch 64 under a memory budget (32 x 2 under the default 2 MiB on the CPU), twice the
// steps for the second half (effective batch 128; the schedule and the step count go on), the
// memory tracker's table, and the weights as safetensors (safetensors.torch.load_file reads them).
// pytorch_equivalent.py is the same job (PyTorch has no planner: it takes 32 x 2 as given).
//   quickstart [cpu|cuda|cuda:N] [budget]    (default: cuda:0 when a GPU is usable, else cpu; 2MiB)
#include <algorithm>
#include <cstdio>
#include <string>

#include <cumulus/cumulus.h>

using namespace cumulus;

namespace {

// The user's own model, written as a torch.nn.Module subclass is: 64 -> 1024 -> ReLU -> 10.
class Net : public nn::Module {
 public:
  Net(Generator& gen, Device device)
      : fc1_(register_module("fc1", std::make_shared<nn::Linear>(64, 1024, gen, device))),
        fc2_(register_module("fc2", std::make_shared<nn::Linear>(1024, 10, gen, device))) {}
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

// Test accuracy in %, evaluated in batches of the training's micro-batch (as within the budget).
double accuracy(Net& model, const data::ImageDataset& test, int64_t batch_size) {
  NoGradGuard no_grad;
  data::DataLoader loader(test, batch_size);
  ops::ClassificationTally tally(loader.device());
  for (int64_t i = 0; i < loader.num_batches(); ++i) {
    const data::Batch b = loader.batch(i);
    const Tensor logits = model(b.x);
    tally.add(logits, b.y, ops::cross_entropy(logits, b.y));
  }
  return 100.0 * static_cast<double>(tally.read().correct) / static_cast<double>(test.size());
}

void train(Device device, const std::string& budget) {
  constexpr int kEpochs = 10, kEffectiveBatch = 64;
  const data::ImageDataset train_set = make_digits(1500, 1, device), test_set = make_digits(300, 2, device);
  Generator gen(0);
  Net model(gen, device);
  auto params = std::make_shared<nn::FlatParameters>(model);  // one flat buffer for weights, one for grads
  optim::AdamWOptions adamw;
  adamw.lr = 3e-3f;
  auto optimizer = std::make_shared<optim::AdamW>(params, adamw);

  // The planner: the largest micro-batch dividing the effective batch whose training, AdamW's state
  // included, stays within the budget: predicted from recorded micro-batches, then run once under it.
  PlanRequest request;
  request.device = device;
  request.effective_batch = kEffectiveBatch;
  request.budget = parse_byte_size(budget);
  request.optimizer = optimizer.get();
  request.micro_batch = [&](int64_t samples) {  // one training micro-batch, its gradients discarded
    const data::Batch b = data::DataLoader(train_set, samples).batch(0);
    ops::cross_entropy(model(b.x), b.y, ops::Reduction::Sum).backward();
    params->mark_gradients_stale();
  };
  const Plan plan = plan_batch(request);
  CUMULUS_CHECK(plan.micro_batch > 0, OutOfMemory, "planner: ", plan.reason);
  std::printf("planner: %s\n", plan.reason.c_str());
  const int64_t micro_batch = plan.micro_batch;
  const int accum_steps = static_cast<int>(plan.accum_steps);
  data::DataLoader loader(train_set, micro_batch, /*shuffle=*/true, /*seed=*/0);
  MemoryTracker tracker(device, {"Net 64-1024-10", micro_batch, accum_steps});  // the report's model and split

  optim::TrainerOptions options;
  options.accum_steps = accum_steps;
  options.clip_grad_norm = 1.0f;
  options.use_graphs = device.is_cuda();  // the closure reads its batch through DataLoader::next
  options.tracker = &tracker;
  auto groups = [&](int64_t n) { return (loader.num_batches() + n - 1) / n; };
  const int64_t steps = kEpochs / 2 * (groups(accum_steps) + groups(2 * accum_steps));
  optim::Trainer trainer(optimizer, options,
                         std::make_shared<optim::CosineWarmupLR>(adamw.lr, /*warmup_steps=*/10, steps));
  const optim::Accumulator& counters = trainer.accumulator();

  for (int epoch = 0; epoch < kEpochs; ++epoch) {
    if (epoch == kEpochs / 2) trainer.set_accum_steps(2 * accum_steps);  // effective batch 64 -> 128
    loader.set_epoch(epoch);
    loader.seek(0);
    trainer.begin_epoch(epoch, loader.num_batches());
    for (int64_t i = 0; i < loader.num_batches(); ++i) {
      trainer.micro_batch(std::min<int64_t>(micro_batch, train_set.size() - i * micro_batch), [&] {
        const data::Batch b = loader.next(i);
        return ops::cross_entropy(model(b.x), b.y, ops::Reduction::Sum);
      });
      trainer.step_if_ready();
    }
    std::printf("epoch %2d  train loss %.4f  lr %.5f  steps %3lld  test accuracy %.1f%%\n", epoch + 1,
                counters.epoch_loss_sum() / counters.epoch_samples_stepped(), counters.last_lr(),
                static_cast<long long>(counters.optimizer_steps()), accuracy(model, test_set, micro_batch));
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
    train(device, argc > 2 ? argv[2] : "2MiB");
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "quickstart: %s\n", e.what());
    return 1;
  }
}
