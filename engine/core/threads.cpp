#include "cumulus/core/threads.h"

#include <cblas.h>
#include <dlfcn.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <strings.h>
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include "cumulus/core/error.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vec_math.h"

// Note [OpenBLAS under an address-space limit]
// OpenBLAS (0.3.21, the pthread build) keeps one buffer of BUFFER_SIZE (128 MiB + a page on
// x86-64) for every thread that runs BLAS: a worker takes its buffer as it starts, the calling
// thread at its first GEMM, and both keep it until exit. When malloc fails it retries forever. Its
// constructor starts a worker per core before main, so under `ulimit -v` a worker whose buffer did
// not fit spins in malloc from the start: a GEMM that hands it work waits forever, and so does the
// exit-time thread shutdown that joins it, even after a clean out-of-memory message. No OpenBLAS
// setting bounds that loop, so we make sure it never starts: under a finite RLIMIT_AS,
// - openblas_preinit (in the executable's .preinit_array, before OpenBLAS's constructor)
//   re-executes the program once with OPENBLAS_NUM_THREADS=1, so OpenBLAS starts no worker;
// - fit_cpu_threads/set_cpu_threads, before each buffer OpenBLAS will take, check that the address
//   space still has room for it (a mapping of that size succeeds; for a worker also its stack and
//   the 64 MiB malloc arena glibc reserves for a new thread), then run a GEMM on that many threads
//   so OpenBLAS takes the buffer now, while the room is there. A buffer that does not fit is an
//   OutOfMemory naming the limit instead of a hang.
// Once taken, the buffers are reused by every later GEMM of those threads, so no later GEMM
// allocates in OpenBLAS (BLAS called from another thread of one's own would take another buffer).
// Without a limit nothing changes. The sizes are this build's; a build with smaller buffers is
// only checked more strictly.

// Note [OpenBLAS kernels on an unrecognized CPU]
// OpenBLAS (a DYNAMIC_ARCH build: Debian's) picks its kernels by CPU model at load. 0.3.21 does not
// know the model a VM may report (here "Intel(R) Xeon(R) Processor", AVX-512 capable) and falls back
// to Prescott's SSE3 kernels: a 512^3 SGEMM took 20.4 ms there against 3.0 ms with its SkylakeX
// kernels on the same core. On AMD Zen 4 (family 0x19 with AVX-512, which it runs on 256-bit
// units) it picks Cooperlake's AVX-512 kernels, whose blocking and packing cost more than its
// Haswell kernels' on the same FMA units: the small GPT's [512, 128] x [128, 384]-sized products
// took 486 us against 465, its step 127.8 ms against 122.9 (paired runs), the seed MLP's GEMMs at
// 64 rows 2.13 ms against 2.01 (one thread, EPYC family 25 model 17: bench/results/2026-11-29-
// cpu-zen4-blas). So when the library loads (after OpenBLAS's own constructor, before any GEMM),
// if the user set no OPENBLAS_CORETYPE and OpenBLAS
// chose Prescott on a CPU with AVX-512 (F, CD, BW, DQ, VL) or AVX2 and FMA, or anything but Haswell
// on Zen 4, its core selection runs again with OPENBLAS_CORETYPE set to SkylakeX or Haswell, through
// the two functions a DYNAMIC_ARCH build exports for it (looked up with dlsym: a build without them
// keeps its choice). The variable stays set, so the programs a test or the app starts choose the
// same kernels at once. Results change only as any two OpenBLAS kernels' summation orders do.

namespace cumulus {

namespace {

bool cpu_has_avx512() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
         __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
}

// AMD Zen 4: family 0x19 (Zen 3 has no AVX-512, Zen 5 is family 0x1a).
bool cpu_is_zen4() {
#if defined(__x86_64__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid(0, &a, &b, &c, &d) == 0 || b != 0x68747541 || d != 0x69746e65 || c != 0x444d4163)  // AuthenticAMD
    return false;
  __get_cpuid(1, &a, &b, &c, &d);
  const unsigned family = ((a >> 8) & 0xf) + ((a >> 20) & 0xff);
  return family == 0x19 && cpu_has_avx512();
#else
  return false;
#endif
}

// The kernels to select instead of `chosen`, or null to keep it.
const char* better_openblas_core(const char* chosen) {
  if (cpu_is_zen4()) return strcasecmp(chosen, "haswell") == 0 ? nullptr : "Haswell";
  if (strcasecmp(chosen, "prescott") != 0) return nullptr;
  if (cpu_has_avx512()) return "SkylakeX";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
  return nullptr;
}

bool select_openblas_core() {
  const char* chosen = openblas_get_corename();
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr || chosen == nullptr) return false;
  const char* core = better_openblas_core(chosen);
  auto quit = reinterpret_cast<void (*)()>(::dlsym(RTLD_DEFAULT, "gotoblas_dynamic_quit"));
  auto init = reinterpret_cast<void (*)()>(::dlsym(RTLD_DEFAULT, "gotoblas_dynamic_init"));
  if (core == nullptr || quit == nullptr || init == nullptr) return false;
  ::setenv("OPENBLAS_CORETYPE", core, 1);
  quit();
  init();
  return true;
}

const bool g_openblas_core_selected = select_openblas_core();

constexpr std::size_t kMiB = std::size_t(1) << 20;
constexpr std::size_t kBlasBufferBytes = 128 * kMiB + 4096;
constexpr std::size_t kMallocArenaBytes = 64 * kMiB;

constexpr char kVariable[] = "OPENBLAS_NUM_THREADS=";
constexpr char kMarker[] = "CUMULUS_OPENBLAS_PREINIT=";
// Set before constructors run (constant-initialized): the marker's value after the re-execution.
const char* g_marker = nullptr;
int g_pool = 0;  // worker threads + 1 that hold their buffer (0: not yet known)
thread_local bool t_caller_has_buffer = false;

bool address_space_limited(rlim_t* limit) {
  rlimit r{};
  if (::getrlimit(RLIMIT_AS, &r) != 0 || r.rlim_cur == RLIM_INFINITY) return false;
  *limit = r.rlim_cur;
  return true;
}

bool address_space_has_room(std::size_t bytes) {
  void* p = ::mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return false;
  ::munmap(p, bytes);
  return true;
}

std::size_t worker_bytes() {
  std::size_t stack = 8 * kMiB;
  pthread_attr_t attr;
  if (::pthread_getattr_default_np(&attr) == 0) {
    ::pthread_attr_getstacksize(&attr, &stack);
    ::pthread_attr_destroy(&attr);
  }
  return kBlasBufferBytes + stack + kMallocArenaBytes;
}

// A GEMM large enough for OpenBLAS to split over every thread: each takes its buffer now.
void take_blas_buffers() {
  constexpr int n = 256;
  std::vector<float> a(static_cast<std::size_t>(n) * n, 1.0f), c(a.size());
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, a.data(), n, 0.0f, c.data(), n);
}

[[noreturn]] void throw_no_room(rlim_t limit, int thread, std::size_t bytes) {
  throw OutOfMemory("OpenBLAS thread " + std::to_string(thread) + " needs " + std::to_string(bytes / kMiB) +
                    " MiB of address space, which the address-space limit (ulimit -v) of " +
                    std::to_string(limit / 1024) + " KiB no longer leaves free; raise the limit" +
                    (thread > 1 ? " or use fewer threads (--threads)" : ""));
}

// Takes the buffers of up to n threads under `limit`; returns how many threads have one.
int take_buffers_within(int n, rlim_t limit, bool strict) {
  if (!t_caller_has_buffer) {
    openblas_set_num_threads(1);  // the workers OpenBLAS may already have hold their buffers (or cannot be helped)
    if (!address_space_has_room(kBlasBufferBytes)) throw_no_room(limit, 1, kBlasBufferBytes);
    take_blas_buffers();
    t_caller_has_buffer = true;
  }
  int fitted = 1;
  for (int k = 2; k <= n; ++k) {
    if (k > g_pool) {
      if (!address_space_has_room(worker_bytes())) {
        openblas_set_num_threads(fitted);
        if (strict) throw_no_room(limit, k, worker_bytes());
        break;
      }
      openblas_set_num_threads(k);  // starts worker k - 1, which takes its buffer as it starts
      take_blas_buffers();          // returns once that worker has run its share
      g_pool = k;
    }
    fitted = k;
  }
  openblas_set_num_threads(fitted);
  return fitted;
}

// Without an address-space limit, OpenBLAS runs one thread per call and the GEMMs split across the
// kernels' pool (Note [One pool for the kernels and the BLAS], kernels/cpu/gemm.cpp); under one,
// OpenBLAS keeps the threads whose buffers fit and runs each GEMM on them.
int set_threads(int n, bool strict) {
  CUMULUS_CHECK(n >= 1, InvalidArgument, "set_cpu_threads: need at least 1 thread, got ", n);
  rlim_t limit = 0;
  if (!address_space_limited(&limit)) {
    openblas_set_num_threads(1);
    kernels::set_kernel_threads(n, true);
    return n;
  }
  if (g_pool == 0) g_pool = openblas_get_num_threads();  // the workers OpenBLAS started before main
  const int fitted = take_buffers_within(n, limit, strict);
  kernels::set_kernel_threads(fitted, false);
  return fitted;
}

// The threads OpenBLAS started with (its reading of OPENBLAS_NUM_THREADS and the cores), taken
// over by the kernels' pool as the library loads, after OpenBLAS's own constructor.
int take_over_blas_threads() {
  const int n = openblas_get_num_threads();
  rlim_t limit = 0;
  if (address_space_limited(&limit)) {
    kernels::set_kernel_threads(n, false);
  } else {
    openblas_set_num_threads(1);
    kernels::set_kernel_threads(n, true);
  }
  return n;
}

const int g_initial_threads = take_over_blas_threads();

}  // namespace

// Re-executes the program once with OPENBLAS_NUM_THREADS=1 (the user's value kept in kMarker): a
// variable set here would not reach OpenBLAS, as libc's own initialization, which runs after
// .preinit_array, resets the environment to the one the process started with.
void openblas_preinit(int, char** argv, char** envp) {
  rlim_t limit = 0;
  if (!address_space_limited(&limit) || envp == nullptr) return;
  const std::size_t marker_len = std::strlen(kMarker), variable_len = std::strlen(kVariable);
  std::size_t n = 0;
  const char* user_value = nullptr;
  for (char** e = envp; *e != nullptr; ++e, ++n) {
    if (std::strncmp(*e, kMarker, marker_len) == 0) {
      g_marker = *e + marker_len;
      return;  // the second start: OpenBLAS reads OPENBLAS_NUM_THREADS=1
    }
    if (std::strncmp(*e, kVariable, variable_len) == 0) user_value = *e + variable_len;
  }
  char** env = static_cast<char**>(std::malloc((n + 3) * sizeof(char*)));
  const std::size_t saved_len = user_value != nullptr ? std::strlen(user_value) : 0;
  char* marker = static_cast<char*>(std::malloc(marker_len + 2 + saved_len));
  if (env == nullptr || marker == nullptr) return;
  std::size_t k = 0;
  for (char** e = envp; *e != nullptr; ++e)
    if (std::strncmp(*e, kVariable, variable_len) != 0) env[k++] = *e;
  std::memcpy(marker, kMarker, marker_len);
  marker[marker_len] = user_value != nullptr ? '+' : '-';  // '+' and the value, or '-': unset
  if (user_value != nullptr) std::memcpy(marker + marker_len + 1, user_value, saved_len);
  marker[marker_len + 1 + saved_len] = '\0';
  env[k++] = const_cast<char*>("OPENBLAS_NUM_THREADS=1");
  env[k++] = marker;
  env[k] = nullptr;
  ::execve("/proc/self/exe", argv, env);  // on failure, start as OpenBLAS would have anyway
  std::free(marker);
  std::free(env);
}

void set_cpu_threads(int n) { set_threads(n, true); }

int fit_cpu_threads(int n) { return set_threads(n, false); }

int cpu_threads() { return kernels::kernel_threads(); }

int use_cpu_threads(int n) {
  CUMULUS_CHECK(n >= 0, InvalidArgument, "use_cpu_threads: need 0 (every core) or a thread count, got ", n);
  if (n == 0) return fit_cpu_threads(default_cpu_threads());
  set_cpu_threads(n);
  return n;
}

const char* blas_core() {
  const char* name = openblas_get_corename();
  return name != nullptr ? name : "unknown";
}

const char* cpu_capability() {
  if (kernels::vec512::available()) return "avx512";
  return kernels::vec::available() ? "avx2" : "scalar";
}

int default_cpu_threads() {
  if (g_marker == nullptr) return g_initial_threads;
  // Give children the environment the user gave us; OpenBLAS has read its own already.
  const bool user_set = g_marker[0] == '+';
  if (user_set) ::setenv("OPENBLAS_NUM_THREADS", g_marker + 1, 1);
  else ::unsetenv("OPENBLAS_NUM_THREADS");
  const std::string saved = user_set ? std::string(g_marker + 1) : std::string();
  ::unsetenv("CUMULUS_OPENBLAS_PREINIT");
  g_marker = nullptr;
  const char* const values[] = {saved.c_str(), std::getenv("GOTO_NUM_THREADS"), std::getenv("OMP_NUM_THREADS")};
  for (const char* value : values) {
    const int n = value != nullptr ? std::atoi(value) : 0;
    if (n > 0) return std::min(n, openblas_get_num_procs());
  }
  return openblas_get_num_procs();
}

}  // namespace cumulus
