// Device pieces of the CUDA paged attention kernels that stream keys a 16-key slice per warp:
// PagedTileKernel (paged_decode_tiles.cu) and PagedDecodeWarpKernel
// (paged_decode_persistent.cu).
//
// Algorithm (Dao, "FlashAttention-2: Faster Attention with Better Parallelism and Work
// Partitioning", 2023): each CTA (or warp) owns a tile of query rows and streams the keys it
// may see in tiles through shared memory, keeping a running max m, running sum l and an
// unnormalized fp32 accumulator per row (online softmax), so scores never reach global memory.
// Tensor cores: S = Q·Kᵀ and O += P·V with mma.sync m16n8k16 (bf16 in, fp32 accumulate), P
// re-packed from the S accumulators into A fragments in registers as in FlashAttention-2.
//
// GQA head packing: a CTA serves ONE KV head, and its query rows are (query token, query head
// of that KV head's group) pairs, row = token · group + head-in-group. A decode token of a
// Llama-3-8B layer (group 4) is 4 rows of one m16 tile, so the group's query heads share every
// K/V byte loaded (the decode step is bandwidth-bound, so KV bytes are what counts).
//
// Split-KV (Dao et al., "Flash-Decoding for long-context inference", 2023): when the grid of
// (query tiles × KV heads × sequences) is too small to fill the GPU — decode at small batch —
// the key range is cut into partitions handled by separate CTAs, each writing a normalized
// partial output and its (max, sum); SplitKvCombineKernel (attention_device.cuh) merges them.
//
// PrefetchBeforeWait: a decode step's attention is a programmatic dependent of the RoPE + KV
// write kernel before it (PagedAttentionOptions::pdl), which lets it launch as soon as that
// kernel has started. The step's metadata, block tables and the keys below each sequence's context
// length were written before that kernel started (by the host and by earlier steps), so the
// decode kernels read them and issue their first ring copies before griddepcontrol.wait; q,
// the new tokens' keys (written by that kernel) and every global write come after it. This
// hides the metadata → block table → K/V latency chain behind the kernel before.
//
// Shapes are compile-time padded: head dims are rounded up to a supported tile width (kD, kDV)
// and the padding columns are zero-filled in shared memory (cp.async with src-size 0), as are
// key rows past the partition end, so no uninitialized shared memory reaches an mma.
#ifndef SLUICE_KERNELS_ATTENTION_PAGED_DECODE_DEVICE_CUH_
#define SLUICE_KERNELS_ATTENTION_PAGED_DECODE_DEVICE_CUH_

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "kernels/attention/attention_device.cuh"
#include "kernels/attention/decode_rope_fusion.cuh"
#include "kernels/attention/paged_attention_launch.cuh"
#include "kernels/attention/paged_prefill_device.cuh"
#include "kernels/cuda/device_utils.cuh"

namespace sluice::kernels::paged_detail {

using attention_detail::CpAsync16;
using attention_detail::CpAsyncCommit;
using attention_detail::CpAsyncWait;
using attention_detail::Exp2;
using attention_detail::SmemAddr;

// Four transposed 8×8 bf16 matrices from shared memory (ldmatrix .trans): lanes 8i..8i+7 give
// the row addresses of matrix i; each lane receives the B-fragment layout of the transposes.
__device__ __forceinline__ void LdMatrixX4Trans(uint32_t (&r)[4], const void* smem_row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SmemAddr(smem_row)));
}

// Four 8×8 bf16 matrices from shared memory (ldmatrix, not transposed): lanes 8i..8i+7 give
// the row addresses of matrix i; lane l receives row l / 4, columns 2(l % 4)..+1 of each, which
// is the B-fragment layout of a matrix stored as [n][k] rows (K rows for Q·Kᵀ).
__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], const void* smem_row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SmemAddr(smem_row)));
}

// Rows of a kDim-wide K or V slice in shared memory. Padded (kSwizzled false): pitch
// Pitch<kDim>. Swizzled: unpadded rows (pitch kDim) whose 16-byte chunk c of row r sits at
// chunk c ^ (r % 8), so the 8 rows one ldmatrix phase reads still hit distinct banks, and every
// 128-byte run of a row (one L2 line of a cache row) lands in one 128-byte-aligned span of
// shared memory. Why: a cp.async destination row that starts 16 bytes into a 128-byte span
// (the padded pitch is 272 bytes) splits each copied line's shared stores in two, and the L2
// then moves more sectors than the K/V bytes need (ncu: bench/results/paged_attention_variants.md).
// The XOR swizzle is the usual one for ldmatrix-read tiles (e.g. CUTLASS's Swizzle<3, 3, 3>).
template <int kDim, bool kSwizzled>
struct SliceRows {
  static_assert(!kSwizzled || kDim % 64 == 0, "swizzled rows hold a multiple of 8 chunks");
  static constexpr int kPitch = kSwizzled ? kDim : Pitch<kDim>();
  // The XOR mask of row `row`'s columns (bf16 elements; 0 unswizzled).
  __host__ __device__ static constexpr int Mask(int row) { return kSwizzled ? (row & 7) << 3 : 0; }
  // Element offset of (row, col), col a multiple of 8.
  __host__ __device__ static constexpr int At(int row, int col) {
    return row * kPitch + (col ^ Mask(row));
  }
};

// A thread's two rows (g and g + 8) of the m16 tile whose first row is row0: row r of a
// (sequence, KV head) is query token r / group, query head kv_head · group + r % group.
struct RowInfo {
  int pos[2], token[2], head[2];
  bool valid[2];
};

__device__ __forceinline__ RowInfo MakeRows(int row0, int rows, int group, int q_begin, int ctx,
                                            int kv_head, int g) {
  RowInfo rw;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = row0 + g + 8 * i;
    rw.valid[i] = r < rows;
    const int qi = rw.valid[i] ? r / group : 0;
    rw.token[i] = q_begin + qi;
    rw.head[i] = kv_head * group + (rw.valid[i] ? r % group : 0);
    rw.pos[i] = ctx + qi;
  }
  return rw;
}

// Q fragments (A operand) of the thread's rows, straight from global memory (rotated on the
// way when `fused`, with the token's (cos, sin) table rope_cs).
template <int kKSteps>
__device__ __forceinline__ void LoadQFrag(const AttnArgs& args, const RowInfo& rw, int t,
                                          bool fused, const float2* rope_cs,
                                          uint32_t (&q_frag)[kKSteps][4]) {
#pragma unroll
  for (int ks = 0; ks < kKSteps; ++ks) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int i = j & 1;
      const int col = ks * 16 + 2 * t + (j >> 1) * 8;
      // q is 4-byte aligned with an even stride and head_dim is a multiple of 8, so the pair
      // is one 32-bit word.
      uint32_t pair = 0;
      if (rw.valid[i] && col < args.head_dim) {
        const bf16* q_head = args.q + rw.token[i] * args.q_token_stride + rw.head[i] * args.head_dim;
        pair = fused ? attention_detail::DecodeRopePair(q_head, col, rope_cs, args.fusion.half)
                     : __ldg(reinterpret_cast<const unsigned int*>(q_head + col));
      }
      q_frag[ks][j] = pair;
    }
  }
}

// Cache slot of key key0 + lane (lane < kBN; −1 outside [kv_begin, kv_end)) of the sequence
// whose block-table row is block_table.
template <int kBN>
__device__ __forceinline__ int64_t LaneSlot(const AttnArgs& args, const int32_t* block_table,
                                            int key0, int kv_begin, int kv_end, int lane) {
  const int j = key0 + lane;
  if (lane >= kBN || j < kv_begin || j >= kv_end) return -1;
  const int block = args.block_shift >= 0 ? j >> args.block_shift : j / args.block_size;
  const int offset = j - block * args.block_size;
  return static_cast<int64_t>(__ldg(block_table + block)) * args.block_size + offset;
}

// One 16-byte chunk of CopySlice: plain cp.async (as every other kernel here), or with
// kEvictFirst (the 8-warp persistent decode warps) cp.async with the L2 evict-first `policy`
// and no .L2::256B prefetch-size hint (attention_device.cuh): at batch 256 the attention is
// bound by L2 throughput, and the hint makes the L2 move more sectors between its partitions.
template <bool kEvictFirst>
__device__ __forceinline__ void CopyChunk(void* dst, const void* src, int bytes, uint64_t policy) {
  if constexpr (kEvictFirst) {
    attention_detail::CpAsync16EvictFirstNoPrefetch(dst, src, bytes, policy);
  } else {
    CpAsync16(dst, src, bytes);
  }
}

// One warp copies the rows of a kBN-key slice of one cache (K or V: rows SliceRows<kDim,
// kSwizzled>, true head dim `dim`, `token_stride` elements between tokens) into dst, without
// committing; lane_slot is LaneSlot of the slice (zero-filled rows for −1 and columns past
// `dim`). base: the KV head's first element in the cache. kEvictFirst / policy: the cp.async
// flavour (CopyChunk).
template <int kDim, int kBN, bool kEvictFirst = false, bool kSwizzled = false>
__device__ __forceinline__ void CopyRows(bf16* dst, int64_t lane_slot, const bf16* base,
                                         int64_t token_stride, int dim, int lane,
                                         uint64_t policy = 0) {
  constexpr int kChunks = kDim / 8;
  static_assert((kBN * kChunks) % 32 == 0);
#pragma unroll
  for (int i = 0; i < kBN * kChunks / 32; ++i) {
    const int c = lane + 32 * i;
    const int key = c / kChunks;
    const int col = (c % kChunks) * 8;
    const int64_t slot = __shfl_sync(0xffffffffu, lane_slot, key);
    const bool live = slot >= 0 && col < dim;
    CopyChunk<kEvictFirst>(dst + SliceRows<kDim, kSwizzled>::At(key, col),
                           live ? base + slot * token_stride + col : base, live ? 16 : 0, policy);
  }
}

// One warp copies the K rows (SliceRows<kD, kSwizzled>) and then V rows of a kBN-key slice
// into k_dst (V after the kBN K rows) and commits the copy group (CopyRows for the arguments).
template <int kD, int kDV, int kBN, bool kEvictFirst = false, bool kSwizzled = false>
__device__ __forceinline__ void CopySlice(const AttnArgs& args, bf16* k_dst, int64_t lane_slot,
                                          const bf16* k_base, const bf16* v_base, int lane,
                                          uint64_t policy = 0) {
  CopyRows<kD, kBN, kEvictFirst, kSwizzled>(
      k_dst, lane_slot, k_base, static_cast<int64_t>(args.num_kv_heads) * args.head_dim,
      args.head_dim, lane, policy);
  CopyRows<kDV, kBN, kEvictFirst, kSwizzled>(
      k_dst + kBN * SliceRows<kD, kSwizzled>::kPitch, lane_slot, v_base,
      static_cast<int64_t>(args.num_kv_heads) * args.v_head_dim, args.v_head_dim, lane, policy);
  CpAsyncCommit();
}

// CopySlice for a slice whose kBN keys are all live and lie in one cache block (block size a
// multiple of kBN, slices start at multiples of kBN), with K and V rows of equal
// width and token stride: key k's slot is key 0's plus k, so a lane fetches one slot (one
// shuffle) and steps one offset by a constant for its K and V chunks, where CopySlice
// shuffles and multiplies per chunk and cache. Same bytes in the same places. Needs kD / 8
// chunks a row dividing 32.
template <int kD, int kBN, bool kEvictFirst = false, bool kSwizzled = false>
__device__ __forceinline__ void CopySliceContiguous(const AttnArgs& args, bf16* k_dst,
                                                    int64_t lane_slot, const bf16* k_base,
                                                    const bf16* v_base, int lane,
                                                    uint64_t policy) {
  constexpr int kChunks = kD / 8;
  static_assert(kChunks <= 32 && 32 % kChunks == 0 && kBN % (32 / kChunks) == 0);
  // Chunk i of this lane: key lane / kChunks + i · kKeysPerRound, column (lane % kChunks) · 8.
  constexpr int kKeysPerRound = 32 / kChunks;
  const int64_t token_stride = static_cast<int64_t>(args.num_kv_heads) * args.head_dim;
  using Rows = SliceRows<kD, kSwizzled>;
  bf16* const v_dst = k_dst + kBN * Rows::kPitch;
  const int key = lane / kChunks;
  const int col = (lane % kChunks) * 8;
  const int bytes = col < args.head_dim ? 16 : 0;
  const int64_t slot0 = __shfl_sync(0xffffffffu, lane_slot, 0);
  const int64_t off = bytes > 0 ? (slot0 + key) * token_stride + col : 0;
  const int64_t step = bytes > 0 ? kKeysPerRound * token_stride : 0;
  const bf16* k_src = k_base + off;
  const bf16* v_src = v_base + off;
#pragma unroll
  for (int i = 0; i < kBN / kKeysPerRound; ++i) {
    const int at = Rows::At(key + i * kKeysPerRound, col);
    CopyChunk<kEvictFirst>(k_dst + at, k_src, bytes, policy);
    CopyChunk<kEvictFirst>(v_dst + at, v_src, bytes, policy);
    k_src += step;
    v_src += step;
  }
  CpAsyncCommit();
}

// Online-softmax update of the warp's m16 rows with kBN keys key0.. (K rows r0.. of k_smem, V
// rows r0.. of v_smem): S = Q·Kᵀ, scale and mask (partition [kv_begin, kv_end), causal,
// window, padding rows), rescale by the new running max, O += P·V. pos_first / pos_last: the
// positions of the tile's first and last rows (the "whole slice visible" shortcut).
template <int kD, int kDV, int kBN>
__device__ __forceinline__ void AttendSlice(const AttnArgs& args, const bf16* k_smem,
                                            const bf16* v_smem, int r0, int key0, int kv_begin,
                                            int kv_end, int pos_first, int pos_last,
                                            const RowInfo& rw,
                                            const uint32_t (&q_frag)[kD / 16][4],
                                            float (&acc)[kDV / 8][4], float (&row_max)[2],
                                            float (&row_sum)[2], int lane) {
  constexpr int kKSteps = kD / 16;   // k16 steps of Q·Kᵀ
  constexpr int kSTiles = kBN / 8;   // n8 score tiles per warp
  constexpr int kVTiles = kDV / 8;   // n8 output tiles
  constexpr int kPSteps = kBN / 16;  // k16 steps of P·V
  const int g = lane / 4;
  const int t = lane % 4;
  float s[kSTiles][4];
  // At padded head dims ≤ 128 K's B fragments come two k-steps per ldmatrix.x4 (one
  // instruction where the 32-bit loads take four; the same values in the same mma order) and
  // the rescale below is skipped when no row's max grew; wider heads keep the plain forms,
  // which are faster there (kind 0 at 192/128).
  constexpr bool kLeanMath = kD <= 128;
  const bool ldsm_k = kKSteps % 2 == 0 && kLeanMath;
#pragma unroll
  for (int n = 0; n < kSTiles; ++n) {
    s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
    if (ldsm_k) {
      const bf16* kmat = k_smem + (r0 + n * 8 + (lane & 7)) * Pitch<kD>() + (lane >> 3) * 8;
#pragma unroll
      for (int ks = 0; ks + 1 < kKSteps; ks += 2) {
        uint32_t b[4];
        LdMatrixX4(b, kmat + ks * 16);
        Mma16816(s[n], q_frag[ks], b[0], b[1]);
        Mma16816(s[n], q_frag[ks + 1], b[2], b[3]);
      }
    } else {
      const bf16* krow = k_smem + (r0 + n * 8 + g) * Pitch<kD>() + 2 * t;
#pragma unroll
      for (int ks = 0; ks < kKSteps; ++ks) {
        const uint32_t b0 = *reinterpret_cast<const uint32_t*>(krow + ks * 16);
        const uint32_t b1 = *reinterpret_cast<const uint32_t*>(krow + ks * 16 + 8);
        Mma16816(s[n], q_frag[ks], b0, b1);
      }
    }
  }
  // Slices every row of the tile sees in full (most prefill tiles) skip the per-element mask;
  // padding rows then hold finite junk that is never stored.
  const bool full = key0 >= kv_begin && key0 + kBN <= kv_end && key0 + kBN - 1 <= pos_first &&
                    (args.sliding_window <= 0 || key0 > pos_last - args.sliding_window);
  float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int n = 0; n < kSTiles; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = e >> 1;
      const int j = key0 + n * 8 + 2 * t + (e & 1);
      const bool visible =
          full || (rw.valid[i] && j >= kv_begin && j < kv_end && j <= rw.pos[i] &&
                   (args.sliding_window <= 0 || j > rw.pos[i] - args.sliding_window));
      s[n][e] = visible ? s[n][e] * args.scale_log2 : -INFINITY;
      tile_max[i] = fmaxf(tile_max[i], s[n][e]);
    }
  }
  float alpha[2], base[2];
  bool grew = false;  // some row's running max changed
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    tile_max[i] = fmaxf(tile_max[i], __shfl_xor_sync(0xffffffffu, tile_max[i], 1));
    tile_max[i] = fmaxf(tile_max[i], __shfl_xor_sync(0xffffffffu, tile_max[i], 2));
    const float new_max = fmaxf(row_max[i], tile_max[i]);
    // A row with nothing visible yet keeps max −inf; exponentiate against 0 so that
    // exp2(−inf − base) is 0 rather than NaN.
    base[i] = new_max == -INFINITY ? 0.0f : new_max;
    alpha[i] = Exp2(row_max[i] - base[i]);
    grew |= new_max != row_max[i];
    row_max[i] = new_max;
  }
  // When no row of the warp's tile has a new max, every alpha is exp2(0) = 1 (or the row is
  // still empty: its sum and outputs are 0), so the rescale of the running sum and the kDV / 2
  // accumulators per thread is skipped (warp-uniform). Once a decode row's max has settled
  // most slices take this path; the results are the same bits.
  if (!kLeanMath || __any_sync(0xffffffffu, grew)) {
#pragma unroll
    for (int i = 0; i < 2; ++i) row_sum[i] *= alpha[i];
#pragma unroll
    for (int u = 0; u < kVTiles; ++u) {
      acc[u][0] *= alpha[0];
      acc[u][1] *= alpha[0];
      acc[u][2] *= alpha[1];
      acc[u][3] *= alpha[1];
    }
  }
  uint32_t p_frag[kPSteps][4];
#pragma unroll
  for (int n = 0; n < kSTiles; ++n) {
    float p[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      p[e] = Exp2(s[n][e] - base[e >> 1]);
      row_sum[e >> 1] += p[e];
    }
    // C fragments of score tiles 2k and 2k+1 are exactly the A fragment of P's k-step k.
    p_frag[n / 2][(n & 1) * 2 + 0] = PackBf16(p[0], p[1]);
    p_frag[n / 2][(n & 1) * 2 + 1] = PackBf16(p[2], p[3]);
  }
#pragma unroll
  for (int kk = 0; kk < kPSteps; ++kk) {
    // ldmatrix.x4.trans: matrices (keys 0-7, cols u·8), (keys 8-15, u·8), (0-7, u·8+8),
    // (8-15, u·8+8) → B fragments of output tiles u and u+1.
    const bf16* vrow = v_smem + (r0 + kk * 16 + (lane & 15)) * Pitch<kDV>() + (lane >> 4) * 8;
#pragma unroll
    for (int u = 0; u < kVTiles; u += 2) {
      uint32_t b[4];
      LdMatrixX4Trans(b, vrow + u * 8);
      Mma16816(acc[u], p_frag[kk], b[0], b[1]);
      Mma16816(acc[u + 1], p_frag[kk], b[2], b[3]);
    }
  }
}

// Sums each row's partial sum over its quad (the 4 lanes holding the row's columns).
__device__ __forceinline__ void QuadSumRows(float (&row_sum)[2]) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    row_sum[i] += __shfl_xor_sync(0xffffffffu, row_sum[i], 1);
    row_sum[i] += __shfl_xor_sync(0xffffffffu, row_sum[i], 2);
  }
}

// Writes the thread's valid rows: normalized bf16 output when the launch is not split, else
// the fp32 normalized partial and (max, sum) of split `split` for the combine.
template <int kDV>
__device__ __forceinline__ void StoreRows(const AttnArgs& args, const RowInfo& rw, int split,
                                          const float (&acc)[kDV / 8][4], const float (&row_max)[2],
                                          const float (&row_sum)[2], int t) {
  constexpr int kVTiles = kDV / 8;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    if (!rw.valid[i]) continue;
    const float inv = row_sum[i] > 0.0f ? 1.0f / row_sum[i] : 0.0f;
    const int64_t out_row = static_cast<int64_t>(rw.token[i]) * args.num_heads + rw.head[i];
    if (args.num_splits == 1) {
      bf16* o = args.out + out_row * args.v_head_dim;
#pragma unroll
      for (int u = 0; u < kVTiles; ++u) {
        const int col = u * 8 + 2 * t;
        if (col < args.v_head_dim) {
          *reinterpret_cast<__nv_bfloat162*>(o + col) =
              __floats2bfloat162_rn(acc[u][2 * i] * inv, acc[u][2 * i + 1] * inv);
        }
      }
    } else {
      const int64_t part_row =
          static_cast<int64_t>(split) * args.num_tokens * args.num_heads + out_row;
      float* o = args.partial_out + part_row * args.v_head_dim;
#pragma unroll
      for (int u = 0; u < kVTiles; ++u) {
        const int col = u * 8 + 2 * t;
        if (col < args.v_head_dim) {
          *reinterpret_cast<float2*>(o + col) =
              make_float2(acc[u][2 * i] * inv, acc[u][2 * i + 1] * inv);
        }
      }
      if (t == 0) args.partial_ml[part_row] = make_float2(row_max[i], row_sum[i]);
    }
  }
}

}  // namespace sluice::kernels::paged_detail

#endif  // SLUICE_KERNELS_ATTENTION_PAGED_DECODE_DEVICE_CUH_
