// bench_precision: what mixed precision (Note [Mixed precision] in engine/ops/linear.cpp) saves in
// activation memory and gains or costs in time, for the seed MLP and the CNN, on CPU and (when a GPU
// is usable) on CUDA. Issue 13's GPU target: the CNN at micro-batch 256 faster in bf16 than in fp32.
//
// Families (names are <device>/<model>_micro_batch/<precision>/B, then "/manual_time"): forward +
// backward of one micro-batch of B samples (mlp: 16, 64, 256, 1024; cnn: 64, 256) in fp32, bf16 or
// fp16, gradients overwritten into the f32 buffers (stale marking outside the timed region), no
// optimizer step. The batch is stored in the precision's type, as the DataLoader makes it.
// Counters: us_per_micro_batch, samples_per_s, and from one tracked, untimed micro-batch
// activation_bytes_per_micro_batch (held at the end of forward) and peak_bytes. On the CPU 16-bit
// storage is emulated (f32 arithmetic over widened copies), so CPU times say nothing of a GPU's.
// Timing and memory method: see rig.h.
#include <benchmark/benchmark.h>

#include <memory>
#include <string>

#include "bench/rig.h"
#include "cumulus/core/precision.h"
#include "cumulus/models/cnn.h"
#include "cumulus/train/trainer.h"

using namespace cumulus;
using namespace cumulus::bench;

namespace {

enum class ModelKind { mlp, cnn };

// The model with flat parameters, as the app builds it.
struct AnyModel {
  AnyModel(ModelKind kind, Device device) : gen(0) {
    if (kind == ModelKind::mlp) net = std::make_shared<models::SeedMLP>(gen, device);
    else net = std::make_shared<models::CNN>(gen, device);
    params = std::make_shared<nn::FlatParameters>(*net);
  }
  Generator gen;
  std::shared_ptr<nn::Module> net;
  std::shared_ptr<nn::FlatParameters> params;
};

void micro_batch(benchmark::State& state, Device device, ModelKind kind, Precision precision, int64_t b) {
  const std::string reason = precision_unsupported_reason(precision, device);
  if (!reason.empty()) {
    state.SkipWithError(reason.c_str());
    return;
  }
  const int64_t rows = kind == ModelKind::mlp ? kDataRows : 1024;
  Data d = make_data(device, rows);
  {
    MemoryCategoryScope scope(MemoryCategory::data);
    d.x = d.x.to(compute_dtype(precision));
  }
  AnyModel m(kind, device);
  train::Trainer acc(make_optimizer(OptimizerKind::sgd, m.params), never_stepping());
  auto loss_of = [&](int64_t start) {
    return ops::cross_entropy((*m.net)(d.x.narrow_rows(start, b)), d.y.narrow_rows(start, b), ops::Reduction::Sum);
  };

  memory::MicroBatchRecord record;
  {
    memory::MemoryTracker::Options o;
    o.model = kind == ModelKind::mlp ? "seed_mlp" : "cnn";
    o.micro_batch_size = b;
    o.timeline_steps = 0;
    memory::MemoryTracker tracker(device, o);
    acc.optimizer().zero_grad();
    tracker.begin_micro_batch(0, 0, b);
    Tensor loss = loss_of(0);
    tracker.end_forward();
    acc.backward(loss, b);
    loss = Tensor();
    tracker.end_backward();
    record = tracker.micro_batches().front();
  }

  Cursor cursor(d, b);
  const double total_s = timed_loop(
      state, device, [&] { acc.optimizer().zero_grad(); },  // untimed: the flags of a step's end
      [&] { acc.backward(loss_of(cursor.next()), b); });
  if (!m.params->any_gradient()) state.SkipWithError("no gradient was accumulated");
  const double iters = static_cast<double>(state.iterations());
  state.counters["samples_per_s"] = benchmark::Counter(static_cast<double>(b) * iters, benchmark::Counter::kIsRate);
  state.counters["us_per_micro_batch"] = iters > 0 ? total_s * 1e6 / iters : 0.0;
  state.counters["micro_batch"] = static_cast<double>(b);
  state.counters["activation_bytes_per_micro_batch"] = bytes_counter(record.activation_bytes);
  state.counters["peak_bytes"] = bytes_counter(record.peak_bytes);
}

// ---- registration --------------------------------------------------------------------------------

void register_device(Device device) {
  const std::string dev = device.is_cpu() ? "cpu" : "cuda";
  for (ModelKind kind : {ModelKind::mlp, ModelKind::cnn}) {
    const std::string model = kind == ModelKind::mlp ? "mlp" : "cnn";
    const auto sizes = kind == ModelKind::mlp ? std::vector<int64_t>{16, 64, 256, 1024} : std::vector<int64_t>{64, 256};
    for (int64_t b : sizes)
      for (Precision p : {Precision::fp32, Precision::bf16, Precision::fp16}) {
        auto* bm = add(dev + "/" + model + "_micro_batch/" + precision_name(p) + "/" + std::to_string(b), micro_batch,
                       device, kind, p, b);
        bm->UseManualTime()->Unit(benchmark::kMicrosecond);
        if (device.is_cpu()) bm->MeasureProcessCPUTime();  // OpenBLAS's threads included
      }
  }
}

}  // namespace

int main(int argc, char** argv) {
  return run_benchmarks(argc, argv, "bench_precision",
                        "seed MLP 784-512-512-10 and CNN (cumulus/models/cnn.h), Reduction::Sum", register_device);
}
