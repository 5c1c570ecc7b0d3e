// Fuzzes cumulus::plan::parse_byte_size (engine/plan/planner.cpp), the parser of --memory-budget: any
// text either gives a byte count >= 0 or throws cumulus::Error.
#include <cstdint>
#include <string>

#include "cumulus/core/error.h"
#include "cumulus/plan/planner.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    if (cumulus::plan::parse_byte_size(text) < 0) __builtin_trap();
  } catch (const cumulus::Error&) {
    // The expected outcome for malformed input.
  }
  return 0;
}
