// The CUDA execution context of a device: the one stream all of that device's work is queued on,
// the cuBLAS and cuBLASLt handles with the workspace they share, the cuBLASLt plan cache, and
// whether a graph capture is under way.
// Ops and launchers get it explicitly (CUMULUS_DISPATCH binds it to the name an op gives);
// nothing else holds CUDA state. See Note [Execution context] in engine/core/cuda_context.cpp and docs/ARCHITECTURE.md.
// Only for CUDA builds.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>

namespace cumulus::kernels {
class GemmLtPlans;  // kernels/cuda/kernels.h
}  // namespace cumulus::kernels

namespace cumulus::cuda {

// Makes `index` the current CUDA device for the scope, restoring the previous one after.
class DeviceGuard {
 public:
  explicit DeviceGuard(int index);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

class Context {
 public:
  int device_index() const { return index_; }
  cudaStream_t stream() const { return stream_; }
  // Created on first use (never during a capture: warm up first), workspace in category workspace.
  cublasHandle_t cublas();
  // The same for cuBLASLt. Its calls take the workspace explicitly (workspace(), the one cuBLAS
  // uses: Note [Execution context] says why one block serves both).
  cublasLtHandle_t cublaslt();
  // The libraries' workspace: kWorkspaceBytes in category workspace, made with the first handle.
  void* workspace();
  static constexpr std::size_t kWorkspaceBytes = 8u << 20;
  // The cuBLASLt GEMMs planned on this device (Note [cuBLASLt plan cache] in
  // kernels/cuda/gemm.cu): made with the context, alive as long as it.
  kernels::GemmLtPlans& gemm_lt_plans() const { return *gemm_lt_plans_; }
  // A device counter for kernels whose last block to finish completes the work (it counts the
  // blocks that arrived): 0 between kernels, each such kernel leaves it 0. The stream runs one
  // kernel at a time, so they can all share it. Made, zeroed, with the context (Note [Execution
  // context]), so any capture may use it.
  unsigned* arrival_counter() const { return arrival_counter_; }
  // Whether a graph capture is recording this context's stream (set by Graph::capture).
  bool capturing() const { return capturing_.load(std::memory_order_relaxed); }

 private:
  friend Context& context(int device_index);
  friend class Graph;
  explicit Context(int index);
  int index_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  cublasLtHandle_t cublaslt_ = nullptr;
  void* workspace_ = nullptr;
  unsigned* arrival_counter_ = nullptr;
  kernels::GemmLtPlans* gemm_lt_plans_ = nullptr;
  std::atomic<bool> capturing_{false};
};

// The context of a device, created on first use and alive until process exit. After creation
// this is one atomic load: no lock on the dispatch path.
Context& context(int device_index);
inline cudaStream_t stream(int device_index) { return context(device_index).stream(); }

// Device memory in use that the caching allocator never held (Note [Memory outside the allocator]
// in engine/core/cuda_context.cpp): the driver's used bytes less `allocator_reserved_bytes`, and
// the part the context reserves as local memory for kernels' stack frames (an estimate).
struct MemoryOutsideAllocator {
  int64_t bytes = 0;
  int64_t local_memory_bytes = 0;
};
MemoryOutsideAllocator memory_outside_allocator(int device_index, int64_t allocator_reserved_bytes);

// Blocks the host until the stream's work is done. Every host synchronization cumulus makes goes
// through here (or through wait_event), so host_synchronizations() counts them all.
void synchronize_stream(cudaStream_t stream);
void wait_event(cudaEvent_t event);
int64_t host_synchronizations();

// A CUDA graph recorded from the work queued on a context's stream, replayed with launch().
// Note [CUDA graphs] in engine/core/cuda_context.cpp says what may be captured and how memory
// behaves: allocations made while capturing come from the device allocator's graph pool, whose
// blocks are reserved to graphs while any graph lives.
class Graph {
 public:
  Graph() = default;
  // Records `work` (run once on the host, nothing executes on the device). Throws CudaError
  // naming the cause when the work cannot be captured, typically a host synchronization; the
  // context is usable afterwards.
  static Graph capture(Context& ctx, const std::function<void()>& work);
  ~Graph();
  Graph(Graph&& o) noexcept;
  Graph& operator=(Graph&& o) noexcept;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  bool valid() const { return exec_ != nullptr; }
  // Queues one replay on the stream (one host call, however many kernels the graph holds).
  void launch();
  int64_t kernel_nodes() const { return kernel_nodes_; }
  int64_t launches() const { return launches_; }

 private:
  void reset() noexcept;
  Context* ctx_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
  int64_t kernel_nodes_ = 0;
  int64_t launches_ = 0;
};

}  // namespace cumulus::cuda
