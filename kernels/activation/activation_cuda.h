// CUDA activations (bf16 storage, fp32 math): the gated SiLU of Llama MLPs, the GELUs of ViTs. Launcher conventions:
// kernels/cuda/cuda_common.h.
#ifndef SLUICE_KERNELS_ACTIVATION_ACTIVATION_CUDA_H_
#define SLUICE_KERNELS_ACTIVATION_ACTIVATION_CUDA_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/cuda_common.h"

namespace sluice::kernels {

// SiluMulCuda: out[r, i] = bf16(silu(g) * u) with g = gate_up[r, i], u = gate_up[r, d + i]
// (fp32 math, silu(g) = g / (1 + e^-g)), for i < d. gate_up: [rows, 2d] bf16 (gate then up,
// as SiluMulCpu), out: [rows, d] bf16; must not overlap gate_up.
// Errors: InvalidArgument for d < 1 or rows < 0; Internal for launch errors.
absl::Status SiluMulCuda(const bf16* gate_up, bf16* out, int64_t rows, int64_t d,
                         cudaStream_t stream);

// GeluCuda: out[i] = bf16(GELU(x[i])), the exact (erf) GELU of GeluCpu in fp32, for i < n.
// QuickGeluCuda: out[i] = bf16(x · sigmoid(1.702 · x)), QuickGeluCpu's formula (CLIP).
// x, out: [n] bf16; out may alias x (in place after a GEMM).
// Errors: InvalidArgument for n < 0 or null pointers (n > 0); Internal for launch errors.
absl::Status GeluCuda(const bf16* x, bf16* out, int64_t n, cudaStream_t stream);
absl::Status QuickGeluCuda(const bf16* x, bf16* out, int64_t n, cudaStream_t stream);

}  // namespace sluice::kernels

#endif  // SLUICE_KERNELS_ACTIVATION_ACTIVATION_CUDA_H_
