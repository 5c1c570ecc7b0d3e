// Which vector code the CPU kernels run (kernels/cpu/vec_math.h): what this CPU has, capped by the
// environment variable CUMULUS_CPU_CAPABILITY (avx512, avx2 or scalar; read once, like PyTorch's
// ATEN_CPU_CAPABILITY). The cap lets one machine run, test and time each path a user's CPU may take:
// a CPU with AVX-512 never takes the AVX2 or scalar rows on its own (tests/CMakeLists.txt runs the
// op cases under both caps). Defined here, in a file compiled for the baseline x86-64, so that
// asking never runs an instruction the CPU may lack.
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "kernels/cpu/vec_math.h"

namespace cumulus::kernels {
namespace {

enum class Capability { kScalar, kAvx2, kAvx512 };

Capability cap_from_environment() {
  const char* value = std::getenv("CUMULUS_CPU_CAPABILITY");
  if (value == nullptr || *value == '\0' || std::strcmp(value, "avx512") == 0) return Capability::kAvx512;
  if (std::strcmp(value, "avx2") == 0) return Capability::kAvx2;
  if (std::strcmp(value, "scalar") == 0) return Capability::kScalar;
  // A speed setting, as OMP_NUM_THREADS: said once and ignored rather than failing the program.
  std::fprintf(stderr, "cumulus: CUMULUS_CPU_CAPABILITY=%s is not avx512, avx2 or scalar; ignored\n", value);
  return Capability::kAvx512;
}

Capability cap() {
  static const Capability c = cap_from_environment();
  return c;
}

}  // namespace

bool vec::available() {
#if defined(__x86_64__)
  static const bool ok = cap() >= Capability::kAvx2 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return ok;
#else
  return false;
#endif
}

bool vec512::available() {
#if defined(__x86_64__)
  static const bool ok =
      cap() >= Capability::kAvx512 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma");
  return ok;
#else
  return false;
#endif
}

}  // namespace cumulus::kernels
