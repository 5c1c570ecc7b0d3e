// Compiled with cumulus's public usage requirements only: the engine's private folders must not be
// reachable from a consumer (the repository root is a private include directory of the engine).
#include <cumulus/cumulus.h>

#if __has_include("kernels/cpu/kernels.h") ||                                                              \
                  __has_include("tests/test_util.h") ||                                                    \
                                __has_include("apps/fashion_mnist/run_config.h") ||                        \
                                              __has_include("engine/ops/internal.h") ||                    \
                                                            __has_include("engine/core/cuda_context.h") || \
                                                                          __has_include("kernels/cuda/cuda_check.h")
#error "cumulus exposes its private folders (kernels/, tests/, apps/, engine/) to consumers"
#endif

int cumulus_consumer_hidden_headers_checked = 1;
