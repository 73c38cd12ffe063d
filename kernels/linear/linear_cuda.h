// CUDA linear layer through cuBLASLt: y = x · Wᵀ (+ bias), bf16 storage with fp32 accumulation.
// Launcher conventions: kernels/cuda/cuda_common.h.
#ifndef SLUICE_KERNELS_LINEAR_LINEAR_CUDA_H_
#define SLUICE_KERNELS_LINEAR_LINEAR_CUDA_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cuda/cuda_common.h"

namespace sluice::kernels {

// CublasLt owns a cuBLASLt handle, a device workspace and a cache of matmul plans (descriptors
// plus the heuristic's algorithm) keyed by shape, bias and pointer alignment. Thread-safe
// (calls are serialized by a mutex). Use one per device.
class CublasLt {
 public:
  // Default workspace: 32 MiB, as NVIDIA recommends for Hopper.
  static constexpr size_t kDefaultWorkspaceBytes = size_t{32} << 20;
  // Create makes the handle and allocates the workspace on the current device.
  // Errors: Internal for cuBLAS/CUDA failures (e.g. no device).
  static absl::StatusOr<std::unique_ptr<CublasLt>> Create(
      size_t workspace_bytes = kDefaultWorkspaceBytes);
  ~CublasLt();
  CublasLt(const CublasLt&) = delete;
  CublasLt& operator=(const CublasLt&) = delete;

  struct Impl;

 private:
  explicit CublasLt(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  friend absl::Status LinearCuda(CublasLt& lt, const bf16* x, const bf16* w, const bf16* bias,
                                 bf16* y, int64_t m, int64_t n, int64_t k, cudaStream_t stream);
};

// LinearCuda computes y[m, n] = bf16(Σ_k x[m, k] · w[n, k] + bias[n]) (LinearCpu's layout:
// row-major, contiguous; bias [n] may be null), accumulating in fp32 (CUBLAS_COMPUTE_32F) and
// rounding once. The algorithm is chosen by cuBLASLt's heuristic per (m, n, k), so unlike
// LinearCpu a row's bits may depend on m. y must not overlap x or w.
// Errors: InvalidArgument for m, n or k < 1 or > INT32_MAX-sized leading dimensions;
// Internal for cuBLASLt failures (e.g. no algorithm for this shape).
absl::Status LinearCuda(CublasLt& lt, const bf16* x, const bf16* w, const bf16* bias, bf16* y,
                        int64_t m, int64_t n, int64_t k, cudaStream_t stream);

}  // namespace sluice::kernels

#endif  // SLUICE_KERNELS_LINEAR_LINEAR_CUDA_H_
