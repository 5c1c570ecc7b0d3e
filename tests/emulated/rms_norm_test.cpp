// rms_norm's CUDA kernels (kernels/cuda/rms_norm.cu) on the CPU emulation, and the CPU kernels
// (kernels/cpu/rms_norm.cpp, whichever vector path this CPU and CUMULUS_CPU_CAPABILITY give), both
// against a double reference: forward, dx with beta 0 over NaN and beta 1 adding, dweight with
// beta 0 over NaN and beta 1; rows narrower than a vector (1, 7), with a tail (300), wider than a
// block, without a weight; more rows than the weight kernel's groups.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "kernels/cpu/rms_norm_kernels.h"
#include "kernels/cuda/rms_norm_kernels.h"
#include "tests/emulated/emulated.h"

namespace cumulus::testing {
namespace {

template <typename T>
class RmsNormEmulated : public ::testing::Test {};
TYPED_TEST_SUITE(RmsNormEmulated, StorageTypes, StorageTypeName);

struct RmsNormRef {
  std::vector<double> y, dx, dw;
};

RmsNormRef rms_norm_reference(const DeviceVector<float>& x, const DeviceVector<float>& dy, const float* w, int64_t rows,
                              int64_t cols, float eps) {
  RmsNormRef ref{std::vector<double>(x.size()), std::vector<double>(x.size()), std::vector<double>(cols, 0.0)};
  for (int64_t r = 0; r < rows; ++r) {
    double squares = 0, gx = 0;
    for (int64_t c = 0; c < cols; ++c) squares += static_cast<double>(x[r * cols + c]) * x[r * cols + c];
    const double inv = 1.0 / std::sqrt(squares / cols + eps);
    for (int64_t c = 0; c < cols; ++c) {
      const double wc = w != nullptr ? w[c] : 1.0, xhat = x[r * cols + c] * inv;
      ref.y[r * cols + c] = xhat * wc;
      ref.dw[c] += dy[r * cols + c] * xhat;
      gx += dy[r * cols + c] * wc * xhat;
    }
    for (int64_t c = 0; c < cols; ++c) {
      const double wc = w != nullptr ? w[c] : 1.0, xhat = x[r * cols + c] * inv;
      ref.dx[r * cols + c] = inv * (dy[r * cols + c] * wc - xhat * gx / cols);
    }
  }
  return ref;
}

TYPED_TEST(RmsNormEmulated, BothDevicesMatchADoubleReference) {
  using T = TypeParam;
  const double tol = 4 * unit_rounding<T>() + 1e-5;
  for (auto [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{{3, 1}, {5, 7}, {11, 300}, {2, 1030}})
    for (bool weighted : {true, false})
      for (bool cuda : {false, true}) {
        SCOPED_TRACE(std::to_string(rows) + " x " + std::to_string(cols) + (weighted ? ", weight" : "") +
                     (cuda ? ", CUDA" : ", CPU"));
        const auto x = stored_as<T>(random_values(rows * cols, -2, 3, 1));
        const auto dy = stored_as<T>(random_values(rows * cols, -1, 1, 2));
        const auto w = random_values(cols, 0.5f, 1.5f, 3);
        const float* wp = weighted ? w.data() : nullptr;
        const float eps = 1e-6f;
        const RmsNormRef ref = rms_norm_reference(widened(x), widened(dy), wp, rows, cols, eps);
        DeviceVector<T> y(x.size());
        DeviceVector<float> rstd(rows);
        if (cuda) kernels::rms_norm_forward_cuda(x.data(), wp, rows, cols, eps, y.data(), rstd.data(), nullptr);
        else kernels::rms_norm_forward_cpu(x.data(), wp, rows, cols, eps, y.data(), rstd.data());
        expect_within(y, ref.y, tol, tol, "y");
        const auto backward = [&](float beta, T* dx, float beta_dw, float* dw) {
          if (cuda)
            kernels::rms_norm_backward_cuda(x.data(), dy.data(), wp, rstd.data(), rows, cols, beta, dx, beta_dw, dw,
                                            nullptr);
          else kernels::rms_norm_backward_cpu(x.data(), dy.data(), wp, rstd.data(), rows, cols, beta, dx, beta_dw, dw);
        };
        DeviceVector<T> dx(x.size(), kernels::from_f32<T>(kNaN));
        DeviceVector<float> dw(cols, kNaN);
        backward(0.0f, dx.data(), 0.0f, dw.data());
        expect_within(dx, ref.dx, tol, 1e-4, "dx, beta 0");
        expect_within(dw, ref.dw, 1e-5, 1e-4, "dweight, beta 0");
        DeviceVector<T> dx1(x.size(), kernels::from_f32<T>(1.0f));
        DeviceVector<float> dw1(cols, 2.0f);
        backward(1.0f, dx1.data(), 1.0f, dw1.data());
        std::vector<double> dx_plus(ref.dx), dw_plus(ref.dw);
        for (double& v : dx_plus) v += 1.0;
        for (double& v : dw_plus) v += 2.0;
        expect_within(dx1, dx_plus, tol, 1e-4, "dx, beta 1");
        expect_within(dw1, dw_plus, 1e-5, 1e-4, "dweight, beta 1");
        DeviceVector<T> dx_only(x.size(), kernels::from_f32<T>(kNaN));
        backward(0.0f, dx_only.data(), 0.0f, nullptr);
        expect_within(dx_only, ref.dx, tol, 1e-4, "dx alone");
      }
}

}  // namespace
}  // namespace cumulus::testing
