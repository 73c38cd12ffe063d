// The paged prefill kernels' shared pieces: their argument block (Fa2Args), the epilogue
// (StorePrefillRows), the mma.sync / ldmatrix wrappers, the online-softmax step, the skeleton
// the mma.sync kernels share (tile bounds, Q copy, Q·Kᵀ, P·V), and the host entry
// points of the FlashAttention-2 style kernel (paged_prefill_fa2.cu).
#ifndef SLUICE_KERNELS_ATTENTION_PAGED_PREFILL_DEVICE_CUH_
#define SLUICE_KERNELS_ATTENTION_PAGED_PREFILL_DEVICE_CUH_

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "absl/status/status.h"
#include "kernels/attention/attention_device.cuh"
#include "kernels/cuda/device_utils.cuh"

namespace sluice::kernels::paged_detail {

using bf16 = __nv_bfloat16;

// Kernel arguments shared by every paged attention kernel (paged_attention_launch.cuh's AttnArgs
// extends them for the decode kernels; see PagedAttentionCuda for their meaning).
struct Fa2Args {
  const bf16* q;
  int64_t q_token_stride;
  const bf16* k_cache;
  const bf16* v_cache;
  const int32_t* query_start_loc;
  const int32_t* context_lens;
  const int32_t* block_tables;
  int64_t max_blocks_per_seq;
  int num_heads;
  int num_kv_heads;
  int group;  // query heads per KV head
  int head_dim;
  int v_head_dim;
  int block_size;
  int block_shift;  // log2(block_size) when a power of two, else -1
  int sliding_window;
  float scale_log2;  // softmax scale · log2(e): scores are exponentiated with exp2
  int num_m_tiles;
  int num_splits;
  int partition_tokens;  // keys per split (multiple of the key tile); unused when num_splits 1
  int num_tokens;
  bool q_vec;  // q 16-byte aligned with a stride of whole 16-byte chunks (prefill kinds)
  bf16* out;
  float* partial_out;  // [num_splits, num_tokens, num_heads, v_head_dim] normalized
  float2* partial_ml;  // [num_splits, num_tokens, num_heads] (max·log2e-scaled, sum)
};

// StorePrefillRows: the prefill kernels' epilogue. Each of a warp's kMT m16 tiles holds, per
// thread, rows g and g + 8 (acc[mi][u][2i..2i+1]: columns u·8 + 2t, +1); the row sums are
// summed over the quad, and rows below `rows` (query tokens × group) are normalized and written
// as bf16 to args.out, or, for a split, as fp32 to args.partial_out with (max · c_log2, sum) in
// args.partial_ml for the split-KV combine (the max in log2-scaled units; −inf stays −inf).
// wrow0: the warp's first row; q_begin: the sequence's first query token.
template <int kMT, int kVTiles>
__device__ __forceinline__ void StorePrefillRows(const Fa2Args& args,
                                                 const float (&acc)[kMT][kVTiles][4],
                                                 const float (&row_max)[kMT][2],
                                                 const float (&row_sum)[kMT][2], float c_log2,
                                                 int wrow0, int rows, int q_begin, int kv_head,
                                                 int split, int g, int t) {
  const int group = args.group;
#pragma unroll
  for (int mi = 0; mi < kMT; ++mi) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float sum = row_sum[mi][i];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      const int r = wrow0 + mi * 16 + g + 8 * i;
      if (r >= rows) continue;
      const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
      const int64_t out_row = static_cast<int64_t>(q_begin + r / group) * args.num_heads +
                              kv_head * group + r % group;
      if (args.num_splits == 1) {
        bf16* o = args.out + out_row * args.v_head_dim;
#pragma unroll
        for (int u = 0; u < kVTiles; ++u) {
          const int col = u * 8 + 2 * t;
          if (col < args.v_head_dim) {
            *reinterpret_cast<__nv_bfloat162*>(o + col) =
                __floats2bfloat162_rn(acc[mi][u][2 * i] * inv, acc[mi][u][2 * i + 1] * inv);
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
                make_float2(acc[mi][u][2 * i] * inv, acc[mi][u][2 * i + 1] * inv);
          }
        }
        // The combine expects the max in log2-scaled units (−inf stays −inf: c > 0).
        if (t == 0) args.partial_ml[part_row] = make_float2(row_max[mi][i] * c_log2, sum);
      }
    }
  }
}

using cuda_detail::Mma16816;  // kernels/cuda/device_utils.cuh

static __device__ __forceinline__ uint32_t PackBf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// Shared-memory row pitch in bf16: 8 elements (16 bytes) of padding shift consecutive rows by
// 4 banks, so the 8 rows read by one B-fragment load (and by ldmatrix) hit distinct banks.
template <int kD>
__host__ __device__ constexpr int Pitch() {
  return kD + 8;
}

// Four 8×8 bf16 matrices from shared memory (ldmatrix, no transpose) at 32-bit shared-window
// addresses (fewer live registers than generic pointers): lanes 8i..8i+7 give the row
// addresses of matrix i; lane l receives row l/4, columns 2(l%4)..+1 of each. ..Trans: the
// transposes (B fragments of a row-major K×N tile).
static __device__ __forceinline__ void LdMatrixX4At(uint32_t (&r)[4], uint32_t smem_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr));
}
static __device__ __forceinline__ void LdMatrixX4TransAt(uint32_t (&r)[4], uint32_t smem_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr));
}

// PrefillSoftmaxStep: one key tile's online-softmax step (FlashAttention-2) for a warp's m16
// tile of query rows, as the MMA-tile, FA2 and wgmma prefill kernels keep it: this thread holds
// rows g and g + 8, score tile n the keys 8n + 2t, +1 (s[n][2i + e]: row g + 8i; raw, unscaled
// scores, masked ones −inf), output column tile u likewise (acc[u][2i + e]). The running max
// stays in raw score units and the scale folds into the exponent, P = 2^(s·c − m·c) with
// c = scale·log2(e) > 0: one FFMA + MUFU per score. row_sum (this thread's partial sums) and
// acc are rescaled only when some row of the warp raised its max (exact: otherwise every
// factor is 1). P comes out rounded to bf16 as the A fragments of P·V: the C fragments of
// score tiles 2k and 2k + 1 are exactly the A fragment of P's k-step k.
template <int kSTiles, int kVTiles>
__device__ __forceinline__ void PrefillSoftmaxStep(const float (&s)[kSTiles][4], float c_log2,
                                                   float (&row_max)[2], float (&row_sum)[2],
                                                   float (&acc)[kVTiles][4],
                                                   uint32_t (&p_frag)[kSTiles / 2][4]) {
  float neg_base[2], alpha[2];
  bool raised = false;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float mx = row_max[i];
#pragma unroll
    for (int n = 0; n < kSTiles; ++n) mx = fmaxf(mx, fmaxf(s[n][2 * i], s[n][2 * i + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    // A row with nothing visible yet keeps max −inf; exponentiate against 0 so that 2^(−inf)
    // is 0 rather than NaN.
    const float mb = mx == -INFINITY ? 0.0f : mx * c_log2;
    const bool up = mx != row_max[i];
    alpha[i] = up ? attention_detail::Exp2(row_max[i] * c_log2 - mb) : 1.0f;
    raised |= up;
    row_max[i] = mx;
    row_sum[i] *= alpha[i];
    neg_base[i] = -mb;
  }
  if (__any_sync(0xffffffffu, raised)) {
#pragma unroll
    for (int u = 0; u < kVTiles; ++u) {
      acc[u][0] *= alpha[0];
      acc[u][1] *= alpha[0];
      acc[u][2] *= alpha[1];
      acc[u][3] *= alpha[1];
    }
  }
#pragma unroll
  for (int n = 0; n < kSTiles; ++n) {
    float p[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      p[e] = attention_detail::Exp2(fmaf(s[n][e], c_log2, neg_base[e >> 1]));
      row_sum[e >> 1] += p[e];
    }
    p_frag[n / 2][(n & 1) * 2 + 0] = PackBf16(p[0], p[1]);
    p_frag[n / 2][(n & 1) * 2 + 1] = PackBf16(p[2], p[3]);
  }
}

// ---- The prefill kernels' shared skeleton (PagedMmaPrefillKernel, Fa2PrefillKernel; the
// wgmma kernel shares PrefillTileOf) ----

// PrefillTile: the query rows and keys one CTA serves. The grid is linear in x over (query
// tile, KV head, split), the longest query tiles (latest under the causal mask) first so the
// short ones fill the tail, and z over the sequences. Rows are query tokens × group (row =
// token · group + head in the group).
struct PrefillTile {
  int seq, split, kv_head, q_begin, ctx, group, rows, row0;
  int kv_begin, kv_end;  // the keys the tile's rows may see, within the CTA's split
};

// PrefillTileOf fills *tile for this CTA (kBM rows a query tile) and returns false when the
// tile starts past the sequence's rows (uniform over the CTA, which then exits; nothing after
// that test is computed). kWindow false: the kernel serves no sliding window (keys from 0).
template <int kBM, bool kWindow = true>
__device__ __forceinline__ bool PrefillTileOf(const Fa2Args& args, PrefillTile* tile) {
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
  const int row0 = m_tile * kBM;
  if (row0 >= rows) return false;
  const int row_last = min(row0 + kBM, rows) - 1;
  int kv_begin = 0;
  if constexpr (kWindow) {
    kv_begin = args.sliding_window > 0 ? max(0, ctx + row0 / group - args.sliding_window + 1) : 0;
  }
  int kv_end = ctx + row_last / group + 1;
  if (args.num_splits > 1) {
    kv_begin = max(kv_begin, split * args.partition_tokens);
    kv_end = min(kv_end, (split + 1) * args.partition_tokens);
  }
  *tile = PrefillTile{seq, split, kv_head, q_begin, ctx, group, rows, row0, kv_begin, kv_end};
  return true;
}

// CopyPrefillQ: the tile's kBM query rows into q_smem (row pitch Pitch<kD>()), zero-filled
// past the true head dim and the last row, by kThreads threads: 16-byte cp.async when
// args.q_vec (the caller commits them), else 32-bit loads.
template <int kBM, int kD, int kThreads>
__device__ __forceinline__ void CopyPrefillQ(const Fa2Args& args, const PrefillTile& tile,
                                             bf16* q_smem) {
  constexpr int kChunks = kD / 8;  // 16-byte chunks per Q row
  for (int c = threadIdx.x; c < kBM * kChunks; c += kThreads) {
    const int r = c / kChunks;
    const int col = (c % kChunks) * 8;
    const int row = tile.row0 + r;
    const bool live = row < tile.rows && col < args.head_dim;
    const bf16* src = args.q;
    if (live) {
      src += static_cast<int64_t>(tile.q_begin + row / tile.group) * args.q_token_stride +
             static_cast<int64_t>(tile.kv_head * tile.group + row % tile.group) * args.head_dim +
             col;
    }
    bf16* dst = q_smem + r * Pitch<kD>() + col;
    if (args.q_vec) {
      attention_detail::CpAsync16(dst, src, live ? 16 : 0);
    } else {
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        reinterpret_cast<uint32_t*>(dst)[w] =
            live ? __ldg(reinterpret_cast<const unsigned int*>(src) + w) : 0u;
      }
    }
  }
}

// PrefillInitRows: a warp's kMT m16 tiles before the first key tile: zero output, running max
// −inf (raw score units), zero partial sums.
template <int kMT, int kVTiles>
__device__ __forceinline__ void PrefillInitRows(float (&acc)[kMT][kVTiles][4],
                                                float (&row_max)[kMT][2],
                                                float (&row_sum)[kMT][2]) {
#pragma unroll
  for (int mi = 0; mi < kMT; ++mi) {
#pragma unroll
    for (int u = 0; u < kVTiles; ++u) {
      acc[mi][u][0] = acc[mi][u][1] = acc[mi][u][2] = acc[mi][u][3] = 0.0f;
    }
  }
#pragma unroll
  for (int mi = 0; mi < kMT; ++mi) {
    row_max[mi][0] = row_max[mi][1] = -INFINITY;
    row_sum[mi][0] = row_sum[mi][1] = 0.0f;
  }
}

// PrefillQk: the raw scores s = Q·Kᵀ of a warp's kMT m16 tiles over a key tile of kSTiles n8
// tiles, kKSteps k16 steps deep. q_lane / k_lane: this lane's ldmatrix addresses (shared-window
// bytes) of the warp's Q A fragments (rows lane%16, columns 8·(lane/16)) and of the tile's K B
// fragments, two n8 tiles an ldmatrix.x4 (keys lane%8 + 8·(lane/16), columns 8·(lane/8 % 2)),
// tile_off the tile's buffer (bytes from k_lane's); kPitch: bf16 per Q / K row in shared memory.
template <int kMT, int kSTiles, int kKSteps, int kPitch>
__device__ __forceinline__ void PrefillQk(float (&s)[kMT][kSTiles][4], uint32_t q_lane,
                                          uint32_t k_lane, uint32_t tile_off) {
  constexpr int kB = static_cast<int>(sizeof(bf16));
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
      LdMatrixX4At(qa[mi], q_lane + (mi * 16 * kPitch + ks * 16) * kB);
    }
#pragma unroll
    for (int np = 0; np < kSTiles / 2; ++np) {
      uint32_t kb[4];
      LdMatrixX4At(kb, k_lane + tile_off + (np * 16 * kPitch + ks * 16) * kB);
#pragma unroll
      for (int mi = 0; mi < kMT; ++mi) {
        Mma16816(s[mi][2 * np], qa[mi], kb[0], kb[1]);
        Mma16816(s[mi][2 * np + 1], qa[mi], kb[2], kb[3]);
      }
    }
  }
}

// PrefillPv: acc += P·V for a warp's kMT m16 tiles (P: PrefillSoftmaxStep's bf16 A fragments,
// kPSteps k16 steps of keys) over kVTiles n8 output tiles. v_lane: this lane's ldmatrix.trans
// address of the V rows (keys lane%16, columns 8·(lane/16)), tile_off the tile's buffer (bytes
// from v_lane's); kPitchV: bf16 per V row.
template <int kMT, int kPSteps, int kVTiles, int kPitchV>
__device__ __forceinline__ void PrefillPv(float (&acc)[kMT][kVTiles][4],
                                          const uint32_t (&p_frag)[kMT][kPSteps][4],
                                          uint32_t v_lane, uint32_t tile_off) {
  constexpr int kB = static_cast<int>(sizeof(bf16));
#pragma unroll
  for (int kk = 0; kk < kPSteps; ++kk) {
    const uint32_t vrow = v_lane + tile_off + kk * 16 * kPitchV * kB;
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

// ---- FlashAttention-2 style prefill kernel (paged_prefill_fa2.cu) ----
// Whether the FA2 kernel serves (head_dim, v_head_dim): both ≤ 128 and the larger > 32
// (padded to 64 or 128 columns). Others must use another prefill kernel.
inline bool Fa2Supports(int64_t head_dim, int64_t v_head_dim) {
  const int64_t m = head_dim > v_head_dim ? head_dim : v_head_dim;
  return m > 32 && m <= 128;
}

// Query rows (token · group + head) per CTA.
constexpr int kFa2RowsPerCta = 128;

// CTAs resident per SM at the padded dims of (head_dim, v_head_dim) (≥ 1; 1 on errors).
// Requires Fa2Supports.
int Fa2Occupancy(int64_t head_dim, int64_t v_head_dim);

// Launches the kernel over `grid` = (m tiles · KV heads · splits, 1, sequences), linear x with
// the longest query tiles first (as PagedMmaPrefillKernel). Requires Fa2Supports and
// args.scale_log2 > 0. `pdl`: launch as a programmatic dependent.
absl::Status LaunchFa2Prefill(const Fa2Args& args, dim3 grid, cudaStream_t stream, bool pdl);

}  // namespace sluice::kernels::paged_detail

#endif  // SLUICE_KERNELS_ATTENTION_PAGED_PREFILL_DEVICE_CUH_
