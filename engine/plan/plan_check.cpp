#include "cumulus/plan/plan_check.h"

#include <cstdio>

#include "cumulus/memory/category.h"

namespace cumulus::plan {

std::string plan_check_line(const PlanCheck& check) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.3g", check.predicted_epoch_seconds);
  std::string line =
      "predicted " + std::string(buf) + " s an epoch and peak " + format_bytes(check.predicted_peak_bytes);
  if (!check.measured) return line;
  std::snprintf(buf, sizeof buf, "%.3g", check.measured_epoch_seconds);
  return line + ", measured " + buf + " s and peak " + format_bytes(check.measured_peak_bytes);
}

}  // namespace cumulus::plan
