// Op cases (Note [Op cases] in op_case.h) for an op written by a user against the public custom-op
// API (cumulus/autograd/function.h): a learnable gain on tanh, y = g * tanh(x) with g one value.
// The arithmetic runs on the host (any device: the tensors' values are copied over and back), as a
// user may write it; the registry checks it like any built-in op: its gradients (through the
// API's sinks), its output counted as an activation and named "gain_tanh", and CPU against CUDA.
#include <cmath>

#include "cumulus/autograd/function.h"
#include "op_case.h"

namespace cumulus::testing {

namespace {

std::vector<float> host_values(const Tensor& t) { return t.to(Device::cpu()).to_vector<float>(); }

struct GainTanh : autograd::Function<GainTanh> {
  static constexpr const char* name = "gain_tanh";

  static Tensor forward(autograd::FunctionContext& ctx, const std::vector<Tensor>& in) {
    const std::vector<float> x = host_values(in[0]);
    const float g = host_values(in[1])[0];
    std::vector<float> y(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) y[i] = g * std::tanh(x[i]);
    ctx.save_for_backward({in[0], in[1]});
    return Tensor::from_vector(y, in[0].shape(), in[0].device());
  }

  // dx = dy g (1 - tanh(x)^2), dg = sum dy tanh(x)
  static std::vector<Tensor> backward(autograd::FunctionContext& ctx, const Tensor& dy) {
    const Tensor& xt = ctx.saved_tensors()[0];
    const std::vector<float> x = host_values(xt), d = host_values(dy);
    const float g = host_values(ctx.saved_tensors()[1])[0];
    std::vector<float> dx(x.size());
    double dg = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      const float t = std::tanh(x[i]);
      dx[i] = d[i] * g * (1 - t * t);
      dg += static_cast<double>(d[i]) * t;
    }
    return {Tensor::from_vector(dx, xt.shape(), xt.device()),
            Tensor::from_vector(std::vector<float>{static_cast<float>(dg)}, Shape{1}, xt.device())};
  }
};

}  // namespace

CUMULUS_OP_CASES(custom_op) {
  OpCase c;
  c.op = "gain_tanh";
  c.name = "custom_gain_tanh_3x7_f32";
  c.inputs = {{{3, 7}, DType::f32, -2, 2}, {{1}, DType::f32, 0.5, 1.5}};
  c.forward = [](const Inputs& t) { return GainTanh::apply({t[0], t[1]}); };
  c.reference = [](const Values& v) { return map(v[0], [g = v[1][0]](double x) { return g * std::tanh(x); }); };
  c.grad_tolerance = 1e-5;
  c.bench_shapes = {{1024, 1024}, {1}};
  cases.push_back(c);
}

}  // namespace cumulus::testing
