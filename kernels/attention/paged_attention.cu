// CUDA paged attention (paged_attention_cuda.h): one FlashAttention-2-style kernel for prefill
// chunks and decode tokens, plus a split-KV combine and the KV-cache write.
//
// Algorithm (Dao, "FlashAttention-2: Faster Attention with Better Parallelism and Work
// Partitioning", 2023): each CTA owns a tile of query rows and streams the keys it may see in
// tiles through shared memory, keeping a running max m, running sum l and an unnormalized
// fp32 accumulator per row (online softmax), so scores never reach global memory.
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
// partial output and its (max, sum); SplitKvCombineKernel (attention_device.cuh) merges them with
// the log-sum-exp rule  o = Σ_i o_i·l_i·2^(m_i−M) / Σ_i l_i·2^(m_i−M),  M = max_i m_i. Inside a CTA
// the same split happens across warps (kWarpsN > 1: each warp takes a slice of every key tile,
// merged through shared memory at the end), which keeps several warps busy on the 16 rows of a
// decode tile. Decode tiles stream their keys through per-warp cp.async rings (kRing: no CTA
// barrier until the merge), in CTAs of 2 or 4 warps chosen so the grid fills the SMs.
//
// PrefetchBeforeWait: a decode step's attention is a programmatic dependent of the RoPE + KV
// write kernel before it (kernels::DecodePdl), which lets it launch as soon as that kernel
// has started. The step's metadata, block tables and the keys below each sequence's context
// length were written before that kernel started (by the host and by earlier steps), so the
// decode kernels read them and issue their first ring copies before griddepcontrol.wait; q,
// the new tokens' keys (written by that kernel) and every global write come after it. This
// hides the metadata → block table → K/V latency chain (several µs a layer) behind the kernel
// before.
//
// Shapes are compile-time padded: head dims are rounded up to a supported tile width (kD, kDV)
// and the padding columns are zero-filled in shared memory (cp.async with src-size 0), as are
// key rows past the partition end, so no uninitialized shared memory reaches an mma.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cmath>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/attention/attention_device.cuh"
#include "kernels/attention/decode_rope_fusion.cuh"
#include "kernels/attention/paged_attention_cuda.h"
#include "kernels/attention/paged_prefill_device.cuh"
#include "kernels/attention/paged_prefill_wgmma.h"
#include "kernels/cuda/device_utils.cuh"

namespace sluice::kernels {
namespace {

using attention_detail::CpAsync16;
using attention_detail::CpAsyncCommit;
using attention_detail::CpAsyncWait;
using attention_detail::Exp2;
using attention_detail::kMaxSplitsDevice;
using attention_detail::SmemAddr;
using cuda_detail::Aligned16;

constexpr float kLog2e = 1.4426950408889634f;

// The prefill kernels' argument block (paged_prefill_device.cuh) plus the decode kernels' extras.
struct AttnArgs : paged_detail::Fa2Args {
  attention_detail::DecodeRopeFusion fusion;
  int num_sequences;  // PagedDecodeWarpKernel's (sequence, KV head, split) units
};

using cuda_detail::Mma16816;  // kernels/cuda/device_utils.cuh

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

__device__ __forceinline__ uint32_t PackBf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// Shared-memory row pitch in bf16: 8 elements (16 bytes) of padding shift consecutive rows by
// 4 banks, so the 8 rows read by one B-fragment load (and by ldmatrix) hit distinct banks.
template <int kD>
__host__ __device__ constexpr int Pitch() {
  return kD + 8;
}

// Rows of a kDim-wide K or V slice in shared memory. Padded (kSwizzled false): pitch
// Pitch<kDim>. Swizzled: unpadded rows (pitch kDim) whose 16-byte chunk c of row r sits at
// chunk c ^ (r % 8), so the 8 rows one ldmatrix phase reads still hit distinct banks, and every
// 128-byte run of a row (one L2 line of a cache row) lands in one 128-byte-aligned span of
// shared memory. Why: a cp.async destination row that starts 16 bytes into a 128-byte span
// (the padded pitch is 272 bytes) splits each copied line's shared stores in two; ncu at
// Llama-3-8B batch 256 counted 1.5× the L2 sectors the K/V bytes need and 44% excess shared
// wavefronts on the copies (bench/results/ncu_decode_warp_b256_stop19_h200.txt). The XOR
// swizzle is the usual one for ldmatrix-read tiles (e.g. CUTLASS's Swizzle<3, 3, 3>).
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

// Configuration: kD/kDV padded head dims (multiples of 16), kWarpsM warps over query rows
// (16 rows each), kWarpsN warps over each key tile (kBN keys each), kStages K+V tiles resident
// in a cp.async ring (kStages − 1 copies in flight while one tile is being used).
template <int kD, int kDV, int kWarpsM, int kWarpsN, int kBN, int kStages>
struct AttnConfig {
  static_assert(kStages >= 2);
  static constexpr int kThreads = 32 * kWarpsM * kWarpsN;
  static constexpr int kBM = 16 * kWarpsM;
  static constexpr int kTileN = kBN * kWarpsN;
  static constexpr int kTileElems = kTileN * (Pitch<kD>() + Pitch<kDV>());
  static constexpr int kLoopBytes = kStages * kTileElems * static_cast<int>(sizeof(bf16));
  static constexpr int kMergeBytes = kWarpsN > 1
                                         ? kThreads*(kDV / 2 + 4) * static_cast<int>(sizeof(float))
                                         : 0;
  static constexpr int kSmemBytes = kLoopBytes > kMergeBytes ? kLoopBytes : kMergeBytes;
};

// ---- Pieces shared by the decode kernels (PagedTileKernel, PagedDecodeWarpKernel) ----

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

// kRing (decode tiles, kWarpsM 1): every warp streams its own kBN-key slices of the key tiles
// through a private kStages-deep cp.async ring (its share of the same shared memory), synced
// with __syncwarp only, so no warp waits at a CTA barrier for another's copies or math until
// the final merge; one block-table lookup per lane and slice (prefetched a slice ahead) serves
// all 16-byte copies of that slice's keys. Without kRing the CTA copies each whole tile
// cooperatively and all warps meet at two barriers per tile.
template <int kD, int kDV, int kWarpsM, int kWarpsN, int kBN, int kStages, bool kRing>
__global__ void __launch_bounds__(32 * kWarpsM * kWarpsN)
    PagedTileKernel(const AttnArgs args) {
  using Cfg = AttnConfig<kD, kDV, kWarpsM, kWarpsN, kBN, kStages>;
  static_assert(!kRing || kWarpsM == 1, "warp rings serve decode tiles");
  constexpr int kKSteps = kD / 16;                                 // k16 steps of Q·Kᵀ
  constexpr int kVTiles = kDV / 8;                                 // n8 output tiles
  constexpr int kSliceElems = kBN * (Pitch<kD>() + Pitch<kDV>());  // one warp's slice (kRing)
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* const tile_smem = reinterpret_cast<bf16*>(smem_raw);

  // Before the dependency wait (PDL) only the step's metadata, block tables and keys below the
  // context length are read (PrefetchBeforeWait); q and the K/V just appended come after it.
  const int seq = blockIdx.z;
  const int kv_head = blockIdx.y;
  // Later query tiles see more keys under the causal mask: launch them first so the short
  // ones fill the tail of the grid.
  const int m_tile = args.num_m_tiles - 1 - static_cast<int>(blockIdx.x) / args.num_splits;
  const int split = blockIdx.x % args.num_splits;
  const int q_begin = args.query_start_loc[seq];
  const int q_len = args.query_start_loc[seq + 1] - q_begin;
  const int ctx = args.context_lens[seq];
  const int group = args.group;
  const int rows = q_len * group;
  const int row0 = m_tile * Cfg::kBM;
  if (row0 >= rows) return;  // uniform over the CTA
  const int row_last = min(row0 + Cfg::kBM, rows) - 1;

  // Keys this tile may see: causal end at the last row's position, window start at the
  // first row's; then this CTA's partition of them.
  const int pos_first = ctx + row0 / group;
  const int pos_last = ctx + row_last / group;
  int kv_begin = args.sliding_window > 0 ? max(0, pos_first - args.sliding_window + 1) : 0;
  int kv_end = pos_last + 1;
  if (args.num_splits > 1) {
    kv_begin = max(kv_begin, split * args.partition_tokens);
    kv_end = min(kv_end, (split + 1) * args.partition_tokens);
  }

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int wm = warp % kWarpsM;
  const int wn = warp / kWarpsM;
  const int g = lane / 4;
  const int t = lane % 4;

  // This thread's two rows (g and g+8 of the warp's m16 tile).
  const RowInfo rw = MakeRows(row0 + wm * 16, rows, group, q_begin, ctx, kv_head, g);

  float acc[kVTiles][4];
#pragma unroll
  for (int u = 0; u < kVTiles; ++u) acc[u][0] = acc[u][1] = acc[u][2] = acc[u][3] = 0.0f;
  float row_max[2] = {-INFINITY, -INFINITY};
  float row_sum[2] = {0.0f, 0.0f};  // this thread's partial; summed over the quad at the end

  const int32_t* block_table = args.block_tables + seq * args.max_blocks_per_seq;
  const int64_t k_token_stride = static_cast<int64_t>(args.num_kv_heads) * args.head_dim;
  const int64_t v_token_stride = static_cast<int64_t>(args.num_kv_heads) * args.v_head_dim;
  const bf16* k_base = args.k_cache + static_cast<int64_t>(kv_head) * args.head_dim;
  const bf16* v_base = args.v_cache + static_cast<int64_t>(kv_head) * args.v_head_dim;

  // Cooperative copy of the K and V tile starting at key `tile` into buffer `buf` (16-byte
  // chunks, zero-filled outside [kv_begin, kv_end) and past the true head dims).
  auto load_tile = [&](int tile, int buf) {
    bf16* k_dst = tile_smem + buf * Cfg::kTileElems;
    bf16* v_dst = k_dst + Cfg::kTileN * Pitch<kD>();
    constexpr int kKChunks = kD / 8, kVChunks = kDV / 8;
    constexpr int kChunks = kKChunks > kVChunks ? kKChunks : kVChunks;
    // Thread c copies chunk c % kChunks of key c / kChunks for K and for V, so a warp moves
    // whole contiguous rows and one block-table lookup serves both.
#pragma unroll 4
    for (int c = threadIdx.x; c < Cfg::kTileN * kChunks; c += Cfg::kThreads) {
      const int key = c / kChunks;
      const int col = (c % kChunks) * 8;
      const int j = tile + key;
      const bool in_range = j >= kv_begin && j < kv_end;
      int64_t slot = 0;
      if (in_range) {
        const int block = args.block_shift >= 0 ? j >> args.block_shift : j / args.block_size;
        const int offset = j - block * args.block_size;
        slot = static_cast<int64_t>(__ldg(block_table + block)) * args.block_size + offset;
      }
      if (col < kD) {
        const bool live = in_range && col < args.head_dim;
        CpAsync16(k_dst + key * Pitch<kD>() + col,
                  live ? k_base + slot * k_token_stride + col : k_base, live ? 16 : 0);
      }
      if (col < kDV) {
        const bool live = in_range && col < args.v_head_dim;
        CpAsync16(v_dst + key * Pitch<kDV>() + col,
                  live ? v_base + slot * v_token_stride + col : v_base, live ? 16 : 0);
      }
    }
    CpAsyncCommit();
  };

  // kRing: this warp's private ring; slices are copied by CopySlice with the LaneSlot of
  // their first key.
  bf16* const ring_smem = tile_smem + wn * kStages * kSliceElems;
  auto lookup = [&](int key0) {
    return LaneSlot<kBN>(args, block_table, key0, kv_begin, kv_end, lane);
  };
  // The slice of warp wn in the tile at `tile` holds keys some row may see.
  auto needed = [&](int tile) {
    const int key0 = tile + wn * kBN;
    return key0 < kv_end && key0 + kBN > kv_begin;
  };

  // Decode fusion: the (cos, sin) table lives after the kernel's own shared memory; the new
  // key's K/V reach the cache before the first copy below.
  float2* const rope_cs = reinterpret_cast<float2*>(smem_raw + Cfg::kSmemBytes);
  const bool fused = args.fusion.inv_freq != nullptr;

  // Tiles start at a multiple of kTileN so a window start inside a tile is just masked.
  // Ring: tile i lives in buffer i % kStages and is copy group i; every iteration commits one
  // group (empty past the last tile: an empty group completes at once), so "tile i landed" is
  // always "at most kStages − 1 newer groups pending". With kRing the same holds per warp
  // (each thread's groups hold only its own warp's copies).
  const int tile_first = kv_begin / Cfg::kTileN * Cfg::kTileN;
  int64_t next_slot = kRing ? lookup(tile_first + wn * kBN) : 0;  // for the next slice copy
  auto load = [&](int tile, int buf) {
    if constexpr (kRing) {
      if (needed(tile)) {
        CopySlice<kD, kDV, kBN>(args, ring_smem + buf * kSliceElems, next_slot, k_base, v_base,
                                lane);
      } else {
        CpAsyncCommit();
      }
      next_slot = lookup(tile + Cfg::kTileN + wn * kBN);
    } else {
      if (tile < kv_end) {
        load_tile(tile, buf);
      } else {
        CpAsyncCommit();
      }
    }
  };
  // Ring slices wholly below ctx were written by earlier steps: copied before the wait
  // (PrefetchBeforeWait). A decode fusion launch writes the new key first (below).
  int pre = 0;
  if constexpr (kRing) {
    if (!fused) {
      for (; pre < kStages - 1; ++pre) {
        const int tile = tile_first + pre * Cfg::kTileN;
        if (needed(tile) && tile + wn * kBN + kBN > ctx) break;
        load(tile, pre);
      }
    }
  }
  attention_detail::GridDependencyWait();
  attention_detail::LaunchDependents();  // a PDL-launched combine may get ready meanwhile
  if (fused) {
    attention_detail::DecodeRopePrologue(
        args.fusion, args.q + static_cast<int64_t>(q_begin) * args.q_token_stride, q_begin,
        kv_head, args.num_kv_heads, args.head_dim, kv_begin <= ctx && ctx < kv_end, rope_cs);
  }
  for (; pre < kStages - 1; ++pre) load(tile_first + pre * Cfg::kTileN, pre);
  // Q fragments: read once per CTA, after the first K/V copies are issued so their latencies
  // overlap.
  uint32_t q_frag[kKSteps][4];
  LoadQFrag<kKSteps>(args, rw, t, fused, rope_cs, q_frag);

  int buf = 0;             // buffer of `tile`
  int fill = kStages - 1;  // buffer the next prefetch goes to (freed last round)
  for (int tile = tile_first; tile < kv_end; tile += Cfg::kTileN) {
    load(tile + (kStages - 1) * Cfg::kTileN, fill);
    CpAsyncWait<kStages - 1>();
    if constexpr (kRing) {
      __syncwarp();
    } else {
      __syncthreads();
    }
    // This warp's slice: rows r0.. of buffer `buf`.
    const bf16* k_smem = kRing ? ring_smem + buf * kSliceElems : tile_smem + buf * Cfg::kTileElems;
    const bf16* v_smem = k_smem + (kRing ? kBN : Cfg::kTileN) * Pitch<kD>();
    const int r0 = kRing ? 0 : wn * kBN;

    const int key0 = tile + wn * kBN;  // first key of this warp's slice
    // Skip slices no row of this warp can see (past the causal end / before the window).
    if (key0 < kv_end && key0 + kBN > kv_begin) {
      AttendSlice<kD, kDV, kBN>(args, k_smem, v_smem, r0, key0, kv_begin, kv_end, pos_first,
                                pos_last, rw, q_frag, acc, row_max, row_sum, lane);
    }
    // The prefetch after this overwrites the buffer just read.
    if constexpr (kRing) {
      __syncwarp();
    } else {
      __syncthreads();
    }
    buf = buf + 1 == kStages ? 0 : buf + 1;
    fill = fill + 1 == kStages ? 0 : fill + 1;
  }

  QuadSumRows(row_sum);

  if constexpr (kWarpsN > 1) {
    // Merge the kWarpsN key slices: every warp has the same fragment layout, so lane l of
    // warp (wm, wn) merges elementwise with lane l of warps (wm, *). Loop smem is free now.
    constexpr int kStride = kDV / 2 + 4;  // floats per lane: acc + (max, sum) × 2 rows
    float* merge = reinterpret_cast<float*>(smem_raw) + threadIdx.x * kStride;
    if constexpr (kRing) __syncthreads();  // other warps may still read their rings
    if (wn > 0) {
#pragma unroll
      for (int u = 0; u < kVTiles; ++u) {
#pragma unroll
        for (int e = 0; e < 4; ++e) merge[u * 4 + e] = acc[u][e];
      }
      merge[kDV / 2 + 0] = row_max[0];
      merge[kDV / 2 + 1] = row_max[1];
      merge[kDV / 2 + 2] = row_sum[0];
      merge[kDV / 2 + 3] = row_sum[1];
    }
    __syncthreads();
    if (wn > 0) return;
    for (int w = 1; w < kWarpsN; ++w) {
      const float* other = merge + w * kWarpsM * 32 * kStride;
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const float m_other = other[kDV / 2 + i];
        const float new_max = fmaxf(row_max[i], m_other);
        const float base = new_max == -INFINITY ? 0.0f : new_max;
        const float a_self = Exp2(row_max[i] - base);
        const float a_other = Exp2(m_other - base);
        row_sum[i] = row_sum[i] * a_self + other[kDV / 2 + 2 + i] * a_other;
        row_max[i] = new_max;
#pragma unroll
        for (int u = 0; u < kVTiles; ++u) {
          acc[u][2 * i] = acc[u][2 * i] * a_self + other[u * 4 + 2 * i] * a_other;
          acc[u][2 * i + 1] = acc[u][2 * i + 1] * a_self + other[u * 4 + 2 * i + 1] * a_other;
        }
      }
    }
  }

  StoreRows<kDV>(args, rw, split, acc, row_max, row_sum, t);
}

// ---- Persistent decode warps (PagedDecodeKernel::kPersistentWarps) ----
//
// PagedTileKernel gives each (sequence, KV head) a CTA whose warps split the keys and
// merge at the end. At batch 256 × 1k context (Llama-3-8B: 2048 CTAs of 2 warps, ~4 waves of
// ~70 µs) every CTA pays a ramp — metadata, then block table, then the first K/V bytes, ~2-3
// µs of dependent latency with its ring empty — and a merge barrier, ~4% of its life; at 8k
// context (8× longer CTAs) the same kernel reaches 0.96 of the copy bandwidth, at 1k 0.92.
// Here a WARP owns a whole unit (sequence, KV head, split): no merge and no CTA barrier, and
// each warp walks its units u = first, first + W, ... (W warps in the grid, sized to about
// one or a few rounds of resident warps) through ONE private cp.async ring whose copies run
// kStages − 1 slices ahead ACROSS unit boundaries: while the warp finishes unit n, the first
// slices of unit n + 1 are already in flight, and the metadata of the unit after that (query
// range, context length) is loaded a unit ahead, the block-table lookup a slice ahead. So the
// ramp is paid once per warp rather than once per unit. Same math per slice as the warp rings
// (AttendSlice), same partial-output format for split-KV.
// Units enumerate KV heads fastest, then sequences, then splits: warps running side by side
// read the neighbouring heads of the same cache rows.
// Decode fusion: before its first copy the warp writes the rotated k and v of every unit it
// owns that holds its token's new key position (exactly one unit per (sequence, KV head)
// does, and that unit is read by no other warp), then __syncwarp orders those writes before
// its own cp.async reads; each unit's q is rotated with a per-warp (cos, sin) table.
// Shared memory: kWarps × kStages slices of kBN keys (+ kWarps tables of kD/2 float2 when
// fused); at d 128 with 4 warps × 3 stages 102 KiB: 2 CTAs (8 warps) per SM; the wide shape
// served at padded head dim 128 puts the same 8 warps in one CTA (204 KiB) and copies with an
// L2 evict-first policy.
struct DecodeUnit {
  int seq, kv_head, split;  // split: the index of the unit's partial output
  int q_begin, rows, ctx;
  int kv_begin, kv_end;  // keys the unit's rows may see, within its partition
  int tile_first;        // first slice start (a multiple of kBN); == kv_end when no keys
};

struct UnitMeta {
  int q_begin, q_end, ctx;
};

__device__ __forceinline__ int UnitSeq(const AttnArgs& a, int u) {
  return (u / a.num_kv_heads) % a.num_sequences;
}

// Metadata of unit u (zeros past the last unit: no rows).
__device__ __forceinline__ UnitMeta LoadUnitMeta(const AttnArgs& a, int u, int num_units) {
  if (u >= num_units) return UnitMeta{0, 0, 0};
  const int seq = UnitSeq(a, u);
  return UnitMeta{a.query_start_loc[seq], a.query_start_loc[seq + 1], a.context_lens[seq]};
}

// Unit u with metadata m: split u / (KV heads · sequences) is the partition of the keys
// [split · P, (split + 1) · P) (P = partition_tokens) and the index of its partial output.
template <int kBN>
__device__ __forceinline__ DecodeUnit MakeUnit(const AttnArgs& a, int u, const UnitMeta& m) {
  DecodeUnit d;
  d.kv_head = u % a.num_kv_heads;
  d.seq = UnitSeq(a, u);
  d.split = u / a.num_kv_heads / a.num_sequences;
  d.q_begin = m.q_begin;
  d.rows = (m.q_end - m.q_begin) * a.group;  // ≤ 16 (decode plan), 0 past the last unit
  d.ctx = m.ctx;
  d.kv_begin = 0;
  d.kv_end = 0;
  if (d.rows > 0) {
    // As PagedTileKernel for its one m16 tile.
    const int pos_last = m.ctx + (d.rows - 1) / a.group;
    d.kv_begin = a.sliding_window > 0 ? max(0, m.ctx - a.sliding_window + 1) : 0;
    d.kv_end = pos_last + 1;
    if (a.num_splits > 1) {
      d.kv_begin = max(d.kv_begin, d.split * a.partition_tokens);
      d.kv_end = min(d.kv_end, (d.split + 1) * a.partition_tokens);
    }
  }
  d.tile_first = d.kv_begin < d.kv_end ? d.kv_begin / kBN * kBN : d.kv_end;
  return d;
}

// ---- Swapped GQA decode math (the wide persistent warps, ≤ 8 query rows a unit) ----
//
// A decode unit has rows = query tokens × group ≤ 8 query rows (4 at Llama-3-8B's group 4),
// but the m16 tiles of AttendSlice hold 16: three quarters of the Q·Kᵀ and P·V work and of
// the 64 output accumulators a thread keeps are padding. The swapped form puts the keys on
// the m16 side and the unit's rows on the n8 side (TensorRT-LLM's XQA kernels pack GQA query
// heads the same way): Sᵀ[16 keys × 8 rows] = K·Qᵀ (kD / 16 mma a slice, K by ldmatrix as the
// A operand, Qᵀ as B fragments kept in registers), the online softmax runs per column (a
// column's 16 keys live in the 8 lanes of one t, reduced with three shuffles), Pᵀ goes from
// the C layout to the B layout with movmatrix.trans, and Oᵀ[dims × 8 rows] += Vᵀ·Pᵀ (kDV / 16
// mma a slice, Vᵀ by ldmatrix.trans as the A operand): half the mma and 32 accumulators.
// Column r of a unit is its row r: query token q_begin + r / group, head kv_head·group +
// r % group; columns ≥ rows hold zero queries and are never stored. Split-KV units write the
// partials StoreRows writes.
// ptxas (sm_90a): 128 registers a thread instead of 218. H200, Llama-3-8B batch 256 × ~1k keys
// (bench/results/cuda_ab_stop15_h200.json): attention 263.3-265.8 µs a layer vs 276.2-276.7
// (4.19 of the 4.25 TB/s copy bandwidth), graph ITL 14.78-14.89 ms vs 15.11-15.22. Measured
// and dropped: two 8-warp CTAs a SM over rings of 3 half-slices (K and V copied as separate
// groups; 13 KiB a warp, so 16 warps a SM): 14.81-14.82 ms, no better than 8 warps, also
// with the Q·Kᵀ k-steps alternating between two score accumulators — at 4.19 TB/s the
// launch is bound by the bytes, not the warps' instruction chains.

// Transposes the 8×8 b16 matrix whose row lane / 4, columns 2(lane % 4)..+1 this lane holds.
__device__ __forceinline__ uint32_t MovMatrixTrans(uint32_t x) {
  uint32_t y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

// Qᵀ's B fragments for every k16 step: b0 = Q[row g][ks·16 + 2t..+1], b1 = … + 8; rotated on
// the way when `rope_cs` is the unit's token's (cos, sin) table (decode fusion, one token a
// unit), as LoadQFrag.
template <int kKSteps>
__device__ __forceinline__ void LoadQSwapped(const AttnArgs& a, const DecodeUnit& c, int g, int t,
                                             uint32_t (&qb)[kKSteps][2],
                                             const float2* rope_cs = nullptr) {
  const bool live = g < c.rows;
  const bf16* qrow =
      live ? a.q + static_cast<int64_t>(c.q_begin + g / a.group) * a.q_token_stride +
                 static_cast<int64_t>(c.kv_head * a.group + g % a.group) * a.head_dim
           : a.q;
#pragma unroll
  for (int ks = 0; ks < kKSteps; ++ks) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int col = ks * 16 + h * 8 + 2 * t;
      if (!live || col >= a.head_dim) {
        qb[ks][h] = 0u;
      } else if (rope_cs != nullptr) {
        qb[ks][h] = attention_detail::DecodeRopePair(qrow, col, rope_cs, a.fusion.half);
      } else {
        qb[ks][h] = *reinterpret_cast<const uint32_t*>(qrow + col);
      }
    }
  }
}

// The keys [lo, hi) that every live row of swapped unit c sees (ScoresSwapped's mask is
// all-true there): within the partition, at or before the first row's position (rows of one
// unit are its tokens' group heads, positions ctx, ctx + 1, …), and inside the window of the
// last row. A slice key0.. is whole-visible when lo ≤ key0 and key0 + 16 ≤ hi.
struct SwappedFullKeys {
  int lo, hi;
};
__device__ __forceinline__ SwappedFullKeys SwappedFull(const AttnArgs& a, const DecodeUnit& c) {
  int lo = c.kv_begin;
  if (a.sliding_window > 0) {
    const int pos_last = c.ctx + (c.rows > 0 ? (c.rows - 1) / a.group : 0);
    lo = max(lo, pos_last - a.sliding_window + 1);
  }
  return SwappedFullKeys{lo, min(c.kv_end, c.ctx + 1)};
}

// Sᵀ of one 16-key slice (K rows 0..15 of k_smem, keys key0..) of unit c in the swapped form
// and its online-softmax step: rescales acc / col_sum where a column's max grew and returns
// Pᵀ as the B fragments pb of Oᵀ += Vᵀ·Pᵀ (PvSwapped). acc[m]: Oᵀ tile m, (dim m·16 + g,
// columns 2t, 2t+1), (dim m·16 + g + 8, …); col_max / col_sum: columns 2t and 2t+1 (col_sum
// partial over this lane's keys).
// full (warp-uniform): every key of the slice is visible to every row (SwappedFullKeys), so
// the per-score mask is skipped. kSwizzled: k_smem's rows are SliceRows<kD, true>.
template <int kD, int kDV, bool kSwizzled = false>
__device__ __forceinline__ void ScoresSwapped(const AttnArgs& a, const bf16* k_smem, int key0,
                                              const DecodeUnit& c,
                                              const uint32_t (&qb)[kD / 16][2],
                                              float (&acc)[kDV / 16][4], float (&col_max)[2],
                                              float (&col_sum)[2], int lane, uint32_t (&pb)[2],
                                              bool full = false) {
  constexpr int kKSteps = kD / 16;
  constexpr int kOTiles = kDV / 16;
  const int g = lane / 4;
  const int t = lane % 4;
  float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  // ldmatrix.x4: lanes 0-7 keys 0-7 / dims +0, 8-15 keys 8-15 / +0, 16-23 keys 0-7 / +8,
  // 24-31 keys 8-15 / +8 → the A fragment (a0 key g, a1 key g + 8, a2 / a3 the next 8 dims).
  using Rows = SliceRows<kD, kSwizzled>;
  const int krow = (lane & 7) + ((lane >> 3) & 1) * 8;
  const bf16* kmat = k_smem + krow * Rows::kPitch;
  // Column ks·16 + (lane / 16)·8 = ks·16 ^ (lane / 16)·8 (the lane's part is below 16), so
  // At(krow, column) = (lane's part ^ Mask) ^ ks·16. Keep the XOR: with the mask folded in,
  // + would be wrong.
  const int kcol = ((lane >> 4) * 8) ^ Rows::Mask(krow);
#pragma unroll
  for (int ks = 0; ks < kKSteps; ++ks) {
    uint32_t af[4];
    LdMatrixX4(af, kmat + (kcol ^ (ks * 16)));
    Mma16816(s, af, qb[ks][0], qb[ks][1]);
  }
  float tile_max[2] = {-INFINITY, -INFINITY};
  if (full) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      s[e] *= a.scale_log2;
      tile_max[e & 1] = fmaxf(tile_max[e & 1], s[e]);
    }
  } else {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int key = key0 + g + (e >> 1) * 8;
      const int col = 2 * t + (e & 1);
      const int pos = c.ctx + col / a.group;
      const bool visible = key >= c.kv_begin && key < c.kv_end && key <= pos &&
                           (a.sliding_window <= 0 || key > pos - a.sliding_window);
      s[e] = visible ? s[e] * a.scale_log2 : -INFINITY;
      tile_max[e & 1] = fmaxf(tile_max[e & 1], s[e]);
    }
  }
  float alpha[2], base[2];
  bool grew = false;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
#pragma unroll
    for (int x = 4; x < 32; x *= 2) {
      tile_max[i] = fmaxf(tile_max[i], __shfl_xor_sync(0xffffffffu, tile_max[i], x));
    }
    const float new_max = fmaxf(col_max[i], tile_max[i]);
    base[i] = new_max == -INFINITY ? 0.0f : new_max;
    alpha[i] = Exp2(col_max[i] - base[i]);
    grew |= new_max != col_max[i];
    col_max[i] = new_max;
  }
  if (__any_sync(0xffffffffu, grew)) {
#pragma unroll
    for (int i = 0; i < 2; ++i) col_sum[i] *= alpha[i];
#pragma unroll
    for (int m = 0; m < kOTiles; ++m) {
      acc[m][0] *= alpha[0];
      acc[m][1] *= alpha[1];
      acc[m][2] *= alpha[0];
      acc[m][3] *= alpha[1];
    }
  }
  float p[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    p[e] = Exp2(s[e] - base[e & 1]);
    col_sum[e & 1] += p[e];
  }
  // Pᵀ keys 0-7 / 8-15 in the C layout (row key, columns 2t..) → transposed, the B fragments
  // (keys 2t..+1 / 8 + 2t..+1, column g) of Oᵀ += Vᵀ·Pᵀ.
  pb[0] = MovMatrixTrans(PackBf16(p[0], p[1]));
  pb[1] = MovMatrixTrans(PackBf16(p[2], p[3]));
}

// Oᵀ += Vᵀ·Pᵀ for one 16-key slice (V rows 0..15 of v_smem, rows SliceRows<kDV, kSwizzled>;
// pb from ScoresSwapped).
template <int kDV, bool kSwizzled = false>
__device__ __forceinline__ void PvSwapped(const bf16* v_smem, const uint32_t (&pb)[2],
                                          float (&acc)[kDV / 16][4], int lane) {
  // ldmatrix.x4.trans: lanes 0-7 keys 0-7 / dims +0, 8-15 keys 0-7 / +8, 16-23 keys 8-15 / +0,
  // 24-31 keys 8-15 / +8 → Vᵀ's A fragment (dims g / g + 8 × keys 2t.. / 8 + 2t..).
  using Rows = SliceRows<kDV, kSwizzled>;
  const int vrow = (lane & 7) + (lane >> 4) * 8;
  const bf16* vmat = v_smem + vrow * Rows::kPitch;
  const int vcol = (((lane >> 3) & 1) * 8) ^ Rows::Mask(vrow);  // XOR as ScoresSwapped's kcol
#pragma unroll
  for (int m = 0; m < kDV / 16; ++m) {
    uint32_t av[4];
    LdMatrixX4Trans(av, vmat + (vcol ^ (m * 16)));
    Mma16816(acc[m], av, pb[0], pb[1]);
  }
}

// Writes unit c's rows from the swapped accumulators: bf16 outputs, or with num_splits > 1 the
// fp32 partial and its (max, sum) in the layout StoreRows writes.
template <int kDV>
__device__ __forceinline__ void StoreSwapped(const AttnArgs& a, const DecodeUnit& c,
                                             const float (&acc)[kDV / 16][4],
                                             const float (&col_max)[2], float (&col_sum)[2],
                                             int lane) {
  const int g = lane / 4;
  const int t = lane % 4;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
#pragma unroll
    for (int x = 4; x < 32; x *= 2) col_sum[i] += __shfl_xor_sync(0xffffffffu, col_sum[i], x);
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int col = 2 * t + i;
    if (col >= c.rows) continue;
    const float inv = col_sum[i] > 0.0f ? 1.0f / col_sum[i] : 0.0f;
    const int64_t out_row = static_cast<int64_t>(c.q_begin + col / a.group) * a.num_heads +
                            c.kv_head * a.group + col % a.group;
    if (a.num_splits == 1) {
      bf16* o = a.out + out_row * a.v_head_dim;
#pragma unroll
      for (int m = 0; m < kDV / 16; ++m) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int dim = m * 16 + g + 8 * h;
          if (dim < a.v_head_dim) o[dim] = __float2bfloat16_rn(acc[m][i + 2 * h] * inv);
        }
      }
    } else {
      const int64_t part_row =
          static_cast<int64_t>(c.split) * a.num_tokens * a.num_heads + out_row;
      float* o = a.partial_out + part_row * a.v_head_dim;
#pragma unroll
      for (int m = 0; m < kDV / 16; ++m) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int dim = m * 16 + g + 8 * h;
          if (dim < a.v_head_dim) o[dim] = acc[m][i + 2 * h] * inv;
        }
      }
      if (g == 0) a.partial_ml[part_row] = make_float2(col_max[i], col_sum[i]);
    }
  }
}

// The producer side of a persistent decode warp: the kBN-key slices of the units first,
// first + stride, … (< num_units) in order, skipping units without keys (their outputs are
// still written by the consumer). u / p: the unit of the next slice to copy, tile its first
// key, slot its LaneSlot; next_meta the metadata of the unit after it.
template <int kBN>
struct SliceStream {
  int u, stride, num_units, tile;
  DecodeUnit p;
  UnitMeta next_meta;
  int64_t slot;

  __device__ __forceinline__ SliceStream(const AttnArgs& a, int first, int stride_, int units,
                                         const UnitMeta& meta0, int lane)
      : u(first), stride(stride_), num_units(units) {
    p = MakeUnit<kBN>(a, u, meta0);
    next_meta = LoadUnitMeta(a, u + stride, num_units);
    tile = p.tile_first;
    SkipEmpty(a);
    Locate(a, lane);
  }
  __device__ __forceinline__ bool live() const { return u < num_units; }
  // After the current slice was copied: the next slice (and its unit).
  __device__ __forceinline__ void Next(const AttnArgs& a, int lane) {
    tile += kBN;
    SkipEmpty(a);
    Locate(a, lane);
  }

 private:
  __device__ __forceinline__ void SkipEmpty(const AttnArgs& a) {
    while (u < num_units && tile >= p.kv_end) {
      u += stride;
      p = MakeUnit<kBN>(a, u, next_meta);
      next_meta = LoadUnitMeta(a, u + stride, num_units);
      tile = p.tile_first;
    }
  }
  __device__ __forceinline__ void Locate(const AttnArgs& a, int lane) {
    slot = u < num_units ? LaneSlot<kBN>(a, a.block_tables + p.seq * a.max_blocks_per_seq, tile,
                                         p.kv_begin, p.kv_end, lane)
                         : -1;
  }
};

template <int kD, int kDV, int kWarps, int kBN, int kStages, bool kSwizzled = false>
struct DecodeWarpConfig {
  static_assert(kStages >= 2);
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kSliceElems =
      kBN * (SliceRows<kD, kSwizzled>::kPitch + SliceRows<kDV, kSwizzled>::kPitch);
  static constexpr int kSmemBytes = kWarps * kStages * kSliceElems * static_cast<int>(sizeof(bf16));
  // Fused launches add a (cos, sin) table per warp after the rings.
  static constexpr int kFusionBytes = kWarps * attention_detail::DecodeRopeSmemBytes(kD);
};

// kEvictFirst: K/V copies with an L2 evict-first policy (CopyChunk).
// kSwapped: the swapped GQA math (ScoresSwapped / PvSwapped; only launched with ≤ 8 rows a
// unit; under decode fusion each unit's q is rotated on load with its token's table).
// kSwizzled (swapped only): the ring's K/V rows are SliceRows<·, true>.
template <int kD, int kDV, int kWarps, int kBN, int kStages, bool kEvictFirst,
          bool kSwapped = false, bool kSwizzled = false>
__global__ void __launch_bounds__(32 * kWarps) PagedDecodeWarpKernel(const AttnArgs args) {
  static_assert(kSwapped || !kSwizzled, "AttendSlice reads padded rows");
  using Cfg = DecodeWarpConfig<kD, kDV, kWarps, kBN, kStages, kSwizzled>;
  constexpr int kKSteps = kD / 16;
  constexpr int kVTiles = kDV / 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int g = lane / 4;
  const int t = lane % 4;
  bf16* const ring = reinterpret_cast<bf16*>(smem_raw) + warp * kStages * Cfg::kSliceElems;
  float2* const rope_cs =
      reinterpret_cast<float2*>(smem_raw + Cfg::kSmemBytes) + warp * (kD / 2);
  const bool fused = args.fusion.inv_freq != nullptr;
  // Fused launches at head dims ≤ 128 write each unit's new key right before copying the slice
  // that holds it (DeferredKvWrite), so the slices below it stream from the start as in plain
  // launches; wider heads write every new key of the warp before any copy (the loaded row
  // costs d/32 × 3 bf16 and d/32 floats a lane, which at d 256 would spill).
  const bool deferred_write = kD <= 128 && fused;
  const uint64_t policy = kEvictFirst ? attention_detail::L2EvictFirstPolicy() : 0;
  const int num_units = args.num_sequences * args.num_kv_heads * args.num_splits;
  const int stride = static_cast<int>(gridDim.x) * kWarps;
  const int first = static_cast<int>(blockIdx.x) * kWarps + warp;

  // Producer: the slice stream of all this warp's units, kStages − 1 slices ahead of the
  // consumer. Every issue() commits exactly one copy group (empty once the stream is
  // exhausted), so "slice i landed" is "at most kStages − 1 newer groups pending", as in the
  // rings of PagedTileKernel.
  const UnitMeta meta0 = LoadUnitMeta(args, first, num_units);
  // Fused launches load each unit's RoPE position while the warp attends the unit before
  // (step metadata: the first one before the dependency wait), so a unit's table costs no load.
  const auto position_of = [&](const UnitMeta& m) {
    return fused && m.q_end > m.q_begin ? static_cast<float>(args.fusion.positions[m.q_begin])
                                        : 0.0f;
  };
  float c_pos = position_of(meta0);
  SliceStream<kBN> pr(args, first, stride, num_units, meta0, lane);
  int fill = 0;
  constexpr int kPendingPerLane = kD <= 128 ? kD / 32 : 1;
  attention_detail::PendingKvWrite<kPendingPerLane> pending;  // DeferredKvWrite's new key
  int pending_unit = -1;  // the unit it was loaded for
  bool waited = false;  // past the dependency wait (qkv may be read)
  constexpr bool kContiguousFits = kD == kDV && 32 % (kD / 8) == 0;
  const bool contiguous_copies =
      kContiguousFits && args.head_dim == args.v_head_dim && args.block_size % kBN == 0;
  auto issue = [&]() {
    if (pr.live()) {
      // DeferredKvWrite (only after the dependency wait: the early copies take slices wholly
      // below ctx). The unit's new key (position ctx, token q_begin) is loaded into registers
      // when the slice before the one holding it is copied, and rotated and stored with its
      // value right before that slice's copy (loaded then if the unit has no earlier slice).
      if (deferred_write && waited && pr.p.rows > 0 && pr.p.kv_begin <= pr.p.ctx &&
          pr.p.ctx < pr.p.kv_end && pr.tile <= pr.p.ctx && pr.p.ctx < pr.tile + 2 * kBN) {
        const auto load = [&]() {
          attention_detail::DecodeKvWriteLoad<kPendingPerLane>(
              args.fusion, args.q + static_cast<int64_t>(pr.p.q_begin) * args.q_token_stride,
              pr.p.q_begin, pr.p.kv_head, args.head_dim, lane, pending);
          pending_unit = pr.u;
        };
        if (pr.p.ctx >= pr.tile + kBN) {
          load();
        } else {
          if (pending_unit != pr.u) load();
          attention_detail::DecodeKvWriteStore<kPendingPerLane>(
              args.fusion, pr.p.kv_head, args.num_kv_heads, args.head_dim, lane, pending);
          __syncwarp();  // orders the writes before the copies
        }
      }
      const int64_t kv_off = static_cast<int64_t>(pr.p.kv_head);
      bool copied = false;
      if constexpr (kContiguousFits) {
        if (contiguous_copies && pr.tile >= pr.p.kv_begin && pr.tile + kBN <= pr.p.kv_end) {
          CopySliceContiguous<kD, kBN, kEvictFirst, kSwizzled>(
              args, ring + fill * Cfg::kSliceElems, pr.slot,
              args.k_cache + kv_off * args.head_dim, args.v_cache + kv_off * args.head_dim, lane,
              policy);
          copied = true;
        }
      }
      if (!copied) {
        CopySlice<kD, kDV, kBN, kEvictFirst, kSwizzled>(
            args, ring + fill * Cfg::kSliceElems, pr.slot, args.k_cache + kv_off * args.head_dim,
            args.v_cache + kv_off * args.v_head_dim, lane, policy);
      }
      pr.Next(args, lane);
    } else {
      CpAsyncCommit();  // an empty group keeps the wait_group count
    }
    fill = fill + 1 == kStages ? 0 : fill + 1;
  };
  // Slices wholly below their unit's context length, copied before the dependency wait
  // (PrefetchBeforeWait); in a fusion launch only with the deferred writes.
  int pre = 0;
  if (!fused || deferred_write) {
    while (pre < kStages - 1 && (!pr.live() || pr.tile + kBN <= pr.p.ctx)) {
      issue();
      ++pre;
    }
  }
  attention_detail::GridDependencyWait();
  attention_detail::LaunchDependents();
  waited = true;

  if (fused && !deferred_write) {
    // The new keys of this warp's units reach the cache before any of its copies.
    for (int u = first; u < num_units; u += stride) {
      const DecodeUnit d = MakeUnit<kBN>(args, u, LoadUnitMeta(args, u, num_units));
      if (d.rows > 0 && d.kv_begin <= d.ctx && d.ctx < d.kv_end) {
        attention_detail::DecodeRopeTable(args.fusion, d.q_begin, rope_cs, lane, 32);
        __syncwarp();
        attention_detail::DecodeRopeWriteKv(
            args.fusion, args.q + static_cast<int64_t>(d.q_begin) * args.q_token_stride,
            d.q_begin, d.kv_head, args.num_kv_heads, args.head_dim, rope_cs, lane, 32);
        __syncwarp();  // before cs is refilled, and orders the writes before the copies
      }
    }
  }

  for (; pre < kStages - 1; ++pre) issue();

  // Consumer: the same units in the same order, one slice per iteration.
  int buf = 0;
  UnitMeta c_meta = meta0;
  for (int u = first; u < num_units; u += stride) {
    const DecodeUnit c = MakeUnit<kBN>(args, u, c_meta);
    const float pos = c_pos;
    c_meta = LoadUnitMeta(args, u + stride, num_units);
    c_pos = position_of(c_meta);
    if constexpr (kSwapped) {
      static_assert(kBN == 16, "one m16 tile of keys a slice");
      if (fused && c.rows > 0) {
        attention_detail::DecodeRopeTableAt(args.fusion, pos, rope_cs, lane, 32);
        __syncwarp();
      }
      uint32_t qb[kKSteps][2];
      LoadQSwapped<kKSteps>(args, c, g, t, qb, fused ? rope_cs : nullptr);
      if (fused) __syncwarp();  // every lane has read rope_cs before the next unit refills it
      float acc[kDV / 16][4];
#pragma unroll
      for (int m = 0; m < kDV / 16; ++m) acc[m][0] = acc[m][1] = acc[m][2] = acc[m][3] = 0.0f;
      float col_max[2] = {-INFINITY, -INFINITY};
      float col_sum[2] = {0.0f, 0.0f};
      const SwappedFullKeys fk = SwappedFull(args, c);
      for (int tile = c.tile_first; tile < c.kv_end; tile += kBN) {
        issue();
        CpAsyncWait<kStages - 1>();
        __syncwarp();
        const bf16* k_smem = ring + buf * Cfg::kSliceElems;
        uint32_t pb[2];
        ScoresSwapped<kD, kDV, kSwizzled>(args, k_smem, tile, c, qb, acc, col_max, col_sum,
                                          lane, pb, tile >= fk.lo && tile + kBN <= fk.hi);
        PvSwapped<kDV, kSwizzled>(k_smem + kBN * SliceRows<kD, kSwizzled>::kPitch, pb, acc,
                                  lane);
        __syncwarp();  // the next issue() may refill this buffer
        buf = buf + 1 == kStages ? 0 : buf + 1;
      }
      StoreSwapped<kDV>(args, c, acc, col_max, col_sum, lane);
      continue;
    }
    const RowInfo rw = MakeRows(0, c.rows, args.group, c.q_begin, c.ctx, c.kv_head, g);
    if (fused && c.rows > 0) {
      attention_detail::DecodeRopeTableAt(args.fusion, pos, rope_cs, lane, 32);
      __syncwarp();
    }
    uint32_t q_frag[kKSteps][4];
    LoadQFrag<kKSteps>(args, rw, t, fused, rope_cs, q_frag);
    float acc[kVTiles][4];
#pragma unroll
    for (int v = 0; v < kVTiles; ++v) acc[v][0] = acc[v][1] = acc[v][2] = acc[v][3] = 0.0f;
    float row_max[2] = {-INFINITY, -INFINITY};
    float row_sum[2] = {0.0f, 0.0f};
    const int pos_last = c.ctx + (c.rows > 0 ? (c.rows - 1) / args.group : 0);
    for (int tile = c.tile_first; tile < c.kv_end; tile += kBN) {
      issue();
      CpAsyncWait<kStages - 1>();
      __syncwarp();
      const bf16* k_smem = ring + buf * Cfg::kSliceElems;
      AttendSlice<kD, kDV, kBN>(args, k_smem, k_smem + kBN * Pitch<kD>(), 0, tile, c.kv_begin,
                                c.kv_end, c.ctx, pos_last, rw, q_frag, acc, row_max, row_sum,
                                lane);
      __syncwarp();  // the next issue() may refill this buffer
      buf = buf + 1 == kStages ? 0 : buf + 1;
    }
    QuadSumRows(row_sum);
    StoreRows<kDV>(args, rw, c.split, acc, row_max, row_sum, t);
    if (fused) __syncwarp();  // every lane has read rope_cs before the next unit refills it
  }
}

// ---- MMA-tile prefill kernel (PagedPrefillKernel::kMmaTiles) ----
//
// The same online-softmax algorithm and GQA row packing as PagedTileKernel, reshaped for
// long prompts, where the mma.sync pipe — not bytes — is what should bound the time:
//  * A warp owns kMT m16 tiles (32 rows at kMT 2), so every K/V fragment read from shared
//    memory feeds 2·kMT mmas: half the shared-memory bytes per mma of 16-row warps, and a
//    128-row CTA tile makes each K/V tile copied from L2 serve twice the rows of the 64-row
//    tiles of kind 0.
//  * Q lives in shared memory (copied once per CTA) and is re-read per key tile with ldmatrix:
//    a 32-row warp cannot keep its Q fragments (64 registers at d 128) beside a 128-register
//    accumulator and 64 scores. K fragments come from ldmatrix.x4 (two n8 tiles × k16 per
//    instruction) instead of two 32-bit loads per mma; V from ldmatrix.x4.trans as before.
//  * One barrier per key tile: a thread waits for tile i, the CTA syncs, and only then is the
//    buffer of tile i − 1 (which every warp has left) refilled with tile i + kStages − 1.
//  * Scores stay unscaled until the exponent: p = 2^(s·c − m·c) with c = scale·log2(e) is one
//    FFMA + MUFU per score (needs c > 0, checked by the planner); the running max m is kept in
//    raw score units.
//  * The accumulator rescale (kMT·kDV/2 FMULs per thread) is skipped when no row of the warp
//    raised its max (exact: the factor would be 1).
//  * Masking per element only on tiles some row of the warp sees partly (the causal diagonal,
//    window edges, partition edges); the rest take the unmasked path.
//  * Per-warp K/V copies: warp w copies keys [w·kBN/kWarps, (w+1)·kBN/kWarps) of each tile, one
//    block-table lookup per lane and tile (prefetched a tile ahead) shuffled to the lanes
//    copying that key's 16-byte chunks.
//  * The grid is linear over (query tile, KV head, split) with the longest query tiles (latest
//    under the causal mask) first for every head, so the short tiles fill the tail.
// Registers: at kD = kDV = 128, kMT 2, kBN 32 a thread holds 128 accumulator and 32 score
// floats; launch bounds of 2 CTAs × 128 threads leave it 255 registers (nvcc -Xptxas -v:
// 249 on sm_90a, no spills).
template <int kD, int kDV, int kWarps, int kMT, int kBN, int kStages>
struct PrefillConfig {
  static_assert(kStages >= 2);
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kBM = 16 * kMT * kWarps;
  static constexpr int kQElems = kBM * Pitch<kD>();
  static constexpr int kTileElems = kBN * (Pitch<kD>() + Pitch<kDV>());
  static constexpr int kSmemBytes =
      (kQElems + kStages * kTileElems) * static_cast<int>(sizeof(bf16));
};

// Four 8×8 bf16 matrices from shared memory (ldmatrix, no transpose) at 32-bit shared-window
// addresses (fewer live registers than generic pointers): lanes 8i..8i+7 give the row
// addresses of matrix i; lane l receives row l/4, columns 2(l%4)..+1 of each. ..Trans: the
// transposes, as LdMatrixX4Trans.
__device__ __forceinline__ void LdMatrixX4At(uint32_t (&r)[4], uint32_t smem_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr));
}
__device__ __forceinline__ void LdMatrixX4TransAt(uint32_t (&r)[4], uint32_t smem_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr));
}

template <int kD, int kDV, int kWarps, int kMT, int kBN, int kStages>
__global__ void __launch_bounds__(32 * kWarps, 2) PagedMmaPrefillKernel(const AttnArgs args) {
  using Cfg = PrefillConfig<kD, kDV, kWarps, kMT, kBN, kStages>;
  constexpr int kKSteps = kD / 16;   // k16 steps of Q·Kᵀ
  constexpr int kSTiles = kBN / 8;   // n8 score tiles per m16 tile
  constexpr int kVTiles = kDV / 8;   // n8 output tiles
  constexpr int kPSteps = kBN / 16;  // k16 steps of P·V
  constexpr int kKChunks = kD / 8, kVChunks = kDV / 8;  // 16-byte chunks per K / V row
  constexpr int kWarpKeys = kBN / kWarps;                // keys each warp copies per tile
  static_assert(kSTiles % 2 == 0 && kVTiles % 2 == 0 && kWarpKeys <= 32);
  static_assert((kWarpKeys * kKChunks) % 32 == 0 && (kWarpKeys * kVChunks) % 32 == 0);
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* const q_smem = reinterpret_cast<bf16*>(smem_raw);
  bf16* const kv_smem = q_smem + Cfg::kQElems;

  attention_detail::GridDependencyWait();
  attention_detail::LaunchDependents();
  const int seq = blockIdx.z;
  int linear = static_cast<int>(blockIdx.x);
  const int split = linear % args.num_splits;
  linear /= args.num_splits;
  const int kv_head = linear % args.num_kv_heads;
  const int m_tile = args.num_m_tiles - 1 - linear / args.num_kv_heads;
  const int q_begin = args.query_start_loc[seq];
  const int q_len = args.query_start_loc[seq + 1] - q_begin;
  const int ctx = args.context_lens[seq];
  const int group = args.group;
  const int rows = q_len * group;
  const int row0 = m_tile * Cfg::kBM;
  if (row0 >= rows) return;  // uniform over the CTA
  const int row_last = min(row0 + Cfg::kBM, rows) - 1;
  int kv_begin = args.sliding_window > 0
                     ? max(0, ctx + row0 / group - args.sliding_window + 1)
                     : 0;
  int kv_end = ctx + row_last / group + 1;
  if (args.num_splits > 1) {
    kv_begin = max(kv_begin, split * args.partition_tokens);
    kv_end = min(kv_end, (split + 1) * args.partition_tokens);
  }

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int g = lane / 4;
  const int t = lane % 4;
  const int wrow0 = row0 + warp * 16 * kMT;  // this warp's first row
  // Positions of this warp's first and last valid row (the unmasked-tile test).
  const int w_pos_first = ctx + wrow0 / group;
  const int w_pos_last = ctx + max(wrow0, min(wrow0 + 16 * kMT, rows) - 1) / group;

  // Q tile → shared memory, zero-filled past the true head dim and the last row. 16-byte
  // cp.async when q allows (args.q_vec), else 32-bit loads.
  for (int c = threadIdx.x; c < Cfg::kBM * kKChunks; c += Cfg::kThreads) {
    const int r = c / kKChunks;
    const int col = (c % kKChunks) * 8;
    const int row = row0 + r;
    const bool live = row < rows && col < args.head_dim;
    const bf16* src = args.q;
    if (live) {
      src += static_cast<int64_t>(q_begin + row / group) * args.q_token_stride +
             static_cast<int64_t>(kv_head * group + row % group) * args.head_dim + col;
    }
    bf16* dst = q_smem + r * Pitch<kD>() + col;
    if (args.q_vec) {
      CpAsync16(dst, src, live ? 16 : 0);
    } else {
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        reinterpret_cast<uint32_t*>(dst)[w] =
            live ? __ldg(reinterpret_cast<const unsigned int*>(src) + w) : 0u;
      }
    }
  }
  CpAsyncCommit();  // the oldest group: waiting for K/V tile 0 waits for Q too

  // Slot of key tile + warp·kWarpKeys + lane (lane < kWarpKeys; −1 outside [kv_begin, kv_end)).
  auto lookup = [&](int tile) -> int64_t {
    const int j = tile + warp * kWarpKeys + lane;
    if (lane >= kWarpKeys || j < kv_begin || j >= kv_end) return -1;
    const int block = args.block_shift >= 0 ? j >> args.block_shift : j / args.block_size;
    const int offset = j - block * args.block_size;
    return static_cast<int64_t>(__ldg(args.block_tables + seq * args.max_blocks_per_seq + block)) *
               args.block_size +
           offset;
  };
  // The warp's keys of a tile into buffer `buf` (zero rows for slot −1, zero columns past the
  // true head dims), as one commit group.
  // Bases and strides are recomputed from the kernel parameters here (cheap, once per tile)
  // rather than held in registers across the math.
  auto copy_keys = [&](int buf, int64_t lane_slot) {
    const int64_t k_token_stride = static_cast<int64_t>(args.num_kv_heads) * args.head_dim;
    const int64_t v_token_stride = static_cast<int64_t>(args.num_kv_heads) * args.v_head_dim;
    const bf16* k_base = args.k_cache + static_cast<int64_t>(kv_head) * args.head_dim;
    const bf16* v_base = args.v_cache + static_cast<int64_t>(kv_head) * args.v_head_dim;
    bf16* k_dst = kv_smem + buf * Cfg::kTileElems + warp * kWarpKeys * Pitch<kD>();
    bf16* v_dst = kv_smem + buf * Cfg::kTileElems + kBN * Pitch<kD>() + warp * kWarpKeys * Pitch<kDV>();
#pragma unroll
    for (int i = 0; i < kWarpKeys * kKChunks / 32; ++i) {
      const int c = lane + 32 * i;
      const int key = c / kKChunks;
      const int col = (c % kKChunks) * 8;
      const int64_t slot = __shfl_sync(0xffffffffu, lane_slot, key);
      const bool live = slot >= 0 && col < args.head_dim;
      CpAsync16(k_dst + key * Pitch<kD>() + col,
                live ? k_base + slot * k_token_stride + col : k_base, live ? 16 : 0);
    }
#pragma unroll
    for (int i = 0; i < kWarpKeys * kVChunks / 32; ++i) {
      const int c = lane + 32 * i;
      const int key = c / kVChunks;
      const int col = (c % kVChunks) * 8;
      const int64_t slot = __shfl_sync(0xffffffffu, lane_slot, key);
      const bool live = slot >= 0 && col < args.v_head_dim;
      CpAsync16(v_dst + key * Pitch<kDV>() + col,
                live ? v_base + slot * v_token_stride + col : v_base, live ? 16 : 0);
    }
    CpAsyncCommit();
  };
  // Tiles start at multiples of kBN; tile i (from tile_first) lives in buffer i % kStages and
  // is commit group i + 1 (Q is group 0). Every call commits one group (empty past kv_end).
  const int tile_first = kv_begin / kBN * kBN;
  int64_t next_slot = lookup(tile_first);
  auto load = [&](int tile, int buf) {
    if (tile < kv_end) {
      copy_keys(buf, next_slot);
    } else {
      CpAsyncCommit();
    }
    next_slot = lookup(tile + kBN);
  };
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) load(tile_first + s * kBN, s);

  float acc[kMT][kVTiles][4];
#pragma unroll
  for (int mi = 0; mi < kMT; ++mi) {
#pragma unroll
    for (int u = 0; u < kVTiles; ++u) {
      acc[mi][u][0] = acc[mi][u][1] = acc[mi][u][2] = acc[mi][u][3] = 0.0f;
    }
  }
  float row_max[kMT][2];  // raw (unscaled) score units
  float row_sum[kMT][2];  // this thread's partial; summed over the quad at the end
#pragma unroll
  for (int mi = 0; mi < kMT; ++mi) {
    row_max[mi][0] = row_max[mi][1] = -INFINITY;
    row_sum[mi][0] = row_sum[mi][1] = 0.0f;
  }
  const float c_log2 = args.scale_log2;  // > 0 (the planner checks)

  // ldmatrix lane addresses: Q A fragments (rows lane%16, columns 8·(lane/16)); K B fragments
  // of two n8 tiles (keys lane%8 + 8·(lane/16), columns 8·(lane/8 % 2)); V as in kind 0.
  // Byte addresses in the shared window.
  constexpr int kB = static_cast<int>(sizeof(bf16));
  const uint32_t q_lane =
      SmemAddr(q_smem + (warp * 16 * kMT + (lane & 15)) * Pitch<kD>() + (lane >> 4) * 8);
  const uint32_t k_lane =
      SmemAddr(kv_smem + ((lane & 7) + ((lane >> 4) << 3)) * Pitch<kD>() + ((lane >> 3) & 1) * 8);
  const uint32_t v_lane =
      SmemAddr(kv_smem + kBN * Pitch<kD>() + (lane & 15) * Pitch<kDV>() + (lane >> 4) * 8);

  int buf = 0;  // buffer of `tile`
  for (int tile = tile_first; tile < kv_end; tile += kBN) {
    CpAsyncWait<kStages - 2>();
    __syncthreads();
    // Every warp is past tile − kBN: its buffer takes the tile kStages − 1 ahead.
    load(tile + (kStages - 1) * kBN, buf == 0 ? kStages - 1 : buf - 1);
    const uint32_t tile_off = static_cast<uint32_t>(buf * Cfg::kTileElems * kB);
    buf = buf + 1 == kStages ? 0 : buf + 1;
    // Skip tiles no row of this warp sees (the causal end of the warp's rows is before the
    // CTA's; the window start after it).
    if (tile > w_pos_last ||
        (args.sliding_window > 0 && tile + kBN <= w_pos_first - args.sliding_window + 1)) {
      continue;
    }

    float s[kMT][kSTiles][4];
#pragma unroll
    for (int mi = 0; mi < kMT; ++mi) {
#pragma unroll
      for (int n = 0; n < kSTiles; ++n) s[mi][n][0] = s[mi][n][1] = s[mi][n][2] = s[mi][n][3] = 0.0f;
    }
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
      uint32_t qa[kMT][4];
#pragma unroll
      for (int mi = 0; mi < kMT; ++mi) {
        LdMatrixX4At(qa[mi], q_lane + (mi * 16 * Pitch<kD>() + ks * 16) * kB);
      }
#pragma unroll
      for (int np = 0; np < kSTiles / 2; ++np) {
        uint32_t kb[4];
        LdMatrixX4At(kb, k_lane + tile_off + (np * 16 * Pitch<kD>() + ks * 16) * kB);
#pragma unroll
        for (int mi = 0; mi < kMT; ++mi) {
          Mma16816(s[mi][2 * np], qa[mi], kb[0], kb[1]);
          Mma16816(s[mi][2 * np + 1], qa[mi], kb[2], kb[3]);
        }
      }
    }
    // Mask only where some row of the warp sees part of the tile.
    const bool full = tile >= kv_begin && tile + kBN <= kv_end && tile + kBN - 1 <= w_pos_first &&
                      (args.sliding_window <= 0 || tile > w_pos_last - args.sliding_window);
    if (!full) {
#pragma unroll
      for (int mi = 0; mi < kMT; ++mi) {
#pragma unroll
        for (int n = 0; n < kSTiles; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            // This thread's rows are g and g + 8 of each m16 tile; padding rows see nothing.
            const int r = wrow0 + mi * 16 + g + 8 * (e >> 1);
            const int pos = r < rows ? ctx + r / group : -1;
            const int j = tile + n * 8 + 2 * t + (e & 1);
            const bool visible = j >= kv_begin && j < kv_end && j <= pos &&
                                 (args.sliding_window <= 0 || j > pos - args.sliding_window);
            if (!visible) s[mi][n][e] = -INFINITY;
          }
        }
      }
    }
    // Online softmax per m16 tile (raw-unit max; exponent base −m·c per row), then
    // P = 2^(s·c − m·c) rounded to bf16 A fragments: the C fragments of score tiles 2k and 2k+1
    // are exactly the A fragment of P's k-step k. One m16 tile at a time so its scores die
    // into P fragments before the next tile's rescale (register peak).
    uint32_t p_frag[kMT][kPSteps][4];
#pragma unroll
    for (int mi = 0; mi < kMT; ++mi) {
      float neg_base[2], alpha[2];
      bool raised = false;
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        float mx = row_max[mi][i];
#pragma unroll
        for (int n = 0; n < kSTiles; ++n) {
          mx = fmaxf(mx, fmaxf(s[mi][n][2 * i], s[mi][n][2 * i + 1]));
        }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        // A row with nothing visible yet keeps max −inf; exponentiate against 0 so that
        // 2^(−inf) is 0 rather than NaN.
        const float mb = mx == -INFINITY ? 0.0f : mx * c_log2;
        const bool up = mx != row_max[mi][i];
        alpha[i] = up ? Exp2(row_max[mi][i] * c_log2 - mb) : 1.0f;
        raised |= up;
        row_max[mi][i] = mx;
        row_sum[mi][i] *= alpha[i];
        neg_base[i] = -mb;
      }
      // Rescale only when some row of the warp raised its max (otherwise every alpha is 1).
      if (__any_sync(0xffffffffu, raised)) {
#pragma unroll
        for (int u = 0; u < kVTiles; ++u) {
          acc[mi][u][0] *= alpha[0];
          acc[mi][u][1] *= alpha[0];
          acc[mi][u][2] *= alpha[1];
          acc[mi][u][3] *= alpha[1];
        }
      }
#pragma unroll
      for (int n = 0; n < kSTiles; ++n) {
        float p[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          p[e] = Exp2(fmaf(s[mi][n][e], c_log2, neg_base[e >> 1]));
          row_sum[mi][e >> 1] += p[e];
        }
        p_frag[mi][n / 2][(n & 1) * 2 + 0] = PackBf16(p[0], p[1]);
        p_frag[mi][n / 2][(n & 1) * 2 + 1] = PackBf16(p[2], p[3]);
      }
    }
#pragma unroll
    for (int kk = 0; kk < kPSteps; ++kk) {
      const uint32_t vrow = v_lane + tile_off + kk * 16 * Pitch<kDV>() * kB;
#pragma unroll
      for (int u = 0; u < kVTiles; u += 2) {
        uint32_t b[4];
        LdMatrixX4TransAt(b, vrow + u * 8 * kB);
#pragma unroll
        for (int mi = 0; mi < kMT; ++mi) {
          Mma16816(acc[mi][u], p_frag[mi][kk], b[0], b[1]);
          Mma16816(acc[mi][u + 1], p_frag[mi][kk], b[2], b[3]);
        }
      }
    }
  }
  // An empty partition never waited for its Q copy; no copy may outlive the CTA.
  CpAsyncWait<0>();

  paged_detail::StorePrefillRows<kMT, kVTiles>(args, acc, row_max, row_sum, c_log2, wrow0, rows,
                                               q_begin, kv_head, split, g, t);
}

// Padded head-dim variants: the smallest (kD, kDV) covering (head_dim, v_head_dim).
enum class Variant { k32, k64, k128, k192v128, k256 };

bool PickVariant(int64_t d, int64_t dv, Variant* v) {
  const int64_t m = std::max(d, dv);
  if (m <= 32) {
    *v = Variant::k32;
  } else if (m <= 64) {
    *v = Variant::k64;
  } else if (m <= 128) {
    *v = Variant::k128;
  } else if (d <= 192 && dv <= 128) {
    *v = Variant::k192v128;
  } else if (m <= 256) {
    *v = Variant::k256;
  } else {
    return false;
  }
  return true;
}

// Decode tiles (≤ 16 rows per token group) use 4 warps over keys; prefill tiles 4 warps over
// rows with 64-key tiles shared by all of them.
constexpr int kDecodeWarpsN = 4, kDecodeBN = 16;
constexpr int kPrefillWarpsM = 4, kPrefillBN = 64;
constexpr int kPrefillStages = 2;
constexpr int kKeyTile = 64;  // = kDecodeWarpsN·kDecodeBN = kPrefillBN; partitions align to it
static_assert(kDecodeWarpsN * kDecodeBN == kKeyTile && kPrefillBN == kKeyTile);
constexpr int kMinPartition = 2 * kKeyTile;
constexpr int64_t kMaxSplits = kMaxSplitsDevice;

// Kernel kinds. Prefill: kKindCtaTiles (PagedTileKernel, 64-row CTA tiles of 4 warps ×
// 16 rows, 64-key tiles, 2 stages), kKindMmaTiles (PagedMmaPrefillKernel: 4 warps × 2 m16 tiles,
// 32-key tiles, 3 stages), kKindFa2 (paged_prefill_fa2.cu), kKindWgmma
// (paged_prefill_wgmma.cu). Decode: warp rings of 4 warps × 2 or 3 stages and of 2 warps × 3
// stages (depths shrink to what fits shared memory for wide heads); the persistent decode
// warps are LaunchPlan::persistent, not a kind.
constexpr int kKindCtaTiles = 0, kKindRing4x2 = 1, kKindRing4x3 = 2, kKindRing2x3 = 3,
              kKindMmaTiles = 4, kKindFa2 = 5, kKindWgmma = 6;
constexpr int kNumKinds = 7;
// The persistent decode warps' shapes, both with 16-key slices in 3-stage rings: at padded
// head dims 128, 8 warps a CTA (a CTA's warps read all 8 KV heads of a Llama-3-8B sequence,
// i.e. whole 2 KiB cache rows, together; 1 CTA per SM) with evict-first copies ("wide"); at
// other dims 4 warps a CTA, plain cp.async (fewer stages where wide heads do not fit; ≥ 2
// always do: 4 × 2 × 16 × 528 × 2 B = 132 KiB at d 256).
constexpr int kDecodeWarpsPerCta = 4, kDecodeWarpStages = 3;
constexpr int kWideDecodeWarpsPerCta = 8;
constexpr int DecodeWarpsPerCtaOf(bool wide) {
  return wide ? kWideDecodeWarpsPerCta : kDecodeWarpsPerCta;
}
constexpr int kPrefillMmaWarps = 4;

// Rows per CTA of a prefill kind.
constexpr int PrefillRowsPerCta(int kind) {
  return kind == kKindWgmma      ? paged_detail::kWgmmaRowsPerCta
         : kind == kKindFa2      ? paged_detail::kFa2RowsPerCta
         : kind == kKindMmaTiles ? 32 * kPrefillMmaWarps
                                 : 16 * kPrefillWarpsM;
}

// Deepest ring of kBN-key slices for kWarps warps (≤ kWant stages) within the 227 KiB of shared
// memory a CTA may use on sm_90; < 2 means it does not fit.
template <int kD, int kDV, int kWarps, int kWant>
constexpr int FitStages() {
  constexpr int kBytes = kWarps * kDecodeBN * (Pitch<kD>() + Pitch<kDV>()) * 2;
  constexpr int kFit = 227 * 1024 / kBytes;
  return kFit < kWant ? kFit : kWant;
}

// The attention launches are programmatic dependents under kernels::DecodePdl (the whole
// decode step as one programmatic chain; false below sm_90).
bool PdlEnabled() { return DecodePdl(); }

struct LaunchPlan {
  bool decode;  // rows per sequence fit one m16 tile
  bool persistent = false;  // PagedDecodeWarpKernel (kind unused)
  bool wide = false;        // its 8-warp evict-first shape (padded head dims 128)
  // The wide shape with the swapped GQA math: ≤ 8 query rows a (sequence, KV head), with or
  // without decode fusion.
  bool swapped = false;
  int kind;     // kernel kind (kKind*)
  int rows_per_cta;
  int m_tiles;
  int num_splits;
  int partition_tokens;
};

absl::Status ValidateParams(const PagedAttentionParams& p) {
  if (p.num_heads < 1 || p.num_kv_heads < 1 || p.head_dim < 1 || p.v_head_dim < 1 ||
      p.block_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("PagedAttentionCuda: sizes must be >= 1 (num_heads ", p.num_heads,
                     ", num_kv_heads ", p.num_kv_heads, ", head_dim ", p.head_dim, ", v_head_dim ",
                     p.v_head_dim, ", block_size ", p.block_size, ")"));
  }
  if (p.num_heads > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("PagedAttentionCuda: num_heads ", p.num_heads, " > 65535"));
  }
  if (p.num_heads % p.num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("PagedAttentionCuda: num_heads ", p.num_heads,
                                                   " is not a multiple of num_kv_heads ",
                                                   p.num_kv_heads));
  }
  Variant v;
  if (p.head_dim % 8 != 0 || p.v_head_dim % 8 != 0 || !PickVariant(p.head_dim, p.v_head_dim, &v)) {
    return absl::InvalidArgumentError(
        absl::StrCat("PagedAttentionCuda: unsupported head dims (head_dim ", p.head_dim,
                     ", v_head_dim ", p.v_head_dim, "); both must be multiples of 8, at most 256"));
  }
  if (p.sliding_window < 0 || p.sliding_window > INT32_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("PagedAttentionCuda: sliding_window ", p.sliding_window, " out of range"));
  }
  return absl::OkStatus();
}

absl::Status ValidateBatch(const PagedAttentionCudaBatch& b) {
  if (b.num_sequences < 1 || b.num_tokens < 1 || b.max_query_len < 1 || b.max_seq_len < 1 ||
      b.max_blocks_per_seq < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PagedAttentionCuda: batch sizes must be >= 1 (num_sequences ", b.num_sequences,
        ", num_tokens ", b.num_tokens, ", max_query_len ", b.max_query_len, ", max_seq_len ",
        b.max_seq_len, ", max_blocks_per_seq ", b.max_blocks_per_seq, ")"));
  }
  if (b.max_query_len > b.max_seq_len) {
    return absl::InvalidArgumentError(absl::StrCat("PagedAttentionCuda: max_query_len ",
                                                   b.max_query_len, " exceeds max_seq_len ",
                                                   b.max_seq_len));
  }
  if (b.num_sequences > 65535 || b.max_seq_len > INT32_MAX / 2 || b.num_tokens > INT32_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("PagedAttentionCuda: batch too large (num_sequences ", b.num_sequences,
                     " > 65535 or max_seq_len ", b.max_seq_len, " / num_tokens ", b.num_tokens,
                     " beyond int32)"));
  }
  if (b.query_start_loc == nullptr || b.context_lens == nullptr || b.block_tables == nullptr) {
    return absl::InvalidArgumentError("PagedAttentionCuda: null batch metadata pointer");
  }
  return absl::OkStatus();
}

absl::Status LaunchWithSmem(void (*kernel)(AttnArgs), int threads, int smem_bytes,
                            const AttnArgs& args, dim3 grid, cudaStream_t stream) {
  if (smem_bytes > 48 * 1024) {
    // Above 48 KiB dynamic shared memory must be opted into (idempotent, host-only; allowed
    // during stream capture).
    SLUICE_CUDA_RETURN_IF_ERROR(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes),
        "PagedAttentionCuda: cudaFuncSetAttribute");
  }
  const cudaError_t e = attention_detail::LaunchKernelMaybePdl(
      kernel, grid, dim3(threads), smem_bytes, stream, PdlEnabled(), args);
  SLUICE_CUDA_RETURN_IF_ERROR(e, "PagedAttentionCuda: launch");
  return CudaLaunchStatus("PagedAttentionCuda");
}

template <int kD, int kDV, int kWarpsM, int kWarpsN, int kBN, int kStages, bool kRing>
absl::Status Launch(const AttnArgs& args, dim3 grid, cudaStream_t stream) {
  using Cfg = AttnConfig<kD, kDV, kWarpsM, kWarpsN, kBN, kStages>;
  // A fused decode launch also holds the RoPE table (decode_rope_fusion.cuh).
  const int fusion_bytes =
      args.fusion.inv_freq != nullptr ? attention_detail::DecodeRopeSmemBytes(kD) : 0;
  return LaunchWithSmem(&PagedTileKernel<kD, kDV, kWarpsM, kWarpsN, kBN, kStages, kRing>,
                        Cfg::kThreads, Cfg::kSmemBytes + fusion_bytes, args, grid, stream);
}

// Ops run by WithKernel on the kernel instantiation of a kind.
struct LaunchOp {
  const AttnArgs* args;
  dim3 grid;
  cudaStream_t stream;
  template <int kD, int kDV, int kWarpsM, int kWarpsN, int kBN, int kStages, bool kRing>
  absl::Status Run() const {
    return Launch<kD, kDV, kWarpsM, kWarpsN, kBN, kStages, kRing>(*args, grid, stream);
  }
  template <int kD, int kDV, int kWarps, int kMT, int kBN, int kStages>
  absl::Status RunPrefill() const {
    using Cfg = PrefillConfig<kD, kDV, kWarps, kMT, kBN, kStages>;
    return LaunchWithSmem(&PagedMmaPrefillKernel<kD, kDV, kWarps, kMT, kBN, kStages>, Cfg::kThreads,
                          Cfg::kSmemBytes, *args, grid, stream);
  }
};

// CTAs of the kernel resident per SM (≥ 1).
int Occupancy(void (*kernel)(AttnArgs), int threads, int smem_bytes) {
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

struct OccupancyOp {
  template <int kD, int kDV, int kWarpsM, int kWarpsN, int kBN, int kStages, bool kRing>
  int Run() const {
    using Cfg = AttnConfig<kD, kDV, kWarpsM, kWarpsN, kBN, kStages>;
    return Occupancy(&PagedTileKernel<kD, kDV, kWarpsM, kWarpsN, kBN, kStages, kRing>,
                     Cfg::kThreads, Cfg::kSmemBytes);
  }
  template <int kD, int kDV, int kWarps, int kMT, int kBN, int kStages>
  int RunPrefill() const {
    using Cfg = PrefillConfig<kD, kDV, kWarps, kMT, kBN, kStages>;
    return Occupancy(&PagedMmaPrefillKernel<kD, kDV, kWarps, kMT, kBN, kStages>, Cfg::kThreads,
                     Cfg::kSmemBytes);
  }
};

// PagedDecodeWarpKernel's depth at padded dims (kD, kDV): kDecodeWarpStages or what fits the
// 227 KiB of shared memory with the fusion's tables.
template <int kD, int kDV>
constexpr int DecodeWarpStages() {
  constexpr int kStageBytes =
      kDecodeWarpsPerCta * kDecodeBN * (Pitch<kD>() + Pitch<kDV>()) * static_cast<int>(sizeof(bf16));
  constexpr int kFusionBytes = kDecodeWarpsPerCta * attention_detail::DecodeRopeSmemBytes(kD);
  constexpr int kFit = (227 * 1024 - kFusionBytes) / kStageBytes;
  static_assert(kFit >= 2, "two stages of persistent decode warps fit");
  return kFit < kDecodeWarpStages ? kFit : kDecodeWarpStages;
}

// PagedDecodeWarpKernel at padded dims (kD, kDV): the 4-warp shape, or (kWide, dims 128 only)
// the 8-warp evict-first one, with the swapped math on swizzled slice rows (kSwapped) or the
// m16-row math on padded rows; op.Run gets the kernel, its config and threads.
template <int kD, int kDV, bool kWide, bool kSwapped = false, typename Op>
auto WithDecodeWarpKernel(const Op& op) {
  if constexpr (!kWide) {
    constexpr int kStages = DecodeWarpStages<kD, kDV>();
    using Cfg = DecodeWarpConfig<kD, kDV, kDecodeWarpsPerCta, kDecodeBN, kStages>;
    return op.template Run<Cfg>(
        &PagedDecodeWarpKernel<kD, kDV, kDecodeWarpsPerCta, kDecodeBN, kStages, false>);
  } else {
    static_assert(kD == 128 && kDV == 128);
    using Cfg = DecodeWarpConfig<kD, kDV, kWideDecodeWarpsPerCta, kDecodeBN, kDecodeWarpStages,
                                 kSwapped>;
    static_assert(Cfg::kSmemBytes + Cfg::kFusionBytes <= 227 * 1024);
    return op.template Run<Cfg>(&PagedDecodeWarpKernel<kD, kDV, kWideDecodeWarpsPerCta, kDecodeBN,
                                                       kDecodeWarpStages, true, kSwapped,
                                                       kSwapped>);
  }
}

// WithDecodeWarpKernel for a run-time shape (the 4-warp one off the 128 dims).
template <int kD, int kDV, typename Op>
auto WithDecodeWarpShape(bool wide, const Op& op, bool swapped = false) {
  if constexpr (kD == 128 && kDV == 128) {
    if (wide && swapped) return WithDecodeWarpKernel<kD, kDV, true, true>(op);
    if (wide) return WithDecodeWarpKernel<kD, kDV, true>(op);
  }
  return WithDecodeWarpKernel<kD, kDV, false>(op);
}

// Ops run by WithDims on PagedDecodeWarpKernel at padded dims (kD, kDV).
struct DecodeWarpLaunchOp {
  const AttnArgs* args;
  int ctas;
  bool wide;
  cudaStream_t stream;
  bool swapped = false;  // LaunchPlan::swapped
  template <typename Cfg>
  absl::Status Run(void (*kernel)(AttnArgs)) const {
    const int smem = Cfg::kSmemBytes + (args->fusion.inv_freq != nullptr ? Cfg::kFusionBytes : 0);
    return LaunchWithSmem(kernel, Cfg::kThreads, smem, *args, dim3(static_cast<unsigned>(ctas)),
                          stream);
  }
  template <int kD, int kDV>
  absl::Status Run() const {
    return WithDecodeWarpShape<kD, kDV>(wide, *this, swapped);
  }
};
// Sizes the wide shape with its padded, unswapped kernel (204 KiB at d 128); the swapped
// kernel on swizzled rows launched instead (192 KiB) also fits one CTA per SM, and a low
// estimate would only shrink the persistent grid.
struct DecodeWarpOccupancyOp {
  bool wide;
  template <typename Cfg>
  int Run(void (*kernel)(AttnArgs)) const {
    return Occupancy(kernel, Cfg::kThreads, Cfg::kSmemBytes);
  }
  template <int kD, int kDV>
  int Run() const {
    return WithDecodeWarpShape<kD, kDV>(wide, *this);
  }
};

template <int kD, int kDV, int kWarps, int kWant, typename Op>
auto WithRing(const Op& op) {
  constexpr int kStages = FitStages<kD, kDV, kWarps, kWant>();
  static_assert(kStages >= 2, "4 and 2 warps × 2 stages always fit");
  return op.template Run<kD, kDV, 1, kWarps, kDecodeBN, kStages, true>();
}

// Runs op.Run<config>() for the kernel of `kind` at padded dims (kD, kDV). The MMA-tile kind
// exists at padded dims up to 128 only (the planner picks it only there; wider dims
// instantiate the CTA tiles in its place).
template <int kD, int kDV, typename Op>
auto WithKernel(int kind, const Op& op) {
  switch (kind) {
    case kKindMmaTiles:
      if constexpr (kD <= 128 && kDV <= 128) {
        return op.template RunPrefill<kD, kDV, kPrefillMmaWarps, 2, 32, 3>();
      } else {
        return op.template Run<kD, kDV, kPrefillWarpsM, 1, kPrefillBN, kPrefillStages, false>();
      }
    case kKindRing4x2:
      return WithRing<kD, kDV, kDecodeWarpsN, 2>(op);
    case kKindRing4x3:
      return WithRing<kD, kDV, kDecodeWarpsN, 3>(op);
    case kKindRing2x3:
      return WithRing<kD, kDV, kDecodeWarpsN / 2, 3>(op);
    default:
      return op.template Run<kD, kDV, kPrefillWarpsM, 1, kPrefillBN, kPrefillStages, false>();
  }
}

// Runs op.Run<kD, kDV>() at the padded dims of v.
template <typename Op>
auto WithDims(Variant v, const Op& op) {
  switch (v) {
    case Variant::k32:
      return op.template Run<32, 32>();
    case Variant::k64:
      return op.template Run<64, 64>();
    case Variant::k192v128:
      return op.template Run<192, 128>();
    case Variant::k256:
      return op.template Run<256, 256>();
    case Variant::k128:
    default:
      return op.template Run<128, 128>();
  }
}

template <typename Op>
struct KindOp {
  int kind;
  const Op* op;
  template <int kD, int kDV>
  auto Run() const {
    return WithKernel<kD, kDV>(kind, *op);
  }
};

template <typename Op>
auto WithVariant(Variant v, int kind, const Op& op) {
  return WithDims(v, KindOp<Op>{kind, &op});
}

// CTAs of the chosen kernel resident on the whole GPU at once (SMs × occupancy), cached per
// (variant, kernel kind) for device 0..15; the launch path must stay cheap and capturable.
int64_t ResidentSlots(Variant v, int kind) {
  static std::atomic<int> cache[16][5][kNumKinds];
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= 16) device = 0;
  std::atomic<int>& slot = cache[device][static_cast<int>(v)][kind];
  int n = slot.load(std::memory_order_relaxed);
  if (n > 0) return n;
  int sms = 132;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  const int per_sm =
      kind == kKindWgmma ? paged_detail::WgmmaPrefillOccupancy()
      : kind == kKindFa2
          ? paged_detail::Fa2Occupancy(v == Variant::k64 ? 64 : 128, v == Variant::k64 ? 64 : 128)
          : WithVariant(v, kind, OccupancyOp{});
  n = std::max(1, sms * per_sm);
  slot.store(n, std::memory_order_relaxed);
  return n;
}

// Persistent decode warps resident on the whole GPU at once (SMs × CTAs per SM × warps), cached
// per shape for device 0..15.
int64_t ResidentDecodeWarps(Variant v, bool wide) {
  static std::atomic<int> cache[16][5][2];  // [4-warp, wide]
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= 16) device = 0;
  std::atomic<int>& slot = cache[device][static_cast<int>(v)][wide ? 1 : 0];
  int n = slot.load(std::memory_order_relaxed);
  if (n > 0) return n;
  int sms = 132;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  n = std::max(1, sms * WithDims(v, DecodeWarpOccupancyOp{wide}) * DecodeWarpsPerCtaOf(wide));
  slot.store(n, std::memory_order_relaxed);
  return n;
}

// CTAs of a persistent decode launch over `units` (sequence, KV head, split) units: as few
// rounds of units per warp as the resident warps allow, spread evenly (every warp gets the
// same number of units, ± 1).
int64_t DecodeWarpCtas(int64_t units, Variant v, bool wide) {
  const int64_t resident = ResidentDecodeWarps(v, wide);
  const int64_t rounds = (units + resident - 1) / resident;
  const int64_t warps = (units + rounds - 1) / rounds;
  const int per_cta = DecodeWarpsPerCtaOf(wide);
  return (warps + per_cta - 1) / per_cta;
}

// The prefill kind of a launch: the chain wgmma → FA2 → MMA tiles → CTA tiles from `first`
// on, each kind where it serves. The MMA, FA2 and wgmma kinds fold the scale into the
// exponent (need scale > 0) and hold at most 128-wide heads in registers.
int PrefillKind(const PagedAttentionParams& p, PagedPrefillKernel first) {
  const bool mma_fits = p.head_dim <= 128 && p.v_head_dim <= 128 && p.scale > 0.0f &&
                        std::isfinite(p.scale);
  if (!mma_fits || first == PagedPrefillKernel::kCtaTiles) return kKindCtaTiles;
  if (first == PagedPrefillKernel::kWgmma &&
      paged_detail::WgmmaPrefillSupports(p.head_dim, p.v_head_dim, p.scale, p.sliding_window)) {
    return kKindWgmma;
  }
  if (first != PagedPrefillKernel::kMmaTiles && paged_detail::Fa2Supports(p.head_dim, p.v_head_dim)) {
    return kKindFa2;
  }
  return kKindMmaTiles;
}

// Plan picks the kernel and the grid. Split-KV: with few CTAs the GPU idles, and CTAs run in
// waves of `slots`, so a partial last wave wastes its share. Among partitions of ≥
// kMinPartition keys (multiples of the key tile) pick the one whose waves are fullest,
// preferring fewer splits (each split costs a partial-output write and the combine pass)
// unless more splits fill the waves ≥ 10% better (relative). Depends only on host-side
// bounds and the options, so captured graphs stay valid.
LaunchPlan Plan(const PagedAttentionCudaBatch& b, const PagedAttentionParams& p,
                const PagedAttentionOptions& options) {
  LaunchPlan plan;
  const int64_t group = p.num_heads / p.num_kv_heads;
  const int64_t max_rows = b.max_query_len * group;
  plan.decode = max_rows <= 16;
  Variant v = Variant::k128;
  PickVariant(p.head_dim, p.v_head_dim, &v);
  plan.kind = plan.decode ? kKindCtaTiles : PrefillKind(p, options.prefill_kernel);
  plan.rows_per_cta = plan.decode ? 16 : PrefillRowsPerCta(plan.kind);
  plan.m_tiles = static_cast<int>((max_rows + plan.rows_per_cta - 1) / plan.rows_per_cta);
  plan.num_splits = 1;
  plan.partition_tokens = 0;
  const int64_t ctas = plan.m_tiles * p.num_kv_heads * b.num_sequences;
  if (plan.decode) {
    // Persistent decode warps where the unsplit units fill the resident warps at least once
    // (batch 256 × 8 KV heads on an H200: 2048 units, 1056 warps), so they need no split-KV
    // pass (or always, or never, as the options force); smaller grids take the warp rings.
    // Units are indexed in int32 (< 2^31 with any split count).
    const bool fits_int = ctas * kMaxSplits < INT32_MAX;
    const PagedDecodeKernel dk = options.decode_kernel;
    plan.persistent =
        fits_int && (dk == PagedDecodeKernel::kPersistentWarps ||
                     (dk == PagedDecodeKernel::kAuto && ctas >= ResidentDecodeWarps(v, false)));
    if (plan.persistent) {
      // The shape follows the head dims, not which launches take the warps (the 4-warp
      // shape's resident warps decide that above).
      plan.wide = v == Variant::k128;
      plan.swapped = plan.wide && max_rows <= 8 && p.head_dim % 8 == 0;
      plan.kind = kKindRing2x3;  // unused: LaunchVariant checks persistent first
    } else if (2 * ctas >= ResidentSlots(v, kKindRing2x3)) {
      // Warp rings. With CTAs for about a wave of 2-warp × 3-stage CTAs (4 per SM at head_dim
      // 128) or more, those: smaller CTAs fill the SMs in fewer, fuller waves.
      plan.kind = kKindRing2x3;
    } else {
      // Fewer CTAs (the grid will split): 4-warp rings, 3 stages while the unsplit grid fits
      // two waves of them (the fewer, fuller waves need no split), else 2 (more CTAs per SM,
      // each CTA's ramp and epilogue hidden behind the others' streaming).
      plan.kind = ctas <= 2 * ResidentSlots(v, kKindRing4x3) ? kKindRing4x3 : kKindRing4x2;
    }
  }
  // Persistent warps each serve a unit as a CTA would: the split rule counts them as slots.
  const int64_t slots =
      plan.persistent ? ResidentDecodeWarps(v, plan.wide) : ResidentSlots(v, plan.kind);
  int64_t keys = b.max_seq_len;
  if (p.sliding_window > 0) {
    keys = std::min<int64_t>(keys, p.sliding_window + b.max_query_len + kKeyTile);
  }
  if (ctas >= 8 * slots || keys < 2 * kMinPartition) return plan;
  // Short partitions only when the batch is far too small to fill the GPU (latency-bound);
  // otherwise each split's partial write, combine and pipeline ramp cost more than a slightly
  // emptier last wave. Latency-bound decode goes down to one key tile per CTA (batch 1 × 1k
  // context, 8 KV heads: 8 CTAs → 8·17), so every SM streams and each CTA's chain is one copy
  // and one tile of math.
  const bool latency_bound = ctas * 4 < slots;
  const int64_t min_part =
      latency_bound ? (plan.decode ? kKeyTile : kMinPartition) : 4 * kMinPartition;
  auto fill = [&](int64_t splits) {
    const int64_t total = ctas * splits;
    const int64_t waves = (total + slots - 1) / slots;
    return static_cast<double>(total) / static_cast<double>(waves * slots);
  };
  double best_fill = fill(1);
  int64_t best_part = 0;
  for (int64_t part = (keys / kKeyTile) * kKeyTile; part >= min_part; part -= kKeyTile) {
    const int64_t splits = (b.max_seq_len + part - 1) / part;
    if (splits < 2 || splits > kMaxSplits) continue;
    if (ctas * splits > 16 * slots) break;
    const double f = fill(splits);
    if (f > best_fill * 1.1) {
      best_fill = f;
      best_part = part;
    }
  }
  if (best_part > 0) {
    // The loop finds the longest partition for the best split count, which can leave the
    // last split a sliver (1024 keys in 2: 960 + 64), and a unit waits for its longest
    // split: spread the keys evenly over that many splits instead (512 + 512).
    const int64_t splits = (b.max_seq_len + best_part - 1) / best_part;
    const int64_t even = (b.max_seq_len + splits - 1) / splits;
    best_part = std::max<int64_t>(kKeyTile, (even + kKeyTile - 1) / kKeyTile * kKeyTile);
    plan.partition_tokens = static_cast<int>(best_part);
    plan.num_splits = static_cast<int>((b.max_seq_len + best_part - 1) / best_part);
  }
  return plan;
}

absl::Status LaunchVariant(const AttnArgs& args, const LaunchPlan& plan, dim3 grid,
                           const PagedAttentionParams& params, cudaStream_t stream) {
  Variant v = Variant::k128;
  PickVariant(params.head_dim, params.v_head_dim, &v);
  if (plan.persistent) {
    const int64_t units = args.num_sequences * static_cast<int64_t>(params.num_kv_heads) *
                          plan.num_splits;
    return WithDims(v, DecodeWarpLaunchOp{&args,
                                          static_cast<int>(DecodeWarpCtas(units, v, plan.wide)),
                                          plan.wide, stream, plan.swapped});
  }
  if (plan.kind == kKindWgmma) {
    const paged_detail::Fa2Args& fa2 = args;  // the shared part of AttnArgs
    return paged_detail::LaunchWgmmaPrefill(fa2, grid, stream, PdlEnabled());
  }
  if (plan.kind == kKindFa2) {
    const paged_detail::Fa2Args& fa2 = args;  // the shared part of AttnArgs
    return paged_detail::LaunchFa2Prefill(fa2, grid, stream, PdlEnabled());
  }
  return WithVariant(v, plan.kind, LaunchOp{&args, grid, stream});
}

}  // namespace

absl::StatusOr<PagedAttentionPlanInfo> DescribePagedAttentionPlan(
    const PagedAttentionCudaBatch& batch, const PagedAttentionParams& params,
    const PagedAttentionOptions& options) {
  if (absl::Status s = ValidateParams(params); !s.ok()) return s;
  if (absl::Status s = ValidateBatch(batch); !s.ok()) return s;
  const LaunchPlan plan = Plan(batch, params, options);
  PagedAttentionPlanInfo info;
  info.num_splits = plan.num_splits;
  info.swapped = plan.persistent && plan.swapped;
  if (plan.persistent) {
    info.kernel = PagedAttentionKernel::kPersistentWarps;
  } else if (plan.decode) {
    info.kernel = PagedAttentionKernel::kWarpRings;
  } else {
    info.kernel = plan.kind == kKindWgmma      ? PagedAttentionKernel::kWgmma
                  : plan.kind == kKindFa2      ? PagedAttentionKernel::kFa2
                  : plan.kind == kKindMmaTiles ? PagedAttentionKernel::kMmaTiles
                                               : PagedAttentionKernel::kCtaTiles;
  }
  return info;
}

size_t PagedAttentionCudaWorkspaceBytes(const PagedAttentionCudaBatch& batch,
                                        const PagedAttentionParams& params,
                                        const PagedAttentionOptions& options) {
  if (!ValidateParams(params).ok() || !ValidateBatch(batch).ok()) return 0;
  const LaunchPlan plan = Plan(batch, params, options);
  return attention_detail::SplitKvWorkspaceBytes(plan.num_splits, batch.num_tokens,
                                                 params.num_heads, params.v_head_dim);
}

namespace {

// PagedAttentionCuda, or with `fusion` set (fusion.inv_freq non-null) the fused decode launch of
// PagedAttentionRopeDecodeCuda (the caller has checked PagedAttentionDecodeFusionApplies).
absl::Status RunPagedAttention(const bf16* q, int64_t q_token_stride, const bf16* k_cache,
                               const bf16* v_cache, const PagedAttentionCudaBatch& batch,
                               const PagedAttentionParams& params, void* workspace, bf16* out,
                               const attention_detail::DecodeRopeFusion& fusion,
                               const PagedAttentionOptions& options, cudaStream_t stream) {
  if (absl::Status s = ValidateParams(params); !s.ok()) return s;
  if (absl::Status s = ValidateBatch(batch); !s.ok()) return s;
  if (q == nullptr || k_cache == nullptr || v_cache == nullptr || out == nullptr) {
    return absl::InvalidArgumentError("PagedAttentionCuda: null q, cache or out pointer");
  }
  if (q_token_stride < params.num_heads * params.head_dim) {
    return absl::InvalidArgumentError(absl::StrCat("PagedAttentionCuda: q_token_stride ",
                                                   q_token_stride, " < num_heads · head_dim ",
                                                   params.num_heads * params.head_dim));
  }
  if (!Aligned16(k_cache) || !Aligned16(v_cache) || (reinterpret_cast<uintptr_t>(q) & 3u) != 0 ||
      (reinterpret_cast<uintptr_t>(out) & 3u) != 0 || q_token_stride % 2 != 0) {
    return absl::InvalidArgumentError(
        "PagedAttentionCuda: k_cache/v_cache must be 16-byte aligned, q/out 4-byte aligned "
        "with an even q_token_stride");
  }
  const LaunchPlan plan = Plan(batch, params, options);
  const size_t ws_bytes = attention_detail::SplitKvWorkspaceBytes(
      plan.num_splits, batch.num_tokens, params.num_heads, params.v_head_dim);
  if (ws_bytes > 0 && (workspace == nullptr || !Aligned16(workspace))) {
    return absl::InvalidArgumentError(
        absl::StrCat("PagedAttentionCuda: needs a 16-byte aligned workspace of ", ws_bytes,
                     " bytes (PagedAttentionCudaWorkspaceBytes)"));
  }
  AttnArgs args;
  args.q = q;
  args.q_token_stride = q_token_stride;
  args.k_cache = k_cache;
  args.v_cache = v_cache;
  args.query_start_loc = batch.query_start_loc;
  args.context_lens = batch.context_lens;
  args.block_tables = batch.block_tables;
  args.max_blocks_per_seq = batch.max_blocks_per_seq;
  args.num_heads = static_cast<int>(params.num_heads);
  args.num_kv_heads = static_cast<int>(params.num_kv_heads);
  args.group = static_cast<int>(params.num_heads / params.num_kv_heads);
  args.head_dim = static_cast<int>(params.head_dim);
  args.v_head_dim = static_cast<int>(params.v_head_dim);
  args.block_size = static_cast<int>(params.block_size);
  args.block_shift = -1;
  for (int sh = 0; sh < 31; ++sh) {
    if ((int64_t{1} << sh) == params.block_size) args.block_shift = sh;
  }
  args.sliding_window = static_cast<int>(params.sliding_window);
  args.scale_log2 = params.scale * kLog2e;
  args.num_m_tiles = plan.m_tiles;
  args.num_splits = plan.num_splits;
  args.partition_tokens = plan.partition_tokens;
  args.num_tokens = static_cast<int>(batch.num_tokens);
  args.q_vec = Aligned16(q) && q_token_stride % 8 == 0 && params.head_dim % 8 == 0;
  args.out = out;
  const attention_detail::SplitKvCombineArgs combine = attention_detail::MakeSplitKvCombineArgs(
      ws_bytes > 0 ? workspace : nullptr, batch.query_start_loc, plan.num_splits, args.num_tokens,
      args.num_heads, args.v_head_dim, out);
  args.partial_ml = combine.partial_ml;
  args.partial_out = combine.partial_out;
  args.fusion = fusion;
  args.num_sequences = static_cast<int>(batch.num_sequences);

  // Prefill kinds but the CTA tiles take a linear x over (query tile, KV head, split), longest
  // tiles first.
  const bool linear = plan.kind >= kKindMmaTiles;
  const dim3 grid(
      static_cast<unsigned>(plan.m_tiles * plan.num_splits * (linear ? params.num_kv_heads : 1)),
      static_cast<unsigned>(linear ? 1 : params.num_kv_heads),
      static_cast<unsigned>(batch.num_sequences));
  const absl::Status s = LaunchVariant(args, plan, grid, params, stream);
  if (!s.ok() || plan.num_splits == 1) return s;
  attention_detail::LaunchSplitKvCombine(combine, batch.max_query_len, batch.num_sequences, stream,
                                         PdlEnabled());
  return CudaLaunchStatus("PagedAttentionCuda combine");
}

}  // namespace

absl::Status PagedAttentionCuda(const bf16* q, int64_t q_token_stride, const bf16* k_cache,
                                const bf16* v_cache, const PagedAttentionCudaBatch& batch,
                                const PagedAttentionParams& params, void* workspace, bf16* out,
                                cudaStream_t stream, const PagedAttentionOptions& options) {
  return RunPagedAttention(q, q_token_stride, k_cache, v_cache, batch, params, workspace, out,
                           attention_detail::DecodeRopeFusion{}, options, stream);
}

bool PagedAttentionDecodeFusionPays(const PagedAttentionCudaBatch& batch,
                                    const PagedAttentionParams& params,
                                    const PagedAttentionOptions& options) {
  if (!ValidateParams(params).ok() || !ValidateBatch(batch).ok()) return false;
  const LaunchPlan plan = Plan(batch, params, options);
  // The persistent decode warps pay only with the deferred new-key writes (head dims ≤ 128).
  const bool deferred = params.head_dim <= 128 && params.v_head_dim <= 128;
  return plan.decode && plan.num_splits == 1 && (!plan.persistent || deferred);
}

bool PagedAttentionDecodeFusionApplies(const PagedAttentionCudaBatch& batch,
                                       const PagedAttentionParams& params, int64_t rotary_dim,
                                       const PagedAttentionOptions& options) {
  if (!ValidateParams(params).ok() || !ValidateBatch(batch).ok()) return false;
  // One new token per sequence in one m16 tile (so one CTA per KV head and split: exactly one
  // owns the new key), K and V rows of the same width, and rotation pairs that never straddle
  // the rotated halves of a 32-bit q load.
  return batch.max_query_len == 1 && Plan(batch, params, options).decode &&
         params.v_head_dim == params.head_dim && rotary_dim >= 2 && rotary_dim % 4 == 0 &&
         rotary_dim <= params.head_dim;
}

absl::Status PagedAttentionRopeDecodeCuda(const bf16* qkv, int64_t token_stride, bf16* k_cache,
                                          bf16* v_cache, const PagedAttentionCudaBatch& batch,
                                          const PagedAttentionParams& params,
                                          const int32_t* positions, const DeviceRopeTable& rope,
                                          const int64_t* slot_mapping, void* workspace, bf16* out,
                                          cudaStream_t stream,
                                          const PagedAttentionOptions& options) {
  if (!PagedAttentionDecodeFusionApplies(batch, params, rope.rotary_dim, options) ||
      rope.inv_freq.size() != static_cast<size_t>(rope.rotary_dim / 2)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PagedAttentionRopeDecodeCuda: not a fusable decode launch (max_query_len ",
        batch.max_query_len, ", head_dim ", params.head_dim, ", v_head_dim ", params.v_head_dim,
        ", rotary_dim ", rope.rotary_dim, ")"));
  }
  if (positions == nullptr || slot_mapping == nullptr) {
    return absl::InvalidArgumentError("PagedAttentionRopeDecodeCuda: null positions or slots");
  }
  if (token_stride < (params.num_heads + 2 * params.num_kv_heads) * params.head_dim) {
    return absl::InvalidArgumentError(
        absl::StrCat("PagedAttentionRopeDecodeCuda: token_stride ", token_stride,
                     " shorter than the q + k + v row"));
  }
  attention_detail::DecodeRopeFusion f;
  f.inv_freq = rope.inv_freq.data();
  f.positions = positions;
  f.slot_mapping = slot_mapping;
  f.k_cache = k_cache;
  f.v_cache = v_cache;
  f.half = static_cast<int>(rope.rotary_dim / 2);
  f.scaling = rope.attention_scaling;
  f.k_offset = params.num_heads * params.head_dim;
  f.v_offset = (params.num_heads + params.num_kv_heads) * params.head_dim;
  return RunPagedAttention(qkv, token_stride, k_cache, v_cache, batch, params, workspace, out, f,
                           options, stream);
}

namespace {

// One CTA per token; 16-byte moves when every pointer, stride and row length allows.
__global__ void WriteKvCacheKernel(const bf16* k, int64_t k_token_stride, const bf16* v,
                                   int64_t v_token_stride, const int64_t* slot_mapping,
                                   int64_t k_elems, int64_t v_elems, bf16* k_cache, bf16* v_cache,
                                   bool vec) {
  const int64_t token = blockIdx.x;
  const int64_t slot = slot_mapping[token];
  if (slot < 0) return;
  const bf16* srcs[2] = {k + token * k_token_stride, v + token * v_token_stride};
  bf16* dsts[2] = {k_cache + slot * k_elems, v_cache + slot * v_elems};
  const int64_t lens[2] = {k_elems, v_elems};
  for (int which = 0; which < 2; ++which) {
    if (lens[which] == 0) continue;
    if (vec) {
      const auto* s = reinterpret_cast<const cuda_detail::Bf16x8*>(srcs[which]);
      auto* d = reinterpret_cast<cuda_detail::Bf16x8*>(dsts[which]);
      for (int64_t i = threadIdx.x; i < lens[which] / 8; i += blockDim.x) d[i] = s[i];
    } else {
      for (int64_t i = threadIdx.x; i < lens[which]; i += blockDim.x) {
        dsts[which][i] = srcs[which][i];
      }
    }
  }
}

}  // namespace

absl::Status WriteKvCacheCuda(const bf16* k, int64_t k_token_stride, const bf16* v,
                              int64_t v_token_stride, const int64_t* slot_mapping,
                              int64_t num_tokens, int64_t k_elems_per_token,
                              int64_t v_elems_per_token, bf16* k_cache, bf16* v_cache,
                              cudaStream_t stream) {
  if (num_tokens < 0 || k_elems_per_token < 1 || v_elems_per_token < 0 ||
      k_token_stride < k_elems_per_token || v_token_stride < v_elems_per_token) {
    return absl::InvalidArgumentError(absl::StrCat(
        "WriteKvCacheCuda: bad sizes (num_tokens ", num_tokens, ", k_elems_per_token ",
        k_elems_per_token, ", v_elems_per_token ", v_elems_per_token, ", k_token_stride ",
        k_token_stride, ", v_token_stride ", v_token_stride, ")"));
  }
  if (num_tokens > INT32_MAX) {
    return absl::InvalidArgumentError("WriteKvCacheCuda: num_tokens beyond int32");
  }
  if (k == nullptr || k_cache == nullptr || slot_mapping == nullptr ||
      (v_elems_per_token > 0 && (v == nullptr || v_cache == nullptr))) {
    return absl::InvalidArgumentError("WriteKvCacheCuda: null pointer");
  }
  if (num_tokens == 0) return absl::OkStatus();
  const bool vec =
      Aligned16(k) && Aligned16(k_cache) && k_token_stride % 8 == 0 && k_elems_per_token % 8 == 0 &&
      (v_elems_per_token == 0 || (Aligned16(v) && Aligned16(v_cache) && v_token_stride % 8 == 0 &&
                                  v_elems_per_token % 8 == 0));
  WriteKvCacheKernel<<<static_cast<unsigned>(num_tokens), 128, 0, stream>>>(
      k, k_token_stride, v, v_token_stride, slot_mapping, k_elems_per_token, v_elems_per_token,
      k_cache, v_cache, vec);
  return CudaLaunchStatus("WriteKvCacheCuda");
}

}  // namespace sluice::kernels
