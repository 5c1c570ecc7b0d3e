#include "training.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>

#include "common/metrics_log.h"
#include "common/progress.h"
#include "cumulus/core/error.h"
#include "cumulus/core/op_profile.h"
#include "cumulus/core/threads.h"
#include "cumulus/io/file.h"
#include "cumulus/io/run_files.h"
#include "cumulus/memory/allocator.h"
#include "cumulus/memory/report.h"
#include "cumulus/ops/fused_mlp.h"
#include "cumulus/plan/planner.h"
#include "run_control.h"

using namespace cumulus;

namespace fmnist {
namespace {

void print_banner(const RunConfig& o, const nn::Model& model, const RunDescription& d, const TrainingState& state) {
  const int n0 = o.accum_steps_at(state.state.counters.epoch);
  const std::string ranks = o.world_size > 1 ? " x " + std::to_string(o.world_size) + " ranks" : std::string();
  say("device: %s | model: %s | data: %s (%lld train, %lld test) | micro-batch %lld x %d steps%s = effective batch "
      "%lld | %s lr %g%s\n",
      o.device.describe().c_str(),
      o.model == ModelKind::cnn ? "cnn (batch norm: statistics per micro-batch)" : "mlp 784-512-512-10",
      d.data_dir.c_str(), static_cast<long long>(d.train_samples), static_cast<long long>(d.test_samples),
      static_cast<long long>(o.batch_size), n0, ranks.c_str(), static_cast<long long>(o.batch_size * n0 * o.world_size),
      o.optimizer == OptimizerKind::adamw ? "AdamW" : "SGD", static_cast<double>(o.lr),
      o.lr_schedule == LrScheduleKind::constant
          ? ""
          : (" (" + std::string(choice_name(o.lr_schedule)) + " schedule)").c_str());
  if (o.recompute == RecomputeChoice::on)
    say("recompute: on (activations of %s are recomputed in backward)\n",
        o.recompute_segments == 0
            ? "the model's segments"
            : ("segments " + plan::recompute_text(o.recompute_segments, model.recompute_segment_names())).c_str());
  if (o.model == ModelKind::mlp) {
    const char* fused = o.device.is_cuda()
                            ? "fused (mlp_cross_entropy: a micro-batch's forward, loss and backward in 3 + 3 "
                              "launches of our own; not yet measured on a GPU)"
                            : "fused (mlp_cross_entropy: one op for the micro-batch; on the CPU the generic "
                              "kernels' arithmetic)";
    say("kernels: %s\n", kernels_used(model, o, o.batch_size) == "fused" ? fused : "generic (one op per layer)");
  }
  if (!o.device.is_cuda())  // the step's speed depends on these (docs/fashion_mnist.md, --threads)
    say("cpu: %d thread%s, %s kernels, OpenBLAS %s kernels\n", cpu_threads(), cpu_threads() == 1 ? "" : "s",
        cpu_capability(), blas_core());
  if (o.precision != Precision::fp32)
    say("precision: %s activations, gradients of activations and GEMM weight copies; f32 weights, gradient "
        "buffers, optimizer state and loss%s\n",
        choice_name(o.precision),
        (needs_loss_scaling(o.precision) ? "; dynamic loss scale (now " + loss_scale_text(d.loss_scale) + ")"
                                         : std::string())
            .c_str());
  if (d.host_resident_data)
    say("data: on the host; micro-batches copied to the device one ahead (pinned staging, copy stream)\n");
  if (o.world_size > 1)
    say("data parallel: %d ranks (%s), this is rank 0; one all-reduce of the gradient per optimizer step, in %s "
        "buckets overlapping the last backward of each group\n",
        o.world_size, d.backend.c_str(), "1 MiB");
  if (!o.resume_path.empty())
    say("resumed from %s at epoch %d, micro-batch %lld\n", o.resume_path.c_str(), state.state.counters.epoch + 1,
        static_cast<long long>(state.state.counters.micro_batch_index));
}

// --memory-report, --trace and --memory-plot, each said once written.
void write_reports(const RunConfig& o, memory::MemoryTracker& tracker) {
  memory::MemoryReportFiles files;
  files.report.path = o.memory_report_path;
  files.trace.path = o.trace_path;
  files.plot.path = o.memory_plot_path;
  memory::write_memory_reports(tracker, files, [&o](const char* what, const std::string& path) {
    if (!o.quiet) say("%s written to %s\n", what, path.c_str());
  });
}

app::MetricsLog open_metrics(const RunConfig& o, const TrainingState& state) {
  try {
    return app::MetricsLog(o.metrics_path, "epoch",
                           o.resume_path.empty() ? std::nullopt : std::optional<int64_t>(state.state.counters.epoch));
  } catch (const Error& e) {
    throw Error("--metrics " + std::string(e.what()));
  }
}

// What one epoch's training measured, for its warnings, the planner's check and its --metrics line.
struct EpochSummary {
  int epoch = 0;                  // from 0
  int64_t first_micro_batch = 0;  // where this run started the epoch: > 0 when it resumed inside it
  double train_loss = 0.0;        // the epoch's mean per unit, a resumed epoch's earlier part included
  double seconds = 0.0;           // this run's training time of the epoch (its queued work included)
  int64_t units_trained = 0;      // the units this run trained in the epoch (every rank's)
  // The largest allocated bytes of this rank's micro-batches (the tracker's records) and steps.
  int64_t peak_bytes = 0;
  // Over this run's part of the epoch: steps skipped for a non-finite gradient; data parallel, the
  // gradient all-reduces, their time and the buckets that started while a backward ran.
  int64_t skipped_steps = 0;
  int64_t gradient_reductions = 0;
  double communication_seconds = 0.0;
  int64_t buckets_started_in_backward = 0;
};

// The epochs from the run's start to --epochs, each trained by Trainer::train_epoch from the last
// group boundary, then its test pass, its --metrics line and its checkpoint.
class TrainingLoop {
 public:
  explicit TrainingLoop(const TrainingParts& p)
      : p_(p),
        o_(p.o),
        trainer_(p.trainer),
        progress_(stderr, !p.o.quiet && g_root, p.o.epochs),
        loss_([this](const data::Batch& b) { return training_loss(p_.model, b); }),
        point_(p.trainer, p.state.state),
        metrics_(open_metrics(p.o, p.state)),
        profile_(p.optimizer.parameters().device()) {
    p.trainer.set_tracker(&p.tracker);
  }

  std::optional<int> run();

 private:
  bool train_epoch(int epoch, EpochSummary& summary);
  train::EpochOptions epoch_hooks(EpochSummary& summary);
  EpochSummary running_totals() const;
  bool stop_asked() const { return app::stop_requested_on_any_rank(p_.comm); }
  void measure_plan(const EpochSummary& e);
  void end_epoch(const EpochSummary& e);
  void warn_of_skipped_steps(const EpochSummary& e);
  void check_plan(const EpochSummary& e);
  nlohmann::ordered_json metrics_line(const EpochSummary& e, const train::Evaluation& r) const;
  void checkpoint_now(const train::CheckpointState& state, const char* why);
  // `together`: every rank stops at this boundary (a sharded state can be gathered for the checkpoint).
  int stop(const std::string& message, int code, const char* why, bool together = false);
  int stop_together(const std::string& where);
  // --op-profile: whether this epoch is profiled, and the table and JSON of those so far.
  bool profiled(int epoch) const;
  void report_profile();

  const TrainingParts& p_;
  const RunConfig& o_;
  train::Trainer& trainer_;
  app::TrainingProgress progress_;
  int epoch_ = 0;                 // the epoch running, from 0
  int64_t next_micro_batch_ = 0;  // where a stop inside the epoch left it
  const train::BatchLoss loss_;
  // The last group boundary: what a checkpoint written now restores. Between an epoch's last group
  // and its test pass, the epoch's end: a run interrupted in the test pass resumes with that pass.
  train::ResumePoint point_;
  app::MetricsLog metrics_;
  OpProfile profile_;
  int first_epoch_ = 0;  // this run's
  int profiled_epochs_ = 0;
};

// A stop is honoured at a group boundary, after the group in flight has stepped: the checkpoint then
// holds exactly what the run has done, batch norm's running statistics included. With several
// ranks, at a boundary all of them agree on (stop_asked is a collective), so they stop together.
train::EpochOptions TrainingLoop::epoch_hooks(EpochSummary& summary) {
  train::EpochOptions hooks;
  hooks.stop = [this](int64_t) { return stop_asked(); };
  CachingAllocator& allocator = allocator_for(p_.optimizer.parameters().device());
  hooks.on_step = [&summary, &allocator](const train::MicroBatchDone&) {
    summary.peak_bytes = std::max(summary.peak_bytes, allocator.stats().allocated_peak);
  };
  hooks.on_micro_batch = [this, &summary](const train::MicroBatchDone& done) {
    // The tracker's record: a step after the micro-batch has reset the allocator's peak since.
    if (done.trained_here) summary.peak_bytes = std::max(summary.peak_bytes, p_.tracker.last_micro_batch().peak_bytes);
    app::fault_signal_point("micro_batch", epoch_ + 1, done.index);
    summary.units_trained = done.units_done;
    if (progress_.due(done.index + 1)) progress_.update(done.index + 1, point_.mean_loss(), summary.units_trained);
  };
  return hooks;
}

// One epoch's training from the resume point; false when a stop ended it at a group boundary.
bool TrainingLoop::train_epoch(int epoch, EpochSummary& summary) {
  allocator_for(p_.optimizer.parameters().device()).reset_peak();
  const auto t0 = std::chrono::steady_clock::now();
  const train::EpochOptions options = point_.begin_epoch(epoch, epoch_hooks(summary));
  summary.first_micro_batch = options.first;
  progress_.begin_epoch(epoch, p_.train_loader.num_batches(), options.first);
  std::optional<OpProfileScope> timed;
  if (profiled(epoch)) timed.emplace(profile_);
  const train::EpochResult trained = trainer_.train_epoch(p_.train_loader, epoch, loss_, options);
  timed.reset();
  profiled_epochs_ += profiled(epoch) && trained.finished ? 1 : 0;
  progress_.end_epoch();
  if (!trained.finished) {
    next_micro_batch_ = trained.next_micro_batch;
    return false;
  }
  // Reading the loss waits for the device, so the epoch's time includes its queued work.
  summary.train_loss = point_.mean_loss();
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return true;
}

// The run's totals that EpochSummary reports per epoch (reading them waits for the device).
EpochSummary TrainingLoop::running_totals() const {
  EpochSummary now;
  const train::TrainingCounters counters = trainer_.counters();
  now.skipped_steps = counters.skipped_steps;
  if (dist::Communicator* comm = p_.trainer_options.communicator.get()) {
    const dist::Communicator::Stats stats = comm->stats();
    now.gradient_reductions = stats.gradient_reductions;
    now.communication_seconds = stats.communication_seconds;
    now.buckets_started_in_backward = counters.buckets_started_in_backward;
  }
  return now;
}

// The planner's prediction against the first full epoch this run trains (one resumed mid-epoch is
// not comparable: Note [Predicting time] in engine/plan/planner.cpp).
void TrainingLoop::measure_plan(const EpochSummary& e) {
  memory::MemoryTracker& tracker = p_.tracker;
  if (!tracker.plan_check() || tracker.plan_check()->measured || e.first_micro_batch != 0) return;
  tracker.measure_plan(e.epoch, e.seconds, e.peak_bytes);
}

void TrainingLoop::checkpoint_now(const train::CheckpointState& state, const char* why) {
  if (o_.checkpoint_path.empty() && !o_.gathers_checkpoint) return;
  // --zero 1: every rank's shard of the optimizer state goes to rank 0, which writes the whole.
  const std::vector<std::pair<std::string, Tensor>> optimizer_state = trainer_.optimizer_state();
  if (o_.checkpoint_path.empty()) return;
  try {
    train::save_training_checkpoint(o_.checkpoint_path, p_.model, optimizer_state, state,
                                    settings_table().recorded({o_, ""}));
  } catch (const Error& e) {
    throw Error("--checkpoint: " + std::string(e.what()));
  }
  if (!o_.quiet) say("checkpoint (%s) written to %s\n", why, o_.checkpoint_path.c_str());
}

// Ends the run after an interrupt, an out-of-memory or a failed write: the checkpoint of the last
// group boundary and the reports are still written (each failure reported, none hiding another).
int TrainingLoop::stop(const std::string& message, int code, const char* why, bool together) {
  progress_.end_epoch();
  if (!message.empty()) std::fprintf(stderr, "fashion_mnist: %s\n", message.c_str());
  allocator_for(o_.device).set_memory_limit(0);  // room to report and save; a group in flight is dropped
  int status = code;
  auto checkpoint = [&] {
    if (!o_.gathers_checkpoint || together) return checkpoint_now(point_.state(), why);
    if (!o_.checkpoint_path.empty())
      std::fprintf(stderr,
                   "fashion_mnist: checkpoint not written: one rank stopped alone, so the optimizer's shards "
                   "(--zero 1) cannot be gathered; %s keeps the last one\n",
                   o_.checkpoint_path.c_str());
  };
  for (auto& write : {std::function<void()>(checkpoint), std::function<void()>([&] { write_reports(o_, p_.tracker); }),
                      std::function<void()>([&] { report_profile(); })}) {
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
  const std::string message = "interrupted (" + std::string(app::stop_signal_name(app::stop_signal())) + ") " + where;
  const int status =
      stop(g_root ? message : std::string(), app::exit_code_for_stop(app::stop_signal()), "interrupted", true);
  if (o_.world_size > 1) {
    p_.comm.barrier();
    g_agreed_exit = true;
  }
  return status;
}

// A word on the epoch's skipped steps.
void TrainingLoop::warn_of_skipped_steps(const EpochSummary& e) {
  const int64_t skipped = e.skipped_steps;
  const bool scaling = needs_loss_scaling(o_.precision);
  const float loss_scale = scaling ? trainer_.counters().loss_scale : 1.0f;
  // Under fp16 a skipped step is how the loss scale finds its level, not a fault; at its floor
  // (Note [Loss scaling]) the scale cannot help any more, and the user hears of it.
  const float min_scale = p_.trainer_options.loss_scaling.min_scale;
  const bool at_floor = scaling && loss_scale <= min_scale;
  if (g_root && scaling && skipped > 0 && std::isfinite(e.train_loss) && !at_floor && !o_.quiet)
    say("fp16: %lld optimizer step(s) skipped for gradients that overflowed in fp16; loss scale now %s\n",
        static_cast<long long>(skipped), loss_scale_text(loss_scale).c_str());
  else if (g_root && (skipped > 0 || !std::isfinite(e.train_loss))) {
    const std::string floor_note = at_floor && skipped > 0
                                       ? "; fp16's loss scale holds at its floor of " + loss_scale_text(min_scale) +
                                             ", so these gradients overflow unscaled"
                                       : "";
    std::fprintf(stderr,
                 "fashion_mnist: warning: epoch %d: %lld optimizer step(s) skipped for non-finite gradients, "
                 "training loss %g (a NaN or Inf in the data, the weights or the loss; try a lower --lr or "
                 "--clip-grad-norm%s)%s\n",
                 e.epoch + 1, static_cast<long long>(skipped), e.train_loss, scaling ? " or --precision bf16" : "",
                 floor_note.c_str());
  }
}

// The planner's prediction against this epoch, where measure_plan measured it (the first full epoch).
void TrainingLoop::check_plan(const EpochSummary& e) {
  const std::optional<plan::PlanCheck>& check = p_.tracker.plan_check();
  if (check && check->measured && check->epoch == e.epoch && g_root && !o_.quiet)
    say("planner: %s\n", plan::plan_check_line(*check).c_str());
}

nlohmann::ordered_json TrainingLoop::metrics_line(const EpochSummary& e, const train::Evaluation& r) const {
  const train::TrainingCounters c = trainer_.counters();
  nlohmann::ordered_json line = {{"epoch", e.epoch + 1},
                                 {"train_loss", e.train_loss},
                                 {"test_loss", r.loss},
                                 {"test_accuracy", r.accuracy},
                                 {"samples_per_s", static_cast<double>(e.units_trained) / e.seconds},
                                 {"epoch_seconds", e.seconds},
                                 {"optimizer_steps", c.optimizer_steps},
                                 {"skipped_steps", c.skipped_steps},
                                 {"peak_bytes", e.peak_bytes},
                                 {"micro_batch_size", o_.batch_size},
                                 {"model", choice_name(o_.model)},
                                 {"accum_steps", c.accum_steps / o_.world_size},  // per rank, as --accum-steps
                                 {"lr", c.last_lr},
                                 {"precision", choice_name(o_.precision)},
                                 {"kernels", kernels_used(p_.model, o_, o_.batch_size)}};
  if (needs_loss_scaling(o_.precision)) line["loss_scale"] = c.loss_scale;
  if (o_.world_size > 1) {
    line["world_size"] = o_.world_size;
    line["gradient_reductions"] = e.gradient_reductions;
    line["communication_seconds"] = e.communication_seconds;
    line["gradient_buckets"] = c.gradient_buckets;
    line["buckets_started_in_backward"] = e.buckets_started_in_backward;
  }
  if (p_.model.uses_batch_statistics())
    line["batch_norm_statistics_samples"] = o_.batch_size;  // per micro-batch, not per group
  if (!p_.state.overridden.empty()) line["overrides"] = p_.state.overridden;
  if (const std::optional<plan::PlanCheck>& check = p_.tracker.plan_check()) {
    // The planner's prediction; epoch_seconds and peak_bytes measure it.
    line["predicted_epoch_seconds"] = check->predicted_epoch_seconds;
    line["predicted_peak_bytes"] = check->predicted_peak_bytes;
  }
  return line;
}

// After the epoch's training: the warnings, the planner's check, the test pass (an interrupt there
// throws Interrupted), the epoch's results and its --metrics line.
void TrainingLoop::end_epoch(const EpochSummary& e) {
  warn_of_skipped_steps(e);
  check_plan(e);
  app::fault_signal_point("test_pass", e.epoch + 1);
  train::Evaluation r;
  if (g_root) r = test_pass(p_.model, p_.test_loader);  // the other ranks hold the same weights
  say("Epoch %d\n-------------------\n", e.epoch + 1);
  print_test_results(r);
  try {
    metrics_.append(metrics_line(e, r).dump());
  } catch (const Error& err) {
    throw Error("--metrics: " + std::string(err.what()));
  }
}

// The epochs after this run's first (its warm-up), or a one-epoch run's only one.
bool TrainingLoop::profiled(int epoch) const {
  return !o_.op_profile_path.empty() && (epoch > first_epoch_ || o_.epochs - first_epoch_ == 1);
}

void TrainingLoop::report_profile() {
  if (o_.op_profile_path.empty()) return;
  if (!o_.quiet && profiled_epochs_ > 0) say("%s\n", profile_.table(20, profiled_epochs_, "epoch").c_str());
  try {
    io::write_file_atomic(o_.op_profile_path, profile_.json(profiled_epochs_, "epoch"), io::OutputLinks::replace);
  } catch (const Error& e) {
    throw Error("--op-profile: " + std::string(e.what()));
  }
  if (!o_.quiet) say("op profile written to %s\n", o_.op_profile_path.c_str());
}

std::optional<int> TrainingLoop::run() {
  first_epoch_ = point_.epoch();
  try {
    for (int epoch = point_.epoch(); epoch < o_.epochs; ++epoch) {
      epoch_ = epoch;
      EpochSummary e;
      e.epoch = epoch;
      const EpochSummary before = running_totals();
      if (!train_epoch(epoch, e))
        return stop_together("at epoch " + std::to_string(epoch + 1) + ", micro-batch " +
                             std::to_string(next_micro_batch_));
      const EpochSummary after = running_totals();
      e.skipped_steps = after.skipped_steps - before.skipped_steps;
      e.gradient_reductions = after.gradient_reductions - before.gradient_reductions;
      e.communication_seconds = after.communication_seconds - before.communication_seconds;
      e.buckets_started_in_backward = after.buckets_started_in_backward - before.buckets_started_in_backward;
      measure_plan(e);
      end_epoch(e);
      point_.end_epoch();
      checkpoint_now(point_.state(), "epoch end");
      // After the epoch's checkpoint: nothing is lost, a resumed run starts the next epoch.
      if (stop_asked()) return stop_together("after epoch " + std::to_string(epoch + 1));
    }
    report_profile();
  } catch (const app::Interrupted&) {
    return stop("interrupted (" + std::string(app::stop_signal_name(app::stop_signal())) +
                    ") in the test pass of epoch " + std::to_string(epoch_ + 1) +
                    "; a resumed run starts with that test pass",
                app::exit_code_for_stop(app::stop_signal()), "interrupted");
  } catch (const OutOfMemory& e) {
    const int status = stop(
        std::string(e.what()) +
            "\nfashion_mnist: lower --batch-size, or let the planner fit it: --effective-batch N --memory-budget SIZE",
        1, "out of memory; resumes at the last completed step");
    if (!o_.quiet) {
      memory::print_memory_table(p_.tracker, stdout);  // with the failing request and the largest live ops
      say("");
    }
    return status;
  } catch (const Error& e) {
    return stop(e.what(), 1, "after an error; resumes at the last completed step");
  }
  return std::nullopt;
}

}  // namespace

void announce_run(const RunConfig& o, const nn::Model& model, const RunDescription& d, const TrainingState& state) {
  if (!o.quiet) print_banner(o, model, d, state);
  for (const std::string& change : state.overridden)
    if (g_root) std::fprintf(stderr, "fashion_mnist: --override: %s\n", change.c_str());
  if (state.state.counters.epoch == o.epochs && g_root) {
    std::fprintf(stderr,
                 "fashion_mnist: '%s' has finished all %d epochs (--epochs %d): nothing to train; give a "
                 "larger --epochs to train further\n",
                 o.resume_path.c_str(), o.epochs, o.epochs);
  }
}

memory::MemoryTracker::Options tracker_options(const RunConfig& o, const nn::Model& model) {
  memory::MemoryTracker::Options to;
  to.model = model.name();
  if (model.uses_batch_statistics())
    to.annotations["batch_norm_statistics"] = "per micro-batch of " + std::to_string(o.batch_size) + " samples";
  to.micro_batch_size = o.batch_size;
  to.accum_steps = o.accum_steps_at(0);
  const std::string kernels = kernels_used(model, o, o.batch_size);
  to.settings = settings_table().named(app::kMemoryReport, {o, kernels});
  return to;
}

train::Evaluation test_pass(nn::Module& model, data::DataLoader& loader) {
  return train::evaluate_classifier(model, loader, [](int64_t) { app::throw_if_interrupted(); });
}

void print_test_results(const train::Evaluation& r) {
  say("Test Results:\n Accuracy: %.1f%%, Avg loss: %f\n\n", 100.0 * r.accuracy, r.loss);
}

void finish_reports(const RunConfig& o, memory::MemoryTracker& tracker, dist::Communicator& comm) {
  if (!o.quiet && g_root) {
    memory::print_memory_table(tracker, stdout);
    say("");
  }
  write_reports(o, tracker);
  if (g_root && o.world_size > 1 && !o.quiet) say("data parallel: %s\n", comm.stats_text().c_str());
}

std::optional<int> train(const TrainingParts& parts) { return TrainingLoop(parts).run(); }

}  // namespace fmnist
