// The memory report as a terminal table (print_memory_table).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "cumulus/memory/report.h"
#include "report_internal.h"

namespace cumulus::memory {

using report_detail::RecomputeSummary;
using report_detail::summarize_recompute;

namespace {

void print_recompute_line(MemoryTracker& tracker, int64_t micro_batch_size, std::FILE* out) {
  const RecomputeSummary rs = summarize_recompute(tracker, micro_batch_size);
  if (rs.micro_batches == 0) return;
  const double share = rs.backward_ms > 0 ? 100.0 * rs.recompute_ms / rs.backward_ms : 0.0;
  std::fprintf(out,
               "  recompute on: %lld segments per micro-batch; activations %s kept vs %s without recompute; "
               "recomputing took %.1f%% of backward (%.2f ms per micro-batch)\n",
               static_cast<long long>(rs.segments), format_bytes(rs.activation_bytes).c_str(),
               format_bytes(rs.stored_activation_bytes).c_str(), share,
               rs.recompute_ms / static_cast<double>(rs.micro_batches));
}

// Mixed precision (Note [Mixed precision] in engine/ops/linear.cpp): the 16-bit weight copies live
// from a forward to its backward, so they are part of each micro-batch's peak, not of the step's.
void print_weight_copies_line(MemoryTracker& tracker, std::FILE* out) {
  int64_t copies = 0;
  for (const auto& r : tracker.micro_batches())
    copies = std::max(copies, r.peak_by_category[static_cast<std::size_t>(MemoryCategory::parameter_copies)]);
  if (copies > 0)
    std::fprintf(out, "  16-bit weight copies (mixed precision): %s at a micro-batch's peak\n",
                 format_bytes(copies).c_str());
}

// Where a run ran out of memory, what asked and which ops held the most.
void print_out_of_memory_line(MemoryTracker& tracker, std::FILE* out) {
  const auto oom = tracker.out_of_memory();
  if (!oom) return;
  const OutOfMemoryRecord& f = oom->failure;
  std::string where;
  if (oom->in_progress)
    where = std::string(" in the ") + oom->phase + " of epoch " + std::to_string(oom->epoch + 1) +
            (std::string(oom->phase) == "step" ? ", step " + std::to_string(oom->step)
                                               : ", micro-batch " + std::to_string(oom->index));
  std::string top;
  for (std::size_t i = 0; i < f.live_by_op.size() && i < 3; ++i)
    top += (i ? ", " : "") + f.live_by_op[i].first + " " + format_bytes(f.live_by_op[i].second);
  std::fprintf(out, "  out of memory%s: %s asked for %s (%s) with %s reserved of %s; live by op: %s\n", where.c_str(),
               f.op.c_str(), format_bytes(f.requested_bytes).c_str(), category_name(f.category),
               format_bytes(f.reserved).c_str(), f.limit > 0 ? format_bytes(f.limit).c_str() : "no limit",
               top.empty() ? "none" : top.c_str());
}

}  // namespace

void print_memory_table(MemoryTracker& tracker, std::FILE* out) {
  const MemorySummary s = tracker.summary();
  int64_t activations = 0;
  for (const auto& r : tracker.micro_batches())
    if (r.units == s.micro_batch_size) activations = std::max(activations, r.activation_bytes);
  if (!s.warning.empty()) std::fprintf(out, "warning: memory tracker: %s\n", s.warning.c_str());
  std::fprintf(out, "memory per micro-batch (%lld units) on %s: activations %s (%s/unit), peak %s\n",
               static_cast<long long>(s.micro_batch_size), tracker.device().str().c_str(),
               format_bytes(activations).c_str(),
               format_bytes(static_cast<int64_t>(std::llround(s.activation_bytes_per_unit))).c_str(),
               format_bytes(s.peak_at_micro_batch).c_str());
  // Data: the datasets live now, and a micro-batch's own batch, which is gone by the summary.
  const std::string batch =
      s.batch_data_bytes > 0 ? " + " + format_bytes(s.batch_data_bytes) + " per micro-batch" : std::string();
  std::fprintf(out, "  parameters %s | gradients %s | optimizer state %s | workspace %s | data %s%s\n",
               format_bytes(s.parameters_bytes).c_str(), format_bytes(s.gradients_bytes).c_str(),
               format_bytes(s.optimizer_state_bytes).c_str(), format_bytes(s.workspace_bytes).c_str(),
               format_bytes(s.data_bytes).c_str(), batch.c_str());
  if (s.host_optimizer_state_bytes > 0)
    std::fprintf(out, "  optimizer state on the host %s (its own pool: not in the device's peak or budget)\n",
                 format_bytes(s.host_optimizer_state_bytes).c_str());
  if (s.outside_allocator_bytes > 0 || s.context_local_memory_bytes > 0)
    std::fprintf(out,
                 "  outside the allocator %s (the CUDA context, libraries, other processes), of which stack frames' "
                 "local memory about %s\n",
                 format_bytes(s.outside_allocator_bytes).c_str(), format_bytes(s.context_local_memory_bytes).c_str());
  std::fprintf(out, "  run peak %s (reserved peak %s) | %lld x %d: peak %s vs one batch of %lld: %s (%s)\n",
               format_bytes(s.peak_bytes).c_str(), format_bytes(s.reserved_peak_bytes).c_str(),
               static_cast<long long>(s.micro_batch_size), s.accum_steps, format_bytes(s.peak_at_micro_batch).c_str(),
               static_cast<long long>(s.micro_batch_size * s.accum_steps),
               format_bytes(s.peak_at_effective_batch).c_str(), s.effective_batch_measured ? "measured" : "predicted");
  print_recompute_line(tracker, s.micro_batch_size, out);
  // Which kernels trained (the app's "kernels" setting): the fused MLP op keeps a different set of
  // activations than the generic ops (Note [Fused MLP] in engine/ops/fused_mlp.cpp).
  for (const auto& [key, value] : tracker.options().settings)
    if (key == "kernels") std::fprintf(out, "  kernels: %s\n", value.c_str());
  print_weight_copies_line(tracker, out);
  print_out_of_memory_line(tracker, out);
}

}  // namespace cumulus::memory
