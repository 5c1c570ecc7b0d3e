// CapturedTraining: an Accumulator's micro-batches and optimizer steps run as CUDA graphs, one
// host call each instead of one per kernel. See Note [Captured training] in
// engine/optim/captured_training.cpp.
//
//   optim::CapturedTraining run(acc, /*use_graphs=*/true, &tracker);   // tracker optional
//   loader.seek(0);
//   for each micro-batch:
//     run.micro_batch(samples, [&] { data::Batch b = loader.next();
//                                    return ops::cross_entropy(model(b.x), b.y, ops::Reduction::Sum); });
//     run.step_if_ready();
//
// The closure must queue the same work every time for a given sample count: its inputs come from
// device-side state (DataLoader::next), never from host values that change between calls. On the
// CPU, or with use_graphs false, everything runs eagerly through the same calls.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "cumulus/memory/tracker.h"
#include "cumulus/optim/accumulator.h"

namespace cumulus::optim {

class CapturedTraining {
 public:
  CapturedTraining(Accumulator& accumulator, bool use_graphs, MemoryTracker* tracker = nullptr);
  ~CapturedTraining();
  CapturedTraining(const CapturedTraining&) = delete;
  CapturedTraining& operator=(const CapturedTraining&) = delete;

  // Forward (the closure returns the loss summed over `samples` samples), backward into the
  // gradient buffers, and the bookkeeping of Accumulator::backward.
  void micro_batch(int64_t samples, const std::function<Tensor()>& forward_loss);
  // Accumulator::step_if_ready, with the device part replayed as a graph.
  bool step_if_ready();
  bool flush();

  bool graphs_enabled() const { return use_graphs_; }
  struct Stats {
    int64_t eager_micro_batches = 0, replayed_micro_batches = 0;
    int64_t eager_steps = 0, replayed_steps = 0;
    int64_t captures = 0;
    int64_t kernels_per_micro_batch = 0;  // in the last micro-batch graph captured
    int64_t kernels_per_step = 0;
  };
  const Stats& stats() const { return stats_; }
  // Frees every graph (their memory returns to the general cache). Later calls capture afresh.
  void reset();

 private:
  struct Captured;
  bool step(bool only_if_ready);
  std::vector<bool> stale_pattern() const;
  std::vector<bool> frozen_pattern() const;

  Accumulator& acc_;
  bool use_graphs_;
  MemoryTracker* tracker_;
  // Micro-batch graphs by (samples, which gradient slots are stale, which parameters are frozen):
  // the sinks' modes (overwrite or accumulate) and the gradients computed at all are part of the
  // captured work. Seen once: eager; twice: captured, then replayed.
  using MicroBatchKey = std::tuple<int64_t, std::vector<bool>, std::vector<bool>>;
  std::map<MicroBatchKey, std::unique_ptr<Captured>> micro_batches_;
  std::unique_ptr<Captured> step_;
  Stats stats_;
};

}  // namespace cumulus::optim
