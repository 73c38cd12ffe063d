// CUDA gated activation (bf16 storage, fp32 math). Launcher conventions:
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

}  // namespace sluice::kernels

#endif  // SLUICE_KERNELS_ACTIVATION_ACTIVATION_CUDA_H_
