// CPU threads of the BLAS library (OpenBLAS), the only multi-threaded part of the CPU backend.
#pragma once

namespace cumulus {

// Sets how many threads OpenBLAS uses from now on (n >= 1). Unlike OPENBLAS_NUM_THREADS, which
// OpenBLAS reads once when the process starts, this works at any time.
void set_cpu_threads(int n);
// The threads OpenBLAS uses now (every core unless set).
int cpu_threads();

}  // namespace cumulus
