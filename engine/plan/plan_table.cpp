#include <cstdarg>
#include <cstdio>
#include <string>

#include "cumulus/memory/category.h"
#include "cumulus/plan/planner.h"

namespace cumulus::plan {
namespace {

void append(std::string& out, const char* format, ...) __attribute__((format(printf, 2, 3)));
void append(std::string& out, const char* format, ...) {
  std::va_list args, again;
  va_start(args, format);
  va_copy(again, args);
  const int n = std::vsnprintf(nullptr, 0, format, args);
  va_end(args);
  const std::size_t at = out.size();
  out.resize(at + static_cast<std::size_t>(n) + 1);
  std::vsnprintf(&out[at], static_cast<std::size_t>(n) + 1, format, again);
  va_end(again);
  out.resize(at + static_cast<std::size_t>(n));
}

}  // namespace

std::string plan_table_text(const Plan& plan, int64_t budget, const std::string& unit) {
  std::string out;
  const bool line = plan.method == PlanMethod::probe_line;  // no reserved bytes predicted
  if (!line)
    append(out, "planner: predicted from the recorded allocation sequence (%s); reserved at rest %s, budget %s\n",
           plan.prediction.c_str(), format_bytes(plan.reserved_at_rest).c_str(),
           budget > 0 ? format_bytes(budget).c_str() : "none");
  char step[64] = "not timed (no room under the budget to probe it)";
  if (plan.step_timed) std::snprintf(step, sizeof step, "%.3g ms", plan.step_seconds * 1e3);
  append(out,
         "planner: the optimizer step %s; probes took %.3g s (the largest %lld %ss, each size timed %d times); "
         "a micro-batch takes, fitted over the probed sizes:\n",
         step, plan.probe_seconds, static_cast<long long>(plan.largest_probe), unit.c_str(), plan.timing_repeats);
  for (const Plan::Weighed& w : plan.weighed)
    append(out, "  %-46s %.3g ms + %.3g ms a %s (%d sizes); reserved at rest %s; largest fitting %lld\n",
           plan_setting_text(w.setting, plan.recompute_segments).c_str(), w.time.fixed_seconds * 1e3,
           w.time.seconds_per_unit * 1e3, unit.c_str(), w.time.probes, format_bytes(w.reserved_at_rest).c_str(),
           static_cast<long long>(w.largest_fitting));
  // Each row's collectives (Note [Predicting time]): part of its ms an effective batch.
  if (plan.collective_times.world_size > 1)
    append(out, "planner: collectives measured: %s\n", plan.collective_times.text().c_str());
  append(out, "  %11s %19s %6s %9s %6s %4s %4s %10s %15s %5s %6s %12s %8s %17s %10s %6s\n", "micro-batch", "recompute",
         "data", "precision", "state", "bits", "zero", "peak MiB", "reserved bytes", "fits", "accum", "ms/eff.batch",
         "comm ms", "spread ms", "s/epoch", "chosen");
  for (const PlanRow& r : plan.table) {
    const std::string reserved = line ? "-" : std::to_string(r.reserved_bytes);
    char spread[40];
    std::snprintf(spread, sizeof spread, "%.3f-%.3f", r.batch_seconds_low * 1e3, r.batch_seconds_high * 1e3);
    append(out, "  %11lld %19s %6s %9s %6s %4d %4d %10.2f %15s %5s %6lld %12.3f %8.3f %17s %10.3f %6s\n",
           static_cast<long long>(r.micro_batch), recompute_text(r.setting.recompute, plan.recompute_segments).c_str(),
           data_placement_name(r.setting.data), precision_name(r.setting.precision),
           optim::state_placement_name(r.setting.optimizer_state), r.setting.optimizer_bits, r.setting.zero_stage,
           static_cast<double>(r.peak_bytes) / (1 << 20), reserved.c_str(),
           budget <= 0 ? "-"
           : r.fits    ? "yes"
                       : "no",
           static_cast<long long>(r.accum_steps), r.batch_seconds * 1e3, r.communication_seconds * 1e3, spread,
           r.epoch_seconds, r.chosen ? "*" : "");
  }
  return out;
}

}  // namespace cumulus::plan
