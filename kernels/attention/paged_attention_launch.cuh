// The interface between the CUDA paged attention files: the kernels' argument block, the padded
// head-dim shapes, and each kernel family's launch and occupancy entry points, called by the
// planner (paged_attention_plan.cu).
//   paged_decode_tiles.cu       PagedTileKernel: decode warp rings and prefill CTA tiles
//   paged_decode_persistent.cu  PagedDecodeWarpKernel: persistent decode warps
//   paged_prefill_mma.cu        PagedMmaPrefillKernel: 128-row mma.sync prefill tiles
//   paged_prefill_fa2.cu        FlashAttention-2 prefill tiles (paged_prefill_device.cuh)
//   paged_prefill_wgmma.cu      sm_90a wgmma prefill (paged_prefill_wgmma.h)
//   paged_kv_cache_write.cu     WriteKvCacheCuda
#ifndef SLUICE_KERNELS_ATTENTION_PAGED_ATTENTION_LAUNCH_CUH_
#define SLUICE_KERNELS_ATTENTION_PAGED_ATTENTION_LAUNCH_CUH_

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "absl/status/status.h"
#include "kernels/attention/attention_device.cuh"
#include "kernels/attention/decode_rope_fusion.cuh"
#include "kernels/attention/paged_prefill_device.cuh"
#include "kernels/cuda/cuda_common.h"

namespace sluice::kernels::paged_detail {

// The prefill kernels' argument block (paged_prefill_device.cuh) plus the decode kernels' extras.
struct AttnArgs : Fa2Args {
  attention_detail::DecodeRopeFusion fusion;
  int num_sequences;  // PagedDecodeWarpKernel's (sequence, KV head, split) units
};

// Padded head dims: the smallest (kD, kDV) covering (head_dim, v_head_dim).
enum class PaddedDims { k32, k64, k128, k192v128, k256 };

// Runs op.Run<kD, kDV>() at the padded dims v.
template <typename Op>
auto WithPaddedDims(PaddedDims v, const Op& op) {
  switch (v) {
    case PaddedDims::k32:
      return op.template Run<32, 32>();
    case PaddedDims::k64:
      return op.template Run<64, 64>();
    case PaddedDims::k192v128:
      return op.template Run<192, 128>();
    case PaddedDims::k256:
      return op.template Run<256, 256>();
    case PaddedDims::k128:
    default:
      return op.template Run<128, 128>();
  }
}

// Keys per tile of the prefill CTA tiles and of a decode warp ring's CTA (4 warps × 16-key
// slices); split-KV partitions are multiples of it.
constexpr int kKeyTile = 64;
// Keys per slice of a decode warp ring and of the persistent decode warps.
constexpr int kDecodeSliceKeys = 16;
// Query rows (token · group + head) per CTA of the prefill CTA tiles and the MMA tiles.
constexpr int kCtaTileRows = 64;
constexpr int kMmaTileRows = 128;

// PagedTileKernel's shapes: 64-row prefill CTA tiles (4 warps × 16 rows, 64-key tiles, 2
// stages); decode warp rings of 4 and of 2 warps × 3 stages (depths shrink to what fits shared
// memory for wide heads).
enum class TileKind { kCtaTiles, kRing4x3, kRing2x3 };
absl::Status LaunchTileKernel(TileKind kind, PaddedDims dims, const AttnArgs& args, dim3 grid,
                              cudaStream_t stream, bool pdl);
// CTAs resident per SM (≥ 1).
int TileKernelOccupancy(TileKind kind, PaddedDims dims);

// PagedMmaPrefillKernel at padded dims up to 128 (InvalidArgument for wider ones); grid: linear
// x over (query tile, KV head, split), longest tiles first.
absl::Status LaunchMmaPrefill(PaddedDims dims, const AttnArgs& args, dim3 grid,
                              cudaStream_t stream, bool pdl);
int MmaPrefillOccupancy(PaddedDims dims);

// PagedDecodeWarpKernel over `ctas` CTAs: at padded dims 128 the wide shape (8 warps a CTA,
// evict-first copies; with `swapped` the swapped GQA math, ≤ 8 query rows a unit), elsewhere 4
// warps a CTA (`wide` and `swapped` must then be false).
absl::Status LaunchPersistentDecode(PaddedDims dims, bool wide, bool swapped, const AttnArgs& args,
                                    int ctas, cudaStream_t stream, bool pdl);
// CTAs of the shape resident per SM (≥ 1), sized with its unswapped kernel.
int PersistentDecodeOccupancy(PaddedDims dims, bool wide);
constexpr int PersistentWarpsPerCta(bool wide) { return wide ? 8 : 4; }

// Launches kernel (opting into > 48 KiB of dynamic shared memory first; idempotent, host-only,
// allowed during stream capture), as a programmatic dependent when pdl.
inline absl::Status LaunchWithSmem(void (*kernel)(AttnArgs), int threads, int smem_bytes,
                                   const AttnArgs& args, dim3 grid, cudaStream_t stream, bool pdl) {
  if (smem_bytes > 48 * 1024) {
    SLUICE_CUDA_RETURN_IF_ERROR(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes),
        "PagedAttentionCuda: cudaFuncSetAttribute");
  }
  const cudaError_t e = attention_detail::LaunchKernelMaybePdl(kernel, grid, dim3(threads),
                                                               smem_bytes, stream, pdl, args);
  SLUICE_CUDA_RETURN_IF_ERROR(e, "PagedAttentionCuda: launch");
  return CudaLaunchStatus("PagedAttentionCuda");
}

// CTAs of kernel resident per SM (≥ 1).
inline int Occupancy(void (*kernel)(AttnArgs), int threads, int smem_bytes) {
  if (smem_bytes > 48 * 1024 &&
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes) !=
          cudaSuccess) {
    return 1;
  }
  int n = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, smem_bytes) !=
      cudaSuccess) {
    return 1;
  }
  return std::max(n, 1);
}

}  // namespace sluice::kernels::paged_detail

#endif  // SLUICE_KERNELS_ATTENTION_PAGED_ATTENTION_LAUNCH_CUH_
