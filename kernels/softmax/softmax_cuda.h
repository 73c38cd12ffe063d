// CUDA row softmax of fp32 attention scores into bf16 probabilities (the P operand of the
// P·V GEMM). Launcher conventions: kernels/cuda/cuda_common.h.
#ifndef SLUICE_KERNELS_SOFTMAX_SOFTMAX_CUDA_H_
#define SLUICE_KERNELS_SOFTMAX_SOFTMAX_CUDA_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/cuda_common.h"

namespace sluice::kernels {

// ScaledSoftmaxRowsCuda: out[r, :] = bf16(softmax(scale · x[r, :])), ScaledSoftmaxRowsCpu's
// formula in fp32 (block max and block sum in a fixed order: deterministic, independent of
// rows), rounded once. x [rows, n] float32, out [rows, n] bf16, both contiguous. One block per
// row. Errors: InvalidArgument for n < 1, rows < 0 or null pointers; Internal for launch errors.
absl::Status ScaledSoftmaxRowsCuda(const float* x, int64_t rows, int64_t n, float scale,
                                   bf16* out, cudaStream_t stream);

}  // namespace sluice::kernels

#endif  // SLUICE_KERNELS_SOFTMAX_SOFTMAX_CUDA_H_
