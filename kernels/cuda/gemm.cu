// GEMM on CUDA through cuBLAS. cuBLAS is column-major; a row-major matrix is the column-major view
// of its transpose, so row-major C = op(A) op(B) is computed as column-major C^T = op(B)^T op(A)^T:
// the operands swap places and m, n swap, the leading dimensions stay. With beta = 1 a Linear's
// weight gradient accumulates inside the GEMM (Note [Gradient sinks]).
//
// gemm_lt_cuda is the same GEMM through cuBLASLt, which can fold a bias or a bias gradient into the
// GEMM's epilogue (Note [Fused linear] in engine/ops/linear.cpp; its ReLU epilogues we do not use:
// Note [ReLU epilogues and NaN] there). The same swap applies:
// cuBLASLt's A is our b, its B is our a, and its D is our c transposed, [n rows, m columns].
//
// gemm_ex_cuda and the void* gemm_lt_cuda take the operands' storage types (GemmTypes): a and b in
// f32, bf16 or f16, c in f32 or a's type. The compute type stays CUBLAS_COMPUTE_32F, so products
// accumulate in f32 whatever the storage, and 16-bit a and b run on tensor cores.
#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>

#include "kernels/cuda/kernels.h"

// The CPU emulation (tests/emulation/cublasLt.h) compiles this file too, to run the host-side rules
// of the cuBLASLt plans (tests/emulated/gemm_lt_test.cpp). It has no CUDA runtime errors and no
// launch counter, so there a failed call throws CudaError with its status and nothing is counted.
#ifdef CUMULUS_CUDA_EMULATION
namespace cumulus::kernels::gemm_checks {
inline void count_launch() {}
[[noreturn]] inline void throw_cublas_error(cublasStatus_t st, const char* expr, const char* file, int line) {
  throw CudaError(detail::concat("cuBLAS status ", static_cast<int>(st), " from ", expr, " at ", file, ":", line));
}
}  // namespace cumulus::kernels::gemm_checks
#define CUMULUS_CUBLAS_CHECK(expr)                                                                 \
  do {                                                                                             \
    const cublasStatus_t cumulus_st_ = (expr);                                                     \
    if (cumulus_st_ != CUBLAS_STATUS_SUCCESS)                                                      \
      ::cumulus::kernels::gemm_checks::throw_cublas_error(cumulus_st_, #expr, __FILE__, __LINE__); \
  } while (0)
#else
#include "kernels/cuda/cuda_check.h"
namespace cumulus::kernels::gemm_checks {
using detail::count_launch;
using detail::throw_cublas_error;
}  // namespace cumulus::kernels::gemm_checks
#endif

namespace cumulus::kernels {

namespace {

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::f32: return CUDA_R_32F;
    case DType::bf16: return CUDA_R_16BF;
    case DType::f16: return CUDA_R_16F;
    default: break;
  }
  return CUDA_R_32F;  // unreachable after check_types
}

// The combinations cuBLAS offers with CUBLAS_COMPUTE_32F: a and b floating, c f32 or a's type.
void check_types(const char* who, GemmTypes types) {
  CUMULUS_CHECK(is_floating(types.ab) && (types.cd == DType::f32 || types.cd == types.ab), InvalidArgument, who,
                ": unsupported operand types (a and b ", dtype_name(types.ab), ", c ", dtype_name(types.cd),
                "): a and b must be f32, bf16 or f16, c f32 or a's type");
}

}  // namespace

void gemm_cuda(cublasHandle_t handle, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
               float alpha, const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
               float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  CUMULUS_CHECK(m <= INT_MAX && n <= INT_MAX && k <= INT_MAX && lda <= INT_MAX && ldb <= INT_MAX,
                InvalidArgument, "gemm_cuda: dimensions past 32 bits (m ", m, ", n ", n, ", k ", k, ")");
  gemm_checks::count_launch();
  CUMULUS_CUBLAS_CHECK(cublasSgemm(handle, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                   trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, static_cast<int>(n),
                                   static_cast<int>(m), static_cast<int>(k), &alpha, b,
                                   static_cast<int>(ldb), a, static_cast<int>(lda), &beta, c,
                                   static_cast<int>(ldc)));
}

void gemm_ex_cuda(cublasHandle_t handle, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                  const void* a, int64_t lda, const void* b, int64_t ldb, float beta, void* c, int64_t ldc,
                  GemmTypes types) {
  check_types("gemm_ex_cuda", types);
  if (m == 0 || n == 0) return;
  CUMULUS_CHECK(m <= INT_MAX && n <= INT_MAX && k <= INT_MAX && lda <= INT_MAX && ldb <= INT_MAX && ldc <= INT_MAX,
                InvalidArgument, "gemm_ex_cuda: dimensions past 32 bits (m ", m, ", n ", n, ", k ", k, ")");
  gemm_checks::count_launch();
  // alpha and beta are floats: CUBLAS_COMPUTE_32F's scale type, whatever the storage types.
  const cudaDataType_t ab = cuda_type(types.ab), cd = cuda_type(types.cd);
  CUMULUS_CUBLAS_CHECK(cublasGemmEx(handle, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                                    static_cast<int>(n), static_cast<int>(m), static_cast<int>(k), &alpha, b, ab,
                                    static_cast<int>(ldb), a, ab, static_cast<int>(lda), &beta, c, cd,
                                    static_cast<int>(ldc), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// Note [cuBLASLt plan cache]
// A cuBLASLt GEMM needs a matmul descriptor, matrix layouts and an algorithm from the heuristic
// (cublasLtMatmulAlgoGetHeuristic): host work that costs more than the GEMM itself at the seed
// MLP's sizes. A training run has few distinct GEMMs (per Linear: forward, dx and dW, for the full
// micro-batch, the last partial one and the evaluation batch), so each is planned once and kept in
// a map, keyed by everything the plan depends on, the operands' storage types (GemmTypes)
// included; from the second call with a key on, no heuristic is queried. The map is the caller's
// GemmLtPlans, passed to each call as explicitly as the handle and the workspace: the execution
// context owns one per device (cuda::Context::gemm_lt_plans), which lives, with the context's
// handles, until process exit; a GemmLtPlans destroyed earlier (a test's own) destroys its plans.
// - Capture: planning is host work only (no device allocation, no synchronization), so a shape
//   first seen while a graph is being captured is planned there too; the workspace is the
//   caller's (the context's), passed explicitly, and the GEMM allocates nothing.
// - Alignment: the heuristic assumes 256-byte aligned matrices unless told otherwise, while a
//   view (narrow_rows) starts wherever a row does. Every pointer of the call is classed by its
//   alignment capped at 16 bytes (the widest vector access), the heuristic is told that class, and
//   a plan serves only calls of the same class. So an algorithm is never used on pointers less
//   aligned than it was chosen for, and eager and captured runs of one shape get the same
//   algorithm, hence the same bits.
// - Threads: a context's map is shared by every thread queuing on its device; the map's lock is
//   also held while the call's bias pointer is set in the entry's descriptor and the GEMM is queued
//   (the descriptor is shared state). Uncontended it costs tens of nanoseconds against
//   microseconds of launch.
// - No algorithm (Note [No fused algorithm]) is remembered too: the call returns false and the
//   caller runs the unfused kernels, without asking again. So is an algorithm the matmul rejected
//   (Note [Rejected algorithm]).
//
// Note [Rejected algorithm]
// The heuristic's answer is not a promise: cublasLtMatmul may still refuse an algorithm it offered
// (CUBLAS_STATUS_NOT_SUPPORTED, or CUBLAS_STATUS_INVALID_VALUE for a configuration it finds in
// conflict, such as the algorithm's workspace), having queued nothing. So a plan keeps the
// heuristic's first kLtAlgorithms results in its order; a rejected one is dropped from the plan
// for good and the next is tried in the same call, and when none is left the plan is unsupported
// from then on: the call returns false and the caller runs the unfused kernels, as for no
// algorithm. Any other status of the matmul is a real error and throws.
//
// Note [No fused algorithm]
// cublasLtMatmulAlgoGetHeuristic's documentation (cublasLt.h) names CUBLAS_STATUS_NOT_SUPPORTED for
// "no heuristic for this configuration", but that is not the only answer a configuration it
// rejects gets: it validates the descriptor and layouts itself and answers other statuses, such as
// CUBLAS_STATUS_INVALID_VALUE (its log shows that for an epilogue or scaling setup it refuses), and
// a query may also succeed with no result, or with a first result whose own state is not success.
// To us all of these mean one thing: cuBLASLt offers no fused algorithm for this epilogue, these
// types, shape and alignment. So any answer but a successful result (lt_heuristic_found) is
// remembered as unsupported, gemm_lt_cuda queues nothing and returns false, and the caller runs
// the unfused kernels. Only the heuristic's answer is read this way: the descriptor, layout and
// preference calls before it fail only on real errors, and throw; the matmul's refusal of an
// algorithm is Note [Rejected algorithm].
//
// Note [Epilogue bias type]
// cuBLASLt reads the bias of its BIAS epilogues in the type CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE
// names, by default D's type; the documented exceptions are IMMA kernels (integer compute) and
// FP8 kernels, neither ours. So the attribute keeps its default and the caller hands the bias in
// c's type: an f32 Linear its f32 bias, a 16-bit Linear a 16-bit copy rounded as its weight's copy
// is (Note [Mixed precision] in engine/ops/linear.cpp). cuBLASLt adds it to the f32 sum of products
// and rounds D once (a 16-bit D only when asked: Note [Direct 16-bit output] there).
//
// Note [Bias gradient epilogue]
// GemmEpilogue::bias_grad is sum_k op(a)[i, k] for each row i of our c, i.e. the reduction of our
// `a` over the GEMM's k. After the swap our `a` is cuBLASLt's B and our c's rows are D's columns.
// cuBLASLt's BGRADB is the bias gradient of its input B, reduced over k, one value per column of
// D; BGRADA is the same for A, one value per row of D. So bias_grad is CUBLASLT_EPILOGUE_BGRADB.
// For a Linear's weight gradient, dW [out, in] = dz^T x: our a is dz (transposed, [out, B]), k is
// the batch, and BGRADB gives db[o] = sum_b dz[b, o]. The output is written, never accumulated (no
// beta for it): an overwriting gradient sink, or a temporary the engine adds later (Note [Deferred
// gradient adds] in engine/autograd/engine.cpp).

bool lt_heuristic_found(cublasStatus_t status, int returned, cublasStatus_t first_state) {
  return status == CUBLAS_STATUS_SUCCESS && returned > 0 && first_state == CUBLAS_STATUS_SUCCESS;
}

bool lt_matmul_rejected(cublasStatus_t status) {
  return status == CUBLAS_STATUS_NOT_SUPPORTED || status == CUBLAS_STATUS_INVALID_VALUE;
}

// A named namespace, not an anonymous one: GemmLtPlans::Impl holds these types, and the CPU
// emulation compiles this file as an included header, where GCC warns of such a member.
namespace lt_plans {

struct PlanKey {
  cublasLtHandle_t handle;
  bool trans_a, trans_b;
  int64_t m, n, k, lda, ldb, ldc;
  DType ab, cd;  // GemmTypes
  GemmEpilogue epilogue;
  uint32_t alignment;
  std::size_t workspace_bytes;
  bool operator<(const PlanKey& o) const {
    return std::tie(handle, trans_a, trans_b, m, n, k, lda, ldb, ldc, ab, cd, epilogue, alignment, workspace_bytes) <
           std::tie(o.handle, o.trans_a, o.trans_b, o.m, o.n, o.k, o.lda, o.ldb, o.ldc, o.ab, o.cd, o.epilogue,
                    o.alignment, o.workspace_bytes);
  }
};

// The heuristic results a plan keeps (Note [Rejected algorithm]).
constexpr int kLtAlgorithms = 4;

struct Plan {
  bool supported = false;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;  // cuBLASLt's A (our b), B (our a), C = D
  // The heuristic's algorithms in its order, algos[next] the first not rejected so far.
  cublasLtMatmulAlgo_t algos[kLtAlgorithms] = {};
  int next = 0, count = 0;
};

}  // namespace lt_plans

using lt_plans::kLtAlgorithms;
using lt_plans::Plan;
using lt_plans::PlanKey;

namespace {

// gemm_lt_cuda's outcomes per epilogue: [kind][0] fused, [kind][1] declined.
std::atomic<int64_t> g_outcomes[kGemmEpilogues][2] = {};

void count_outcome(GemmEpilogue kind, bool fused) {
  g_outcomes[static_cast<int>(kind)][fused ? 0 : 1].fetch_add(1, std::memory_order_relaxed);
}

// The largest power of two dividing the address, at most 16 (null pointers do not constrain).
uint32_t alignment_class(const void* p) {
  const auto v = reinterpret_cast<uintptr_t>(p);
  if (v == 0) return 16;
  const uintptr_t low = v & (~v + 1);
  return static_cast<uint32_t>(low < 16 ? low : 16);
}

cublasLtEpilogue_t lt_epilogue(GemmEpilogue e) {
  switch (e) {
    case GemmEpilogue::none: return CUBLASLT_EPILOGUE_DEFAULT;
    case GemmEpilogue::bias: return CUBLASLT_EPILOGUE_BIAS;
    case GemmEpilogue::bias_grad: return CUBLASLT_EPILOGUE_BGRADB;  // Note [Bias gradient epilogue]
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

void destroy(Plan& p) noexcept {
  if (p.desc != nullptr) cublasLtMatmulDescDestroy(p.desc);
  if (p.a != nullptr) cublasLtMatrixLayoutDestroy(p.a);
  if (p.b != nullptr) cublasLtMatrixLayoutDestroy(p.b);
  if (p.c != nullptr) cublasLtMatrixLayoutDestroy(p.c);
  p = Plan();
}

// The call's own pointer in the descriptor: the bias (or bias gradient). Under capture the value is
// taken when the GEMM is queued, so later calls may change it.
void set_epilogue_pointer(cublasLtMatmulDesc_t desc, const GemmEpilogueArgs& e) {
  if (e.kind == GemmEpilogue::none) return;
  const void* bias = e.kind == GemmEpilogue::bias_grad ? static_cast<const void*>(e.bias_grad)
                                                       : static_cast<const void*>(e.bias);
  CUMULUS_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
}

// The heuristic's first kLtAlgorithms algorithms for the plan's descriptor and layouts, into
// p.algos; false when it offers none (Note [No fused algorithm]). The preference's own calls throw
// on failure.
bool heuristic_algorithms(const PlanKey& key, Plan& p) {
  cublasLtMatmulPreference_t pref = nullptr;
  CUMULUS_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  struct Destroy {
    cublasLtMatmulPreference_t pref;
    ~Destroy() { cublasLtMatmulPreferenceDestroy(pref); }
  } destroy_pref{pref};
  const uint64_t workspace = key.workspace_bytes;
  CUMULUS_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                                            sizeof workspace));
  for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
    CUMULUS_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &key.alignment, sizeof key.alignment));
  cublasLtMatmulHeuristicResult_t results[kLtAlgorithms] = {};
  int found = 0;
  const cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(key.handle, p.desc, p.a, p.b, p.c, p.c, pref, kLtAlgorithms, results, &found);
  if (!lt_heuristic_found(st, found, results[0].state)) return false;
  for (int i = 0; i < found && i < kLtAlgorithms && results[i].state == CUBLAS_STATUS_SUCCESS; ++i)
    p.algos[p.count++] = results[i].algo;
  return true;
}

// Descriptor, layouts and the heuristic's algorithms for `key`; supported = false (and nothing
// kept) when the heuristic offers none.
Plan make_plan(const PlanKey& key, const GemmEpilogueArgs& e) {
  Plan p;
  try {
    CUMULUS_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const int32_t op_a = key.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLASLt's A is our b
    const int32_t op_b = key.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    CUMULUS_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a));
    CUMULUS_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b));
    const auto epilogue = static_cast<uint32_t>(lt_epilogue(key.epilogue));
    CUMULUS_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue));
    set_epilogue_pointer(p.desc, e);  // the heuristic reads its alignment
    // Column-major views of the stored matrices: our b is [k, n] row-major (or [n, k] transposed),
    // i.e. [n, k] column-major (or [k, n]); likewise our a; our c [m, n] is D [n, m].
    const uint64_t k = static_cast<uint64_t>(key.k), m = static_cast<uint64_t>(key.m),
                   n = static_cast<uint64_t>(key.n);
    const cudaDataType_t ab = cuda_type(key.ab), cd = cuda_type(key.cd);
    CUMULUS_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, ab, key.trans_b ? k : n, key.trans_b ? n : k, key.ldb));
    CUMULUS_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, ab, key.trans_a ? m : k, key.trans_a ? k : m, key.lda));
    CUMULUS_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.c, cd, n, m, key.ldc));
    if (heuristic_algorithms(key, p)) {
      p.supported = true;
    } else {
      destroy(p);  // remembered as unsupported: no descriptors kept
    }
  } catch (...) {
    destroy(p);
    throw;
  }
  return p;
}

}  // namespace

struct GemmLtPlans::Impl {
  std::mutex mutex;  // held while a plan is looked up, made or used (Note [cuBLASLt plan cache])
  std::map<PlanKey, Plan> plans;
};

GemmLtPlans::GemmLtPlans() : impl_(std::make_unique<Impl>()) {}

GemmLtPlans::~GemmLtPlans() {
  for (auto& entry : impl_->plans) destroy(entry.second);
}

namespace {

// The arguments gemm_lt_cuda refuses, before anything reaches cuBLASLt.
void check_epilogue(const GemmEpilogueArgs& e, GemmTypes types) {
  const bool bias_grad = e.kind == GemmEpilogue::bias_grad;
  CUMULUS_CHECK(!bias_grad || types.cd == DType::f32, InvalidArgument,
                "gemm_lt_cuda: a bias gradient needs an f32 c (cuBLASLt writes it in c's type), not ",
                dtype_name(types.cd));
  CUMULUS_CHECK(e.kind != GemmEpilogue::bias || e.bias != nullptr, InvalidArgument,
                "gemm_lt_cuda: the epilogue needs a bias");
  CUMULUS_CHECK(!bias_grad || e.bias_grad != nullptr, InvalidArgument,
                "gemm_lt_cuda: the epilogue needs a bias-gradient output");
}

}  // namespace

GemmLtOutcomes gemm_lt_outcomes(GemmEpilogue kind) {
  const auto& o = g_outcomes[static_cast<int>(kind)];
  return {o[0].load(std::memory_order_relaxed), o[1].load(std::memory_order_relaxed)};
}

bool gemm_lt_cuda(GemmLtPlans& plans, cublasLtHandle_t handle, void* workspace, std::size_t workspace_bytes,
                  bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                  const float* b, int64_t ldb, float beta, float* c, int64_t ldc, const GemmEpilogueArgs& epilogue,
                  cudaStream_t stream) {
  return gemm_lt_cuda(plans, handle, workspace, workspace_bytes, trans_a, trans_b, m, n, k, alpha,
                      static_cast<const void*>(a), lda, static_cast<const void*>(b), ldb, beta, static_cast<void*>(c),
                      ldc, GemmTypes{}, epilogue, stream);
}

bool gemm_lt_cuda(GemmLtPlans& plans, cublasLtHandle_t handle, void* workspace, std::size_t workspace_bytes,
                  bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const void* a, int64_t lda,
                  const void* b, int64_t ldb, float beta, void* c, int64_t ldc, GemmTypes types,
                  const GemmEpilogueArgs& epilogue, cudaStream_t stream) {
  check_types("gemm_lt_cuda", types);
  check_epilogue(epilogue, types);
  if (m == 0 || n == 0 || k == 0) {  // the unfused path handles empty products
    count_outcome(epilogue.kind, false);
    return false;
  }
  uint32_t alignment = 16;
  for (const void* p : {a, b, static_cast<const void*>(c), static_cast<const void*>(epilogue.bias),
                        static_cast<const void*>(epilogue.bias_grad), static_cast<const void*>(workspace)})
    alignment = std::min(alignment, alignment_class(p));
  const PlanKey key{handle, trans_a, trans_b, m, n, k, lda, ldb, ldc, types.ab, types.cd,
                    epilogue.kind, alignment, workspace_bytes};

  GemmLtPlans::Impl& cache = plans.impl();
  std::lock_guard<std::mutex> lock(cache.mutex);
  auto it = cache.plans.find(key);
  if (it == cache.plans.end()) it = cache.plans.emplace(key, make_plan(key, epilogue)).first;
  Plan& plan = it->second;
  if (plan.supported) set_epilogue_pointer(plan.desc, epilogue);
  for (; plan.supported && plan.next < plan.count; ++plan.next) {
    // cuBLASLt's A is our b and its B our a (the swap above); D is written in place of C.
    const cublasStatus_t st = cublasLtMatmul(handle, plan.desc, &alpha, b, plan.a, a, plan.b, &beta, c, plan.c, c,
                                             plan.c, &plan.algos[plan.next], workspace, workspace_bytes, stream);
    if (st == CUBLAS_STATUS_SUCCESS) {
      gemm_checks::count_launch();
      count_outcome(epilogue.kind, true);
      return true;
    }
    if (!lt_matmul_rejected(st)) gemm_checks::throw_cublas_error(st, "cublasLtMatmul", __FILE__, __LINE__);
  }
  if (plan.supported) destroy(plan);  // every algorithm rejected: unsupported from now on
  count_outcome(epilogue.kind, false);
  return false;
}

}  // namespace cumulus::kernels
