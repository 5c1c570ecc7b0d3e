#!/usr/bin/env bash
# Everything a GPU call can fail on that can be checked here, before the call (issue 58): run it from
# the checkout the session sends (its root), after ../shared/gpu/bundle.sh, and make the call only
# when it ends with "preflight: ready".
#   1. stages the data the checkup reads into .gpu/data (Fashion-MNIST's four files, Shakespeare xz'd);
#   2. rehearses the whole checkup on the CPU (CHECKUP_DEVICE=cpu, small shapes) through .gpu/run.sh,
#      as the GPU machine will run it; it must end with every step at exit 0 (3 minutes at most here);
#   3. checks every library the bundled programs need: in the bundle, a system one, or one the GPU
#      machine has (the driver's libcuda, and CUDA runtime, cuBLAS, cuDNN, NCCL from PyTorch's nvidia-*
#      wheels there); and the glibc and libstdc++ versions they need against that machine's;
#   4. measures what travels (tracked and untracked-not-ignored files, shared/, and .gpu carried) and
#      fails over 64 MiB; then prints the one device call.
# Usage: scripts/gpu_preflight.sh [--bundle] [--data DIR] [--python PY] [--no-rehearsal]
#   --bundle        first build and pack the bundle (../shared/gpu/bundle.sh, ccache on; long on 2 cores)
#   --measure BUILD no bundle yet: pack BUILD/bin as bundle.sh would into a scratch folder, to measure
#                   the size and the libraries only (no rehearsal through run.sh: it is not the bundle)
#   --data DIR      the folder holding fashion-mnist/ and shakespeare/ (default ../shared/data)
#   --python PY     the Python with torch for the rehearsal (default /work/venv/bin/python or python3)
#   --stale-ok      go on when sources the programs are built from changed since the bundle's commit
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
limit_mib=64
make_bundle=0 measure="" rehearse=1 stale_ok=0
data=$(cd "$root/.." && pwd)/shared/data
python=/work/venv/bin/python
[ -x "$python" ] || python=python3
while [ $# -gt 0 ]; do
  case $1 in
    --bundle) make_bundle=1 ;;
    --measure) measure=${2:?--measure needs a build folder}; shift ;;
    --data) data=${2:?--data needs a folder}; shift ;;
    --python) python=${2:?--python needs an interpreter}; shift ;;
    --no-rehearsal) rehearse=0 ;;
    --stale-ok) stale_ok=1 ;;
    *) echo "gpu_preflight: unknown argument '$1' (see the header of $0)" >&2; exit 2 ;;
  esac
  shift
done
fail() { echo "preflight: FAILED: $*" >&2; exit 1; }
mib() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1048576 }'; }
started=$(date +%s)

# ---- the bundle ----------------------------------------------------------------------------------
if ((make_bundle)); then
  echo "preflight: building the bundle (../shared/gpu/bundle.sh)"
  CCACHE_BASEDIR=$root CCACHE_NOHASHDIR=true "$root/../shared/gpu/bundle.sh" -DCMAKE_C_COMPILER_LAUNCHER=ccache \
    -DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache
fi
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
if [ -n "$measure" ]; then
  [ -d "$measure/bin" ] || fail "no $measure/bin"
  carried=$scratch/carried/.gpu  # what .gpu would be, packed by bundle.sh's rules from $measure/bin
  mkdir -p "$scratch/stage/bin" "$scratch/stage/lib" "$carried"
  find "$measure/bin" -maxdepth 1 -type f -perm -u+x -exec cp {} "$scratch/stage/bin/" \;
  for f in "$scratch"/stage/bin/*; do ldd "$f" 2> /dev/null || true; done | awk '/=> \//{print $3}' | sort -u |
    while read -r lib; do
      case "$(basename "$lib")" in
        libc.so* | libm.so* | libdl.so* | libpthread.so* | librt.so* | ld-linux* | libstdc++* | libgcc_s*) ;;
        libcuda.so* | libcudart* | libcublas* | libcudnn* | libnvrtc* | libnvJitLink* | libcufft* | libcurand* | libnccl*) ;;
        *) cp -L "$lib" "$scratch/stage/lib/" ;;
      esac
    done
  git rev-parse HEAD > "$scratch/stage/COMMIT"
  tar -C "$scratch/stage" -cJf "$carried/bundle.tar.xz" .
  cp "$root/../shared/gpu/run.sh" "$carried/run.sh"
  echo "preflight: measuring a bundle packed from $measure/bin (not the sm_90 build of bundle.sh: an estimate)"
  rehearse=0
else
  carried=$root/.gpu
  [ -f "$carried/bundle.tar.xz" ] && [ -f "$carried/run.sh" ] ||
    fail "no .gpu/bundle.tar.xz: run ../shared/gpu/bundle.sh first (or this script with --bundle)"
fi
bundle_commit=$(tar -xJOf "$carried/bundle.tar.xz" ./COMMIT 2> /dev/null || echo unknown)
echo "preflight: bundle $(mib "$(stat -c %s "$carried/bundle.tar.xz")") MiB, commit $bundle_commit" \
  "(the checkout is at $(git rev-parse HEAD))"
# The scripts and the PyTorch side travel as the working tree is; the programs are the bundle's. Any
# other change since the bundle's commit (committed or not) means the call would test older code.
stale=$({ git diff --name-only "$bundle_commit" HEAD 2> /dev/null || echo "(the bundle's commit $bundle_commit is unknown here)"
  git status --porcelain | cut -c4-; } | grep -vE '^(scripts/|docs/|bench/[^/]*\.py$|bench/pytorch/|bench/results/|.*\.md$)' | sort -u || true)
if [ -n "$stale" ] && [ -z "$measure" ]; then
  echo "preflight: changed since the bundle was built: $(echo "$stale" | head -n 12 | tr '\n' ' ')"
  ((stale_ok)) || fail "the bundle is older than the sources above: rebuild it (../shared/gpu/bundle.sh or --bundle), or --stale-ok"
fi

# ---- 1. the data the checkup reads ----------------------------------------------------------------
[ -f "$data/fashion-mnist/train-images-idx3-ubyte.gz" ] || fail "no Fashion-MNIST under $data/fashion-mnist"
[ -f "$data/shakespeare/shakespeare.txt" ] || fail "no $data/shakespeare/shakespeare.txt"
mkdir -p "$carried/data/fashion-mnist" "$carried/data/shakespeare"
cp "$data"/fashion-mnist/*-ubyte.gz "$carried/data/fashion-mnist/"
[ -f "$carried/data/shakespeare/shakespeare.txt.xz" ] && [ "$carried/data/shakespeare/shakespeare.txt.xz" -nt "$data/shakespeare/shakespeare.txt" ] ||
  xz -9 -c "$data/shakespeare/shakespeare.txt" > "$carried/data/shakespeare/shakespeare.txt.xz"
echo "preflight: data staged in .gpu/data: $(du -sh "$carried/data" | cut -f1)"

# ---- 2. the rehearsal on the CPU ------------------------------------------------------------------
if ((rehearse)); then
  out=$scratch/rehearsal
  mkdir -p "$out"
  echo "preflight: rehearsing the checkup on the CPU through .gpu/run.sh (CHECKUP_DEVICE=cpu, small shapes)"
  t0=$(date +%s)
  rc=0
  OUT=$out CHECKUP_DEVICE=cpu CHECKUP_PYTHON=$python bash .gpu/run.sh bash scripts/gpu_checkup.sh \
    .gpu/data/fashion-mnist .gpu/data/shakespeare > "$scratch/rehearsal.log" 2>&1 || rc=$?
  took=$(($(date +%s) - t0))
  # run.sh links every absolute path a test binary names under */bin/ to the bundled program; a
  # path pieced from a binary's string bytes can land in the checkout: those links go, and with
  # them any folder left empty, so nothing of the rehearsal travels.
  find "$root" -path "$root/.git" -prune -o -type l -lname "$carried/x/bin/*" -print 2> /dev/null |
    while read -r link; do rm -f "$link" && rmdir -p --ignore-fail-on-non-empty "$(dirname "$link")" 2> /dev/null || true; done
  rm -rf "$carried/x" "$carried/out"  # run.sh unpacks and writes there: none of it may travel
  kept=$root/build-gpu/rehearsal  # ignored by git (/build-*/): it does not travel
  rm -rf "$kept" && mkdir -p "$kept" && cp "$scratch/rehearsal.log" "$out"/* "$kept/" 2> /dev/null || true
  grep -E '^(==|tests:|sanitize:|gpu_checkup:)|: exit [1-9]|STOP' "$scratch/rehearsal.log" | sed 's/^/  /' || true
  bad=$(grep -cE ': exit [1-9]|: skipped|not started|STOP' "$out/summary.txt" 2> /dev/null || true)
  if ((rc != 0)) || ! grep -q '^gpu_checkup: done' "$out/summary.txt" 2> /dev/null || ((bad > 0)); then
    fail "the rehearsal ended with exit $rc and $bad steps failed, cut or skipped, in ${took} s: see $kept/"
  fi
  echo "preflight: rehearsal passed in ${took} s ($( ((took <= 180)) && echo 'within' || echo 'OVER') the 3 minutes asked);" \
    "its log, summary and archive: $kept/"
fi

# ---- 3. libraries and C library versions ----------------------------------------------------------
x=$scratch/x
mkdir -p "$x"
tar -C "$x" -xJf "$carried/bundle.tar.xz"
# On the GPU machine (../shared/gpu/README.md, /work/.library/device/KINDS.md): the driver and
# PyTorch's CUDA 13 wheels; the system libraries of any glibc Linux.
on_device() {
  case $1 in
    libcuda.so.1) echo "the NVIDIA driver" ;;
    libcudart.so.13) echo "nvidia-cuda-runtime (or the CUDA 13 toolkit)" ;;
    libcublas.so.13 | libcublasLt.so.13) echo "nvidia-cublas" ;;
    libcudnn*.so.9) echo "nvidia-cudnn-cu13" ;;
    libnccl.so.2) echo "nvidia-nccl-cu13" ;;
    libnvrtc*.so.13) echo "nvidia-cuda-nvrtc" ;;
    libnvJitLink.so.13) echo "nvidia-nvjitlink" ;;
    libcufft.so.12 | libcurand.so.10 | libcusparse.so.12 | libcusolver.so.12) echo "PyTorch's nvidia-* wheels" ;;
    *) return 1 ;;
  esac
}
declare -A needed=()
while read -r name path; do
  needed[$name]=$path
done < <(for f in "$x"/bin/*; do LD_LIBRARY_PATH=$x/lib ldd "$f" 2> /dev/null || true; done |
  awk '$2 == "=>" { print $1, $3 }' | sort -u)
problems=()
declare -A from_device=()
for name in "${!needed[@]}"; do
  path=${needed[$name]}
  if [ -e "$x/lib/$name" ]; then continue; fi
  case $name in
    libc.so.6 | libm.so.6 | libdl.so.2 | libpthread.so.0 | librt.so.1 | libstdc++.so.6 | libgcc_s.so.1 | ld-linux-x86-64.so.2) continue ;;
  esac
  if where=$(on_device "$name"); then
    from_device[$name]=$where
  elif [ "$path" = "not" ]; then
    problems+=("$name: not found here either")
  else
    problems+=("$name ($path here): neither in the bundle nor known to be on the GPU machine")
  fi
done
echo "preflight: libraries: ${#needed[@]} needed; $(ls "$x/lib" | wc -l) in the bundle; from the GPU machine:"
for name in $(printf '%s\n' "${!from_device[@]}" | sort); do echo "  $name <- ${from_device[$name]}"; done
[ ${#problems[@]} -eq 0 ] || fail "libraries the GPU machine would lack: $(printf '\n  %s' "${problems[@]}")"
glibc=$(for f in "$x"/bin/* "$x"/lib/*; do objdump -T "$f" 2> /dev/null | grep -oE 'GLIBC_[0-9.]+' || true; done | sort -V -u | tail -n 1)
glibcxx=$(for f in "$x"/bin/* "$x"/lib/*; do objdump -T "$f" 2> /dev/null | grep -oE 'GLIBCXX_[0-9.]+' || true; done | sort -V -u | tail -n 1)
# The GPU machine's image: Ubuntu 24.04 (its Python is 3.12.3): glibc 2.39, libstdc++ GLIBCXX_3.4.33.
echo "preflight: the programs need ${glibc:-no GLIBC symbol} and ${glibcxx:-no GLIBCXX symbol}" \
  "(the GPU machine, Ubuntu 24.04, has GLIBC_2.39 and GLIBCXX_3.4.33)"
if [ "$(printf '%s\n' "${glibc#GLIBC_}" 2.39 | sort -V | tail -n 1)" != 2.39 ] ||
  [ "$(printf '%s\n' "${glibcxx#GLIBCXX_}" 3.4.33 | sort -V | tail -n 1)" != 3.4.33 ]; then
  fail "the programs need a newer glibc or libstdc++ than the GPU machine's"
fi

# ---- 4. what travels ------------------------------------------------------------------------------
# a tracked file deleted from the checkout (moved aside to make room) does not travel
tree=$(git ls-files -z --cached --others --exclude-standard | while IFS= read -r -d '' f; do
  [ -f "$f" ] && printf '%s\0' "$f"; done | du -cb --files0-from=- | tail -n 1 | cut -f1)
shared_b=0
[ -d "$root/shared" ] && shared_b=$(du -sb "$root/shared" | cut -f1)
gpu_b=$(du -sb "$carried" | cut -f1)
total=$((tree + shared_b + gpu_b))
echo "preflight: what travels: working tree $(mib "$tree") MiB + shared/ $(mib "$shared_b") MiB" \
  "+ .gpu $(mib "$gpu_b") MiB (bundle $(mib "$(stat -c %s "$carried/bundle.tar.xz")"), data $(mib "$(du -sb "$carried/data" | cut -f1)"))" \
  "= $(mib "$total") MiB of the $limit_mib MiB limit"
((total <= limit_mib * 1048576)) || fail "$(mib "$total") MiB would travel: over the $limit_mib MiB limit" \
  "(bench/results/, which the call does not read, is $(du -sm bench/results 2> /dev/null | cut -f1) MiB of the tree:" \
  "move it aside for the call and back after it)"
((total <= (limit_mib - 4) * 1048576)) || echo "preflight: warning: less than 4 MiB to spare"
if [ -n "$measure" ]; then
  echo "preflight: measured only (--measure): make the bundle with ../shared/gpu/bundle.sh and run this again"
  exit 0
fi
echo "preflight: ready in $(($(date +%s) - started)) s$( ((rehearse)) || echo ' (NOT rehearsed: --no-rehearsal)'). The one device call (run tool):"
echo "  carry [\".gpu\"], timeout_s 540, command:"
echo "  bash .gpu/run.sh bash scripts/gpu_checkup.sh .gpu/data/fashion-mnist .gpu/data/shakespeare"
