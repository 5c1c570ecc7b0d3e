#include "reports.h"

#include <algorithm>
#include <cstdio>

#include "cumulus/core/error.h"
#include "cumulus/io/file.h"
#include "cumulus/ops/fused_mlp.h"
#include "cumulus/runtime/planner.h"
#include "cumulus/runtime/prediction.h"
#include "run_control.h"
#include "settings.h"
#include "training_setup.h"

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
            : ("segments " + recompute_text(o.recompute_segments, model.recompute_segment_names())).c_str());
  if (o.model == ModelKind::mlp) {
    const char* fused = o.device.is_cuda()
                            ? "fused (mlp_cross_entropy: a micro-batch's forward, loss and backward in 3 + 3 "
                              "launches of our own; not yet measured on a GPU)"
                            : "fused (mlp_cross_entropy: one op for the micro-batch; on the CPU the generic "
                              "kernels' arithmetic)";
    say("kernels: %s\n", kernels_used(model, o, o.batch_size) == "fused" ? fused : "generic (one op per layer)");
  }
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

MemoryTracker::Options tracker_options(const RunConfig& o, const nn::Model& model) {
  MemoryTracker::Options to;
  to.model = model.name();
  if (model.uses_batch_statistics())
    to.annotations["batch_norm_statistics"] = "per micro-batch of " + std::to_string(o.batch_size) + " samples";
  to.micro_batch_size = o.batch_size;
  to.accum_steps = o.accum_steps_at(0);
  const std::string kernels = kernels_used(model, o, o.batch_size);
  to.settings = named_settings(kMemoryReport, {o, kernels});
  if (kernels == "fused" && o.device.is_cuda() && !ops::kFusedMlpMeasuredOnGpu)
    to.annotations["kernels_measured"] = "the fused MLP kernels have not yet been measured on a GPU";
  return to;
}

std::optional<PlanCheck> planned_check(const RunConfig& o) {
  if (o.planned_epoch_seconds <= 0.0) return std::nullopt;
  PlanCheck check;
  check.micro_batch = o.batch_size;
  check.accum_steps = o.accum_steps_at(0);
  check.setting = o.planned_setting;
  check.predicted_epoch_seconds = o.planned_epoch_seconds;
  check.predicted_peak_bytes = o.planned_peak_bytes;
  return check;
}

optim::Evaluation test_pass(nn::Module& model, data::DataLoader& loader) {
  return optim::evaluate_classifier(model, loader, [](int64_t) { throw_if_interrupted(); });
}

void print_test_results(const optim::Evaluation& r) {
  say("Test Results:\n Accuracy: %.1f%%, Avg loss: %f\n\n", 100.0 * r.accuracy, r.loss);
}

void write_reports(const RunConfig& o, MemoryTracker& tracker) {
  auto write = [&](const char* flag, const std::string& path, const std::string& content, const char* what) {
    if (path.empty()) return;
    try {
      io::write_file_atomic(path, content);
    } catch (const Error& e) {
      throw Error(std::string(flag) + ": " + e.what());
    }
    if (!o.quiet) say("%s written to %s\n", what, path.c_str());
  };
  if (!o.memory_report_path.empty())
    write("--memory-report", o.memory_report_path, memory_report_json(tracker), "memory report");
  write("--trace", o.trace_path, memory_trace_json(tracker), "trace");
  write("--memory-plot", o.memory_plot_path, memory_plot_svg(tracker), "memory plot");
}

void finish_reports(const RunConfig& o, MemoryTracker& tracker, dist::Communicator& comm) {
  if (!o.quiet && g_root) {
    print_memory_table(tracker, stdout);
    say("");
  }
  write_reports(o, tracker);
  if (g_root && o.world_size > 1 && !o.quiet) {
    const dist::Communicator::Stats st = comm.stats();
    const bool nccl = comm.backend() == "MPI+NCCL";  // Note [Communication time]
    say("data parallel: %lld gradient all-reduces (%lld transport calls, %.1f MiB per rank), %.3f s in them (%s)\n",
        static_cast<long long>(st.gradient_reductions), static_cast<long long>(st.messages),
        static_cast<double>(st.bytes_reduced) / (1 << 20), st.communication_seconds,
        nccl ? "NCCL's device time" : "the host's wait for MPI");
  }
}

}  // namespace fmnist
