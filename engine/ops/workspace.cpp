// detail::workspace_source (engine/ops/internal.h): library workspace from the caching allocator.
#include "cumulus/memory/allocator.h"
#include "engine/ops/internal.h"

namespace cumulus::ops::detail {

std::function<std::shared_ptr<void>(std::size_t)> workspace_source(const Device& device) {
  return [device](std::size_t bytes) {
    auto block = std::make_shared<Allocation>(allocator_for(device).allocate(bytes, MemoryCategory::workspace));
    return std::shared_ptr<void>(block, block->get());
  };
}

}  // namespace cumulus::ops::detail
