#include "engine/cuda/batched_gemm.h"

#include <cublas_v2.h>

#include <climits>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cublas_status.h"

namespace sluice::cuda_runner {
namespace {

// 4 MiB: the products here are small (per-head MLA projections, the router); cuBLAS needs a
// caller-owned workspace to run inside stream capture without allocating.
constexpr size_t kWorkspaceBytes = size_t{4} << 20;

}  // namespace

absl::StatusOr<std::unique_ptr<BatchedGemm>> BatchedGemm::Create(cudaStream_t stream) {
  std::unique_ptr<BatchedGemm> g(new BatchedGemm());
  cublasHandle_t h = nullptr;
  SLUICE_CUBLAS_RETURN_IF_ERROR(cublasCreate(&h), "cublasCreate");
  g->handle_ = h;
  auto ws = kernels::DeviceBuffer<uint8_t>::Create(kWorkspaceBytes);
  if (!ws.ok()) return ws.status();
  g->workspace_ = std::move(*ws);
  // cublasSetStream resets the workspace to cuBLAS's own pool: set the stream first.
  SLUICE_CUBLAS_RETURN_IF_ERROR(cublasSetStream(h, stream), "cublasSetStream");
  SLUICE_CUBLAS_RETURN_IF_ERROR(
      cublasSetWorkspace(h, g->workspace_.data(), g->workspace_.bytes()), "cublasSetWorkspace");
  return g;
}

BatchedGemm::~BatchedGemm() {
  if (handle_ != nullptr) cublasDestroy(static_cast<cublasHandle_t>(handle_));
}

absl::Status BatchedGemm::Run(const StridedMatrices& x, const StridedMatrices& w, bool w_is_kn,
                              const StridedMatrices& y, bool y_float, int64_t m, int64_t n,
                              int64_t k, int64_t batch) {
  if (m < 1 || n < 1 || k < 1 || batch < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("BatchedGemm: m, n, k, batch must be >= 1 (", m, ", ", n, ", ", k, ", ",
                     batch, ")"));
  }
  if (x.ld < k || y.ld < n || w.ld < (w_is_kn ? n : k)) {
    return absl::InvalidArgumentError("BatchedGemm: a leading dimension is shorter than its row");
  }
  if (m > INT_MAX || n > INT_MAX || k > INT_MAX || batch > INT_MAX || x.ld > INT_MAX ||
      w.ld > INT_MAX || y.ld > INT_MAX) {
    return absl::InvalidArgumentError("BatchedGemm: sizes exceed int32");
  }
  // cuBLAS is column-major: a row-major [r, c] matrix with row stride ld is the column-major
  // [c, r] matrix with the same ld. So yᵀ [n, m] = op(W)ᵀ-view [n, k] · xᵀ [k, m]:
  //   w stored [n, k] row-major = column-major [k, n]: transpose it (OP_T) to get [n, k];
  //   w stored [k, n] row-major = column-major [n, k]: as is (OP_N).
  const float alpha = 1.0f, beta = 0.0f;
  SLUICE_CUBLAS_RETURN_IF_ERROR(
      cublasGemmStridedBatchedEx(
          static_cast<cublasHandle_t>(handle_), w_is_kn ? CUBLAS_OP_N : CUBLAS_OP_T, CUBLAS_OP_N,
          static_cast<int>(n), static_cast<int>(m), static_cast<int>(k), &alpha, w.ptr,
          CUDA_R_16BF, static_cast<int>(w.ld), w.batch_stride, x.ptr, CUDA_R_16BF,
          static_cast<int>(x.ld), x.batch_stride, &beta, const_cast<void*>(y.ptr),
          y_float ? CUDA_R_32F : CUDA_R_16BF, static_cast<int>(y.ld), y.batch_stride,
          static_cast<int>(batch), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
      "cublasGemmStridedBatchedEx");
  return absl::OkStatus();
}

#undef SLUICE_CUBLAS_RETURN_IF_ERROR

}  // namespace sluice::cuda_runner
