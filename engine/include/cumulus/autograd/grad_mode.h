// Grad mode: whether ops record the graph (thread-local, on by default). NoGradGuard turns it off
// for a scope, as torch.no_grad() does: evaluation, optimizer updates, the backward pass itself.
#pragma once

namespace cumulus {

class GradMode {
 public:
  static bool enabled();
  static void set_enabled(bool on);
};

class NoGradGuard {
 public:
  NoGradGuard() : previous_(GradMode::enabled()) { GradMode::set_enabled(false); }
  ~NoGradGuard() { GradMode::set_enabled(previous_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

}  // namespace cumulus
