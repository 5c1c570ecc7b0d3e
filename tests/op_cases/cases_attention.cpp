// Op cases (Note [Op cases] in op_case.h) of ops::scaled_dot_product_attention: causal and not, Tq
// != Tk (a decoding step against a cache), T = 1, T across the CPU kernel's tiles (16 query rows,
// 64 keys) and the CUDA kernels' (64 and 32), D from 4 to 64, q, k and v as the permuted views of a
// qkv projection (as cases_gpt_block.cpp makes them: read in place, no copy), a custom scale, a row
// of scores 30 times larger (the online softmax's rescaling), bf16 storage. The reference is the
// composition in double, loop by loop: scores, the causal mask, softmax, the weighted sum. The
// unfused composition (matmul, masked_fill(tril), softmax, matmul) is a case too, on the same
// reference: bench_ops times both at the sizes of Note [Benchmark sizes].
#include <cmath>
#include <functional>
#include <string>

#include "cumulus/ops/attention.h"
#include "cumulus/ops/compare.h"
#include "cumulus/ops/linear.h"
#include "cumulus/ops/pointwise.h"
#include "cumulus/ops/shape.h"
#include "op_case.h"

namespace cumulus::testing {

namespace {

// Element (b, h, t, c) of q, k or v.
using Element = std::function<double(int64_t b, int64_t h, int64_t t, int64_t c)>;

// [B, H, Tq, D], row-major.
std::vector<double> attention_reference(int64_t B, int64_t H, int64_t tq, int64_t tk, int64_t d, bool causal,
                                        double scale, const Element& q, const Element& k, const Element& v) {
  std::vector<double> out(static_cast<std::size_t>(B * H * tq * d), 0.0);
  std::vector<double> p(static_cast<std::size_t>(tk));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < tq; ++i) {
        double max = -INFINITY, sum = 0;
        for (int64_t j = 0; j < tk; ++j) {
          double s = 0;
          for (int64_t c = 0; c < d; ++c) s += q(b, h, i, c) * k(b, h, j, c);
          p[j] = causal && j > i ? -INFINITY : s * scale;  // the mask
          max = std::max(max, p[j]);
        }
        for (int64_t j = 0; j < tk; ++j) sum += (p[j] = std::exp(p[j] - max));
        for (int64_t c = 0; c < d; ++c) {
          double acc = 0;
          for (int64_t j = 0; j < tk; ++j) acc += p[j] / sum * v(b, h, j, c);
          out[static_cast<std::size_t>(((b * H + h) * tq + i) * d + c)] = acc;
        }
      }
  return out;
}

// Element (b, h, t, c) of a dense [B, H, T, D] tensor's values.
Element dense(const std::vector<double>& x, int64_t H, int64_t T, int64_t D) {
  return [&x, H, T, D](int64_t b, int64_t h, int64_t t, int64_t c) {
    return x[static_cast<std::size_t>(((b * H + h) * T + t) * D + c)];
  };
}

struct Direct {
  std::string name;
  int64_t B, H, tq, tk, D;
  bool causal;
  double scale = 0;  // 0: the default 1 / sqrt(D)
  DType dtype = DType::f32;
  int64_t fd_samples = 0;
  std::function<void(std::vector<float>&)> edit_q;
};

OpCase direct_case(const Direct& s) {
  OpCase c;
  c.op = "scaled_dot_product_attention";
  c.name = s.name;
  c.inputs = {{{s.B, s.H, s.tq, s.D}, s.dtype, -1, 1},
              {{s.B, s.H, s.tk, s.D}, s.dtype, -1, 1},
              {{s.B, s.H, s.tk, s.D}, s.dtype, -1, 1}};
  c.inputs[0].edit = s.edit_q;
  const bool causal = s.causal;
  const double scale = s.scale;
  c.forward = [causal, scale](const Inputs& t) {
    return ops::scaled_dot_product_attention(t[0], t[1], t[2], causal,
                                             scale == 0 ? std::nullopt : std::optional<double>(scale));
  };
  c.reference = [s](const Values& v) {
    const double scale = s.scale == 0 ? 1.0 / std::sqrt(static_cast<double>(s.D)) : s.scale;
    return attention_reference(s.B, s.H, s.tq, s.tk, s.D, s.causal, scale, dense(v[0], s.H, s.tq, s.D),
                               dense(v[1], s.H, s.tk, s.D), dense(v[2], s.H, s.tk, s.D));
  };
  if (s.dtype != DType::f32) {
    c.tolerance = 2e-2;
    c.grad_tolerance = 5e-2;
  }
  c.fd_samples = s.fd_samples;
  c.flops = 4.0 * static_cast<double>(s.B * s.H * s.tq * s.tk * s.D) * (s.causal ? 0.5 : 1.0);
  return c;
}

// The heads of a qkv projection [B, T, 3C] as [B, H, T, D] views (split, reshape, permute), as
// cases_gpt_block.cpp makes them; H fixed, every other size from the tensor (Note [Benchmark sizes]).
std::vector<Tensor> qkv_heads(const Tensor& qkv, int64_t H) {
  const int64_t B = qkv.size(0), T = qkv.size(1), C = qkv.size(2) / 3;
  std::vector<Tensor> parts = ops::split(qkv, C, -1);
  for (Tensor& p : parts) p = ops::permute(ops::reshape(p, {B, T, H, C / H}), {0, 2, 1, 3});
  return parts;
}

// qkv [B, T, 3C] -> [B, H, T, D] attention output, in double.
std::vector<double> qkv_reference(const std::vector<double>& qkv, int64_t B, int64_t T, int64_t C, int64_t H,
                                  bool causal, double scale) {
  const int64_t D = C / H;
  auto part = [&qkv, T, C, D](int64_t which) -> Element {
    return [&qkv, T, C, D, which](int64_t b, int64_t h, int64_t t, int64_t c) {
      return qkv[static_cast<std::size_t>((b * T + t) * 3 * C + which * C + h * D + c)];
    };
  };
  return attention_reference(B, H, T, T, D, causal, scale, part(0), part(1), part(2));
}

struct FromQkv {
  std::string name;
  int64_t B, T, C, H;
  bool causal;
  bool composition = false;  // the unfused ops instead of the fused op
  int64_t fd_samples = 0;
  // Note [Benchmark sizes]: B, T, C at the benchmark (0: none).
  int64_t bench_B = 0, bench_T = 0, bench_C = 0;
  DType dtype = DType::f32;
};

// The unfused attention of the heads, as cases_gpt_block.cpp writes it (ones: [T, T] of 1).
Tensor composition(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& ones, bool causal) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
  Tensor att = ops::matmul(q, ops::transpose(k, -2, -1)) * static_cast<float>(scale);
  if (causal) att = ops::masked_fill(att, ops::eq(ops::tril(ones), 0.0), -INFINITY);
  return ops::matmul(ops::softmax(att, -1), v);
}

OpCase qkv_case(const FromQkv& s) {
  OpCase c;
  c.op = s.composition ? "matmul" : "scaled_dot_product_attention";
  c.name = s.name;
  c.inputs = {{{s.B, s.T, 3 * s.C}, s.dtype, -1, 1}, {{s.T, s.T}, DType::f32, 1, 1}};
  c.inputs[1].grad = false;
  if (s.dtype != DType::f32) {
    c.tolerance = 2e-2;
    c.grad_tolerance = 5e-2;
  }
  const bool causal = s.causal, unfused = s.composition;
  const int64_t H = s.H;
  c.forward = [causal, unfused, H](const Inputs& t) {
    const std::vector<Tensor> h = qkv_heads(t[0], H);
    return unfused ? composition(h[0], h[1], h[2], t[1], causal)
                   : ops::scaled_dot_product_attention(h[0], h[1], h[2], causal);
  };
  c.reference = [s](const Values& v) {
    return qkv_reference(v[0], s.B, s.T, s.C, s.H, s.causal, 1.0 / std::sqrt(static_cast<double>(s.C / s.H)));
  };
  c.inner_ops = {"split", "reshape", "permute"};
  if (unfused)
    for (const char* op : {"transpose", "bmm", "mul", "tril", "eq", "masked_fill", "softmax", "contiguous"})
      c.inner_ops.push_back(op);
  c.fd_samples = s.fd_samples;
  auto flops = [&s](int64_t B, int64_t T, int64_t C) {
    return 4.0 * static_cast<double>(B * T * T * C) * (s.causal && !s.composition ? 0.5 : 1.0);
  };
  c.flops = flops(s.B, s.T, s.C);
  if (s.bench_B > 0) {
    c.bench_shapes = {{s.bench_B, s.bench_T, 3 * s.bench_C}, {s.bench_T, s.bench_T}};
    c.bench_flops = flops(s.bench_B, s.bench_T, s.bench_C);
  }
  return c;
}

}  // namespace

CUMULUS_OP_CASES(attention) {
  // Scores 30 times larger in one query row: exp of the raw scores would overflow nothing yet, but
  // the row's softmax is nearly one-hot and its running maximum moves between key tiles.
  auto large_row = [](int64_t row, int64_t D) {
    return [row, D](std::vector<float>& q) {
      for (int64_t c = 0; c < D; ++c) q[static_cast<std::size_t>(row * D + c)] *= 30.0f;
    };
  };
  const Direct direct[] = {
      {"sdpa_causal_b2_h2_t5_d4_f32", 2, 2, 5, 5, 4, true},
      {"sdpa_b2_h2_t5_d8_f32", 2, 2, 5, 5, 8, false},
      {"sdpa_tq3_tk7_d8_f32", 1, 2, 3, 7, 8, false},
      {"sdpa_decode_tq1_tk9_d16_f32", 2, 2, 1, 9, 16, false},
      {"sdpa_causal_t1_d4_f32", 2, 1, 1, 1, 4, true},
      {"sdpa_causal_t37_d16_f32", 1, 1, 37, 37, 16, true, 0, DType::f32, 48},
      {"sdpa_causal_t70_d4_f32", 1, 2, 70, 70, 4, true, 0, DType::f32, 48},
      {"sdpa_tq70_tk37_d4_f32", 1, 1, 70, 37, 4, false, 0, DType::f32, 48},
      {"sdpa_causal_t5_d64_f32", 1, 1, 5, 5, 64, true, 0, DType::f32, 48},
      {"sdpa_causal_scale0p3_t6_d8_f32", 1, 2, 6, 6, 8, true, 0.3},
      {"sdpa_causal_large_row_t70_d8_f32", 1, 1, 70, 70, 8, true, 0, DType::f32, 48, large_row(67, 8)},
      {"sdpa_large_row_t5_d4_f32", 1, 2, 5, 5, 4, false, 0, DType::f32, 0, large_row(3, 4)},
      {"sdpa_causal_t37_d8_bf16", 1, 2, 37, 37, 8, true, 0, DType::bf16, 48},
      {"sdpa_tq5_tk9_d8_f16", 2, 2, 5, 9, 8, false, 0, DType::f16},
  };
  for (const Direct& s : direct) {
    OpCase c = direct_case(s);
    // One key: every probability is 1 and the output is v, so q and k have no gradient to check
    // (the driver refuses an all-zero one); v's still is.
    if (s.tk == 1) c.inputs[0].grad = c.inputs[1].grad = false;
    cases.push_back(c);
  }

  // Fewer or more leading dimensions than [B, H]: [T, D] and [2, 3, 2, T, D].
  {
    OpCase c = direct_case({"sdpa_causal_3d_h3_t5_d4_f32", 1, 3, 5, 5, 4, true});
    c.inputs = {{{3, 5, 4}}, {{3, 5, 4}}, {{3, 5, 4}}};
    cases.push_back(c);
    OpCase c5 = direct_case({"sdpa_5d_t4_d4_f32", 6, 2, 4, 3, 4, false});
    c5.inputs = {{{2, 3, 2, 4, 4}}, {{2, 3, 2, 3, 4}}, {{2, 3, 2, 3, 4}}};
    cases.push_back(c5);
  }

  // Grouped-query attention: one k and v head shared by four q heads, as expand views (stride 0
  // over the heads; the expand's backward sums the heads' gradients).
  {
    OpCase c = direct_case({"sdpa_causal_gqa_expand_h4_t6_d8_f32", 2, 4, 6, 6, 8, true});
    c.inputs[1].shape = c.inputs[2].shape = {2, 1, 6, 8};
    c.forward = [](const Inputs& t) {
      return ops::scaled_dot_product_attention(t[0], ops::expand(t[1], {2, 4, 6, 8}), ops::expand(t[2], {2, 4, 6, 8}),
                                               true);
    };
    c.reference = [](const Values& v) {
      auto shared = [](const std::vector<double>& x) -> Element {
        return
            [&x](int64_t b, int64_t, int64_t t, int64_t c) { return x[static_cast<std::size_t>((b * 6 + t) * 8 + c)]; };
      };
      return attention_reference(2, 4, 6, 6, 8, true, 1.0 / std::sqrt(8.0), dense(v[0], 4, 6, 8), shared(v[1]),
                                 shared(v[2]));
    };
    c.inner_ops = {"expand"};
    cases.push_back(c);
  }

  const FromQkv qkv[] = {
      {"sdpa_qkv_causal_b2_t5_c8_h2_f32", 2, 5, 8, 2, true},
      {"sdpa_qkv_b2_t5_c8_h2_f32", 2, 5, 8, 2, false},
      {"sdpa_qkv_causal_b1_t37_c32_h2_f32", 1, 37, 32, 2, true, false, 64},
      // bench_ops: fused against the composition, [B=8, H=4, T=64, D=32] and [B=4, H=8, T=256, D=32].
      {"sdpa_qkv_causal_bench_h4_f32", 2, 5, 8, 4, true, false, 0, 8, 64, 128},
      {"attention_composition_qkv_causal_bench_h4_f32", 2, 5, 8, 4, true, true, 0, 8, 64, 128},
      {"sdpa_qkv_causal_bench_h8_f32", 1, 5, 16, 8, true, false, 0, 4, 256, 256},
      {"attention_composition_qkv_causal_bench_h8_f32", 1, 5, 16, 8, true, true, 0, 4, 256, 256},
      // bench_ops on CUDA against PyTorch's SDPA (bench/pytorch/sdpa_op.py): GPT-2 small's attention,
      // [B=8, H=12, T=1024, D=64] from its qkv projection.
      {"sdpa_qkv_causal_gpt2s_bench_bf16", 1, 5, 96, 12, true, false, 0, 8, 1024, 768, DType::bf16},
      {"sdpa_qkv_causal_gpt2s_bench_f32", 1, 5, 96, 12, true, false, 0, 8, 1024, 768},
  };
  for (const FromQkv& s : qkv) cases.push_back(qkv_case(s));
}

}  // namespace cumulus::testing
