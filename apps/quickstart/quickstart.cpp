// quickstart: the seed MLP trained for a few hundred steps on a synthetic 10-class problem, on the
// best device present, with the loss and the memory by category. A stand-in for apps/fashion_mnist
// until that app exists; it shows the engine's training loop and memory accounting end to end.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "cumulus/autograd/grad_mode.h"
#include "cumulus/memory/allocator.h"
#include "cumulus/ops/ops.h"
#include "cumulus/optim/sgd.h"
#include "models/mlp.h"

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

int run(Device device, int steps, int64_t batch) {
  std::printf("device: %s | seed MLP 784-512-512-10 | batch %lld | SGD lr 0.05 | %d steps\n",
              device.str().c_str(), static_cast<long long>(batch), steps);
  Synthetic train = make_data(4096, 1, device);
  Generator gen(0);
  models::SeedMLP model(gen, device);
  optim::SGD opt(model.parameters(), 0.05f);
  CachingAllocator& alloc = allocator_for(device);

  const auto t0 = std::chrono::steady_clock::now();
  const int64_t n = train.x.size(0);
  for (int step = 0; step < steps; ++step) {
    const int64_t start = (step * batch) % (n - batch + 1);
    alloc.reset_peak();
    opt.zero_grad();
    Tensor logits = model(train.x.narrow_rows(start, batch));
    Tensor loss = ops::cross_entropy(logits, train.y.narrow_rows(start, batch), ops::Reduction::Mean);
    loss.backward();
    opt.step();
    if (step % 50 == 0 || step == steps - 1)
      std::printf("step %4d  loss %.4f\n", step, static_cast<double>(loss.item()));
  }
  synchronize(device);
  const MemoryStats st = alloc.stats();  // the peak of the last step (reset at its start)
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  // Accuracy on the training set, without recording a graph.
  int64_t correct = 0;
  {
    NoGradGuard no_grad;
    std::vector<int32_t> pred = ops::argmax(model(train.x)).to_vector<int32_t>();
    std::vector<int32_t> truth = train.y.to_vector<int32_t>();
    for (std::size_t i = 0; i < pred.size(); ++i) correct += pred[i] == truth[i];
  }
  std::printf("train accuracy %.1f%%, %.0f samples/s\n", 100.0 * correct / n, steps * batch / secs);

  std::printf("memory (%s): peak of the last step %s, reserved %s, backend allocations %lld\n",
              device.str().c_str(), format_bytes(st.allocated_peak).c_str(),
              format_bytes(st.reserved).c_str(), static_cast<long long>(st.backend_allocs));
  for (std::size_t c = 0; c < kNumMemoryCategories; ++c)
    std::printf("  %-22s now %10s   at peak %10s\n", category_name(static_cast<MemoryCategory>(c)),
                format_bytes(st.by_category[c].current).c_str(), format_bytes(st.at_peak[c]).c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    Device device = cuda_available() ? Device::cuda(0) : Device::cpu();
    int steps = 300;
    for (int i = 1; i < argc; ++i) {
      std::string a = argv[i];
      if (a == "--help" || a == "-h") {
        std::printf("usage: quickstart [--device cpu|cuda|cuda:N] [--steps N]\n"
                    "Trains the seed MLP on synthetic data and prints loss and memory by category.\n");
        return 0;
      } else if (a == "--device" && i + 1 < argc) {
        device = Device::parse(argv[++i]);
        check_device_available(device);
      } else if (a == "--steps" && i + 1 < argc) {
        steps = std::atoi(argv[++i]);
        if (steps <= 0) {
          std::fprintf(stderr, "quickstart: --steps must be a positive integer, got '%s'\n", argv[i]);
          return 2;
        }
      } else {
        std::fprintf(stderr, "quickstart: unknown or incomplete argument '%s' (see --help)\n", a.c_str());
        return 2;
      }
    }
    return run(device, steps, 64);
  } catch (const Error& e) {
    std::fprintf(stderr, "quickstart: %s\n", e.what());
    return 1;
  }
}
