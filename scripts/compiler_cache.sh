# Sourced by the build scripts: when ccache is installed, `compiler_cache_args` holds the CMake
# flags that compile C, C++ and CUDA through it, with the repository root as ccache's base
# directory, so that a clean clone anywhere (CI's) reuses what an earlier build on this machine
# compiled. The sanitizer and fuzz builds carry debug information, which makes ccache hash the
# build directory too unless told not to: their objects then name the first clone's directory in
# their debug information, which only changes the paths a sanitizer report prints.
compiler_cache_args=()
if command -v ccache > /dev/null 2>&1; then
  export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$root}
  export CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-true}
  compiler_cache_args=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache
                       -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
