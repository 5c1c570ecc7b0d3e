// The fused attention CUDA kernels on the CPU emulation against the CPU kernels
// (kernels/cpu/attention.cpp), both sets: attention.cu's row kernels (Note [CUDA attention
// kernels], the default) and attention_tiled.cu's register-tiled ones (Note [Tiled CUDA attention
// kernels], opt-in): forward output and log-sum-exp, backward dq, dk and dv. They sum in other
// orders than the CPU (a tile of keys at a time with SLEEF's exp there, the host's expf here), so
// within a few roundings of the stored type rather than bit for bit. q, k and v are read as the
// permuted views of a qkv projection [B, T, 3C] (strides [T*3C, D, 3C, 1]) and, for Tq != Tk, as
// dense tensors. Every compiled head size (32, 64, 128) at its own size and padded (D = 4 .. 100
// run in the next larger), T across each set's blocks and tiles (row kernels: 64, 32, 32 rows a
// block, 128, 64, 32 staged; tiled: 64 rows and keys for D <= 64, 32 and 64 x 32 for D = 128) and
// not a multiple of them; outputs start as NaN, so every element must be written, and the
// emulation fills shared memory (static and dynamic) with NaN at each block's start, so a read of a
// staged value never written shows; each gradient also alone (the others null), and, for the qkv
// views, all three written into one gradient of the projection with dout in the output's layout
// (the packed op's backward), on both devices' kernels. A head over 128 columns is refused. Every
// result is the same bits on a second run under another schedule.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <string>
#include <vector>

#include "kernels/cpu/attention_kernels.h"
#include "kernels/cuda/attention_kernels.h"
#include "tests/emulated/emulated.h"

namespace cumulus::testing {
namespace {

using kernels::AttentionGeometry;
using kernels::from_f32;

// Both sets of CUDA kernels: attention.cu's row kernels (the default) and attention_tiled.cu's
// register-tiled ones (opt-in), each against the CPU.
template <typename T>
void cuda_forward(bool tiled, const AttentionGeometry& g, const T* q, const T* k, const T* v, T* out, float* lse) {
  if (tiled) kernels::attention_forward_tiled_cuda(g, q, k, v, out, lse, nullptr);
  else kernels::attention_forward_cuda(g, q, k, v, out, lse, nullptr);
}
template <typename T>
void cuda_backward(bool tiled, const AttentionGeometry& g, const T* q, const T* k, const T* v, const T* out,
                   const float* lse, const T* dout, float* delta, T* dq, T* dk, T* dv) {
  if (tiled) kernels::attention_backward_tiled_cuda(g, q, k, v, out, lse, dout, delta, dq, dk, dv, nullptr);
  else kernels::attention_backward_cuda(g, q, k, v, out, lse, dout, delta, dq, dk, dv, nullptr);
}

template <typename T>
class AttentionEmulated : public ::testing::Test {};
TYPED_TEST_SUITE(AttentionEmulated, StorageTypes, StorageTypeName);

struct Config {
  int64_t B, H, tq, tk, D;
  bool causal, from_qkv;
};

std::string what(const Config& c) {
  return "B " + std::to_string(c.B) + " H " + std::to_string(c.H) + " tq " + std::to_string(c.tq) + " tk " +
         std::to_string(c.tk) + " D " + std::to_string(c.D) + (c.causal ? " causal" : "") +
         (c.from_qkv ? " qkv views" : " dense");
}

template <typename T>
DeviceVector<T> nan_filled(int64_t n) {
  return DeviceVector<T>(static_cast<std::size_t>(n), from_f32<T>(kNaN));
}

// The packed op's backward (ops::packed_qkv_attention): dout read in the output's [B, T, H, D]
// layout, dq, dk and dv written into one [B, T, 3C] gradient at q's, k's and v's places, which
// together cover it (it starts as NaN). The same bits as the dense layouts' `dense` gradients.
template <typename T>
void check_packed(const AttentionGeometry& g, const T* q, const T* k, const T* v, const T* out, const float* lse,
                  const DeviceVector<T>& dout, std::array<const DeviceVector<T>*, 3> dense, bool cuda, bool tiled) {
  SCOPED_TRACE(cuda ? "packed, CUDA" : "packed, CPU");
  AttentionGeometry p = g;
  std::copy(g.o_stride, g.o_stride + 3, p.do_stride);
  std::copy(g.q_stride, g.q_stride + 3, p.dq_stride);
  std::copy(g.k_stride, g.k_stride + 3, p.dk_stride);
  std::copy(g.v_stride, g.v_stride + 3, p.dv_stride);
  const int64_t c = g.heads * g.d;  // q, k and v start 0, C and 2C into each row of 3C
  DeviceVector<T> dout_o(dout.size()), dqkv = nan_filled<T>(g.batch * g.tq * 3 * c);
  DeviceVector<float> delta(static_cast<std::size_t>(g.bh() * g.tq), kNaN);
  for (int64_t bh = 0; bh < g.bh(); ++bh)
    for (int64_t i = 0; i < g.tq; ++i)
      for (int64_t col = 0; col < g.d; ++col) dout_o[p.do_row(bh, i) + col] = dout[g.do_row(bh, i) + col];
  T* base = dqkv.data();
  if (cuda) cuda_backward(tiled, p, q, k, v, out, lse, dout_o.data(), delta.data(), base, base + c, base + 2 * c);
  else kernels::attention_backward_cpu(p, q, k, v, out, lse, dout_o.data(), delta.data(), base, base + c, base + 2 * c);
  const int64_t(AttentionGeometry::*places[3])[3] = {&AttentionGeometry::dq_stride, &AttentionGeometry::dk_stride,
                                                     &AttentionGeometry::dv_stride};
  const char* names[3] = {"dq", "dk", "dv"};
  for (std::size_t t = 0; t < 3; ++t) {
    DeviceVector<T> gathered(dense[t]->size());
    for (int64_t bh = 0; bh < g.bh(); ++bh)
      for (int64_t i = 0; i < g.tq; ++i)
        for (int64_t col = 0; col < g.d; ++col)
          gathered[g.row(g.*places[t], bh, i) + col] =
              base[p.row(p.*places[t], bh, i) + static_cast<int64_t>(t) * c + col];
    expect_same_bits(gathered, *dense[t], std::string(names[t]) + " packed");
  }
}

template <typename T>
void check(const Config& c, bool tiled) {
  SCOPED_TRACE(what(c) + (tiled ? ", tiled kernels" : ", row kernels"));
  const double rel = 4 * unit_rounding<T>(), abs = std::max(2e-5, 4 * unit_rounding<T>());
  const int64_t C = c.H * c.D;
  AttentionGeometry g;
  g.batch = c.B;
  g.heads = c.H;
  g.tq = c.tq;
  g.tk = c.tk;
  g.d = c.D;
  g.causal = c.causal;
  g.scale = 0.37f;
  g.set_dense_gradients();
  DeviceVector<T> qkv, qd, kd, vd;
  const T *q, *k, *v;
  if (c.from_qkv) {
    qkv = stored_as<T>(random_values(c.B * c.tq * 3 * C, -1.5f, 1.5f, 31));
    for (int64_t* s : {g.q_stride, g.k_stride, g.v_stride}) {
      s[0] = c.tq * 3 * C;
      s[1] = c.D;
      s[2] = 3 * C;
    }
    q = qkv.data();
    k = qkv.data() + C;
    v = qkv.data() + 2 * C;
    g.o_stride[0] = c.tq * C, g.o_stride[1] = c.D, g.o_stride[2] = C;  // the op's [B, T, H, D] output
  } else {
    qd = stored_as<T>(random_values(c.B * c.H * c.tq * c.D, -1.5f, 1.5f, 32));
    kd = stored_as<T>(random_values(c.B * c.H * c.tk * c.D, -1.5f, 1.5f, 33));
    vd = stored_as<T>(random_values(c.B * c.H * c.tk * c.D, -1.5f, 1.5f, 34));
    g.q_stride[0] = c.H * c.tq * c.D, g.q_stride[1] = c.tq * c.D, g.q_stride[2] = c.D;
    for (int64_t* s : {g.k_stride, g.v_stride}) s[0] = c.H * c.tk * c.D, s[1] = c.tk * c.D, s[2] = c.D;
    g.o_stride[0] = c.H * c.tq * c.D, g.o_stride[1] = c.tq * c.D, g.o_stride[2] = c.D;
    q = qd.data();
    k = kd.data();
    v = vd.data();
  }
  const int64_t rows = c.B * c.H * c.tq, n_out = rows * c.D, n_kv = c.B * c.H * c.tk * c.D;
  auto out = nan_filled<T>(n_out), want_out = nan_filled<T>(n_out);
  DeviceVector<float> lse(static_cast<std::size_t>(rows), kNaN), want_lse = lse;
  cuda_forward(tiled, g, q, k, v, out.data(), lse.data());
  kernels::attention_forward_cpu(g, q, k, v, want_out.data(), want_lse.data());
  expect_within(out, as_double(want_out), rel, abs, "out");
  expect_within(lse, as_double(want_lse), 1e-6, 1e-5, "lse");
  {  // a second run on another schedule of threads and blocks: the same bits
    cuda_emulation::reseed(what(c) + ", forward again");
    auto again = nan_filled<T>(n_out);
    DeviceVector<float> lse_again(static_cast<std::size_t>(rows), kNaN);
    cuda_forward(tiled, g, q, k, v, again.data(), lse_again.data());
    expect_same_bits(again, out, "out, second run");
    expect_same_bits(lse_again, lse, "lse, second run");
  }

  // The backward from the CPU's output (the same saved tensors for both).
  const auto dout = stored_as<T>(random_values(n_out, -1, 1, 35));
  DeviceVector<float> delta(static_cast<std::size_t>(rows), kNaN), want_delta = delta;
  auto dq = nan_filled<T>(n_out), dk = nan_filled<T>(n_kv), dv = nan_filled<T>(n_kv);
  auto want_dq = dq, want_dk = dk, want_dv = dv;
  cuda_backward(tiled, g, q, k, v, want_out.data(), want_lse.data(), dout.data(), delta.data(), dq.data(), dk.data(),
                dv.data());
  kernels::attention_backward_cpu(g, q, k, v, want_out.data(), want_lse.data(), dout.data(), want_delta.data(),
                                  want_dq.data(), want_dk.data(), want_dv.data());
  expect_within(delta, as_double(want_delta), 1e-6, 1e-5, "delta");
  expect_within(dq, as_double(want_dq), rel, abs, "dq");
  expect_within(dk, as_double(want_dk), rel, abs, "dk");
  expect_within(dv, as_double(want_dv), rel, abs, "dv");

  // dq alone (on another schedule), then dk and dv alone: the same bits, nothing else written.
  cuda_emulation::reseed(what(c) + ", backward again");
  auto dq_only = nan_filled<T>(n_out);
  cuda_backward(tiled, g, q, k, v, want_out.data(), want_lse.data(), dout.data(), delta.data(), dq_only.data(),
                static_cast<T*>(nullptr), static_cast<T*>(nullptr));
  expect_same_bits(dq_only, dq, "dq alone");
  auto dk_only = nan_filled<T>(n_kv), dv_only = nan_filled<T>(n_kv);
  cuda_backward(tiled, g, q, k, v, want_out.data(), want_lse.data(), dout.data(), delta.data(),
                static_cast<T*>(nullptr), dk_only.data(), dv_only.data());
  expect_same_bits(dk_only, dk, "dk alone");
  expect_same_bits(dv_only, dv, "dv alone");
  if (c.from_qkv) {
    check_packed(g, q, k, v, want_out.data(), want_lse.data(), dout, {&dq, &dk, &dv}, true, tiled);
    check_packed(g, q, k, v, want_out.data(), want_lse.data(), dout, {&want_dq, &want_dk, &want_dv}, false, tiled);
  }
}

TYPED_TEST(AttentionEmulated, MatchesTheCpuKernels) {
  const Config configs[] = {
      {2, 2, 5, 5, 4, true, true},    {1, 2, 37, 37, 16, true, true},  {1, 1, 70, 70, 8, true, true},
      {2, 1, 70, 70, 4, false, true}, {1, 2, 3, 9, 8, false, false},   {1, 1, 70, 37, 4, false, false},
      {2, 2, 1, 1, 4, true, false},   {1, 1, 1, 40, 16, false, false}, {1, 1, 5, 5, 128, true, false},
  };
  for (const Config& c : configs)
    for (bool tiled : {false, true}) check<TypeParam>(c, tiled);
}

// D = 32, 64 and 128 exactly (no padded column), and D = 40 and 100 padded to 64 and 128; T past a
// block and tile of each set of kernels and size, causal and not, from a qkv projection and dense
// with Tq != Tk; and GPT-2 small's head over many tiles (T = 300, the tiled kernels: longest first).
TYPED_TEST(AttentionEmulated, EveryHeadSizeAcrossBlocksAndTiles) {
  const Config configs[] = {
      {1, 2, 131, 131, 32, true, true}, {1, 1, 67, 133, 32, false, false}, {1, 2, 70, 70, 64, true, true},
      {2, 1, 33, 71, 64, false, false}, {1, 1, 67, 67, 128, true, true},   {1, 1, 35, 29, 128, false, false},
      {1, 1, 45, 45, 40, true, true},   {1, 1, 19, 23, 100, false, false}, {1, 1, 300, 300, 64, true, true},
  };
  for (const Config& c : configs)
    for (bool tiled : {false, true})
      if (tiled || c.tq < 300) check<TypeParam>(c, tiled);  // T = 300 for the tiled ones' ordering only
}

// A head over 128 columns is refused by both launchers with an error naming the sizes, before any
// launch.
TEST(AttentionEmulatedRefusal, HeadsOver128Columns) {
  AttentionGeometry g;
  g.tq = g.tk = 4;
  g.d = 160;
  g.q_stride[2] = g.k_stride[2] = g.v_stride[2] = g.o_stride[2] = 160;
  DeviceVector<float> x(4 * 160, 0.5f), out(4 * 160, kNaN), lse(4, kNaN), delta(4, kNaN), grads(4 * 160, kNaN);
  for (bool tiled : {false, true}) {
    try {
      cuda_forward(tiled, g, x.data(), x.data(), x.data(), out.data(), lse.data());
      FAIL() << "D = 160 ran";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("32, 64 and 128"), std::string::npos) << e.what();
    }
    EXPECT_THROW(cuda_backward(tiled, g, x.data(), x.data(), x.data(), x.data(), lse.data(), x.data(), delta.data(),
                               grads.data(), grads.data(), grads.data()),
                 InvalidArgument);
  }
  EXPECT_TRUE(std::isnan(out[0]) && std::isnan(grads[0])) << "nothing written";
}

}  // namespace
}  // namespace cumulus::testing
