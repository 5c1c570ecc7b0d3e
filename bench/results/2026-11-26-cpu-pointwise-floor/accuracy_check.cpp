// GELU-tanh's vector functions against a float64 reference (README.md, Accuracy); build from the
// repository root against the engine library: g++ -O2 -std=c++17 -I. accuracy_check.cpp -Lbuild/lib
// -lcumulus_engine.
#include <cmath>
#include <cstdio>
#include <vector>
#include "kernels/cpu/vec_math.h"
using namespace cumulus::kernels;
int main() {
  const int n = 2000001;
  std::vector<float> x(n), y(n), dy(n, 1.0f), g(n);
  for (int i = 0; i < n; ++i) x[i] = -10.0f + 20.0f * i / (n - 1);
  vec::gelu_tanh_f32(x.data(), y.data(), n);
  vec::gelu_tanh_grad_f32(x.data(), dy.data(), g.data(), n);
  const double k = std::sqrt(2.0 / M_PI);
  double ef = 0, eb = 0;
  for (int i = 0; i < n; ++i) {
    double xv = x[i], u = k * (xv + 0.044715 * xv * xv * xv), t = std::tanh(u);
    double f = 0.5 * xv * (1 + t), d = 0.5 * (1 + t) + 0.5 * xv * (1 - t * t) * k * (1 + 3 * 0.044715 * xv * xv);
    double m1 = std::max(std::fabs(f), 1.0), m2 = std::max(std::fabs(d), 1.0);
    ef = std::max(ef, std::fabs(y[i] - f) / (std::nextafter((float)m1, INFINITY) - (float)m1));
    eb = std::max(eb, std::fabs(g[i] - d) / (std::nextafter((float)m2, INFINITY) - (float)m2));
  }
  std::printf("gelu_tanh fwd %.2f ulp  bwd %.2f ulp (of max(|ref|,1))\n", ef, eb);
  float sp[] = {NAN, INFINITY, -INFINITY, -0.0f, 0.0f, 1e-40f, 65504.f, -65520.f, 88.6f, -88.6f, 100.f, -100.f};
  float ys[12], gs[12], ones[12];
  for (float& o : ones) o = 1;
  vec::gelu_tanh_f32(sp, ys, 12);
  vec::gelu_tanh_grad_f32(sp, ones, gs, 12);
  for (int i = 0; i < 12; ++i) std::printf("x=%g y=%g g=%g\n", sp[i], ys[i], gs[i]);
}
