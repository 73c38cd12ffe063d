// BatchedGemm: strided-batched bf16 GEMMs with fp32 accumulation through cuBLAS
// (cublasGemmStridedBatchedEx), for products LinearCuda (one contiguous x · Wᵀ) does not cover:
// MLA's per-head absorbed projections, whose operands are strided views of wider rows, and the
// MoE router, whose logits are kept in float32. Launcher conventions: kernels/cuda/cuda_common.h
// (device pointers, enqueued on the stream given at creation, graph-capturable: cuBLAS runs on
// a workspace owned here, so nothing is allocated during capture).
#ifndef SLUICE_ENGINE_CUDA_BATCHED_GEMM_H_
#define SLUICE_ENGINE_CUDA_BATCHED_GEMM_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cuda/cuda_common.h"

namespace sluice::cuda_runner {

// One strided batch of row-major matrices: element (i, j) of matrix b is at
// ptr[b · batch_stride + i · ld + j] (elements).
struct StridedMatrices {
  const void* ptr = nullptr;
  int64_t ld = 0;
  int64_t batch_stride = 0;
};

class BatchedGemm {
 public:
  // Create makes a cuBLAS handle bound to `stream` with its own workspace.
  // Errors: Internal for cuBLAS/CUDA failures.
  static absl::StatusOr<std::unique_ptr<BatchedGemm>> Create(cudaStream_t stream);
  ~BatchedGemm();
  BatchedGemm(const BatchedGemm&) = delete;
  BatchedGemm& operator=(const BatchedGemm&) = delete;

  // Run computes, for b < batch, y_b[m, n] = Σ_l x_b[i, l] · W_b(l, j) in fp32, rounded once to
  // y's type (bf16, or float32 when y_float):
  //   x: bf16 [m, k] per batch; w: bf16, W_b(l, j) = w_b[j, l] (w_b stored [n, k], as
  //   LinearCuda's weights: x · Wᵀ) unless w_is_kn, then W_b(l, j) = w_b[l, j] (stored [k, n]).
  // y must not overlap x or w. Errors: InvalidArgument for sizes < 1 or a leading dimension
  // shorter than its row; Internal for cuBLAS errors.
  absl::Status Run(const StridedMatrices& x, const StridedMatrices& w, bool w_is_kn,
                   const StridedMatrices& y, bool y_float, int64_t m, int64_t n, int64_t k,
                   int64_t batch);

 private:
  BatchedGemm() = default;
  void* handle_ = nullptr;  // cublasHandle_t
  kernels::DeviceBuffer<uint8_t> workspace_;
};

}  // namespace sluice::cuda_runner

#endif  // SLUICE_ENGINE_CUDA_BATCHED_GEMM_H_
