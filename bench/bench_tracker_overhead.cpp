// What the MemoryTracker costs: the seed MLP trained at micro-batch 16 x 4 (SGD), the same work
// timed with and without the tracker's calls around every micro-batch and step. The two variants
// run interleaved inside each benchmark iteration (untracked group, tracked group, alternating
// which goes first), so drift in machine load hits both alike. Counters: microseconds per
// micro-batch of each, and the overhead in percent (goal: under 2% on CPU at micro-batch 16).
// Because a loaded machine makes the difference of two wall times noisy, the host time spent inside
// the tracker's own calls is also measured directly (`tracker_calls_percent`): on CPU, where the
// tracker's work is all host work, that is its cost.
// The timeline window is off, as in the app's steady state after its first 8 optimizer steps.
#include <chrono>

#include "rig.h"

namespace cumulus::bench {
namespace {

constexpr int64_t kMicroBatch = 16;
constexpr int kAccumSteps = 4;

struct Run {
  Model model;
  Data data;
  Cursor cursor;
  train::Trainer acc;
  memory::MemoryTracker tracker;
  Run(Device device)
      : model(device),
        data(make_data(device)),
        cursor(data, kMicroBatch),
        acc(make_optimizer(OptimizerKind::sgd, model.params),
            [] {
              train::TrainerOptions o;
              o.accum_steps = kAccumSteps;
              return o;
            }()),
        tracker(device, [] {
          memory::MemoryTracker::Options o;
          o.micro_batch_size = kMicroBatch;
          o.accum_steps = kAccumSteps;
          o.timeline_steps = 0;
          return o;
        }()) {
  }

  double tracker_seconds = 0.0;  // host time inside the tracker's calls

  template <typename F>
  void timed_call(F&& f) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    tracker_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

  // One optimizer step of kAccumSteps micro-batches; returns device seconds.
  double group(bool tracked) {
    DeviceTimer timer(model.params->device());
    timer.start();
    for (int k = 0; k < kAccumSteps; ++k) {
      const int64_t start = cursor.next();
      if (tracked) timed_call([&] { tracker.begin_micro_batch(0, k, kMicroBatch); });
      Tensor loss = micro_batch_loss(model, data, start, kMicroBatch);
      if (tracked) timed_call([&] { tracker.end_forward(); });
      acc.backward(loss, kMicroBatch);
      loss = Tensor();
      if (tracked) timed_call([&] { tracker.end_backward(); });
      if (acc.ready()) {
        if (tracked) timed_call([&] { tracker.begin_step(); });
        acc.step_if_ready();
        // The step's number as the Trainer's own records give it: a host read, so only the tracker is timed.
        const int64_t step = acc.position().attempted_steps;
        if (tracked) timed_call([&] { tracker.end_step(step, acc.optimizer().state_bytes()); });
      }
    }
    return timer.seconds();
  }
};

void tracker_overhead(benchmark::State& state, Device device) {
  Run run(device);
  for (int i = 0; i < kWarmupIterations; ++i) run.group(false), run.group(true);
  run.tracker_seconds = 0.0;
  double untracked = 0.0, tracked = 0.0;
  int64_t groups = 0;
  bool tracked_first = false;
  for (auto _ : state) {
    double a, b;
    if (tracked_first) {
      b = run.group(true);
      a = run.group(false);
    } else {
      a = run.group(false);
      b = run.group(true);
    }
    tracked_first = !tracked_first;
    untracked += a;
    tracked += b;
    ++groups;
    state.SetIterationTime(a + b);
  }
  const double per_mb = 1e6 / static_cast<double>(groups * kAccumSteps);
  state.counters["us_per_micro_batch_untracked"] = untracked * per_mb;
  state.counters["us_per_micro_batch_tracked"] = tracked * per_mb;
  state.counters["overhead_percent"] = 100.0 * (tracked - untracked) / untracked;
  state.counters["tracker_calls_us_per_micro_batch"] = run.tracker_seconds * per_mb;
  state.counters["tracker_calls_percent"] = 100.0 * run.tracker_seconds / untracked;
  state.counters["micro_batches_tracked"] = static_cast<double>(run.tracker.micro_batches_seen());
}

const bool registered = [] {
  benchmark::RegisterBenchmark("cpu/tracker_overhead/16x4", tracker_overhead, Device::cpu())->UseManualTime();
  if (cuda_available())
    benchmark::RegisterBenchmark("cuda/tracker_overhead/16x4", tracker_overhead, Device::cuda(0))->UseManualTime();
  return true;
}();

}  // namespace
}  // namespace cumulus::bench

BENCHMARK_MAIN();
