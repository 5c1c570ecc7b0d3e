// An application outside cumulus, built against it the way a user's project would be: the engine's
// one include and the models' headers, the seed MLP, one SGD step on random data (the loss must go
// down), and state dicts of the MLP and of the CNN (batch-norm buffers included) saved and loaded
// back. Run by tests/test_package.cmake.
#include <cumulus/cumulus.h>
#include <cumulus/models/cnn.h>
#include <cumulus/models/mlp.h>

#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

using namespace cumulus;

namespace {

float eval_loss(nn::Module& model, const Tensor& x, const Tensor& y) {
  NoGradGuard no_grad;
  return ops::cross_entropy(model(x), y).item();
}

bool same_outputs(nn::Module& a, nn::Module& b, const Tensor& x) {
  NoGradGuard no_grad;
  return a(x).to_vector<float>() == b(x).to_vector<float>();
}

int run(const std::string& dir) {
  Generator gen(0);
  const int64_t n = 64;
  Tensor x = normal(Shape{n, 784}, 0.0f, 1.0f, gen);
  std::vector<int32_t> labels(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) labels[static_cast<std::size_t>(i)] = static_cast<int32_t>((i * 7) % 10);
  Tensor y = Tensor::from_vector(labels, Shape{n});

  // One optimizer step: two micro-batches of 32 accumulated into one update.
  models::SeedMLP model(gen);
  auto params = std::make_shared<nn::FlatParameters>(model);
  optim::SGDOptions sgd;
  sgd.lr = 0.1f;
  train::TrainerOptions options;
  options.accum_steps = 2;
  train::Trainer trainer(std::make_shared<optim::SGD>(params, sgd), options);
  const float before = eval_loss(model, x, y);
  trainer.begin_epoch(0, 2);
  for (int64_t start = 0; start < n; start += 32) {
    const Tensor xb = x.narrow_rows(start, 32), yb = y.narrow_rows(start, 32);
    trainer.micro_batch(32, [&] { return ops::cross_entropy(model(xb), yb, ops::Reduction::Sum); });
    trainer.step_if_ready();
  }
  const float after = eval_loss(model, x, y);
  std::printf("consumer: one SGD step (2 x 32), loss %.6f -> %.6f, %lld step(s)\n", before, after,
              static_cast<long long>(trainer.counters().optimizer_steps));
  if (!(after < before) || trainer.counters().optimizer_steps != 1) {
    std::fprintf(stderr, "consumer: the loss did not go down after one step\n");
    return 1;
  }

  // State dicts round-trip: the MLP, and the CNN with its batch-norm buffers (in eval mode they
  // decide the output).
  const std::string mlp_path = dir + "/mlp.safetensors", cnn_path = dir + "/cnn.safetensors";
  io::save_state_dict(mlp_path, model);
  Generator other(1);
  models::SeedMLP copy(other);
  io::load_state_dict(mlp_path, copy);
  models::CNN cnn(gen), cnn_copy(other);
  {
    Tensor xb = x.narrow_rows(0, 8);
    cnn(xb);  // a training-mode forward updates the running statistics and the counter
  }
  cnn.eval();
  cnn_copy.eval();
  io::save_state_dict(cnn_path, cnn, {{"note", "consumer"}});
  const io::LoadedStateDict loaded = io::load_state_dict(cnn_path, cnn_copy);
  const bool ok = same_outputs(model, copy, x) && same_outputs(cnn, cnn_copy, x.narrow_rows(0, 8)) &&
                  loaded.metadata.at("note") == "consumer";
  std::printf("consumer: state dicts of the MLP and the CNN round-trip: %s\n", ok ? "identical outputs" : "MISMATCH");
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string dir = argc > 1 ? argv[1] : std::filesystem::temp_directory_path().string();
    return run(dir);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "consumer: %s\n", e.what());
    return 1;
  }
}
