// Per-device CUDA state (see cuda_context.h) and the error helpers of cuda_check.h.
#if CUMULUS_WITH_CUDA
#include "engine/core/cuda_context.h"

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <string>
#include <utility>

#include "cumulus/core/device.h"
#include "cumulus/memory/allocator.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/kernels.h"

namespace cumulus {

namespace detail {
std::atomic<int64_t> cuda_launches{0};

void throw_cuda_error(cudaError_t err, const char* expr, const char* file, int line) {
  throw CudaError(concat("CUDA error ", cudaGetErrorName(err), " (", cudaGetErrorString(err),
                         ") from ", expr, " at ", file, ":", line));
}
void throw_cublas_error(cublasStatus_t st, const char* expr, const char* file, int line) {
  throw CudaError(concat("cuBLAS error ", cublasGetStatusName(st), " (", cublasGetStatusString(st),
                         ") from ", expr, " at ", file, ":", line));
}
void warn_cuda_error(cudaError_t err, const char* expr, const char* file, int line) {
  std::fprintf(stderr, "cumulus: warning: CUDA error %s from %s at %s:%d\n", cudaGetErrorName(err),
               expr, file, line);
}
}  // namespace detail

namespace cuda {

DeviceGuard::DeviceGuard(int index) {
  CUMULUS_CUDA_CHECK(cudaGetDevice(&previous_));
  if (previous_ != index) CUMULUS_CUDA_CHECK(cudaSetDevice(index));
}

DeviceGuard::~DeviceGuard() {
  int now = -1;
  if (cudaGetDevice(&now) == cudaSuccess && now != previous_) CUMULUS_CUDA_WARN(cudaSetDevice(previous_));
}

// Note [Execution context]
// One Context per device holds everything CUDA of that device: the stream every op, copy and
// graph replay of the device is queued on (one stream, so work is ordered without events and the
// caching allocator may hand out a freed block at once), the cuBLAS handle bound to that stream
// and the cuBLASLt handle with the workspace they share, the cuBLASLt plan cache, and the capture
// flag. Ops reach it through CUMULUS_DISPATCH, which binds it to the name the op gives (`ctx`
// throughout) for the launchers to take explicitly. The contexts are created once and never destroyed;
// after creation, context() is one atomic load, so the dispatch path takes no lock.
//
// One workspace for both libraries: every cuBLAS and cuBLASLt call of the device is queued on the
// one stream, so no two of them ever run at the same time and neither can see the other's scratch
// half-written. Two blocks would only double the figure (the memory report would show 16 MiB of
// workspace of which 8 can never be in use). The block is allocated when the first handle is made,
// eagerly, never during a capture (an allocation there would come from the graph pool and belong
// to that graph's lifetime).
//
// The arrival counter (a 4-byte device word, category workspace) is made with the context, not at
// its first use: made lazily it was an allocation inside the first micro-batch that ran the fused
// op (in that micro-batch's memory record and timeline, a one-off that was not the micro-batch's
// own), and a capture of that op before any eager run threw.

namespace {

// cuBLAS's own default workspace on Hopper is 32 MiB; Context::kWorkspaceBytes (8 MiB) covers the
// GEMM shapes of our models and keeps the figure visible in the memory report (category workspace).
constexpr int kMaxDevices = 64;

std::atomic<Context*> g_contexts[kMaxDevices] = {};
std::atomic<int64_t> g_host_syncs{0};

}  // namespace

Context::Context(int index) : index_(index) {
  DeviceGuard guard(index);
  CUMULUS_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  // Never freed, as the context.
  CachingAllocator& alloc = allocator_for(Device::cuda(index));
  auto* block = new Allocation(alloc.allocate(sizeof(unsigned), MemoryCategory::workspace));
  arrival_counter_ = static_cast<unsigned*>(block->get());
  CUMULUS_CUDA_CHECK(cudaMemsetAsync(arrival_counter_, 0, sizeof(unsigned), stream_));
  gemm_lt_plans_ = new kernels::GemmLtPlans();  // never destroyed, as the context
}

Context& context(int index) {
  if (index >= 0 && index < kMaxDevices) {
    if (Context* c = g_contexts[index].load(std::memory_order_acquire)) return *c;
  }
  check_device_available(Device::cuda(index));
  CUMULUS_CHECK(index < kMaxDevices, DeviceError, "device index too large: cuda:", index);
  static std::mutex creation;
  std::lock_guard<std::mutex> lock(creation);
  if (Context* c = g_contexts[index].load(std::memory_order_acquire)) return *c;
  auto* c = new Context(index);  // lives until process exit (the driver may be gone before us)
  g_contexts[index].store(c, std::memory_order_release);
  return *c;
}

// Note [Memory outside the allocator]
// The tracker's figures are the caching allocator's, but a CUDA process holds device memory the
// allocator never sees: the context itself, the libraries' handles and loaded kernels (cuBLAS,
// cuBLASLt, cuDNN, NCCL), and the local memory the driver reserves for kernels' stack frames,
// sized for every thread the device can hold at once (the per-thread stack limit x resident
// threads per SM x SMs; the driver grows the limit when a kernel needs more, and keeps it). The
// driver tells only the total: its used bytes (total - free, cudaMemGetInfo) less the allocator's
// reserved bytes are the rest, another process on the same device included. The local memory's
// share is estimated from the stack limit (cudaLimitStackSize), the setting that sizes it: our hot
// kernels have no stack frames (scripts/cuda_resources.py fails the build otherwise), so it grows
// past the default only for a library's kernels. Both are read when a summary is taken (no sync),
// unless CUMULUS_CUDA_MEMORY_OUTSIDE=0 (the report then says 0).
MemoryOutsideAllocator memory_outside_allocator(int device_index, int64_t allocator_reserved_bytes) {
  DeviceGuard guard(device_index);
  std::size_t free_bytes = 0, total_bytes = 0, stack_bytes = 0;
  CUMULUS_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  CUMULUS_CUDA_CHECK(cudaDeviceGetLimit(&stack_bytes, cudaLimitStackSize));
  int threads_per_sm = 0, sms = 0;
  CUMULUS_CUDA_CHECK(cudaDeviceGetAttribute(&threads_per_sm, cudaDevAttrMaxThreadsPerMultiProcessor, device_index));
  CUMULUS_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device_index));
  MemoryOutsideAllocator m;
  m.bytes = std::max<int64_t>(0, static_cast<int64_t>(total_bytes - free_bytes) - allocator_reserved_bytes);
  m.local_memory_bytes = static_cast<int64_t>(stack_bytes) * threads_per_sm * sms;
  return m;
}

void* Context::workspace() {
  if (workspace_ != nullptr) return workspace_;
  CUMULUS_CHECK(!capturing(), CudaError, "library workspace of cuda:", index_,
                " allocated during a graph capture: run the work once eagerly before capturing it");
  // Never freed, as the context.
  auto* block =
      new Allocation(allocator_for(Device::cuda(index_)).allocate(kWorkspaceBytes, MemoryCategory::workspace));
  workspace_ = block->get();
  return workspace_;
}

cublasHandle_t Context::cublas() {
  if (cublas_ != nullptr) return cublas_;
  CUMULUS_CHECK(!capturing(), CudaError, "cuBLAS handle of cuda:", index_,
                " created during a graph capture: run the work once eagerly before capturing it");
  DeviceGuard guard(index_);
  cublasHandle_t h = nullptr;
  CUMULUS_CUBLAS_CHECK(cublasCreate(&h));
  CUMULUS_CUBLAS_CHECK(cublasSetStream(h, stream_));
  CUMULUS_CUBLAS_CHECK(cublasSetWorkspace(h, workspace(), kWorkspaceBytes));
  cublas_ = h;
  return cublas_;
}

cublasLtHandle_t Context::cublaslt() {
  if (cublaslt_ != nullptr) return cublaslt_;
  CUMULUS_CHECK(!capturing(), CudaError, "cuBLASLt handle of cuda:", index_,
                " created during a graph capture: run the work once eagerly before capturing it");
  DeviceGuard guard(index_);
  workspace();  // before the handle, so a failed allocation leaves no handle behind
  cublasLtHandle_t h = nullptr;
  CUMULUS_CUBLAS_CHECK(cublasLtCreate(&h));
  cublaslt_ = h;
  return cublaslt_;
}

void synchronize_stream(cudaStream_t s) {
  g_host_syncs.fetch_add(1, std::memory_order_relaxed);
  CUMULUS_CUDA_CHECK(cudaStreamSynchronize(s));
}

void wait_event(cudaEvent_t e) {
  g_host_syncs.fetch_add(1, std::memory_order_relaxed);
  CUMULUS_CUDA_CHECK(cudaEventSynchronize(e));
}

int64_t host_synchronizations() { return g_host_syncs.load(std::memory_order_relaxed); }

// Note [CUDA graphs]
// Graph::capture records the work on the context's stream in thread-local capture mode: any call
// that would synchronize with the host (a copy to host memory, a stream or event wait) fails the
// capture, so a captured step is proof that it never synchronizes. Allocations during the capture
// come from the graph pool (Note [Graph pool]); a new segment for it is taken from cudaMalloc with
// the thread switched to relaxed mode for that call alone (the backend does this), as the memory
// then belongs to the pool, not to the graph. Handles (cuBLAS, cuDNN) must exist before: run the
// work once eagerly first. Kernel arguments are frozen at capture: anything that changes between
// replays (the data cursor, 1 / samples, the learning rate, the step count) lives in device memory.

Graph Graph::capture(Context& ctx, const std::function<void()>& work) {
  CUMULUS_CHECK(!ctx.capturing(), CudaError, "nested graph capture on cuda:", ctx.index_);
  DeviceGuard guard(ctx.index_);
  CachingAllocator& alloc = allocator_for(Device::cuda(ctx.index_));
  const int64_t launches_before = detail::cuda_launches.load();
  alloc.acquire_graph_pool();  // held by the graph; released below if the capture fails
  alloc.begin_graph_pool_routing();
  const cudaError_t begin = cudaStreamBeginCapture(ctx.stream_, cudaStreamCaptureModeThreadLocal);
  if (begin != cudaSuccess) {  // nothing is captured: leave the allocator and the context as they were
    alloc.end_graph_pool_routing();
    alloc.release_graph_pool();
    (void)cudaGetLastError();
    detail::throw_cuda_error(begin, "cudaStreamBeginCapture", __FILE__, __LINE__);
  }
  ctx.capturing_ = true;
  cudaGraph_t graph = nullptr;
  auto finish = [&] {
    ctx.capturing_ = false;
    alloc.end_graph_pool_routing();
    const cudaError_t end = cudaStreamEndCapture(ctx.stream_, &graph);
    const int64_t recorded = detail::cuda_launches.load() - launches_before;
    detail::cuda_launches.fetch_sub(recorded);  // recorded, not launched: replays count instead
    return std::make_pair(end, recorded);
  };
  try {
    work();
  } catch (const std::exception& e) {
    finish();
    if (graph) cudaGraphDestroy(graph);
    (void)cudaGetLastError();
    alloc.release_graph_pool();
    throw CudaError(std::string("graph capture failed (the captured work must not synchronize with the "
                                "host, allocate handles or read device values): ") + e.what());
  }
  const auto [end, recorded] = finish();
  if (end != cudaSuccess) {
    if (graph) cudaGraphDestroy(graph);
    (void)cudaGetLastError();
    alloc.release_graph_pool();
    detail::throw_cuda_error(end, "cudaStreamEndCapture", __FILE__, __LINE__);
  }
  Graph g;
  g.ctx_ = &ctx;
  g.kernel_nodes_ = recorded;
  const cudaError_t inst = cudaGraphInstantiate(&g.exec_, graph, 0);
  cudaGraphDestroy(graph);
  if (inst != cudaSuccess) {
    g.exec_ = nullptr;
    alloc.release_graph_pool();
    detail::throw_cuda_error(inst, "cudaGraphInstantiate", __FILE__, __LINE__);
  }
  return g;
}

void Graph::launch() {
  CUMULUS_CHECK(valid(), InvalidArgument, "Graph::launch on an empty graph");
  CUMULUS_CUDA_CHECK(cudaGraphLaunch(exec_, ctx_->stream_));
  detail::count_launch();
  ++launches_;
}

void Graph::reset() noexcept {
  if (exec_ != nullptr) {
    CUMULUS_CUDA_WARN(cudaGraphExecDestroy(exec_));
    allocator_for(Device::cuda(ctx_->index_)).release_graph_pool();
  }
  exec_ = nullptr;
  ctx_ = nullptr;
}

Graph::~Graph() { reset(); }

Graph::Graph(Graph&& o) noexcept { *this = std::move(o); }

Graph& Graph::operator=(Graph&& o) noexcept {
  if (this != &o) {
    reset();
    ctx_ = o.ctx_;
    exec_ = o.exec_;
    kernel_nodes_ = o.kernel_nodes_;
    launches_ = o.launches_;
    o.exec_ = nullptr;
    o.ctx_ = nullptr;
  }
  return *this;
}

}  // namespace cuda
}  // namespace cumulus
#endif  // CUMULUS_WITH_CUDA
