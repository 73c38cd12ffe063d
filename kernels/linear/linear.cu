// LinearCuda through cuBLASLt. cuBLASLt is column-major, so the row-major product
// y[m, n] = x[m, k] · w[n, k]ᵀ is issued as the column-major yᵀ[n, m] = op(A) · B with
// A = w seen as a k×n column-major matrix (op = transpose), B = x seen as k×m, C = D = y seen as
// n×m (ld n). The bias epilogue adds bias[n] along D's rows (CUBLASLT_EPILOGUE_BIAS).
#include <cublasLt.h>

#include <algorithm>
#include <mutex>
#include <tuple>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "kernels/linear/linear_cuda.h"

namespace sluice::kernels {
namespace {

absl::Status CublasStatus(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat(what, ": ", cublasLtGetStatusName(s), ": ", cublasLtGetStatusString(s)));
}

#define SLUICE_CUBLAS_RETURN_IF_ERROR(expr, what)    \
  do {                                               \
    const cublasStatus_t sluice_cublas_s_ = (expr);  \
    if (sluice_cublas_s_ != CUBLAS_STATUS_SUCCESS) { \
      return CublasStatus(sluice_cublas_s_, (what)); \
    }                                                \
  } while (false)

// Largest power of two (<= 256) dividing the address: cuBLASLt's heuristic must know how
// aligned the operands are.
uint32_t Alignment(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  if (a == 0) return 256;
  return static_cast<uint32_t>(std::min<uintptr_t>(256, a & (~a + 1)));
}

// One cached matmul configuration.
struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo;
  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    if (c != nullptr) cublasLtMatrixLayoutDestroy(c);
    if (b != nullptr) cublasLtMatrixLayoutDestroy(b);
    if (a != nullptr) cublasLtMatrixLayoutDestroy(a);
    if (op != nullptr) cublasLtMatmulDescDestroy(op);
  }
};

// (m, n, k, has_bias, align_x, align_w, align_y, align_bias)
using PlanKey = std::tuple<int64_t, int64_t, int64_t, bool, uint32_t, uint32_t, uint32_t, uint32_t>;

}  // namespace

struct CublasLt::Impl {
  cublasLtHandle_t handle = nullptr;
  DeviceBuffer<uint8_t> workspace;
  std::mutex mu;
  absl::flat_hash_map<PlanKey, std::unique_ptr<Plan>> plans;

  ~Impl() {
    plans.clear();
    if (handle != nullptr) cublasLtDestroy(handle);
  }

  absl::StatusOr<Plan*> GetPlan(const PlanKey& key) {
    auto it = plans.find(key);
    if (it != plans.end()) return it->second.get();
    const auto [m, n, k, has_bias, align_x, align_w, align_y, align_bias] = key;
    auto plan = std::make_unique<Plan>();
    SLUICE_CUBLAS_RETURN_IF_ERROR(
        cublasLtMatmulDescCreate(&plan->op, CUBLAS_COMPUTE_32F, CUDA_R_32F),
        "cublasLtMatmulDescCreate");
    const cublasOperation_t trans_a = CUBLAS_OP_T, trans_b = CUBLAS_OP_N;
    SLUICE_CUBLAS_RETURN_IF_ERROR(
        cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a,
                                       sizeof(trans_a)),
        "set TRANSA");
    SLUICE_CUBLAS_RETURN_IF_ERROR(
        cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b,
                                       sizeof(trans_b)),
        "set TRANSB");
    if (has_bias) {
      const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
      SLUICE_CUBLAS_RETURN_IF_ERROR(
          cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                         sizeof(epilogue)),
          "set EPILOGUE");
      const cudaDataType_t bias_type = CUDA_R_16BF;
      SLUICE_CUBLAS_RETURN_IF_ERROR(
          cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                         sizeof(bias_type)),
          "set BIAS_DATA_TYPE");
    }
    SLUICE_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&plan->a, CUDA_R_16BF, k, n, k),
                                  "layout A");
    SLUICE_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&plan->b, CUDA_R_16BF, k, m, k),
                                  "layout B");
    SLUICE_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&plan->c, CUDA_R_16BF, n, m, n),
                                  "layout C");
    cublasLtMatmulPreference_t pref = nullptr;
    SLUICE_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&pref),
                                  "cublasLtMatmulPreferenceCreate");
    const uint64_t ws = workspace.bytes();
    cublasStatus_t s = cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
    const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> aligns[] = {
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_w},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_x},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_y},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_y}};
    for (const auto& [attr, value] : aligns) {
      if (s == CUBLAS_STATUS_SUCCESS) {
        s = cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof(value));
      }
    }
    (void)align_bias;  // Part of the key only: the bias epilogue reads it element-wise.
    cublasLtMatmulHeuristicResult_t result;
    int count = 0;
    if (s == CUBLAS_STATUS_SUCCESS) {
      s = cublasLtMatmulAlgoGetHeuristic(handle, plan->op, plan->a, plan->b, plan->c, plan->c, pref,
                                         1, &result, &count);
    }
    cublasLtMatmulPreferenceDestroy(pref);
    SLUICE_CUBLAS_RETURN_IF_ERROR(s, "cublasLtMatmulAlgoGetHeuristic");
    if (count < 1) {
      return absl::InternalError(
          absl::StrCat("cuBLASLt has no bf16 algorithm for m=", m, " n=", n, " k=", k));
    }
    plan->algo = result.algo;
    Plan* raw = plan.get();
    plans.emplace(key, std::move(plan));
    return raw;
  }
};

CublasLt::CublasLt(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CublasLt::~CublasLt() = default;

absl::StatusOr<std::unique_ptr<CublasLt>> CublasLt::Create(size_t workspace_bytes) {
  auto impl = std::make_unique<Impl>();
  SLUICE_CUBLAS_RETURN_IF_ERROR(cublasLtCreate(&impl->handle), "cublasLtCreate");
  auto ws = DeviceBuffer<uint8_t>::Create(workspace_bytes);
  if (!ws.ok()) return ws.status();
  impl->workspace = *std::move(ws);
  return std::unique_ptr<CublasLt>(new CublasLt(std::move(impl)));
}

absl::Status LinearCuda(CublasLt& lt, const bf16* x, const bf16* w, const bf16* bias, bf16* y,
                        int64_t m, int64_t n, int64_t k, cudaStream_t stream) {
  constexpr int64_t kMaxLd = 0x7fffffff;
  if (m < 1 || n < 1 || k < 1 || m > kMaxLd || n > kMaxLd || k > kMaxLd) {
    return absl::InvalidArgumentError(
        absl::StrCat("LinearCuda: bad shape m=", m, " n=", n, " k=", k));
  }
  CublasLt::Impl& impl = *lt.impl_;
  std::lock_guard<std::mutex> lock(impl.mu);
  const PlanKey key{m,
                    n,
                    k,
                    bias != nullptr,
                    Alignment(x),
                    Alignment(w),
                    Alignment(y),
                    bias != nullptr ? Alignment(bias) : 256u};
  auto plan = impl.GetPlan(key);
  if (!plan.ok()) return plan.status();
  Plan& p = **plan;
  if (bias != nullptr) {
    SLUICE_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
                                      p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)),
                                  "set BIAS_POINTER");
  }
  const float alpha = 1.0f, beta = 0.0f;
  SLUICE_CUBLAS_RETURN_IF_ERROR(
      cublasLtMatmul(impl.handle, p.op, &alpha, w, p.a, x, p.b, &beta, y, p.c, y, p.c, &p.algo,
                     impl.workspace.data(), impl.workspace.bytes(), stream),
      "cublasLtMatmul");
  return absl::OkStatus();
}

}  // namespace sluice::kernels
