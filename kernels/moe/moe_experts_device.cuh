// Internal to kernels/moe (not an API): what MoeExpertsCuda (moe_experts.cu) and the fused
// decode path (moe_fused_decode.cu) share: the workspace layout, the device-side counting sort
// of the (token, k) rows by expert, and the expert GEMMs' A-operand rows.
#ifndef SLUICE_KERNELS_MOE_MOE_EXPERTS_DEVICE_CUH_
#define SLUICE_KERNELS_MOE_MOE_EXPERTS_DEVICE_CUH_

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "kernels/cuda/cuda_common.h"
#include "kernels/moe/moe_cuda.h"

namespace sluice::kernels::moe_detail {

constexpr int kGemvWarps = 8;  // warps per block of the GEMV-style expert kernels
// Sorted rows per tile of the grouped GEMM (moe_experts.cu); the sort counts tiles of it.
constexpr int kBm = 64;
// Largest hidden / intermediate: keeps the column grids within 65535 blocks.
constexpr int64_t kMaxDim = int64_t{1} << 22;

// Workspace segments (see MoeCudaWorkspaceBytes), each 256-byte aligned.
struct Layout {
  size_t offsets, tile_offsets, active, num_active, sorted_rows, row_to_sorted, route_logits,
      route_counter, act, expert_out;
  size_t total;
};

inline size_t Align256(size_t v) { return (v + 255) / 256 * 256; }

inline Layout MakeLayout(int64_t rows, int64_t num_experts, int64_t hidden, int64_t intermediate) {
  Layout l;
  size_t at = 0;
  auto take = [&at](size_t bytes) {
    const size_t begin = at;
    at = Align256(at + bytes);
    return begin;
  };
  const size_t e = static_cast<size_t>(num_experts);
  const size_t r = static_cast<size_t>(rows);
  l.offsets = take((e + 1) * sizeof(int32_t));
  l.tile_offsets = take((e + 1) * sizeof(int32_t));
  l.active = take(e * sizeof(int32_t));
  l.num_active = take(sizeof(int32_t));
  l.sorted_rows = take(r * sizeof(int32_t));
  l.row_to_sorted = take(r * sizeof(int32_t));
  // The multi-block fused routing's logits [T, E] fp32 (T <= kMoeFusedMaxTokens and T <= rows)
  // and its fallback arrival counter.
  l.route_logits = take(std::min<size_t>(r, kMoeFusedMaxTokens) * e * sizeof(float));
  l.route_counter = take(2 * sizeof(uint32_t));  // one used; the layout keeps 8 bytes
  l.act = take(r * static_cast<size_t>(intermediate) * sizeof(bf16));
  l.expert_out = take(r * static_cast<size_t>(hidden) * sizeof(bf16));
  l.total = at;
  return l;
}

struct SortOut {
  int32_t* offsets;        // [E + 1] first sorted row of each expert; [E] = valid rows
  int32_t* tile_offsets;   // [E + 1] first kBm-row tile of each expert; [E] = tiles
  int32_t* active;         // [E] experts with rows, ascending; first *num_active valid
  int32_t* num_active;     // [1]
  int32_t* sorted_rows;    // [rows] sorted position -> row t·top_k + k
  int32_t* row_to_sorted;  // [rows] row -> sorted position, -1 for an id outside [0, E)
};

// Sort segments of the workspace (the part MoeFusedRouteCuda writes).
inline SortOut SortPointers(void* workspace, const Layout& l) {
  unsigned char* ws = static_cast<unsigned char*>(workspace);
  SortOut so;
  so.offsets = reinterpret_cast<int32_t*>(ws + l.offsets);
  so.tile_offsets = reinterpret_cast<int32_t*>(ws + l.tile_offsets);
  so.active = reinterpret_cast<int32_t*>(ws + l.active);
  so.num_active = reinterpret_cast<int32_t*>(ws + l.num_active);
  so.sorted_rows = reinterpret_cast<int32_t*>(ws + l.sorted_rows);
  so.row_to_sorted = reinterpret_cast<int32_t*>(ws + l.row_to_sorted);
  return so;
}

// Inclusive warp scan (Hillis-Steele over shuffles).
__device__ __forceinline__ int WarpInclusiveScan(int v) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const int n = __shfl_up_sync(0xffffffffu, v, off);
    if (lane >= off) v += n;
  }
  return v;
}

// SortRows: the counting sort of MoeSortKernel by the whole calling block (every thread calls
// it; blockDim.x a multiple of 32, >= 32). `counts` and `cursor`: num_experts int32 each of
// shared memory. topk_ids written earlier by this block are visible after a __syncthreads.
__device__ __forceinline__ void SortRows(const int32_t* topk_ids, int rows, int num_experts,
                                         const SortOut& o, int32_t* counts, int32_t* cursor) {
  for (int e = threadIdx.x; e < num_experts; e += blockDim.x) counts[e] = 0;
  __syncthreads();
  for (int r = threadIdx.x; r < rows; r += blockDim.x) {
    const int e = topk_ids[r];
    if (e >= 0 && e < num_experts) atomicAdd(&counts[e], 1);
  }
  __syncthreads();
  if (threadIdx.x < 32) {  // warp 0 scans 32 experts at a time
    const int lane = threadIdx.x;
    int run_rows = 0, run_tiles = 0, run_active = 0;
    for (int base = 0; base < num_experts; base += 32) {
      const int e = base + lane;
      const int c = e < num_experts ? counts[e] : 0;
      const int tiles = (c + kBm - 1) / kBm;
      const int is_active = c > 0 ? 1 : 0;
      const int inc_rows = WarpInclusiveScan(c);
      const int inc_tiles = WarpInclusiveScan(tiles);
      const int inc_active = WarpInclusiveScan(is_active);
      if (e < num_experts) {
        const int first = run_rows + inc_rows - c;
        o.offsets[e] = first;
        cursor[e] = first;
        o.tile_offsets[e] = run_tiles + inc_tiles - tiles;
        if (is_active) o.active[run_active + inc_active - 1] = e;
      }
      run_rows += __shfl_sync(0xffffffffu, inc_rows, 31);
      run_tiles += __shfl_sync(0xffffffffu, inc_tiles, 31);
      run_active += __shfl_sync(0xffffffffu, inc_active, 31);
    }
    if (lane == 0) {
      o.offsets[num_experts] = run_rows;
      o.tile_offsets[num_experts] = run_tiles;
      *o.num_active = run_active;
    }
  }
  __syncthreads();
  for (int r = threadIdx.x; r < rows; r += blockDim.x) {
    const int e = topk_ids[r];
    int pos = -1;
    if (e >= 0 && e < num_experts) {
      pos = atomicAdd(&cursor[e], 1);
      o.sorted_rows[pos] = r;
    }
    o.row_to_sorted[r] = pos;
  }
}

// The A operand of both expert GEMMs, row by sorted position p: for gate/up the token's x row
// (x[sorted_rows[p] / top_k]), for down the activation row act[p].
struct ARows {
  const bf16* base;
  const int32_t* sorted_rows;  // null: row p is base[p]
  int top_k;
  int k;  // row length (elements)
  __device__ __forceinline__ const bf16* Row(int p) const {
    const int src = sorted_rows != nullptr ? sorted_rows[p] / top_k : p;
    return base + static_cast<int64_t>(src) * k;
  }
};

// Output columns [col] of one expert: gate/up writes silu(gate)·up into act[p, col] (n = I),
// down writes expert_out[p, col] (n = H); both rounded to bf16 once.
__device__ __forceinline__ float SiluMul(float g, float u) { return g / (1.0f + expf(-g)) * u; }

}  // namespace sluice::kernels::moe_detail

#endif  // SLUICE_KERNELS_MOE_MOE_EXPERTS_DEVICE_CUH_
