# Sourced by the build scripts: when ccache is installed, `compiler_cache_args` holds the CMake
# flags that compile C, C++ and CUDA through it, with the repository root as ccache's base
# directory, so that a clean clone anywhere (CI's) reuses what an earlier build on this machine
# compiled.
compiler_cache_args=()
if command -v ccache > /dev/null 2>&1; then
  export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$root}
  compiler_cache_args=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache
                       -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
