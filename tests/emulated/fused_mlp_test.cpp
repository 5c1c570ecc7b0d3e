// The fused MLP's CUDA kernels (kernels/cuda/fused_mlp.cu), the very source nvcc compiles, run on the
// CPU through tests/emulation/cuda_runtime.h, against double-precision references: every launcher
// at shapes with partial tiles, several K chunks and several n chunks, beta 0 over NaN (never read),
// beta 1 accumulating, the ReLU mask on and off, a missing gradient, a label out of range, the
// arrival counter left at 0, the loss in cross-entropy's summation order, and the same bits run to
// run. On a GPU, tests/test_fused_mlp.cpp runs the compiled kernels themselves.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "kernels/cuda/kernels.h"
#include "tests/emulated/emulated.h"

namespace cumulus::testing {
namespace {

using kernels::FusedGradients;
std::string shape_name(int64_t batch, int64_t in, int64_t out) {
  return "batch " + std::to_string(batch) + ", " + std::to_string(in) + " -> " + std::to_string(out);
}

// ---- forward -------------------------------------------------------------------------------------

// Shapes: widths below one tile; K over three chunks of 128 (257) and features over three tiles of
// 8, the last partial (17); batches of 1 and 17 (a second, partial row tile). Each emulated CUDA
// thread is a host thread, so the shapes are small.
TEST(FusedKernelsEmulated, LinearForwardMatchesTheReference) {
  for (int64_t batch : {1, 17})
    for (auto [in, out] : std::vector<std::pair<int64_t, int64_t>>{{5, 3}, {257, 17}})
      for (bool relu : {false, true}) {
        SCOPED_TRACE(shape_name(batch, in, out) + (relu ? ", relu" : ""));
        const auto x = random_values(batch * in, -1, 1, 1), w = random_values(out * in, -1, 1, 2),
                   b = random_values(out, -1, 1, 3);
        DeviceVector<float> y(static_cast<std::size_t>(batch * out), kNaN);
        kernels::fused_linear_forward_cuda(x.data(), w.data(), b.data(), batch, in, out, relu, y.data(), nullptr);
        std::vector<double> want(y.size());
        for (int64_t r = 0; r < batch; ++r)
          for (int64_t n = 0; n < out; ++n) {
            double s = b[n];
            for (int64_t k = 0; k < in; ++k) s += static_cast<double>(x[r * in + k]) * w[n * in + k];
            want[r * out + n] = relu && s <= 0 ? 0 : s;
          }
        expect_close(y, want, "y");
      }
}

// ---- the head ------------------------------------------------------------------------------------

struct Head {
  int64_t batch, in, classes;
  DeviceVector<float> h, w, b, probs, row_loss;
  DeviceVector<int32_t> labels;
  DeviceValue<float> loss;
  float scale;
};

// The head's forward with labels cycling over the classes (and, with bad_label, row 3 out of range).
Head run_head_forward(int64_t batch, int64_t in, int64_t classes, bool bad_label) {
  Head hd{batch,
          in,
          classes,
          random_values(batch * in, 0, 1, 4),
          random_values(classes * in, -1, 1, 5),
          random_values(classes, -1, 1, 6),
          {},
          {},
          {},
          DeviceValue<float>(kNaN),
          1.0f / static_cast<float>(batch)};
  for (int64_t r = 0; r < batch; ++r) hd.labels.push_back(static_cast<int32_t>((r * 5) % classes));
  if (bad_label && batch > 3) hd.labels[3] = static_cast<int32_t>(classes);
  hd.probs.assign(static_cast<std::size_t>(batch * classes), kNaN);
  hd.row_loss.assign(static_cast<std::size_t>(batch), kNaN);
  DeviceValue<unsigned> counter(0);
  kernels::fused_head_forward_cuda(hd.h.data(), hd.w.data(), hd.b.data(), hd.labels.data(), batch, in, classes,
                                   hd.scale, hd.probs.data(), hd.row_loss.data(), hd.loss.get(), counter.get(),
                                   nullptr);
  EXPECT_EQ(*counter, 0u) << "the last block leaves the arrival counter at 0";
  return hd;
}

TEST(FusedKernelsEmulated, HeadForwardMatchesTheReferenceAndCrossEntropysSum) {
  for (int64_t batch : {1, 40})
    for (auto [in, classes] : std::vector<std::pair<int64_t, int64_t>>{{130, 10}, {64, 32}})
      for (bool bad_label : {false, true}) {
        if (bad_label && batch <= 3) continue;  // row 3 carries the bad label
        SCOPED_TRACE(shape_name(batch, in, classes) + (bad_label ? ", a label out of range" : ""));
        const Head hd = run_head_forward(batch, in, classes, bad_label);
        std::vector<double> probs(hd.probs.size()), rows(hd.row_loss.size());
        double total = 0;
        for (int64_t r = 0; r < batch; ++r) {
          std::vector<double> z(static_cast<std::size_t>(classes));
          double m = -INFINITY, s = 0;
          for (int64_t c = 0; c < classes; ++c) {
            z[c] = hd.b[c];
            for (int64_t k = 0; k < in; ++k) z[c] += static_cast<double>(hd.h[r * in + k]) * hd.w[c * in + k];
            m = std::max(m, z[c]);
          }
          for (double v : z) s += std::exp(v - m);
          for (int64_t c = 0; c < classes; ++c) probs[r * classes + c] = std::exp(z[c] - m) / s;
          const int32_t y = hd.labels[r];
          rows[r] = y >= 0 && y < classes ? m + std::log(s) - z[y] : NAN;
          total += rows[r];
        }
        expect_close(hd.probs, probs, "softmax");
        expect_close(hd.row_loss, rows, "row losses");
        expect_close(DeviceVector<float>{*hd.loss}, {total * hd.scale}, "loss");
        // The sum of the row losses is cross_entropy_forward_cuda's, whose sum is sum_all_cuda's.
        DeviceValue<float> reference_sum(kNaN);
        kernels::sum_all_cuda(hd.row_loss.data(), batch, hd.scale, reference_sum.get(), nullptr);
        EXPECT_EQ(std::memcmp(reference_sum.get(), hd.loss.get(), sizeof(float)), 0)
            << *hd.loss << " vs " << *reference_sum;
      }
}

// dlogits = g (softmax - onehot); dw, db, dx (masked by h > 0 when asked), overwriting NaN with
// beta 0 and adding to 0.25 with beta 1; then dx alone.
TEST(FusedKernelsEmulated, HeadBackwardMatchesTheReference) {
  for (int64_t batch : {7, 40})
    for (auto [in, classes] : std::vector<std::pair<int64_t, int64_t>>{{130, 10}, {64, 32}}) {
      SCOPED_TRACE(shape_name(batch, in, classes));
      Head hd = run_head_forward(batch, in, classes, false);
      for (int64_t i = 0; i < batch * in; i += 3) hd.h[i] = 0.0f;  // the mask has zeros to apply
      DeviceValue<float> grad_loss(1.5f);
      for (int pass = 0; pass < 2; ++pass) {
        const float beta = static_cast<float>(pass), old = pass == 0 ? kNaN : 0.25f;
        const bool mask = pass == 0;
        DeviceVector<float> dw(static_cast<std::size_t>(classes * in), old), db(static_cast<std::size_t>(classes), old),
            dx(static_cast<std::size_t>(batch * in), old);
        const FusedGradients g{dw.data(), beta, db.data(), beta, dx.data(), beta, mask};
        kernels::fused_head_backward_cuda(hd.probs.data(), hd.labels.data(), grad_loss.get(), hd.scale, hd.h.data(),
                                          hd.w.data(), batch, in, classes, g, nullptr);
        auto dlogit = [&](int64_t r, int64_t c) {
          return static_cast<double>(*grad_loss) * hd.scale *
                 (hd.probs[r * classes + c] - (hd.labels[r] == c ? 1.0 : 0.0));
        };
        const double add = pass == 0 ? 0.0 : 0.25;
        std::vector<double> want_dw(dw.size(), add), want_db(db.size(), add), want_dx(dx.size(), 0.0);
        for (int64_t r = 0; r < batch; ++r)
          for (int64_t c = 0; c < classes; ++c) {
            want_db[c] += dlogit(r, c);
            for (int64_t k = 0; k < in; ++k) {
              want_dw[c * in + k] += dlogit(r, c) * hd.h[r * in + k];
              want_dx[r * in + k] += dlogit(r, c) * hd.w[c * in + k];
            }
          }
        for (std::size_t i = 0; i < want_dx.size(); ++i) want_dx[i] = (mask && hd.h[i] <= 0 ? 0.0 : want_dx[i]) + add;
        expect_close(dw, want_dw, "dw, pass " + std::to_string(pass));
        expect_close(db, want_db, "db, pass " + std::to_string(pass));
        expect_close(dx, want_dx, "dx, pass " + std::to_string(pass));
      }
      DeviceVector<float> dx(static_cast<std::size_t>(batch * in), kNaN);
      FusedGradients only_dx;
      only_dx.dx = dx.data();
      kernels::fused_head_backward_cuda(hd.probs.data(), hd.labels.data(), grad_loss.get(), hd.scale, hd.h.data(),
                                        hd.w.data(), batch, in, classes, only_dx, nullptr);
      for (float v : dx) ASSERT_FALSE(std::isnan(v)) << "dx alone: every element written";
    }
}

// ---- a hidden layer's backward ------------------------------------------------------------------

// dw, db and the masked dx = dz W, over NaN (beta 0), adding (beta 1), and with db absent and no
// mask. out 520: the dx tile's reduction runs over three chunks of 256, the last partial; in 35:
// two k tiles of 32, the second partial.
TEST(FusedKernelsEmulated, LinearBackwardMatchesTheReference) {
  for (int64_t batch : {1, 17})
    for (auto [in, out] : std::vector<std::pair<int64_t, int64_t>>{{3, 10}, {35, 520}}) {
      SCOPED_TRACE(shape_name(batch, in, out));
      const auto dz = random_values(batch * out, -1, 1, 7), w = random_values(out * in, -1, 1, 9);
      auto x = random_values(batch * in, -0.5f, 1, 8);
      for (int64_t i = 0; i < batch * in; i += 4) x[i] = 0.0f;
      for (int pass = 0; pass < 3; ++pass) {
        const float beta = pass == 1 ? 1.0f : 0.0f, old = pass == 1 ? 0.5f : kNaN;
        const bool mask = pass != 2;
        DeviceVector<float> dw(static_cast<std::size_t>(out * in), old), db(static_cast<std::size_t>(out), old),
            dx(static_cast<std::size_t>(batch * in), old);
        FusedGradients g{dw.data(), beta, db.data(), beta, dx.data(), beta, mask};
        if (pass == 2) g.db = nullptr;
        kernels::fused_linear_backward_cuda(dz.data(), x.data(), w.data(), batch, in, out, g, nullptr);
        const double add = pass == 1 ? 0.5 : 0.0;
        std::vector<double> want_dw(dw.size(), add), want_db(db.size(), add), want_dx(dx.size(), 0.0);
        for (int64_t r = 0; r < batch; ++r)
          for (int64_t n = 0; n < out; ++n) {
            const double d = dz[r * out + n];
            want_db[n] += d;
            for (int64_t k = 0; k < in; ++k) {
              want_dw[n * in + k] += d * x[r * in + k];
              want_dx[r * in + k] += d * w[n * in + k];
            }
          }
        for (std::size_t i = 0; i < want_dx.size(); ++i) want_dx[i] = (mask && x[i] <= 0 ? 0.0 : want_dx[i]) + add;
        const std::string tag = ", pass " + std::to_string(pass);
        expect_close(dw, want_dw, "dw" + tag);
        expect_close(dx, want_dx, "dx" + tag);
        if (pass == 2)
          for (float v : db) ASSERT_TRUE(std::isnan(v)) << "db absent: not written";
        else
          expect_close(db, want_db, "db" + tag);
      }
    }
}

// The seed MLP's own shapes at micro-batch 16, each launcher once: 784 is six chunks of 128 and a
// partial seventh, 512 outputs are 64 feature tiles and two n chunks of 256.
TEST(FusedKernelsEmulated, SeedShapesMatchTheReference) {
  const int64_t batch = 16;
  const auto x = random_values(batch * 784, 0, 1, 20), w1 = random_values(512 * 784, -0.05f, 0.05f, 21),
             b1 = random_values(512, -0.05f, 0.05f, 22), dz = random_values(batch * 512, -1, 1, 23),
             w2 = random_values(512 * 512, -0.05f, 0.05f, 24);
  DeviceVector<float> h(static_cast<std::size_t>(batch * 512), kNaN);
  kernels::fused_linear_forward_cuda(x.data(), w1.data(), b1.data(), batch, 784, 512, true, h.data(), nullptr);
  std::vector<double> want_h(h.size());
  for (int64_t r = 0; r < batch; ++r)
    for (int64_t n = 0; n < 512; ++n) {
      double s = b1[n];
      for (int64_t k = 0; k < 784; ++k) s += static_cast<double>(x[r * 784 + k]) * w1[n * 784 + k];
      want_h[r * 512 + n] = std::max(s, 0.0);
    }
  expect_close(h, want_h, "h1");
  // The second layer's backward: dW2, db2 and dh1 masked by h1 > 0.
  DeviceVector<float> dw(static_cast<std::size_t>(512 * 512), kNaN), db(512, kNaN),
      dx(static_cast<std::size_t>(batch * 512), kNaN);
  const FusedGradients g{dw.data(), 0.0f, db.data(), 0.0f, dx.data(), 0.0f, true};
  kernels::fused_linear_backward_cuda(dz.data(), h.data(), w2.data(), batch, 512, 512, g, nullptr);
  std::vector<double> want_dw(dw.size(), 0.0), want_db(db.size(), 0.0), want_dx(dx.size(), 0.0);
  for (int64_t r = 0; r < batch; ++r)
    for (int64_t n = 0; n < 512; ++n) {
      const double d = dz[r * 512 + n];
      want_db[n] += d;
      for (int64_t k = 0; k < 512; ++k) {
        want_dw[n * 512 + k] += d * h[r * 512 + k];
        want_dx[r * 512 + k] += d * w2[n * 512 + k];
      }
    }
  for (std::size_t i = 0; i < want_dx.size(); ++i)
    if (h[i] <= 0) want_dx[i] = 0;
  expect_close(dw, want_dw, "dW2");
  expect_close(db, want_db, "db2");
  expect_close(dx, want_dx, "dh1");
}

// Every sum in a fixed order: two launches give the same bits.
TEST(FusedKernelsEmulated, TwoRunsGiveTheSameBits) {
  const int64_t batch = 17, in = 40, out = 257;
  const auto dz = random_values(batch * out, -1, 1, 10), x = random_values(batch * in, -0.5f, 1, 11),
             w = random_values(out * in, -1, 1, 12), w_forward = random_values(in * out, -1, 1, 13),
             b_forward = random_values(in, -1, 1, 14);
  auto run = [&] {
    DeviceVector<float> dw(static_cast<std::size_t>(out * in)), db(static_cast<std::size_t>(out)),
        dx(static_cast<std::size_t>(batch * in)), y(static_cast<std::size_t>(batch * in));
    const FusedGradients g{dw.data(), 0.0f, db.data(), 0.0f, dx.data(), 0.0f, true};
    kernels::fused_linear_backward_cuda(dz.data(), x.data(), w.data(), batch, in, out, g, nullptr);
    kernels::fused_linear_forward_cuda(dz.data(), w_forward.data(), b_forward.data(), batch, out, in, true, y.data(),
                                       nullptr);
    dw.insert(dw.end(), db.begin(), db.end());
    dw.insert(dw.end(), dx.begin(), dx.end());
    dw.insert(dw.end(), y.begin(), y.end());
    return dw;
  };
  const DeviceVector<float> a = run(), b = run();
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
}

}  // namespace
}  // namespace cumulus::testing
