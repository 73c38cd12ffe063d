// CUDA RMSNorm (bf16 storage, fp32 math), optionally fused with the preceding residual add.
// Same formulas as rms_norm.h's CPU reference; see kernels/cuda/cuda_common.h for the launcher
// conventions (device pointers, enqueued on `stream`, no synchronization).
#ifndef SLUICE_KERNELS_RMS_NORM_RMS_NORM_CUDA_H_
#define SLUICE_KERNELS_RMS_NORM_RMS_NORM_CUDA_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/cuda_common.h"

namespace sluice::kernels {

// RmsNormCuda: out[r, :] = bf16(x[r, :] / sqrt(mean(x[r, :]²) + eps) * weight[:]) for r < rows,
// with the sum of squares, the scale and the products in fp32 and one rounding at the end.
// x, out: [rows, dim] bf16 with row strides x_stride / out_stride (elements); weight: [dim].
// out may alias x (same stride). One thread block per row: a row's result does not depend on
// `rows` (batch invariant) and the reduction order is fixed (deterministic).
// As a programmatic dependent (`pdl`) the kernel reads nothing before its wait.
// Errors: InvalidArgument for dim < 1, rows < 0 or a stride < dim; Internal for launch errors.
absl::Status RmsNormCuda(const bf16* x, int64_t x_stride, const bf16* weight, bf16* out,
                         int64_t out_stride, int64_t rows, int64_t dim, float eps,
                         cudaStream_t stream, bool pdl = false);

// AddRmsNormCuda: residual = bf16(residual + x); out = RmsNorm(residual) as above, computed from
// the rounded residual (as a bf16 model adds the residual before its fp32 norm). All [rows, dim]
// contiguous bf16; weight [dim]. out may alias x. Same errors as RmsNormCuda.
absl::Status AddRmsNormCuda(const bf16* x, bf16* residual, const bf16* weight, bf16* out,
                            int64_t rows, int64_t dim, float eps, cudaStream_t stream,
                            bool pdl = false);

// RmsNormCudaTuned: RmsNormCuda (residual == nullptr) or AddRmsNormCuda (residual != nullptr,
// contiguous: strides == dim) with an explicit launch shape for benchmarks and tests: on the
// vectorized path (dim % 8 == 0, 16-byte aligned rows) each thread handles `vecs_per_thread`
// (1, 2 or 4) 8-element vectors of its row, for rows of at most vecs_per_thread·8192 elements;
// 0 picks the default. Results are identical for every choice. Other rows take the scalar path.
// Errors: those of RmsNormCuda, and InvalidArgument for another vecs_per_thread.
absl::Status RmsNormCudaTuned(const bf16* x, int64_t x_stride, bf16* residual, const bf16* weight,
                              bf16* out, int64_t out_stride, int64_t rows, int64_t dim, float eps,
                              int vecs_per_thread, cudaStream_t stream, bool pdl = false);

}  // namespace sluice::kernels

#endif  // SLUICE_KERNELS_RMS_NORM_RMS_NORM_CUDA_H_
