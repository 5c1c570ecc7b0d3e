// Beta 0 never loads the destination (cuda_common::store_blend's rule), in every kernel family that
// writes a gradient sink: pointwise, structural, batch norm, elementwise, conv's bias gradient. On
// a GPU a load of a fresh gradient buffer is what `compute-sanitizer --tool initcheck` reports; here
// the destination's pages are mapped without access and the first fault on each page is classed as
// a load or a store from the fault's error code, then the page is opened so the kernel runs on. A
// kernel that loads before it tests beta faults with a load first (every thread loads its element
// before storing it); one that never loads faults with stores only. The destination holds NaN, so
// a NaN read and kept would also show in the results. x86-64 Linux only (the error code's layout);
// skipped elsewhere.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#if defined(__linux__) && defined(__x86_64__)
#include <signal.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>
#define CUMULUS_WATCH_LOADS 1
#endif

#include "kernels/cuda/kernels.h"
#include "kernels/cuda/pointwise_kernels.h"
#include "kernels/cuda/structural_kernels.h"
#include "tests/emulated/emulated.h"

namespace cumulus::testing {
namespace {

#if CUMULUS_WATCH_LOADS

// The watched range and what the faults in it were; one watched buffer at a time.
std::atomic<uintptr_t> g_begin{0}, g_end{0};
std::atomic<int> g_loads{0}, g_stores{0};
struct sigaction g_previous;

void on_fault(int sig, siginfo_t* info, void* context) {
  const auto addr = reinterpret_cast<uintptr_t>(info->si_addr);
  if (addr < g_begin.load() || addr >= g_end.load()) {  // not ours: the previous handler's
    sigaction(SIGSEGV, &g_previous, nullptr);
    raise(sig);
    return;
  }
  const auto* uc = static_cast<const ucontext_t*>(context);
  const bool store = (uc->uc_mcontext.gregs[REG_ERR] & 2) != 0;  // x86 page-fault error code, bit 1: write
  (store ? g_stores : g_loads).fetch_add(1);
  const uintptr_t page = addr & ~static_cast<uintptr_t>(sysconf(_SC_PAGESIZE) - 1);
  mprotect(reinterpret_cast<void*>(page), static_cast<std::size_t>(sysconf(_SC_PAGESIZE)), PROT_READ | PROT_WRITE);
}

// n elements of T, every one NaN, on pages no access is allowed to until the first fault opens one.
template <typename T>
class WatchedDestination {
 public:
  explicit WatchedDestination(int64_t n) : n_(n) {
    const auto page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
    bytes_ = (static_cast<std::size_t>(n) * sizeof(T) + page - 1) / page * page;
    void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::runtime_error("mmap failed");
    data_ = static_cast<T*>(p);
    for (int64_t i = 0; i < n; ++i) data_[i] = kernels::from_f32<T>(kNaN);
    mprotect(p, bytes_, PROT_NONE);
    cuda_emulation::adopt_device_memory(p, bytes_);
    g_loads = 0;
    g_stores = 0;
    g_begin = reinterpret_cast<uintptr_t>(p);
    g_end = reinterpret_cast<uintptr_t>(p) + bytes_;
    struct sigaction action = {};
    action.sa_sigaction = on_fault;
    action.sa_flags = SA_SIGINFO;
    sigemptyset(&action.sa_mask);
    sigaction(SIGSEGV, &action, &g_previous);
  }
  ~WatchedDestination() {
    sigaction(SIGSEGV, &g_previous, nullptr);
    g_begin = 0;
    g_end = 0;
    cuda_emulation::forget_device_memory(data_);
    munmap(data_, bytes_);
  }
  WatchedDestination(const WatchedDestination&) = delete;
  WatchedDestination& operator=(const WatchedDestination&) = delete;

  T* get() { return data_; }
  // Loads seen, stores seen, and the values (opening every page: call after the kernel).
  int loads() const { return g_loads.load(); }
  int stores() const { return g_stores.load(); }
  std::vector<float> values() {
    mprotect(data_, bytes_, PROT_READ | PROT_WRITE);
    std::vector<float> v(static_cast<std::size_t>(n_));
    for (int64_t i = 0; i < n_; ++i) v[i] = kernels::to_f32(data_[i]);
    return v;
  }

 private:
  int64_t n_;
  std::size_t bytes_ = 0;
  T* data_ = nullptr;
};

// Runs `kernel(destination)` with beta 0 on a watched destination of n elements: no load, at least
// one store, and no NaN in the results (the inputs are finite).
template <typename T, typename Kernel>
void expect_no_load(const std::string& what, int64_t n, Kernel kernel) {
  SCOPED_TRACE(what);
  WatchedDestination<T> dst(n);
  kernel(dst.get());
  EXPECT_EQ(dst.loads(), 0) << "beta 0 loaded the destination";
  EXPECT_GT(dst.stores(), 0) << "nothing was written";
  const std::vector<float> got = dst.values();
  for (std::size_t i = 0; i < got.size(); ++i) ASSERT_FALSE(std::isnan(got[i])) << "NaN kept at " << i;
}

#endif  // CUMULUS_WATCH_LOADS

constexpr int64_t kRows = 37, kCols = 300, kN = kRows * kCols;  // several pages of floats

class BetaZeroEmulated : public ::testing::Test {
 protected:
  void SetUp() override {
#if !CUMULUS_WATCH_LOADS
    GTEST_SKIP() << "the load watch needs x86-64 Linux";
#endif
  }
  const DeviceVector<float> x = random_values(kN, 0.5f, 1.5f, 1), dy = random_values(kN, -1, 1, 2);
};

#if CUMULUS_WATCH_LOADS

TEST_F(BetaZeroEmulated, PointwiseBackwardNeverLoadsTheDestination) {
  using kernels::BinaryOp;
  using kernels::UnaryOp;
  expect_no_load<float>("unary_backward", kN, [&](float* dx) {
    kernels::unary_backward_cuda(UnaryOp::tanh, x.data(), dy.data(), 0.0f, dx, kN, nullptr);
  });
  expect_no_load<float>("scalar_backward", kN, [&](float* dx) {
    kernels::scalar_backward_cuda(BinaryOp::div, true, 2.0f, x.data(), dy.data(), 0.0f, dx, kN, nullptr);
  });
  expect_no_load<float>("softmax_backward", kN, [&](float* dx) {
    kernels::softmax_backward_cuda(false, x.data(), dy.data(), 0.0f, dx, kRows, kCols, nullptr);
  });
  const DeviceValue<int64_t> offset(3);
  expect_no_load<float>("dropout_backward", kN, [&](float* dx) {
    kernels::dropout_backward_cuda(7, offset.get(), 0.25f, 1.0f / 0.75f, dy.data(), 0.0f, dx, kN, nullptr);
  });
}

TEST_F(BetaZeroEmulated, StructuralBackwardNeverLoadsTheDestination) {
  const DeviceVector<float> mean(kRows, 1.0f), rstd(kRows, 2.0f);
  expect_no_load<float>("layer_norm_backward_dx", kN, [&](float* dx) {
    kernels::layer_norm_backward_dx_cuda(x.data(), dy.data(), nullptr, mean.data(), rstd.data(), kRows, kCols, 0.0f, dx,
                                         nullptr);
  });
  DeviceVector<float> dbias(kCols);
  expect_no_load<float>("layer_norm_param_grads", kCols, [&](float* dw) {
    kernels::layer_norm_param_grads_cuda(x.data(), dy.data(), mean.data(), rstd.data(), kRows, kCols, 0.0f, dw, 0.0f,
                                         dbias.data(), nullptr);
  });
  expect_no_load<float>("narrow_backward", kN, [&](float* dx) {
    kernels::narrow_backward_cuda(dy.data(), kRows, kCols, 100, 150, 1, 0.0f, dx, nullptr);
  });
}

TEST_F(BetaZeroEmulated, BatchNormBackwardNeverLoadsTheDestination) {
  const int64_t n = kRows, c = 3, hw = kCols / c;
  const DeviceVector<float> gamma(c, 1.5f), mean(c, 1.0f), invstd(c, 2.0f);
  DeviceVector<float> dgamma(c), dbeta(c);
  expect_no_load<float>("batch_norm_backward_training dx", kN, [&](float* dx) {
    kernels::batch_norm_backward_training_cuda(x.data(), dy.data(), gamma.data(), mean.data(), invstd.data(), n, c, hw,
                                               0.0f, dx, 0.0f, dgamma.data(), 0.0f, dbeta.data(), nullptr);
  });
  expect_no_load<float>("batch_norm_backward_training dgamma", c, [&](float* dg) {
    kernels::batch_norm_backward_training_cuda(x.data(), dy.data(), gamma.data(), mean.data(), invstd.data(), n, c, hw,
                                               0.0f, static_cast<float*>(nullptr), 0.0f, dg, 0.0f, dbeta.data(),
                                               nullptr);
  });
  expect_no_load<float>("batch_norm_backward_inference dx", kN, [&](float* dx) {
    kernels::batch_norm_backward_inference_cuda(DType::f32, x.data(), dy.data(), gamma.data(), mean.data(),
                                                invstd.data(), n, c, hw, 0.0f, dx, 0.0f, nullptr, 0.0f, nullptr,
                                                nullptr);
  });
}

TEST_F(BetaZeroEmulated, ElementwiseAndConvBiasNeverLoadTheDestination) {
  const DeviceValue<float> scalar(3.0f);
  expect_no_load<float>("fill_from_scalar", kN,
                        [&](float* out) { kernels::fill_from_scalar_cuda(scalar.get(), 0.5f, 0.0f, out, kN, nullptr); });
  expect_no_load<float>("relu_backward", kN,
                        [&](float* dx) { kernels::relu_backward_cuda(x.data(), dy.data(), 0.0f, dx, kN, nullptr); });
  expect_no_load<float>("accumulate", kN, [&](float* y) { kernels::accumulate_cuda(x.data(), 0.0f, y, kN, nullptr); });
  expect_no_load<float>("conv2d_bias_grad", kRows, [&](float* dbias) {
    kernels::conv2d_bias_grad_cuda(dy.data(), 1, kRows, kCols, 0.0f, dbias, nullptr);
  });
  expect_no_load<float>("sum_rows", kCols,
                        [&](float* out) { kernels::sum_rows_cuda(x.data(), kRows, kCols, 0.0f, out, nullptr); });
}

#endif  // CUMULUS_WATCH_LOADS

}  // namespace
}  // namespace cumulus::testing
