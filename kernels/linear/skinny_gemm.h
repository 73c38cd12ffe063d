// Skinny GEMM launch hooks for LinearCuda's autotuner (linear.cu). The public entry points,
// SkinnyGemmCuda and SkinnyGemmSiluMulCuda, are declared in linear_cuda.h.
#ifndef SLUICE_KERNELS_LINEAR_SKINNY_GEMM_H_
#define SLUICE_KERNELS_LINEAR_SKINNY_GEMM_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/cuda_common.h"

namespace sluice::kernels::skinny_detail {

// The (split, stages) pairs the kernel is built for, in the order the autotuner times them.
struct SkinnyVariant {
  int split, stages;
};
inline constexpr SkinnyVariant kSkinnyVariants[] = {{1, 3}, {2, 3}, {4, 3}, {8, 3},
                                                    {1, 4}, {2, 4}, {4, 4}, {8, 4}};

// Whether (split, stages) is built and its shared memory (weight and x rings, 32·stages KB
// and more) fits at m rows.
bool SkinnyVariantSupported(int64_t m, int split, int stages);
// Operands the kernel serves: 1 <= m <= kSkinnyGemmMaxRows, k % 8 == 0, 16-byte aligned x and
// w, n (output columns; the GLU form's w has 2n rows) and k below 2^31.
bool SkinnySupported(const bf16* x, const bf16* w, int64_t m, int64_t n, int64_t k);
// Launch without validating (callers checked both). glu: w is [gate; up] of 2n rows and y gets
// SiLU(gate)·up, [m, n]. Launch errors surface through cudaGetLastError.
void LaunchSkinny(const bf16* x, const bf16* w, const bf16* bias, bf16* y, int64_t m, int64_t n,
                  int64_t k, int split, int stages, bool glu, cudaStream_t stream, bool pdl);

}  // namespace sluice::kernels::skinny_detail

#endif  // SLUICE_KERNELS_LINEAR_SKINNY_GEMM_H_
