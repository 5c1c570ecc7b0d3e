// Op cases (Note [Op cases] in op_case.h): pointwise activations.
#include <algorithm>

#include "cumulus/ops/pointwise.h"
#include "op_case.h"

namespace cumulus::testing {

CUMULUS_OP_CASES(activation) {
  for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    OpCase c;
    c.op = "relu";
    c.name = std::string("relu_3x2x5_") + dtype_name(dtype);
    c.inputs = {{{3, 2, 5}, dtype, -2, 2, 0.05}};  // |x| >= 0.05: off the kink at 0
    c.forward = [](const Inputs& t) { return ops::relu(t[0]); };
    c.reference = [](const Values& v) { return map(v[0], [](double x) { return std::max(x, 0.0); }); };
    // relu passes its (exactly representable) input and upstream gradient through unrounded.
    cases.push_back(c);
  }
}

}  // namespace cumulus::testing
