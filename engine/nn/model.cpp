#include "cumulus/nn/model.h"

#include "cumulus/core/error.h"

namespace cumulus::nn {

const char* kernel_choice_name(KernelChoice choice) {
  switch (choice) {
    case KernelChoice::automatic: return "auto";
    case KernelChoice::fused: return "fused";
    case KernelChoice::generic: return "generic";
  }
  return "?";
}

bool parse_kernel_choice(const std::string& name, KernelChoice& choice) {
  for (KernelChoice c : {KernelChoice::automatic, KernelChoice::fused, KernelChoice::generic})
    if (name == kernel_choice_name(c)) {
      choice = c;
      return true;
    }
  return false;
}

Tensor Model::loss(const Tensor& x, const Tensor& labels, ops::Reduction reduction) {
  return ops::cross_entropy(forward(x), labels, reduction);
}

Model& Model::set_recompute(bool on) {
  CUMULUS_CHECK(!on, InvalidArgument, name(), ": this model offers no activation recompute");
  return *this;
}

std::vector<std::string> Model::recompute_segment_names() const {
  return offers_recompute() ? std::vector<std::string>{"all"} : std::vector<std::string>{};
}

Model& Model::set_recompute_segments(uint32_t mask) {
  const std::size_t segments = recompute_segment_names().size();
  CUMULUS_CHECK(mask >> segments == 0, InvalidArgument, name(), ": recompute segment mask ", mask,
                " names segments past its ", segments);
  return set_recompute(mask != 0);
}

Model& Model::set_kernels(KernelChoice choice) {
  CUMULUS_CHECK(choice != KernelChoice::fused, InvalidArgument, name(),
                ": this model has no fused kernels (only the generic ones)");
  return *this;
}

KernelChoice Model::kernels_for(Device, DType, int64_t) const { return KernelChoice::generic; }

}  // namespace cumulus::nn
