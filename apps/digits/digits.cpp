// digits: two models of one's own built from the library's ops and modules, trained with the
// training API, the memory tracker and the planner on scikit-learn's digits (1797 8 x 8 images,
// pixels 0..16): a residual MLP (layer norm, GELU, dropout) and a small attention block over the 8
// rows of each digit (bmm, softmax, embedding). bench/pytorch/digits_models.py is the same job in
// PyTorch; --compare writes the initial weights for it and prints every optimizer step's loss as
// JSON lines, with dropout off and batches in order (bench/pytorch/compare_digits.py).
#include <cmath>
#include <cstdio>

#include <cumulus/cumulus.h>
#include <CLI/CLI.hpp>

using namespace cumulus;
using std::make_shared;

struct Block : nn::Module {  // pre-norm residual MLP block: h + fc2(dropout(gelu(fc1(norm(h)))))
  Block(int64_t d, int64_t hidden, float p, Generator& g, Device dev)
      : norm(register_module("norm", make_shared<nn::LayerNorm>(d, 1e-5f, true, dev))),
        fc1(register_module("fc1", make_shared<nn::Linear>(d, hidden, g, dev))),
        fc2(register_module("fc2", make_shared<nn::Linear>(hidden, d, g, dev))),
        drop(register_module("drop", make_shared<nn::Dropout>(p, 1))) {}
  Tensor forward(const Tensor& h) override { return h + (*fc2)((*drop)(ops::gelu((*fc1)((*norm)(h))))); }
  std::shared_ptr<nn::LayerNorm> norm;
  std::shared_ptr<nn::Linear> fc1, fc2;
  std::shared_ptr<nn::Dropout> drop;
};

struct ResMLP : nn::Module {
  ResMLP(float p, Generator& g, Device dev)
      : inp(register_module("inp", make_shared<nn::Linear>(64, 128, g, dev))),
        blocks(register_module("blocks", make_shared<nn::Sequential>())),
        norm(register_module("norm", make_shared<nn::LayerNorm>(128, 1e-5f, true, dev))),
        head(register_module("head", make_shared<nn::Linear>(128, 10, g, dev))) {
    for (int i = 0; i < 2; ++i) blocks->add(make_shared<Block>(128, 256, p, g, dev));
  }
  Tensor forward(const Tensor& x) override { return (*head)((*norm)((*blocks)((*inp)(x)))); }
  std::shared_ptr<nn::Linear> inp, head;
  std::shared_ptr<nn::Sequential> blocks;
  std::shared_ptr<nn::LayerNorm> norm;
};

struct Attention : nn::Module {  // the image's 8 rows are 8 tokens of 8 pixels
  static constexpr int64_t d = 32;
  Attention(float p, Generator& g, Device dev)
      : tok(register_module("tok", make_shared<nn::Linear>(8, d, g, dev))),
        pos(register_module("pos", make_shared<nn::Embedding>(8, d, g, dev))),
        ln1(register_module("ln1", make_shared<nn::LayerNorm>(d, 1e-5f, true, dev))),
        qkv(register_module("qkv", make_shared<nn::Linear>(d, 3 * d, g, dev))),
        proj(register_module("proj", make_shared<nn::Linear>(d, d, g, dev))),
        mlp(register_module("mlp", make_shared<Block>(d, 2 * d, p, g, dev))),
        norm(register_module("norm", make_shared<nn::LayerNorm>(d, 1e-5f, true, dev))),
        head(register_module("head", make_shared<nn::Linear>(8 * d, 10, g, dev))),
        positions(Tensor::from_vector(std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7}, {8}, dev)) {}
  Tensor forward(const Tensor& x) override {
    const int64_t B = x.size(0);
    Tensor h = (*tok)(x.reshape({B * 8, 8})).reshape({B, 8, d}) + (*pos)(positions);
    const std::vector<Tensor> qkv_ = ops::split((*qkv)((*ln1)(h).reshape({B * 8, d})).reshape({B, 8, 3 * d}), d, -1);
    const Tensor att = ops::softmax(ops::bmm(qkv_[0], ops::transpose(qkv_[1], 1, 2)) / std::sqrt(float(d)));
    h = (*mlp)(h.reshape({B * 8, d}) + (*proj)(ops::bmm(att, qkv_[2]).reshape({B * 8, d})));
    return (*head)((*norm)(h).reshape({B, 8 * d}));
  }
  std::shared_ptr<nn::Linear> tok, qkv, proj, head;
  std::shared_ptr<nn::Embedding> pos;
  std::shared_ptr<nn::LayerNorm> ln1, norm;
  std::shared_ptr<Block> mlp;
  Tensor positions;
};

int main(int argc, char** argv) try {
  CLI::App cli("digits: a residual MLP or an attention block of one's own on scikit-learn's digits");
  std::string model_name = "resmlp", data_path, device_name = "cpu", budget = "4MiB", compare;
  int epochs = 20, effective_batch = 256;
  cli.add_option("--model", model_name, "resmlp or attention")->check(CLI::IsMember({"resmlp", "attention"}));
  cli.add_option("--data", data_path, "digits.csv.gz (scikit-learn's sklearn/datasets/data/)")->required();
  cli.add_option("--epochs", epochs, "epochs")->check(CLI::PositiveNumber);
  cli.add_option("--device", device_name, "cpu or cuda[:N]");
  cli.add_option("--effective-batch", effective_batch, "samples per optimizer step")->check(CLI::PositiveNumber);
  cli.add_option("--budget", budget, "memory budget the planner fits the effective batch into");
  cli.add_option("--compare", compare, "write the initial weights here; JSON lines out, dropout off, no shuffle");
  CLI11_PARSE(cli, argc, argv);
  const Device device = Device::parse(device_name);
  check_device_available(device);
  const auto [x, y] = data::read_csv_classification(data_path, device);  // pixels 0..16, labels
  const int64_t n = x.size(0), n_train = std::min<int64_t>(1500, n * 5 / 6);
  const data::TensorDataset digits = data::TensorDataset({x, y}).to_float(0, 16);
  const data::TensorDataset train_set = digits.slice(0, n_train), test_set = digits.slice(n_train, n - n_train);
  const float p = compare.empty() ? 0.1f : 0.0f;
  Generator gen(0);
  std::shared_ptr<nn::Module> model = model_name == "resmlp"
                                          ? std::shared_ptr<nn::Module>(make_shared<ResMLP>(p, gen, device))
                                          : make_shared<Attention>(p, gen, device);
  if (!compare.empty()) io::save_state_dict(compare, *model);
  optim::AdamWOptions adamw;
  adamw.lr = 1e-3f;
  adamw.weight_decay = 0.01f;
  auto optimizer = make_shared<optim::AdamW>(make_shared<nn::FlatParameters>(*model), adamw);
  auto loss = [&](const data::Batch& b) { return ops::cross_entropy((*model)(b.x), b.y, ops::Reduction::Sum); };

  const plan::Plan plan = plan::plan_batch(
      train::plan_request(*optimizer, train_set, loss, effective_batch, plan::parse_byte_size(budget)));
  std::printf("planner: %s\n", plan.reason.c_str());
  data::DataLoader loader(train_set, plan.micro_batch, /*shuffle=*/compare.empty(), /*seed=*/0),
      test_loader(test_set, plan.micro_batch);
  memory::MemoryTracker tracker(device, {model_name, plan.micro_batch, static_cast<int>(plan.accum_steps)});
  train::TrainerOptions options;
  options.accum_steps = static_cast<int>(plan.accum_steps);
  options.clip_grad_norm = 1.0f;
  options.tracker = &tracker;
  if (!compare.empty())  // every step's loss, as JSON lines
    options.on_step = [](const train::StepLog& s) {
      std::printf("{\"step\": %lld, \"loss\": %.9g}\n", (long long)s.step, s.loss);
    };
  train::Trainer trainer(optimizer, options);
  for (int epoch = 0; epoch < epochs; ++epoch) {
    const double train_loss = trainer.train_epoch(loader, epoch, loss);
    std::printf("epoch %2d  train loss %.4f  test accuracy %.1f%%\n", epoch + 1, train_loss,
                100.0 * train::evaluate_classifier(*model, test_loader).accuracy);
  }
  memory::print_memory_table(tracker, stdout);
  return 0;
} catch (const Error& e) {
  std::fprintf(stderr, "digits: %s\n", e.what());
  return 1;
}
