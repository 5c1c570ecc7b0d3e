// quickstart: the seed MLP trained with gradient accumulation (micro-batch 16 x 4 steps by default)
// on a synthetic 10-class problem, on the best device present, with the loss and the memory of a
// micro-batch by category. A stand-in for apps/fashion_mnist until that app exists: it shows the
// engine's training loop and memory accounting end to end.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "cumulus/autograd/grad_mode.h"
#include "cumulus/memory/allocator.h"
#include "cumulus/ops/ops.h"
#include "cumulus/nn/flat_parameters.h"
#include "cumulus/optim/accumulator.h"
#include "cumulus/optim/sgd.h"
#include "cumulus/models/mlp.h"

using namespace cumulus;

namespace {

// 10 classes, each a Gaussian blob around its own random mean in 784 dimensions.
struct Synthetic {
  Tensor x;  // [n, 784]
  Tensor y;  // [n] i32
};

Synthetic make_data(int64_t n, uint64_t seed, Device device) {
  Generator gen(seed);
  std::vector<float> means(10 * 784);
  gen.fill_uniform(means.data(), static_cast<int64_t>(means.size()), 0.0f, 1.0f);
  std::vector<float> x(static_cast<std::size_t>(n * 784));
  gen.fill_normal(x.data(), n * 784, 0.0f, 0.5f);
  std::vector<int32_t> y(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    y[i] = static_cast<int32_t>(i % 10);
    for (int64_t j = 0; j < 784; ++j) x[i * 784 + j] += means[y[i] * 784 + j];
  }
  MemoryCategoryScope scope(MemoryCategory::data);
  return {Tensor::from_vector(x, Shape{n, 784}, device), Tensor::from_vector(y, Shape{n}, device)};
}

int run(Device device, int steps, int64_t micro_batch, int accum_steps) {
  std::printf("device: %s | seed MLP 784-512-512-10 | micro-batch %lld x %d steps = effective batch %lld"
              " | SGD lr 0.05 | %d optimizer steps\n",
              device.str().c_str(), static_cast<long long>(micro_batch), accum_steps,
              static_cast<long long>(micro_batch * accum_steps), steps);
  Synthetic train = make_data(4096, 1, device);
  Generator gen(0);
  models::SeedMLP model(gen, device);
  auto params = std::make_shared<nn::FlatParameters>(model);
  optim::SGDOptions sgd;
  sgd.lr = 0.05f;
  optim::AccumulatorOptions acc_options;
  acc_options.accum_steps = accum_steps;
  optim::Accumulator acc(std::make_shared<optim::SGD>(params, sgd), acc_options);
  CachingAllocator& alloc = allocator_for(device);

  const auto t0 = std::chrono::steady_clock::now();
  const int64_t n = train.x.size(0);
  int64_t start = 0;
  double group_loss = 0.0;
  MemoryStats micro_batch_stats;
  while (acc.optimizer_steps() < steps) {
    if (start + micro_batch > n) start = 0;
    alloc.reset_peak();
    Tensor logits = model(train.x.narrow_rows(start, micro_batch));
    Tensor loss = ops::cross_entropy(logits, train.y.narrow_rows(start, micro_batch), ops::Reduction::Sum);
    group_loss += loss.item();  // synchronizes: fine for a demo, the real app reads losses lazily
    acc.backward(loss, micro_batch);
    micro_batch_stats = alloc.stats();
    start += micro_batch;
    if (acc.step_if_ready()) {
      const int64_t step = acc.optimizer_steps();
      if (step % 50 == 1 || step == steps)
        std::printf("step %4lld  loss %.4f\n", static_cast<long long>(step),
                    group_loss / static_cast<double>(micro_batch * accum_steps));
      group_loss = 0.0;
    }
  }
  synchronize(device);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  // Accuracy on the training set, without recording a graph.
  int64_t correct = 0;
  {
    NoGradGuard no_grad;
    std::vector<int32_t> pred = ops::argmax(model(train.x)).to_vector<int32_t>();
    std::vector<int32_t> truth = train.y.to_vector<int32_t>();
    for (std::size_t i = 0; i < pred.size(); ++i) correct += pred[i] == truth[i];
  }
  std::printf("train accuracy %.1f%%, %.0f samples/s\n", 100.0 * static_cast<double>(correct) / static_cast<double>(n),
              static_cast<double>(acc.micro_batches_total() * micro_batch) / secs);

  const MemoryStats& st = micro_batch_stats;  // peak of the last micro-batch (forward + backward)
  std::printf("memory per micro-batch (%s, %lld samples): peak %s, reserved %s, backend allocations %lld\n",
              device.str().c_str(), static_cast<long long>(micro_batch), format_bytes(st.allocated_peak).c_str(),
              format_bytes(st.reserved).c_str(), static_cast<long long>(st.backend_allocs));
  for (std::size_t c = 0; c < kNumMemoryCategories; ++c)
    std::printf("  %-22s at peak %10s   category peak %10s\n", category_name(static_cast<MemoryCategory>(c)),
                format_bytes(st.at_peak[c]).c_str(), format_bytes(st.by_category[c].peak).c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    Device device = cuda_available() ? Device::cuda(0) : Device::cpu();
    int steps = 200;
    int64_t micro_batch = 16;
    int accum_steps = 4;
    for (int i = 1; i < argc; ++i) {
      std::string a = argv[i];
      if (a == "--help" || a == "-h") {
        std::printf(
            "usage: quickstart [--device cpu|cuda|cuda:N] [--steps N] [--batch-size B] [--accum-steps N]\n"
            "Trains the seed MLP on a synthetic 10-class problem with gradient accumulation and prints\n"
            "the loss and the memory of one micro-batch by category.\n"
            "  --device       where to train (default: cuda:0 if a GPU is usable, else cpu)\n"
            "  --steps        optimizer steps (default 200)\n"
            "  --batch-size   micro-batch size (default 16)\n"
            "  --accum-steps  micro-batches per optimizer step (default 4)\n");
        return 0;
      } else if (a == "--device" && i + 1 < argc) {
        try {
          device = Device::parse(argv[++i]);
          check_device_available(device);
        } catch (const Error& e) {
          std::fprintf(stderr, "quickstart: --device: %s\n", e.what());
          return 2;
        }
      } else if ((a == "--steps" || a == "--batch-size" || a == "--accum-steps") && i + 1 < argc) {
        char* end = nullptr;
        const long v = std::strtol(argv[++i], &end, 10);
        if (*end != '\0' || v <= 0 || v > 1000000) {
          std::fprintf(stderr, "quickstart: %s must be a positive integer, got '%s'\n", a.c_str(), argv[i]);
          return 2;
        }
        if (a == "--steps") steps = static_cast<int>(v);
        else if (a == "--batch-size") micro_batch = v;
        else accum_steps = static_cast<int>(v);
      } else {
        std::fprintf(stderr, "quickstart: unknown or incomplete argument '%s' (see --help)\n", a.c_str());
        return 2;
      }
    }
    if (micro_batch > 4096) {
      std::fprintf(stderr, "quickstart: --batch-size %lld exceeds the 4096 synthetic samples\n",
                   static_cast<long long>(micro_batch));
      return 2;
    }
    return run(device, steps, micro_batch, accum_steps);
  } catch (const Error& e) {
    std::fprintf(stderr, "quickstart: %s\n", e.what());
    return 1;
  }
}
