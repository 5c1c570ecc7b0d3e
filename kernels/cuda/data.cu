// The DataLoader's row gather on CUDA (the contract: kernels/gather.h), one launch per batch for
// all of its tensors: each column in turn, by a grid-stride loop over its elements. A copying
// column moves aligned units of up to 8 bytes (its copy unit, kernels/gather.h); a converting one
// goes element by element through the conversions the CPU loop uses, so the bits are the CPU's
// (nvcc's default -prec-div=true makes float(v) / divisor the same IEEE-rounded quotient).
#include <algorithm>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.h"

namespace cumulus::kernels {

namespace {

using cuda_common::blocks_for;
using cuda_common::kThreads;
using cuda_common::launch;

// Each column's copy unit in bytes (0: a converting column), chosen on the host.
struct CopyUnits {
  int32_t bytes[kMaxGatherColumns];
};

__device__ __forceinline__ int64_t sample_of(const int32_t* order, int64_t start, int64_t r) {
  return order ? static_cast<int64_t>(order[start + r]) : start + r;
}

template <typename U>
__device__ void copy_column(const GatherColumn& col, int64_t row_bytes, const int32_t* order, int64_t start,
                            int64_t count) {
  const int64_t units = row_bytes / static_cast<int64_t>(sizeof(U));
  const U* src = static_cast<const U*>(col.src);
  U* dst = static_cast<U*>(col.dst);
  CUMULUS_GRID_STRIDE_LOOP(i, count * units) {
    const int64_t r = i / units, c = i - r * units;
    dst[i] = src[sample_of(order, start, r) * units + c];
  }
}

__device__ void gather_columns(const GatherColumns& columns, const CopyUnits& units, const int32_t* order,
                               int64_t start, int64_t count) {
  for (int32_t k = 0; k < columns.count; ++k) {
    const GatherColumn& col = columns.column[k];
    const int64_t row_bytes = col.row * static_cast<int64_t>(dtype_size(col.src_type));
    switch (units.bytes[k]) {
      case 8: copy_column<uint64_t>(col, row_bytes, order, start, count); break;
      case 4: copy_column<uint32_t>(col, row_bytes, order, start, count); break;
      case 2: copy_column<uint16_t>(col, row_bytes, order, start, count); break;
      case 1: copy_column<uint8_t>(col, row_bytes, order, start, count); break;
      default:
        CUMULUS_GRID_STRIDE_LOOP(i, count * col.row) {
          const int64_t r = i / col.row;
          gather_convert(col, r, sample_of(order, start, r), i - r * col.row);
        }
    }
  }
}

// __grid_constant__: the columns are read in place, in parameter memory, where a run-time column
// index would otherwise copy both structs into a stack frame.
__global__ void gather_rows_kernel(const __grid_constant__ GatherColumns columns, const __grid_constant__ CopyUnits units,
                                   const int32_t* order, int64_t start, int64_t count) {
  gather_columns(columns, units, order, start, count);
}

// The batch at cursor->position (or in ring slot cursor->ring_slot); the last block to finish
// advances the position (every block has read it by then: each reads it before counting itself
// done). The ring slot is the host's to set: it knows which slot it staged.
__global__ void gather_rows_at_cursor_kernel(const __grid_constant__ GatherColumns columns,
                                             const __grid_constant__ CopyUnits units, const int32_t* order,
                                             GatherCursor* cursor, int64_t batch_size, int64_t ring, int64_t count) {
  __shared__ int64_t start;
  if (threadIdx.x == 0) start = (ring > 0 ? int64_t(cursor->ring_slot) : cursor->position) * batch_size;
  __syncthreads();
  gather_columns(columns, units, order, start, count);
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(&cursor->blocks_done, 1u) == gridDim.x - 1) {
      cursor->position += 1;
      cursor->blocks_done = 0;
    }
  }
}

__global__ void set_gather_cursor_kernel(GatherCursor* cursor, int64_t position, int64_t ring_slot) {
  if (position >= 0) cursor->position = position;
  if (ring_slot >= 0) cursor->ring_slot = static_cast<uint32_t>(ring_slot);
}

// The copy units, and the most loop iterations any column needs (the grid's size).
CopyUnits copy_units(const GatherColumns& columns, int64_t count, int64_t* elements) {
  CopyUnits units{};
  *elements = 0;
  for (int32_t k = 0; k < columns.count; ++k) {
    const GatherColumn& col = columns.column[k];
    const int64_t unit = gather_copies(col) ? gather_copy_unit(col) : 0;
    units.bytes[k] = static_cast<int32_t>(unit);
    const int64_t per_row = unit > 0 ? col.row * static_cast<int64_t>(dtype_size(col.src_type)) / unit : col.row;
    *elements = std::max(*elements, count * per_row);
  }
  return units;
}

}  // namespace

void gather_rows_cuda(const GatherColumns& columns, const int32_t* order, int64_t start, int64_t count,
                      cudaStream_t stream) {
  if (count == 0) return;
  int64_t elements = 0;
  const CopyUnits units = copy_units(columns, count, &elements);
  if (elements == 0) return;  // rows of no elements in every column
  launch<gather_rows_kernel>(blocks_for(elements), kThreads, stream, columns, units, order, start, count);
}

void gather_rows_at_cursor_cuda(const GatherColumns& columns, const int32_t* order, GatherCursor* cursor,
                                int64_t batch_size, int64_t ring, int64_t count, cudaStream_t stream) {
  int64_t elements = 0;
  const CopyUnits units = copy_units(columns, count, &elements);
  launch<gather_rows_at_cursor_kernel>(blocks_for(elements), kThreads, stream, columns, units, order, cursor,
                                       batch_size, ring, count);
}

void set_gather_cursor_cuda(GatherCursor* cursor, int64_t position, int64_t ring_slot, cudaStream_t stream) {
  launch<set_gather_cursor_kernel>(1, 1, stream, cursor, position, ring_slot);
}

}  // namespace cumulus::kernels
