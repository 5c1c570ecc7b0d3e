// Host-side pieces both sets of CUDA attention kernels launch with: attention.cu's row kernels and
// attention_tiled.cu's register tiles (Notes [CUDA attention kernels], [Tiled CUDA attention
// kernels]). Included by those two files only.
#pragma once

#include <cstdint>
#include <type_traits>

#include "cumulus/core/error.h"
#include "kernels/cuda/attention_kernels.h"

namespace cumulus::kernels::attention_launch {

// The compiled head size that holds d columns: 32, 64 or 128. `who` names the launcher in the error.
inline int padded_head_size(int64_t d, const char* who) {
  CUMULUS_CHECK(d >= 0 && d <= kAttentionMaxHeadDimCuda, InvalidArgument, who, ": head size D = ", d,
                " is not supported on CUDA (kernels compiled for D = 32, 64 and 128; a smaller D runs in the next "
                "larger, D over ",
                kAttentionMaxHeadDimCuda, " is refused)");
  return d <= 32 ? 32 : d <= 64 ? 64 : 128;
}

// fn(std::integral_constant<int, D>{}) for head, a padded_head_size.
template <typename Fn>
void for_head_size(int head, Fn&& fn) {
  if (head == 32) fn(std::integral_constant<int, 32>{});
  else if (head == 64) fn(std::integral_constant<int, 64>{});
  else fn(std::integral_constant<int, 128>{});
}

// One block per (head, tile of `tile_rows` rows); `tiles` is the tiles a head.
inline unsigned grid_of(const AttentionGeometry& g, int64_t rows, int64_t tile_rows, int64_t& tiles) {
  tiles = (rows + tile_rows - 1) / tile_rows;
  const int64_t blocks = g.bh() * tiles;
  CUMULUS_CHECK(blocks <= 2147483647, InvalidArgument, "attention on CUDA: ", blocks,
                " blocks is too many for one grid");
  return static_cast<unsigned>(blocks);
}

}  // namespace cumulus::kernels::attention_launch
