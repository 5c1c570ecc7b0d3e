// `#pragma unroll [n]` for nvcc, nothing for the host compiler of the CPU emulation (which has no
// such pragma): a loop over a thread's register arrays is unrolled at compile time so that every
// index into them is a constant and the arrays stay in registers (a run-time index puts an array
// in the stack frame, which scripts/cuda_resources.py refuses in a hot kernel).
#pragma once

#ifdef __CUDACC__
#define CUMULUS_PRAGMA(text) _Pragma(#text)
#define CUMULUS_UNROLL CUMULUS_PRAGMA(unroll)
#define CUMULUS_UNROLL_BY(n) CUMULUS_PRAGMA(unroll n)
#else
#define CUMULUS_UNROLL
#define CUMULUS_UNROLL_BY(n)
#endif
