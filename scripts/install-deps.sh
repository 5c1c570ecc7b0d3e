#!/usr/bin/env bash
# Installs the Debian packages cumulus builds with, if any is missing (needs root or sudo).
# The CUDA toolkit is not a Debian package here: when nvcc is absent the build is CPU only.
# --fuzz adds what scripts/fuzz.sh needs: clang and its runtime libraries (libFuzzer, sanitizers).
# curl and ca-certificates: the app downloads Fashion-MNIST with curl over HTTPS when no copy is
# found (minimal images have neither).
# libopenmpi-dev and openmpi-bin: data parallel training (mpirun launches the ranks; tests/test_dist.cpp).
# libsleef-dev: vectorized tanh, exp and erf for the CPU activations (kernels/cpu/vec_math.h).
# ccache: the build scripts compile through it (scripts/compiler_cache.sh), so rebuilds and CI's
# clean clones reuse earlier compilations.
set -euo pipefail
packages=(cmake make g++ libopenblas-dev libgtest-dev libgmock-dev libbenchmark-dev zlib1g-dev
          libcli11-dev nlohmann-json3-dev libsleef-dev curl ca-certificates libopenmpi-dev openmpi-bin ccache)
for arg in "$@"; do
  case "$arg" in
    --fuzz) packages+=(clang libclang-rt-14-dev) ;;
    *) echo "install-deps: unknown argument '$arg' (known: --fuzz)" >&2; exit 2 ;;
  esac
done
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "install-deps: installing ${missing[*]}"
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
