// Where the time goes, op by op: each op's self time (its scope's time less its nested ops'),
// summed by op label over the stretches an OpProfileScope is open on a thread. Every op's forward
// and every autograd node's backward opens an OpScope (memory/category.h), and the Trainer's step
// opens one per part, so the profile names what a step does without any tagging by the user:
//
//   OpProfile profile(device);
//   for (...) {
//     OpProfileScope timed(profile);  // only the steps to profile
//     trainer.micro_batch(units, loss_fn);
//     trainer.step_if_ready();
//   }
//   std::puts(profile.table(20, steps).c_str());
//
// See Note [Op time profile] in engine/core/op_profile.cpp.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cumulus/core/device.h"

namespace cumulus {

// One op label's share of a profile.
struct OpTime {
  std::string op;     // "linear", "linear backward", or kBetweenOps
  int64_t calls = 0;  // how many times its scope opened (0 for kBetweenOps)
  double ms = 0.0;    // self time: nested ops' time is theirs
};

class OpProfile {
 public:
  // The time on this thread outside every op: the autograd walk, the Trainer's bookkeeping, the
  // caller's own code between ops.
  static constexpr const char* kBetweenOps = "(between ops)";

  explicit OpProfile(Device device);
  ~OpProfile();
  OpProfile(const OpProfile&) = delete;
  OpProfile& operator=(const OpProfile&) = delete;

  const Device& device() const;
  // Each label's time, the largest first (kBetweenOps among them, when there was any). On CUDA
  // this waits for the device to pass the last point taken.
  std::vector<OpTime> rows() const;
  // The stretches' time: the rows' sum.
  double total_ms() const;
  // How many OpProfileScopes have closed on it.
  int64_t stretches() const;
  // The rows as a table: the largest `max_rows`, the rest summed in one line; with `per` > 0 also
  // each row's milliseconds per `per_name` (e.g. per step over `per` steps).
  std::string table(int max_rows = 20, int64_t per = 0, const std::string& per_name = "step") const;
  // {"device", "total_ms", "stretches", "per", "per_name", "ops": [{"op", "calls", "ms"}...]}.
  std::string json(int64_t per = 0, const std::string& per_name = "step") const;

  struct State;

 private:
  friend class OpProfileScope;
  std::unique_ptr<State> state_;
};

// Times every op on the calling thread into `profile` while it lives (ops on other threads are
// not timed). One at a time on a thread; the profile must outlive it.
class OpProfileScope {
 public:
  explicit OpProfileScope(OpProfile& profile);
  ~OpProfileScope();
  OpProfileScope(const OpProfileScope&) = delete;
  OpProfileScope& operator=(const OpProfileScope&) = delete;

 private:
  OpProfile::State& state_;
};

}  // namespace cumulus
