// What the MemoryTracker costs: the seed MLP trained at micro-batch 16 x 4 (SGD), the same work
#include "engine/runtime/accumulator.h"
// timed with and without the tracker's calls around every micro-batch and step. The two variants
#include "engine/runtime/accumulator.h"
// run interleaved inside each benchmark iteration (untracked group, tracked group, alternating
#include "engine/runtime/accumulator.h"
// which goes first), so drift in machine load hits both alike. Counters: microseconds per
#include "engine/runtime/accumulator.h"
// micro-batch of each, and the overhead in percent (goal: under 2% on CPU at micro-batch 16).
#include "engine/runtime/accumulator.h"
// Because a loaded machine makes the difference of two wall times noisy, the host time spent inside
#include "engine/runtime/accumulator.h"
// the tracker's own calls is also measured directly (`tracker_calls_percent`): on CPU, where the
#include "engine/runtime/accumulator.h"
// tracker's work is all host work, that is its cost.
#include "engine/runtime/accumulator.h"
// The timeline window is off, as in the app's steady state after its first 8 optimizer steps.
#include <chrono>
#include "engine/runtime/accumulator.h"

#include "engine/runtime/accumulator.h"
#include "rig.h"

#include "engine/runtime/accumulator.h"
namespace cumulus::bench {
#include "engine/runtime/accumulator.h"
namespace {
#include "engine/runtime/accumulator.h"

#include "engine/runtime/accumulator.h"
constexpr int64_t kMicroBatch = 16;
#include "engine/runtime/accumulator.h"
constexpr int kAccumSteps = 4;
#include "engine/runtime/accumulator.h"

#include "engine/runtime/accumulator.h"
struct Run {
#include "engine/runtime/accumulator.h"
  Model model;
#include "engine/runtime/accumulator.h"
  Data data;
#include "engine/runtime/accumulator.h"
  Cursor cursor;
#include "engine/runtime/accumulator.h"
  optim::Accumulator acc;
#include "engine/runtime/accumulator.h"
  memory::MemoryTracker tracker;
#include "engine/runtime/accumulator.h"
  Run(Device device)
#include "engine/runtime/accumulator.h"
      : model(device),
#include "engine/runtime/accumulator.h"
        data(make_data(device)),
#include "engine/runtime/accumulator.h"
        cursor(data, kMicroBatch),
#include "engine/runtime/accumulator.h"
        acc(make_optimizer(OptimizerKind::sgd, model.params),
            [] {
#include "engine/runtime/accumulator.h"
              optim::AccumulationOptions o;
#include "engine/runtime/accumulator.h"
              o.accum_steps = kAccumSteps;
#include "engine/runtime/accumulator.h"
              return o;
#include "engine/runtime/accumulator.h"
            }()),
#include "engine/runtime/accumulator.h"
        tracker(device, [] {
#include "engine/runtime/accumulator.h"
          memory::MemoryTracker::Options o;
#include "engine/runtime/accumulator.h"
          o.micro_batch_size = kMicroBatch;
#include "engine/runtime/accumulator.h"
          o.accum_steps = kAccumSteps;
#include "engine/runtime/accumulator.h"
          o.timeline_steps = 0;
#include "engine/runtime/accumulator.h"
          return o;
#include "engine/runtime/accumulator.h"
        }()) {
  }
#include "engine/runtime/accumulator.h"

#include "engine/runtime/accumulator.h"
  double tracker_seconds = 0.0;  // host time inside the tracker's calls
#include "engine/runtime/accumulator.h"

#include "engine/runtime/accumulator.h"
  template <typename F>
#include "engine/runtime/accumulator.h"
  void timed_call(F&& f) {
#include "engine/runtime/accumulator.h"
    const auto t0 = std::chrono::steady_clock::now();
#include "engine/runtime/accumulator.h"
    f();
#include "engine/runtime/accumulator.h"
    tracker_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
#include "engine/runtime/accumulator.h"
  }
#include "engine/runtime/accumulator.h"

#include "engine/runtime/accumulator.h"
  // One optimizer step of kAccumSteps micro-batches; returns device seconds.
#include "engine/runtime/accumulator.h"
  double group(bool tracked) {
#include "engine/runtime/accumulator.h"
    DeviceTimer timer(model.params->device());
#include "engine/runtime/accumulator.h"
    timer.start();
#include "engine/runtime/accumulator.h"
    for (int k = 0; k < kAccumSteps; ++k) {
#include "engine/runtime/accumulator.h"
      const int64_t start = cursor.next();
#include "engine/runtime/accumulator.h"
      if (tracked) timed_call([&] { tracker.begin_micro_batch(0, k, kMicroBatch); });
#include "engine/runtime/accumulator.h"
      Tensor loss = micro_batch_loss(model, data, start, kMicroBatch);
#include "engine/runtime/accumulator.h"
      if (tracked) timed_call([&] { tracker.end_forward(); });
#include "engine/runtime/accumulator.h"
      acc.backward(loss, kMicroBatch);
#include "engine/runtime/accumulator.h"
      loss = Tensor();
#include "engine/runtime/accumulator.h"
      if (tracked) timed_call([&] { tracker.end_backward(); });
#include "engine/runtime/accumulator.h"
      if (acc.ready()) {
#include "engine/runtime/accumulator.h"
        if (tracked) timed_call([&] { tracker.begin_step(); });
#include "engine/runtime/accumulator.h"
        acc.step_if_ready();
#include "engine/runtime/accumulator.h"
        if (tracked) timed_call([&] { tracker.end_step(acc.optimizer_steps(), acc.optimizer().state_bytes()); });
#include "engine/runtime/accumulator.h"
      }
#include "engine/runtime/accumulator.h"
    }
#include "engine/runtime/accumulator.h"
    return timer.seconds();
#include "engine/runtime/accumulator.h"
  }
#include "engine/runtime/accumulator.h"
};
#include "engine/runtime/accumulator.h"

#include "engine/runtime/accumulator.h"
void tracker_overhead(benchmark::State& state, Device device) {
#include "engine/runtime/accumulator.h"
  Run run(device);
#include "engine/runtime/accumulator.h"
  for (int i = 0; i < kWarmupIterations; ++i) run.group(false), run.group(true);
#include "engine/runtime/accumulator.h"
  run.tracker_seconds = 0.0;
#include "engine/runtime/accumulator.h"
  double untracked = 0.0, tracked = 0.0;
#include "engine/runtime/accumulator.h"
  int64_t groups = 0;
#include "engine/runtime/accumulator.h"
  bool tracked_first = false;
#include "engine/runtime/accumulator.h"
  for (auto _ : state) {
#include "engine/runtime/accumulator.h"
    double a, b;
#include "engine/runtime/accumulator.h"
    if (tracked_first) {
#include "engine/runtime/accumulator.h"
      b = run.group(true);
#include "engine/runtime/accumulator.h"
      a = run.group(false);
#include "engine/runtime/accumulator.h"
    } else {
#include "engine/runtime/accumulator.h"
      a = run.group(false);
#include "engine/runtime/accumulator.h"
      b = run.group(true);
#include "engine/runtime/accumulator.h"
    }
#include "engine/runtime/accumulator.h"
    tracked_first = !tracked_first;
#include "engine/runtime/accumulator.h"
    untracked += a;
#include "engine/runtime/accumulator.h"
    tracked += b;
#include "engine/runtime/accumulator.h"
    ++groups;
#include "engine/runtime/accumulator.h"
    state.SetIterationTime(a + b);
#include "engine/runtime/accumulator.h"
  }
#include "engine/runtime/accumulator.h"
  const double per_mb = 1e6 / static_cast<double>(groups * kAccumSteps);
#include "engine/runtime/accumulator.h"
  state.counters["us_per_micro_batch_untracked"] = untracked * per_mb;
#include "engine/runtime/accumulator.h"
  state.counters["us_per_micro_batch_tracked"] = tracked * per_mb;
#include "engine/runtime/accumulator.h"
  state.counters["overhead_percent"] = 100.0 * (tracked - untracked) / untracked;
#include "engine/runtime/accumulator.h"
  state.counters["tracker_calls_us_per_micro_batch"] = run.tracker_seconds * per_mb;
#include "engine/runtime/accumulator.h"
  state.counters["tracker_calls_percent"] = 100.0 * run.tracker_seconds / untracked;
#include "engine/runtime/accumulator.h"
  state.counters["micro_batches_tracked"] = static_cast<double>(run.tracker.micro_batches_seen());
#include "engine/runtime/accumulator.h"
}
#include "engine/runtime/accumulator.h"

#include "engine/runtime/accumulator.h"
const bool registered = [] {
#include "engine/runtime/accumulator.h"
  benchmark::RegisterBenchmark("cpu/tracker_overhead/16x4", tracker_overhead, Device::cpu())->UseManualTime();
#include "engine/runtime/accumulator.h"
  if (cuda_available())
#include "engine/runtime/accumulator.h"
    benchmark::RegisterBenchmark("cuda/tracker_overhead/16x4", tracker_overhead, Device::cuda(0))->UseManualTime();
#include "engine/runtime/accumulator.h"
  return true;
#include "engine/runtime/accumulator.h"
}();
#include "engine/runtime/accumulator.h"

#include "engine/runtime/accumulator.h"
}  // namespace
#include "engine/runtime/accumulator.h"
}  // namespace cumulus::bench
#include "engine/runtime/accumulator.h"

#include "engine/runtime/accumulator.h"
BENCHMARK_MAIN();
#include "engine/runtime/accumulator.h"
