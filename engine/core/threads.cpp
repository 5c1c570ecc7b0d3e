#include "cumulus/core/threads.h"

#include <cblas.h>

#include "cumulus/core/error.h"

namespace cumulus {

void set_cpu_threads(int n) {
  CUMULUS_CHECK(n >= 1, InvalidArgument, "set_cpu_threads: need at least 1 thread, got ", n);
  openblas_set_num_threads(n);
}

int cpu_threads() { return openblas_get_num_threads(); }

}  // namespace cumulus
