// Compiled with cumulus's public usage requirements only: the engine's private folders must not be
// reachable from a consumer (the repository root is a private include directory of the engine).
#include <cumulus/cumulus.h>

#if __has_include("kernels/cpu/kernels.h") || __has_include("tests/test_util.h") || \
    __has_include("apps/fashion_mnist/options.h") || __has_include("engine/ops/internal.h")
#error "cumulus exposes its private folders (kernels/, tests/, apps/, engine/) to consumers"
#endif

// The CUDA backend's own headers include the toolkit's and are not installed: a consumer of the
// installed package has no CUDA toolkit to compile them with (tests/test_package.cmake also scans
// every installed header for CUDA, MPI, NCCL, BLAS and zlib includes).
#if defined(CONSUMER_OF_INSTALLED_PACKAGE) &&                                                    \
    (__has_include(<cumulus/core/cuda_check.h>) || __has_include(<cumulus/core/cuda_context.h>) || \
     __has_include(<cumulus/core/cudnn_context.h>))
#error "cumulus installs the CUDA backend's internal headers"
#endif

int cumulus_consumer_hidden_headers_checked = 1;
