#include "training_loop.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>

#include "cumulus/core/error.h"
#include "cumulus/memory/allocator.h"
#include "cumulus/runtime/metrics_log.h"
#include "cumulus/runtime/progress.h"
#include "reports.h"
#include "run_control.h"
#include "training_setup.h"

using namespace cumulus;

namespace fmnist {
namespace {

// One epoch's counts as the loop goes, and its training results at its end.
struct Epoch {
  int index = 0;
  int64_t first = 0;  // the micro-batch this run starts it at (a resume)
  int64_t samples_this_run = 0;
  int64_t skipped_before = 0, buckets_in_backward_before = 0;
  dist::Communicator::Stats comm_before;
  std::chrono::steady_clock::time_point t0;
  int64_t peak = 0;
  double train_loss = 0.0, seconds = 0.0;
  bool scaling = false;
  float loss_scale = 1.0f;
};

MetricsLog open_metrics(const RunConfig& o, const TrainingState& state) {
  try {
    return MetricsLog(o.metrics_path, "epoch",
                      o.resume_path.empty() ? std::nullopt : std::optional<int64_t>(state.state.counters.epoch));
  } catch (const Error& e) {
    throw Error("--metrics " + std::string(e.what()));
  }
}

class TrainingLoop {
 public:
  explicit TrainingLoop(const TrainingParts& p)
      : p_(p),
        o_(p.o),
        trainer_(p.trainer),
        progress_(stderr, !p.o.quiet && g_root, p.o.epochs),
        resume_point_(p.trainer, p.state.state),
        metrics_(open_metrics(p.o, p.state)) {
    p.trainer.set_tracker(&p.tracker);
  }

  std::optional<int> run();

 private:
  Epoch begin_epoch(int epoch);
  std::optional<int> train_micro_batches(Epoch& e);
  void end_training_of(Epoch& e);
  void check_plan(const Epoch& e);
  std::optional<int> test_and_record(const Epoch& e);
  nlohmann::ordered_json metrics_line(const Epoch& e, const optim::Evaluation& r) const;
  void checkpoint_now(const char* why);
  int stop(const std::string& message, int code, const char* why);
  bool stop_asked() { return stop_requested_on_any_rank(p_.comm); }
  int stop_together(const std::string& where);

  const TrainingParts& p_;
  const RunConfig& o_;
  const optim::Trainer& trainer_;  // the counters
  TrainingProgress progress_;
  // The last group boundary: what a checkpoint written now restores. Between an epoch's last group
  // and its test pass, the epoch's end: a run interrupted in the test pass resumes with that pass.
  optim::ResumePoint resume_point_;
  MetricsLog metrics_;
};

void TrainingLoop::checkpoint_now(const char* why) {
  if (o_.checkpoint_path.empty()) return;
  try {
    save_checkpoint(o_.checkpoint_path, p_.model, p_.optimizer, resume_point_.state(), o_);
  } catch (const Error& e) {
    throw Error("--checkpoint: " + std::string(e.what()));
  }
  if (!o_.quiet) say("checkpoint (%s) written to %s\n", why, o_.checkpoint_path.c_str());
}

// Ends the run after an interrupt, an out-of-memory or a failed write: the checkpoint of the last
// group boundary and the reports are still written (each failure reported, none hiding another).
int TrainingLoop::stop(const std::string& message, int code, const char* why) {
  progress_.end_epoch();
  if (!message.empty()) std::fprintf(stderr, "fashion_mnist: %s\n", message.c_str());
  allocator_for(o_.device).set_memory_limit(0);  // room to report and save; a group in flight is dropped
  int status = code;
  for (auto& write : {std::function<void()>([&] { checkpoint_now(why); }),
                      std::function<void()>([&] { write_reports(o_, p_.tracker); })}) {
    try {
      write();
    } catch (const Error& e) {
      std::fprintf(stderr, "fashion_mnist: %s\n", e.what());
      status = status == 0 ? 1 : status;
    }
  }
  return status;
}

// A stop every rank makes at the same boundary: after rank 0 has written the checkpoint and the
// reports, the ranks meet and end together (no rank is aborted mid-write).
int TrainingLoop::stop_together(const std::string& where) {
  const std::string message = "interrupted (" + std::string(stop_signal_name(stop_signal())) + ") " + where;
  const int status = stop(g_root ? message : std::string(), exit_code_for_stop(stop_signal()), "interrupted");
  if (o_.world_size > 1) {
    p_.comm.barrier();
    g_agreed_exit = true;
  }
  return status;
}

Epoch TrainingLoop::begin_epoch(int epoch) {
  Epoch e;
  e.index = epoch;
  e.skipped_before = trainer_.skipped_steps();
  e.comm_before = p_.comm.stats();
  e.buckets_in_backward_before = trainer_.buckets_started_in_backward();
  e.t0 = std::chrono::steady_clock::now();
  return e;
}

// The epoch's micro-batches through Trainer::train_epoch, from e.first. A stop is honoured at a
// group boundary, after the group in flight has stepped: the checkpoint then holds exactly what the
// run has done, batch norm's running statistics included. With several ranks, at a boundary all of
// them agree on, so they stop together.
std::optional<int> TrainingLoop::train_micro_batches(Epoch& e) {
  optim::EpochOptions hooks;
  hooks.stop = [&](int64_t) { return stop_asked(); };
  hooks.on_step = [&](const optim::MicroBatchDone&) {
    e.peak = std::max(e.peak, allocator_for(o_.device).stats().allocated_peak);
  };
  hooks.on_micro_batch = [&](const optim::MicroBatchDone& d) {
    if (d.trained_here) e.peak = std::max(e.peak, p_.tracker.last_micro_batch().peak_bytes);
    fault_signal_point("micro_batch", e.index + 1, d.index);
    e.samples_this_run = d.units_done;
    if (progress_.due(d.index + 1)) progress_.update(d.index + 1, resume_point_.mean_loss(), e.samples_this_run);
  };
  const optim::EpochOptions epoch_options = resume_point_.begin_epoch(e.index, hooks);
  e.first = epoch_options.first;
  progress_.begin_epoch(e.index, p_.train_loader.num_batches(), e.first);
  const optim::EpochResult r = p_.trainer.train_epoch(
      p_.train_loader, e.index, [&](const data::Batch& b) { return training_loss(p_.model, b); }, epoch_options);
  if (r.finished) return std::nullopt;
  return stop_together("at epoch " + std::to_string(e.index + 1) + ", micro-batch " +
                       std::to_string(r.next_micro_batch));
}

// The epoch's training loss and time, and a word on skipped steps.
void TrainingLoop::end_training_of(Epoch& e) {
  progress_.end_epoch();
  // Reading the loss waits for the device, so the epoch's time includes its queued work.
  e.train_loss = resume_point_.mean_loss();
  e.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - e.t0).count();
  const int64_t skipped = trainer_.skipped_steps() - e.skipped_before;
  e.scaling = needs_loss_scaling(o_.precision);
  e.loss_scale = e.scaling ? trainer_.loss_scale() : 1.0f;
  // Under fp16 a skipped step is how the loss scale finds its level, not a fault; at its floor
  // (Note [Loss scaling]) the scale cannot help any more, and the user hears of it.
  const float min_scale = p_.trainer_options.loss_scaling.min_scale;
  const bool at_floor = e.scaling && e.loss_scale <= min_scale;
  if (g_root && e.scaling && skipped > 0 && std::isfinite(e.train_loss) && !at_floor && !o_.quiet)
    say("fp16: %lld optimizer step(s) skipped for gradients that overflowed in fp16; loss scale now %s\n",
        static_cast<long long>(skipped), loss_scale_text(e.loss_scale).c_str());
  else if (g_root && (skipped > 0 || !std::isfinite(e.train_loss))) {
    const std::string floor_note = at_floor && skipped > 0
                                       ? "; fp16's loss scale holds at its floor of " + loss_scale_text(min_scale) +
                                             ", so these gradients overflow unscaled"
                                       : "";
    std::fprintf(stderr,
                 "fashion_mnist: warning: epoch %d: %lld optimizer step(s) skipped for non-finite gradients, "
                 "training loss %g (a NaN or Inf in the data, the weights or the loss; try a lower --lr or "
                 "--clip-grad-norm%s)%s\n",
                 e.index + 1, static_cast<long long>(skipped), e.train_loss, e.scaling ? " or --precision bf16" : "",
                 floor_note.c_str());
  }
}

// The planner's prediction against the first full epoch this run trains (one resumed mid-epoch is
// not comparable): its training time and peak (Note [Predicting time] in engine/runtime/planner.cpp).
void TrainingLoop::check_plan(const Epoch& e) {
  const std::optional<PlanCheck>& check = p_.tracker.plan_check();
  if (!check || check->measured || e.first != 0) return;
  p_.tracker.measure_plan(e.index, e.seconds, e.peak);
  if (g_root && !o_.quiet) say("planner: %s\n", plan_check_line(*check).c_str());
}

nlohmann::ordered_json TrainingLoop::metrics_line(const Epoch& e, const optim::Evaluation& r) const {
  nlohmann::ordered_json line = {{"epoch", e.index + 1},
                                 {"train_loss", e.train_loss},
                                 {"test_loss", r.loss},
                                 {"test_accuracy", r.accuracy},
                                 {"samples_per_s", static_cast<double>(e.samples_this_run) / e.seconds},
                                 {"epoch_seconds", e.seconds},
                                 {"optimizer_steps", trainer_.optimizer_steps()},
                                 {"skipped_steps", trainer_.skipped_steps()},
                                 {"peak_bytes", e.peak},
                                 {"micro_batch_size", o_.batch_size},
                                 {"model", choice_name(o_.model)},
                                 {"accum_steps", trainer_.accum_steps() / o_.world_size},  // per rank, as --accum-steps
                                 {"lr", trainer_.last_lr()},
                                 {"precision", choice_name(o_.precision)},
                                 {"kernels", kernels_used(p_.model, o_, o_.batch_size)}};
  if (e.scaling) line["loss_scale"] = e.loss_scale;
  if (o_.world_size > 1) {
    const dist::Communicator::Stats now = p_.comm.stats();
    line["world_size"] = o_.world_size;
    line["gradient_reductions"] = now.gradient_reductions - e.comm_before.gradient_reductions;
    line["communication_seconds"] = now.communication_seconds - e.comm_before.communication_seconds;
    line["gradient_buckets"] = trainer_.gradient_buckets();
    line["buckets_started_in_backward"] = trainer_.buckets_started_in_backward() - e.buckets_in_backward_before;
  }
  if (p_.model.uses_batch_statistics())
    line["batch_norm_statistics_samples"] = o_.batch_size;  // per micro-batch, not per group
  if (!p_.state.overridden.empty()) line["overrides"] = p_.state.overridden;
  if (const std::optional<PlanCheck>& check = p_.tracker.plan_check()) {
    // The planner's prediction; epoch_seconds and peak_bytes measure it.
    line["predicted_epoch_seconds"] = check->predicted_epoch_seconds;
    line["predicted_peak_bytes"] = check->predicted_peak_bytes;
  }
  return line;
}

// The test pass, the epoch's results and --metrics line, and the epoch's checkpoint.
std::optional<int> TrainingLoop::test_and_record(const Epoch& e) {
  optim::Evaluation r;
  try {
    fault_signal_point("test_pass", e.index + 1);
    if (g_root) r = test_pass(p_.model, p_.test_loader);  // the other ranks hold the same weights
  } catch (const Interrupted&) {
    return stop("interrupted (" + std::string(stop_signal_name(stop_signal())) + ") in the test pass of epoch " +
                    std::to_string(e.index + 1) + "; a resumed run starts with that test pass",
                exit_code_for_stop(stop_signal()), "interrupted");
  }
  say("Epoch %d\n-------------------\n", e.index + 1);
  print_test_results(r);
  try {
    metrics_.append(metrics_line(e, r).dump());
  } catch (const Error& err) {
    throw Error("--metrics: " + std::string(err.what()));
  }
  resume_point_.end_epoch();
  checkpoint_now("epoch end");
  // After the epoch's checkpoint: nothing is lost, the next run starts the next epoch.
  if (stop_asked()) return stop_together("after epoch " + std::to_string(e.index + 1));
  return std::nullopt;
}

std::optional<int> TrainingLoop::run() {
  try {
    for (int epoch = resume_point_.epoch(); epoch < o_.epochs; ++epoch) {
      Epoch e = begin_epoch(epoch);
      if (const std::optional<int> stopped = train_micro_batches(e)) return stopped;
      end_training_of(e);
      check_plan(e);
      if (const std::optional<int> stopped = test_and_record(e)) return stopped;
    }
  } catch (const OutOfMemory& e) {
    const int status = stop(
        std::string(e.what()) +
            "\nfashion_mnist: lower --batch-size, or let the planner fit it: --effective-batch N --memory-budget SIZE",
        1, "out of memory; resumes at the last completed step");
    if (!o_.quiet) {
      print_memory_table(p_.tracker, stdout);  // with the failing request and the largest live ops
      say("");
    }
    return status;
  } catch (const Error& e) {
    return stop(e.what(), 1, "after an error; resumes at the last completed step");
  }
  return std::nullopt;
}

}  // namespace

std::optional<int> train(const TrainingParts& parts) { return TrainingLoop(parts).run(); }

}  // namespace fmnist
