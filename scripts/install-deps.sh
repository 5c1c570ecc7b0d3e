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
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The cuDNN frontend's C++ headers, for cuDNN's fused attention (kernels/cuda/cudnn_attention.cpp):
# header-only, shipped inside the PyPI package nvidia-cudnn-frontend. Fetched with pip into a cache
# outside the repository, where CMake looks by default (CUMULUS_CUDNN_FRONTEND_DIR); only where
# nvcc is found. Pinned: 1.18.0 is the release that knows cuDNN 9.19's features (its version
# checks name 9.19.0) and is checked to compile with nvcc 13.0. Without pip or the network the
# build goes on without it: CMake says so and attention runs on our own kernels.
cudnn_frontend_version=1.18.0
cudnn_frontend_dir="${CUMULUS_DEPS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cumulus}/cudnn-frontend-$cudnn_frontend_version"
if { command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; } &&
   [ ! -f "$cudnn_frontend_dir/include/cudnn_frontend.h" ]; then
  echo "install-deps: fetching the cuDNN frontend $cudnn_frontend_version headers into $cudnn_frontend_dir"
  scratch=$(mktemp -d)
  trap 'rm -rf "$scratch"' EXIT
  # Any one wheel of the release carries the same headers: the one for Python 3.11 on x86-64.
  if python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.11 \
       --platform manylinux_2_28_x86_64 --dest "$scratch" "nvidia-cudnn-frontend==$cudnn_frontend_version" &&
     python3 - "$scratch" "$cudnn_frontend_dir" <<'PY'
import glob, os, shutil, sys, zipfile
scratch, target = sys.argv[1], sys.argv[2]
(wheel,) = glob.glob(os.path.join(scratch, "*.whl"))
with zipfile.ZipFile(wheel) as z:
    z.extractall(os.path.join(scratch, "x"), [n for n in z.namelist() if n.startswith("include/")])
os.makedirs(os.path.dirname(target), exist_ok=True)
shutil.rmtree(target, ignore_errors=True)
shutil.move(os.path.join(scratch, "x"), target)
PY
  then
    echo "install-deps: cuDNN frontend headers in $cudnn_frontend_dir/include"
  else
    echo "install-deps: could not fetch nvidia-cudnn-frontend $cudnn_frontend_version with pip;" \
         "the build goes on without cuDNN's fused attention" >&2
  fi
fi
