// bench_recompute: what activation checkpointing (Note [Recompute] in
// engine/autograd/checkpoint.cpp) saves in memory and costs in time, for the CNN (Conv-BN-ReLU-Pool
// x 2, then Linear-ReLU-Linear: cumulus/models/cnn.h), on CPU and (when a GPU is usable) on CUDA.
// Issue 16's target: at micro-batch 256, a peak at least 40% lower for at most 35% more time per
// micro-batch.
//
// Families (names are <device>/cnn_micro_batch/<variant>/B, then "/manual_time"): forward +
// backward of one micro-batch of B (64, 256) samples, gradients overwritten (stale marking outside
// the timed region), no optimizer step. Variants:
//   stored      no recompute (the default)
//   recompute   CNN::set_recompute(true): [conv, BN] of each block ({0,2}, {4,6})
//   blocks      the blocks ({0,4}, {4,8})
//   nested      the blocks and within them [conv, BN] ({0,4}, {0,2}, {4,8}, {4,6})
//   conv_bn_first  the first block's [conv, BN] only ({0,2}): its conv is the cheap one
// Counters: us_per_micro_batch, samples_per_s; from one tracked, untimed micro-batch:
// activation_bytes_per_micro_batch (held at the end of forward), activation_bytes_stored (what
// the stored run holds: activation bytes + the tracker's recompute saving), peak_bytes and
// peak_bytes_excl_data (the synthetic dataset is 1024 samples, f32), recompute_ms and
// recomputed_bytes. Timing and memory method: see rig.h.
#include <benchmark/benchmark.h>

#include <memory>
#include <string>
#include <vector>

#include "bench/rig.h"
#include "cumulus/models/cnn.h"
#include "cumulus/train/trainer.h"

using namespace cumulus;
using namespace cumulus::bench;

namespace {

constexpr int64_t kCnnDataRows = 1024;

struct Variant {
  const char* name;
  std::vector<nn::LayerRange> segments;
};

const std::vector<Variant>& variants() {
  static const std::vector<Variant> v = {
      {"stored", {}},
      {"recompute", models::CNN::recompute_segments_default()},
      {"blocks", {{0, 4}, {4, 8}}},
      {"nested", {{0, 4}, {0, 2}, {4, 8}, {4, 6}}},
      {"conv_bn_first", {{0, 2}}},
  };
  return v;
}

// The CNN with flat parameters, as the app builds it.
struct CnnModel {
  CnnModel(Device device, const std::vector<nn::LayerRange>& segments)
      : gen(0), net(gen, device), params(std::make_shared<nn::FlatParameters>(net)) {
    net.set_recompute(segments);
  }
  Generator gen;
  models::CNN net;
  std::shared_ptr<nn::FlatParameters> params;
};

Tensor cnn_loss(CnnModel& m, const Data& d, int64_t start, int64_t b) {
  return ops::cross_entropy(m.net(d.x.narrow_rows(start, b)), d.y.narrow_rows(start, b), ops::Reduction::Sum);
}

void cnn_micro_batch(benchmark::State& state, Device device, Variant variant, int64_t b) {
  const Data d = make_data(device, kCnnDataRows);
  CnnModel m(device, variant.segments);
  train::Trainer acc(make_optimizer(OptimizerKind::sgd, m.params), never_stepping());

  // Memory and recompute cost of one micro-batch, tracked and untimed.
  memory::MicroBatchRecord record;
  int64_t data_bytes = 0;
  {
    memory::MemoryTracker::Options o;
    o.model = "cnn";
    o.micro_batch_size = b;
    o.timeline_steps = 0;
    memory::MemoryTracker tracker(device, o);
    acc.optimizer().zero_grad();
    tracker.begin_micro_batch(0, 0, b);
    Tensor loss = cnn_loss(m, d, 0, b);
    tracker.end_forward();
    acc.backward(loss, b);
    loss = Tensor();
    tracker.end_backward();
    record = tracker.micro_batches().front();
    data_bytes = record.peak_by_category[static_cast<std::size_t>(MemoryCategory::data)];
  }

  Cursor cursor(d, b);
  const double total_s = timed_loop(
      state, device, [&] { acc.optimizer().zero_grad(); },  // untimed: the flags of a step's end
      [&] { acc.backward(cnn_loss(m, d, cursor.next(), b), b); });
  if (!m.params->any_gradient()) state.SkipWithError("no gradient was accumulated");
  const double iters = static_cast<double>(state.iterations());
  state.counters["samples_per_s"] = benchmark::Counter(static_cast<double>(b) * iters, benchmark::Counter::kIsRate);
  state.counters["us_per_micro_batch"] = iters > 0 ? total_s * 1e6 / iters : 0.0;
  state.counters["micro_batch"] = static_cast<double>(b);
  state.counters["recompute_segments"] = static_cast<double>(record.recompute_segments);
  state.counters["activation_bytes_per_micro_batch"] = bytes_counter(record.activation_bytes);
  state.counters["activation_bytes_stored"] = bytes_counter(record.activation_bytes + record.recompute_avoided_bytes);
  state.counters["recomputed_bytes"] = bytes_counter(record.recomputed_bytes);
  state.counters["recompute_ms"] = record.recompute_ms;
  state.counters["tracked_backward_ms"] = record.backward_ms;
  state.counters["peak_bytes"] = bytes_counter(record.peak_bytes);
  state.counters["peak_bytes_excl_data"] = bytes_counter(record.peak_bytes - data_bytes);
}

// ---- registration --------------------------------------------------------------------------------

void register_device(Device device) {
  const std::string dev = device.is_cpu() ? "cpu" : "cuda";
  for (int64_t b : {64, 256})
    for (const Variant& v : variants()) {
      auto* bm = add(dev + "/cnn_micro_batch/" + v.name + "/" + std::to_string(b), cnn_micro_batch, device, v, b);
      bm->UseManualTime()->Unit(benchmark::kMillisecond);
      if (device.is_cpu()) bm->MeasureProcessCPUTime();  // OpenBLAS's threads included
    }
}

}  // namespace

int main(int argc, char** argv) {
  return run_benchmarks(argc, argv, "bench_recompute", "CNN (cumulus/models/cnn.h), f32, Reduction::Sum",
                        register_device);
}
