// The memory report as JSON (memory_report_json; the schema in docs/memory.md).
#include <cblas.h>
#include <zlib.h>
#include <nlohmann/json.hpp>

#include <string>

#include "cumulus/memory/report.h"
#include "cumulus/version.h"
#include "report_internal.h"

#if CUMULUS_WITH_CUDA
#include <cublas_api.h>
#include <cuda_runtime.h>
#endif
#if CUMULUS_WITH_CUDNN
#include <cudnn.h>
#endif

namespace cumulus::memory {

namespace {

using report_detail::ojson;
using report_detail::RecomputeSummary;
using report_detail::summarize_recompute;

ojson by_category_json(const std::array<int64_t, kNumMemoryCategories>& bytes) {
  ojson j = ojson::object();
  for (std::size_t c = 0; c < kNumMemoryCategories; ++c) j[category_name(static_cast<MemoryCategory>(c))] = bytes[c];
  return j;
}

// The out-of-memory object of the report (docs/memory.md).
ojson out_of_memory_json(const TrackedOutOfMemory& t) {
  const OutOfMemoryRecord& f = t.failure;
  ojson j;
  j["op"] = f.op;
  j["category"] = category_name(f.category);
  j["requested_bytes"] = f.requested_bytes;
  j["rounded_bytes"] = f.rounded_bytes;
  j["segment_bytes"] = f.segment_bytes;
  j["limit_bytes"] = f.limit;
  j["reserved_bytes"] = f.reserved;
  j["allocated_bytes"] = f.allocated;
  j["peak_bytes"] = f.peak_bytes;
  j["live_by_category"] = by_category_json(f.live_by_category);
  ojson ops = ojson::object();
  for (const auto& [op, bytes] : f.live_by_op) ops[op] = bytes;
  j["live_by_op"] = std::move(ops);
  if (t.in_progress) {
    ojson m;
    m["phase"] = t.phase;
    m["epoch"] = t.epoch + 1;
    if (std::string(t.phase) == "step") {
      m["step"] = t.step;
    } else {
      m["index"] = t.index;
      m["units"] = t.units;
    }
    j["micro_batch"] = std::move(m);
  } else {
    j["micro_batch"] = nullptr;  // outside the training phases (e.g. the test pass)
  }
  return j;
}

// The "planner" object (docs/memory.md): the plan, its prediction and, once measured, the
// epoch that checked it (from 1, as every report prints epochs).
ojson plan_check_json(const plan::PlanCheck& c) {
  ojson j;
  j["micro_batch"] = c.micro_batch;
  j["accum_steps"] = c.accum_steps;
  j["setting"] = c.setting;
  j["predicted_epoch_seconds"] = c.predicted_epoch_seconds;
  j["predicted_peak_bytes"] = c.predicted_peak_bytes;
  if (c.measured) {
    j["measured_epoch"] = c.epoch + 1;
    j["measured_epoch_seconds"] = c.measured_epoch_seconds;
    j["measured_peak_bytes"] = c.measured_peak_bytes;
  }
  return j;
}

std::string trimmed(std::string s) {
  const std::size_t a = s.find_first_not_of(' ');
  if (a == std::string::npos) return "";
  return s.substr(a, s.find_last_not_of(' ') - a + 1);
}

#if CUMULUS_WITH_CUDA
// CUDA encodes versions as 1000 * major + 10 * minor.
std::string cuda_version_string(int v) {
  return v <= 0 ? std::string("none") : std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
}
#endif

// The libraries as linked (run-time queries where the library has one, so a report names what
// actually ran).
ojson versions_json() {
  ojson v;
  v["cumulus"] = CUMULUS_VERSION;
#if defined(__clang__)
  v["compiler"] = "clang " __clang_version__;
#elif defined(__GNUC__)
  v["compiler"] = "gcc " + std::to_string(__GNUC__) + "." + std::to_string(__GNUC_MINOR__) + "." +
                  std::to_string(__GNUC_PATCHLEVEL__);
#endif
  v["openblas"] = trimmed(openblas_get_config());
  v["zlib"] = zlibVersion();
  v["nlohmann_json"] = std::to_string(NLOHMANN_JSON_VERSION_MAJOR) + "." + std::to_string(NLOHMANN_JSON_VERSION_MINOR) +
                       "." + std::to_string(NLOHMANN_JSON_VERSION_PATCH);
#if CUMULUS_WITH_CUDA
  int runtime = 0, driver = 0;
  if (cudaRuntimeGetVersion(&runtime) != cudaSuccess) runtime = 0;
  if (cudaDriverGetVersion(&driver) != cudaSuccess) driver = 0;
  (void)cudaGetLastError();
  v["cuda_runtime"] = cuda_version_string(runtime);
  v["cuda_driver"] = cuda_version_string(driver);
  int major = 0, minor = 0, patch = 0;
  if (cublasGetProperty(MAJOR_VERSION, &major) == CUBLAS_STATUS_SUCCESS &&
      cublasGetProperty(MINOR_VERSION, &minor) == CUBLAS_STATUS_SUCCESS &&
      cublasGetProperty(PATCH_LEVEL, &patch) == CUBLAS_STATUS_SUCCESS)
    v["cublas"] = std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
#endif
#if CUMULUS_WITH_CUDNN
  int dmajor = 0, dminor = 0, dpatch = 0;
  if (cudnnGetProperty(MAJOR_VERSION, &dmajor) == CUDNN_STATUS_SUCCESS &&
      cudnnGetProperty(MINOR_VERSION, &dminor) == CUDNN_STATUS_SUCCESS &&
      cudnnGetProperty(PATCH_LEVEL, &dpatch) == CUDNN_STATUS_SUCCESS)
    v["cudnn"] = std::to_string(dmajor) + "." + std::to_string(dminor) + "." + std::to_string(dpatch);
#endif
  return v;
}

// The "summary" object. "recompute" is present only when some kept micro-batch recomputed
// checkpointed segments (Note [Recompute] in engine/autograd/checkpoint.cpp): at the micro-batch
// size, the activation footprint kept with recompute, the one a stored run keeps, what the
// recomputations held; over the micro-batches that recomputed, the time.
ojson summary_json(MemoryTracker& tracker, const MemorySummary& s) {
  ojson summary;
  summary["parameters_bytes"] = s.parameters_bytes;
  summary["gradients_bytes"] = s.gradients_bytes;
  summary["optimizer_state_bytes"] = s.optimizer_state_bytes;
  summary["host_optimizer_state_bytes"] = s.host_optimizer_state_bytes;
  summary["workspace_bytes"] = s.workspace_bytes;
  summary["outside_allocator_bytes"] = s.outside_allocator_bytes;
  summary["context_local_memory_bytes"] = s.context_local_memory_bytes;
  summary["data_bytes"] = s.data_bytes;
  summary["batch_data_bytes"] = s.batch_data_bytes;
  summary["activation_bytes_per_unit"] = s.activation_bytes_per_unit;
  summary["peak_bytes"] = s.peak_bytes;
  summary["reserved_peak_bytes"] = s.reserved_peak_bytes;
  summary["peak_at_micro_batch_bytes"] = s.peak_at_micro_batch;
  summary["peak_at_effective_batch_bytes"] = s.peak_at_effective_batch;
  summary["effective_batch_peak"] = s.effective_batch_measured ? "measured" : "predicted";
  if (const RecomputeSummary rs = summarize_recompute(tracker, s.micro_batch_size); rs.micro_batches > 0) {
    ojson r;
    r["segments_per_micro_batch"] = rs.segments;
    r["activation_bytes"] = rs.activation_bytes;
    r["activation_bytes_without_recompute"] = rs.stored_activation_bytes;
    r["saved_bytes"] = rs.stored_activation_bytes - rs.activation_bytes;
    r["recomputed_bytes"] = rs.recomputed_bytes;
    r["recompute_ms_per_micro_batch"] = rs.recompute_ms / static_cast<double>(rs.micro_batches);
    r["recompute_share_of_backward"] = rs.backward_ms > 0 ? rs.recompute_ms / rs.backward_ms : 0.0;
    summary["recompute"] = std::move(r);
  }
  return summary;
}

// One kept micro-batch; the recompute fields only on micro-batches that recomputed.
ojson micro_batch_json(const MicroBatchRecord& r) {
  ojson m;
  m["epoch"] = r.epoch + 1;
  m["index"] = r.index;
  m["units"] = r.units;
  m["activation_bytes"] = r.activation_bytes;
  m["peak_bytes"] = r.peak_bytes;
  m["peak_by_category"] = by_category_json(r.peak_by_category);
  m["reserved_bytes"] = r.reserved_bytes;
  m["forward_ms"] = r.forward_ms;
  m["backward_ms"] = r.backward_ms;
  if (r.recompute_segments > 0) {
    m["recompute_segments"] = r.recompute_segments;
    m["recomputed_bytes"] = r.recomputed_bytes;
    m["recompute_avoided_bytes"] = r.recompute_avoided_bytes;
    m["recompute_ms"] = r.recompute_ms;
  }
  return m;
}

ojson step_json(const StepRecord& r) {
  ojson st;
  st["step"] = r.step;
  st["epoch"] = r.epoch + 1;
  st["ms"] = r.ms;
  st["optimizer_state_bytes"] = r.optimizer_state_bytes;
  st["peak_bytes"] = r.peak_bytes;
  if (r.communication_ms > 0.0) st["communication_ms"] = r.communication_ms;  // data parallel only
  return st;
}

}  // namespace

std::string memory_report_json(MemoryTracker& tracker) {
  const MemorySummary s = tracker.summary();
  const MemoryTracker::Options& o = tracker.options();
  ojson j;
  j["schema_version"] = kMemoryReportSchemaVersion;
  ojson settings = ojson::object();
  for (const auto& [key, value] : o.settings) settings[key] = value;
  j["settings"] = std::move(settings);
  j["device"] = tracker.device().str();
  j["device_name"] = tracker.device().hardware_name();
  j["versions"] = versions_json();
  j["model"] = o.model;
  j["micro_batch_size"] = s.micro_batch_size;
  j["accum_steps"] = s.accum_steps;
  if (!s.warning.empty()) j["warning"] = s.warning;
  if (!o.annotations.empty()) {
    ojson a = ojson::object();
    for (const auto& [key, value] : o.annotations) a[key] = value;
    j["annotations"] = std::move(a);
  }
  j["summary"] = summary_json(tracker, s);
  // Present only when the tracker was given a plan check, and after an out-of-memory.
  if (const auto& plan = tracker.plan_check()) j["planner"] = plan_check_json(*plan);
  if (const auto oom = tracker.out_of_memory()) j["out_of_memory"] = out_of_memory_json(*oom);
  j["micro_batches_total"] = tracker.micro_batches_seen();  // the lists keep the first max_records
  j["steps_total"] = tracker.steps_seen();
  ojson mbs = ojson::array();
  for (const MicroBatchRecord& r : tracker.micro_batches()) mbs.push_back(micro_batch_json(r));
  j["micro_batches"] = std::move(mbs);
  ojson steps = ojson::array();
  for (const StepRecord& r : tracker.steps()) steps.push_back(step_json(r));
  j["steps"] = std::move(steps);
  return j.dump(1) + "\n";
}

}  // namespace cumulus::memory
