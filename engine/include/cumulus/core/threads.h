// The CPU backend's settings: the threads of the BLAS library (OpenBLAS) and of the kernels (Note
// [CPU kernel threads]), and which vector code the kernels run.
#pragma once

namespace cumulus {

// The widest vector code the CPU kernels run: "avx512", "avx2" or "scalar" (and "scalar" on every
// CPU but x86-64). What this CPU has, capped by the environment variable CUMULUS_CPU_CAPABILITY
// (one of those names; read once; another value is reported on stderr and ignored), so one
// machine can run, test and time each path a user's CPU may take. OpenBLAS picks its own kernels
// (blas_core()).
const char* cpu_capability();

// The kernels OpenBLAS runs, by the name of the core they were written for ("SkylakeX", "Haswell",
// ...): its own choice for this CPU, or the environment's OPENBLAS_CORETYPE, or where OpenBLAS fell
// back to SSE3 on a CPU it does not know, the widest the CPU runs (Note [OpenBLAS kernels on an
// unrecognized CPU], threads.cpp). Both apps' --version print it: a GEMM's speed depends on it.
const char* blas_core();

// Sets how many threads the CPU kernels and GEMMs use from now on (n >= 1): one pool for both, with
// OpenBLAS running one thread per call (Note [One pool for the kernels and the BLAS],
// kernels/cpu/gemm.cpp). Unlike OPENBLAS_NUM_THREADS, which OpenBLAS reads once when the process
// starts, this works at any time. Under an address-space
// limit (RLIMIT_AS, `ulimit -v`) it first takes the memory OpenBLAS needs for them (Note [OpenBLAS
// under an address-space limit], threads.cpp) and throws OutOfMemory naming the limit when they do
// not fit (the threads that fit stay in use).
void set_cpu_threads(int n);
// Like set_cpu_threads, but under an address-space limit uses as many of the n threads as fit
// (at least the calling thread, else OutOfMemory naming the limit). Returns the threads in use.
int fit_cpu_threads(int n);
// The threads the CPU kernels and GEMMs use now (every core unless set).
int cpu_threads();
// What a program's --threads N does: N >= 1 sets N threads (set_cpu_threads); 0 uses every core
// this process may run on (default_cpu_threads: its CPU affinity, or OPENBLAS_NUM_THREADS /
// OMP_NUM_THREADS where the user set them, as PyTorch does), as many as fit under an
// address-space limit (fit_cpu_threads). Returns the threads in use.
int use_cpu_threads(int n);
// The threads OpenBLAS would have started with: OPENBLAS_NUM_THREADS (or GOTO_NUM_THREADS,
// OMP_NUM_THREADS) as the process started, else every core this process may run on.
int default_cpu_threads();

// Runs before OpenBLAS's constructor when placed in an executable's .preinit_array (the macro
// below): under an address-space limit, OpenBLAS starts with no worker threads, so none can wait
// forever for its buffer before main; fit_cpu_threads then starts those that fit. Touches only libc.
void openblas_preinit(int argc, char** argv, char** envp);

}  // namespace cumulus

// In one source file of an executable (a shared library has no .preinit_array).
#define CUMULUS_OPENBLAS_PREINIT                                                                   \
  __attribute__((section(".preinit_array"), used)) static void (*const cumulus_openblas_preinit_)( \
      int, char**, char**) = ::cumulus::openblas_preinit
