// A sum over the last dimension of float tensors of several shapes, timed through ops::sum (mean of
// 2000 calls after 50 warm-up ones). Built against an engine build:
//   g++ -O2 -std=c++17 -I engine/include shapes.cpp -L build/lib -lcumulus_engine -Wl,-rpath,$PWD/build/lib
#include <chrono>
#include <cstdio>
#include <vector>
#include "cumulus/ops/reduce.h"
#include "cumulus/tensor/tensor.h"
#include <random>
using namespace cumulus;
int main() {
  struct C { Shape s; int64_t d; };
  std::vector<C> cs = {{{8,64,128},-1},{{20000,2},1},{{4096,19},1},{{1,100000},1},{{3,1000},1},{{512,768},1},{{64,4096},1}};
  for (auto& c : cs) {
    std::vector<float> v(c.s.numel()); std::mt19937 g(1); std::normal_distribution<float> nd; for (auto& e : v) e = nd(g); Tensor x = Tensor::from_vector(v, c.s);
    for (int i=0;i<50;++i) ops::sum(x, c.d);
    auto t0 = std::chrono::steady_clock::now();
    int n = 2000;
    for (int i=0;i<n;++i) ops::sum(x, c.d);
    double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now()-t0).count()/n;
    std::string name;
    for (int i = 0; i < c.s.ndim(); ++i) name += (i ? ", " : "[") + std::to_string(c.s[i]);
    name += "]";
    printf("sum(x%-12s, %2lld) %8.2f us\n", name.c_str(), static_cast<long long>(c.d), us);
  }
}
