// Device helpers shared by the MoE .cu files (router logits and the decode GEMV path): a warp
// computing the dot products of a few weight rows with a few activation rows, streaming the
// weights once.
#ifndef SLUICE_KERNELS_MOE_MOE_CUDA_DETAIL_CUH_
#define SLUICE_KERNELS_MOE_MOE_CUDA_DETAIL_CUH_

#include <cuda_bf16.h>

#include <cstring>

#include "kernels/cuda/device_utils.cuh"

namespace sluice::kernels::moe_detail {

// Most activation rows a warp multiplies per pass over the weights.
constexpr int kWarpDotRows = 8;

// Weight vectors are read once per call: the streaming load (ld.global.cs) keeps them from
// evicting the activation rows that every warp re-reads from L1/L2.
__device__ __forceinline__ cuda_detail::Bf16x8 LoadWeightVec(const __nv_bfloat16* p) {
  const uint4 r = __ldcs(reinterpret_cast<const uint4*>(p));
  cuda_detail::Bf16x8 v;
  static_assert(sizeof(v) == sizeof(r));
  memcpy(&v, &r, sizeof(v));
  return v;
}

// WarpDotRows: acc[c][j] = Σ_i w[c][i] · a[j][i] over i < k for c < kCols weight rows and
// j < rows (<= kRows <= kWarpDotRows) activation rows, fp32 products and sums. Every lane of the
// warp must call it; every lane gets the sums (fixed butterfly order: deterministic). A row's
// sums do not depend on `rows` or kRows. k % 8 == 0 and all rows 16-byte aligned; a[j] for
// j >= rows is never read.
template <int kCols, int kRows>
__device__ __forceinline__ void WarpDotRows(const __nv_bfloat16* const (&w)[kCols],
                                            const __nv_bfloat16* const (&a)[kRows], int rows, int k,
                                            float (&acc)[kCols][kRows]) {
  static_assert(kRows >= 1 && kRows <= kWarpDotRows);
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int c = 0; c < kCols; ++c) {
#pragma unroll
    for (int j = 0; j < kRows; ++j) acc[c][j] = 0.0f;
  }
  const int vecs = k / 8;
  // Unrolled so that several 16-byte weight loads per lane are in flight (bandwidth-bound).
#pragma unroll 4
  for (int i = lane; i < vecs; i += 32) {
    float wf[kCols][8];
#pragma unroll
    for (int c = 0; c < kCols; ++c) cuda_detail::ToFloat8(LoadWeightVec(w[c] + i * 8), wf[c]);
#pragma unroll
    for (int j = 0; j < kRows; ++j) {
      if (j < rows) {
        float af[8];
        cuda_detail::LoadBf16x8(a[j] + i * 8, af);
#pragma unroll
        for (int c = 0; c < kCols; ++c) {
#pragma unroll
          for (int q = 0; q < 8; ++q) acc[c][j] = fmaf(wf[c][q], af[q], acc[c][j]);
        }
      }
    }
  }
#pragma unroll
  for (int c = 0; c < kCols; ++c) {
#pragma unroll
    for (int j = 0; j < kRows; ++j) acc[c][j] = cuda_detail::WarpSum(acc[c][j]);
  }
}

}  // namespace sluice::kernels::moe_detail

#endif  // SLUICE_KERNELS_MOE_MOE_CUDA_DETAIL_CUH_
