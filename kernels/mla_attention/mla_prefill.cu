// MLA attention kernels of prefill-shaped launches (mla_attention.cu plans them):
//
// MlaLatentMmaKernel<T> (tensor cores; DeepSeek dims: kv_lora_rank a multiple of 16 up to 512,
// row width a multiple of 16 up to kTcMaxWidth): one CTA takes T query tokens × 16 heads =
// M = 16·T rows of the absorbed query and loops over 64-row tiles of the latent cache,
// FlashAttention-2 style (Dao, "FlashAttention-2", 2023):
//   S = Q·Kᵀ over the full row width (mma.sync m16n8k16 bf16, fp32 accumulate; warp w owns
//       keys 8w..8w+7 of the tile for all M rows);
//   online softmax in fp32 (base 2), one warp per row, causal mask per query token;
//   O += P·V with V = the first kv_lora_rank columns of the same tile (warp w owns latent
//       channels 64w..64w+63 for all M rows; V fragments via ldmatrix.trans).
// T = 4 serves prefill chunks that MlaPrefillMmaKernel cannot (dims not multiples of 64, or a
// device without its ~227 KB of shared memory per CTA). Short work splits the keys across CTAs
// in 64-row partitions and merges the partials with SplitKvCombineKernel
// (attention_device.cuh; Flash-Decoding).
//
// MlaPrefillMmaKernel (prefill whenever dims and shared memory allow): the 4-token prefill CTA
// of MlaLatentMmaKernel with a 2-deep tile ring, swizzled shared memory and the scores kept in
// registers (see its comment).
//
// MlaLatentKernel (plain fp32 FMAs, any even rank ≤ 512 and width ≤ 1024, e.g. the tiny test
// fixtures; decode and prefill alike): one CTA per query token and head group; scores: warp w
// computes heads w and w + 8, lane j key j of the 32-key tile; values: thread t accumulates
// channels 2t, 2t+1.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/mla_attention/mla_attention_device.cuh"

namespace sluice::kernels::mla_detail {
namespace {

__global__ void __launch_bounds__(kThreads) MlaLatentKernel(const MlaArgs args) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int width = args.width;
  float* q_s = reinterpret_cast<float*>(smem_raw);      // [kHeads][width], scaled by scale·log2e
  float* p_s = q_s + kHeads * width;                    // [kHeads][kKeys] probabilities
  float* alpha_s = p_s + kHeads * kKeys;                // [kHeads] accumulator rescale
  float* max_s = alpha_s + kHeads;                      // [kHeads]
  float* sum_s = max_s + kHeads;                        // [kHeads]
  bf16* k_s = reinterpret_cast<bf16*>(sum_s + kHeads);  // [kKeys][TilePitch(width)]

  const int seq = blockIdx.z;
  const int qi = blockIdx.x / args.num_splits;
  const int split = blockIdx.x % args.num_splits;
  const int q_begin = args.query_start_loc[seq];
  const int q_len = args.query_start_loc[seq + 1] - q_begin;
  if (qi >= q_len) return;
  const int token = q_begin + qi;
  const int pos = args.context_lens[seq] + qi;
  const int2 kv = SplitRange<kKeys>(args, split, args.context_lens[seq] + q_len, pos + 1);
  const int kv_begin = kv.x, kv_end = kv.y;
  const int h0 = blockIdx.y * kHeads;
  const int heads = min(kHeads, args.num_heads - h0);
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;

  for (int i = threadIdx.x; i < kHeads * width; i += kThreads) {
    const int h = i / width;
    const int c = i - h * width;
    q_s[i] =
        h < heads
            ? __bfloat162float(
                  args.q[token * args.q_token_stride + static_cast<int64_t>(h0 + h) * width + c]) *
                  args.scale_log2
            : 0.0f;
  }
  // Per-warp softmax state of heads warp and warp + 8 (identical in all lanes).
  float run_max[2] = {-INFINITY, -INFINITY};
  float run_sum[2] = {0.0f, 0.0f};
  float acc[kHeads][2];
#pragma unroll
  for (int h = 0; h < kHeads; ++h) acc[h][0] = acc[h][1] = 0.0f;
  const int col = 2 * threadIdx.x;
  const int32_t* block_table = args.block_tables + seq * args.max_blocks_per_seq;

  for (int tile = kv_begin; tile < kv_end; tile += kKeys) {
    LoadLatentTile<kKeys, kThreads>(args, block_table, tile, kv_end, k_s);
    CpAsyncCommit();
    CpAsyncWait<0>();
    __syncthreads();  // also publishes q_s on the first tile

    // Scores of key `lane` for heads warp and warp + 8.
    const bf16* krow = k_s + lane * TilePitch(width);
    const float* q0 = q_s + warp * width;
    const float* q1 = q_s + (warp + 8) * width;
    float s0 = 0.0f, s1 = 0.0f;
    for (int c = 0; c < width; c += 8) {
      float k8[8];
      cuda_detail::LoadBf16x8(krow + c, k8);
      const float4 a0 = *reinterpret_cast<const float4*>(q0 + c);
      const float4 a1 = *reinterpret_cast<const float4*>(q0 + c + 4);
      const float4 b0 = *reinterpret_cast<const float4*>(q1 + c);
      const float4 b1 = *reinterpret_cast<const float4*>(q1 + c + 4);
      s0 += a0.x * k8[0] + a0.y * k8[1] + a0.z * k8[2] + a0.w * k8[3] + a1.x * k8[4] +
            a1.y * k8[5] + a1.z * k8[6] + a1.w * k8[7];
      s1 += b0.x * k8[0] + b0.y * k8[1] + b0.z * k8[2] + b0.w * k8[3] + b1.x * k8[4] +
            b1.y * k8[5] + b1.z * k8[6] + b1.w * k8[7];
    }
    const bool visible = tile + lane < kv_end;
    float sc[2] = {visible ? s0 : -INFINITY, visible ? s1 : -INFINITY};
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float m = sc[i];
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
      const float new_max = fmaxf(run_max[i], m);
      const float base = new_max == -INFINITY ? 0.0f : new_max;
      const float alpha = Exp2(run_max[i] - base);
      const float p = Exp2(sc[i] - base);
      run_sum[i] = run_sum[i] * alpha + cuda_detail::WarpSum(p);
      run_max[i] = new_max;
      const int h = warp + 8 * i;
      p_s[h * kKeys + lane] = p;
      if (lane == 0) alpha_s[h] = alpha;
    }
    __syncthreads();

    if (col < args.rank) {
#pragma unroll
      for (int h = 0; h < kHeads; ++h) {
        acc[h][0] *= alpha_s[h];
        acc[h][1] *= alpha_s[h];
      }
      const int keys = min(kKeys, kv_end - tile);
      for (int j = 0; j < keys; ++j) {
        const float2 c = __bfloat1622float2(
            *reinterpret_cast<const __nv_bfloat162*>(k_s + j * TilePitch(width) + col));
#pragma unroll
        for (int h = 0; h < kHeads; ++h) {
          const float p = p_s[h * kKeys + j];
          acc[h][0] += p * c.x;
          acc[h][1] += p * c.y;
        }
      }
    }
    __syncthreads();  // k_s, p_s and alpha_s are rewritten by the next tile
  }

  if (lane == 0) {
    max_s[warp] = run_max[0];
    max_s[warp + 8] = run_max[1];
    sum_s[warp] = run_sum[0];
    sum_s[warp + 8] = run_sum[1];
  }
  __syncthreads();
#pragma unroll
  for (int h = 0; h < kHeads; ++h) {
    if (h >= heads) break;  // unrolled so acc[h] stays in registers
    const float inv = sum_s[h] > 0.0f ? 1.0f / sum_s[h] : 0.0f;
    const int64_t row = static_cast<int64_t>(token) * args.num_heads + h0 + h;
    if (args.num_splits == 1) {
      if (col < args.rank) {
        *reinterpret_cast<__nv_bfloat162*>(args.out + row * args.rank + col) =
            __floats2bfloat162_rn(acc[h][0] * inv, acc[h][1] * inv);
      }
    } else {
      const int64_t part = static_cast<int64_t>(split) * args.num_tokens * args.num_heads + row;
      if (col < args.rank) {
        *reinterpret_cast<float2*>(args.partial_out + part * args.rank + col) =
            make_float2(acc[h][0] * inv, acc[h][1] * inv);
      }
      if (threadIdx.x == 0) args.partial_ml[part] = make_float2(max_s[h], sum_s[h]);
    }
  }
}

template <int T>
__global__ void __launch_bounds__(kTcThreads, 1) MlaLatentMmaKernel(const MlaArgs args) {
  constexpr int M = 16 * T;  // query rows r = i·16 + h (token i of the CTA, head h0 + h)
  static_assert(kHeads == 16, "one mma m-tile per token");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int width = args.width;
  const int pitch = TilePitch(width);
  bf16* q_s = reinterpret_cast<bf16*>(smem_raw);                 // [M][pitch]
  bf16* k_s = q_s + M * pitch;                                   // [kTcTile][pitch]
  float* s_s = reinterpret_cast<float*>(k_s + kTcTile * pitch);  // [M][kSPitch] log2 scores
  bf16* p_s = reinterpret_cast<bf16*>(s_s + M * kSPitch);        // [M][kPPitch]
  float* m_s = reinterpret_cast<float*>(p_s + M * kPPitch);      // [M] running max
  float* l_s = m_s + M;                                          // [M] running sum
  float* alpha_s = l_s + M;                                      // [M] this tile's rescale

  const int seq = blockIdx.z;
  // Longest causal rows first: the last query tiles of a prefill see the most keys.
  const int q_tiles = gridDim.x / args.num_splits;
  const int qi0 = (q_tiles - 1 - static_cast<int>(blockIdx.x) / args.num_splits) * T;
  const int split = blockIdx.x % args.num_splits;
  const int q_begin = args.query_start_loc[seq];
  const int q_len = args.query_start_loc[seq + 1] - q_begin;
  if (qi0 >= q_len) return;
  const int tokens = min(T, q_len - qi0);
  const int pos0 = args.context_lens[seq] + qi0;  // position of the CTA's first token
  const int2 kv = SplitRange<kTcTile>(args, split, args.context_lens[seq] + q_len, pos0 + tokens);
  const int kv_begin = kv.x, kv_end = kv.y;
  const int h0 = blockIdx.y * kHeads;
  const int heads = min(kHeads, args.num_heads - h0);
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;

  for (int idx = threadIdx.x; idx < M * width; idx += kTcThreads) {
    const int r = idx / width;
    const int c = idx - r * width;
    const int i = r / kHeads, h = r % kHeads;
    bf16 v = __float2bfloat16_rn(0.0f);
    if (i < tokens && h < heads) {
      v = args.q[static_cast<int64_t>(q_begin + qi0 + i) * args.q_token_stride +
                 static_cast<int64_t>(h0 + h) * width + c];
    }
    q_s[r * pitch + c] = v;
  }
  for (int r = threadIdx.x; r < M; r += kTcThreads) {
    m_s[r] = -INFINITY;
    l_s[r] = 0.0f;
  }
  float acc[T][8][4];
#pragma unroll
  for (int t = 0; t < T; ++t) {
#pragma unroll
    for (int n = 0; n < 8; ++n) acc[t][n][0] = acc[t][n][1] = acc[t][n][2] = acc[t][n][3] = 0.0f;
  }
  const int col0 = warp * 64;  // this warp's latent channels [col0, col0 + 64)
  const int32_t* block_table = args.block_tables + seq * args.max_blocks_per_seq;

  for (int tile = kv_begin; tile < kv_end; tile += kTcTile) {
    LoadLatentTile<kTcTile, kTcThreads>(args, block_table, tile, kv_end, k_s);
    CpAsyncCommit();
    CpAsyncWait<0>();
    __syncthreads();  // also publishes q_s, m_s, l_s on the first tile

    {  // S = Q·Kᵀ: warp w, keys 8w..8w+7 of the tile, all M rows.
      float c[T][4];
#pragma unroll
      for (int t = 0; t < T; ++t) c[t][0] = c[t][1] = c[t][2] = c[t][3] = 0.0f;
      const bf16* kb = k_s + (warp * 8 + lane / 4) * pitch + 2 * (lane % 4);
      for (int k = 0; k < width; k += 16) {
        const uint32_t b0 = Ld32(kb + k), b1 = Ld32(kb + k + 8);
#pragma unroll
        for (int t = 0; t < T; ++t) {
          uint32_t a[4];
          LoadA(a, q_s + t * 16 * pitch + k, pitch, lane);
          Mma(c[t], a, b0, b1);
        }
      }
#pragma unroll
      for (int t = 0; t < T; ++t) {
        float* s0 = s_s + (t * 16 + lane / 4) * kSPitch + warp * 8 + 2 * (lane % 4);
        *reinterpret_cast<float2*>(s0) =
            make_float2(c[t][0] * args.scale_log2, c[t][1] * args.scale_log2);
        *reinterpret_cast<float2*>(s0 + 8 * kSPitch) =
            make_float2(c[t][2] * args.scale_log2, c[t][3] * args.scale_log2);
      }
    }
    __syncthreads();

    // Online softmax, one warp per row; lane handles keys lane and lane + 32 of the tile.
    for (int r = warp; r < M; r += kTcThreads / 32) {
      const int i = r / kHeads, h = r % kHeads;
      // Keys tile + jj with jj < visible are causal for this row and inside the partition.
      const int visible = i < tokens && h < heads ? min(kv_end, pos0 + i + 1) - tile : 0;
      const float x0 = lane < visible ? s_s[r * kSPitch + lane] : -INFINITY;
      const float x1 = lane + 32 < visible ? s_s[r * kSPitch + lane + 32] : -INFINITY;
      float mx = fmaxf(x0, x1);
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
      const float old_max = m_s[r];
      const float new_max = fmaxf(old_max, mx);
      const float base = new_max == -INFINITY ? 0.0f : new_max;
      const bf16 p0 = __float2bfloat16_rn(Exp2(x0 - base));
      const bf16 p1 = __float2bfloat16_rn(Exp2(x1 - base));
      p_s[r * kPPitch + lane] = p0;
      p_s[r * kPPitch + lane + 32] = p1;
      // The sum uses the rounded weights P·V multiplies, so the normalization matches.
      const float sum = cuda_detail::WarpSum(__bfloat162float(p0) + __bfloat162float(p1));
      if (lane == 0) {
        const float alpha = Exp2(old_max - base);
        alpha_s[r] = alpha;
        l_s[r] = l_s[r] * alpha + sum;
        m_s[r] = new_max;
      }
    }
    __syncthreads();

    if (col0 < args.rank) {  // O = O·alpha + P·V over this warp's 64 channels
      RescalePv<T, kTcTile, kPPitch>(acc, alpha_s, p_s, k_s, pitch, col0, args.rank, lane);
    }
    __syncthreads();  // k_s, s_s, p_s and alpha_s are rewritten by the next tile
  }
  __syncthreads();  // m_s, l_s when no tile ran
  StoreRows<T>(args, acc, m_s, l_s, tokens, heads, q_begin + qi0, h0, split, warp, lane);
}

// ---- Prefill kernel 1 (MlaPrefillMmaKernel) ----
// The same CTA shape as MlaLatentMmaKernel<4> (M = 64 rows: 4 query tokens × 16 heads, 64-key
// latent tiles, the same split plan), restructured so the tensor cores are fed from registers:
//   * the key tiles stream through a 2-deep cp.async ring: tile i + 1 is copied while tile i is
//     used (the 4-token kernel waits for every tile's copy before computing);
//   * Q and the tiles are stored unpadded with an XOR swizzle (16-byte chunk c of row r at
//     chunk c ^ (r % 8) of its group of 8), so every ldmatrix phase (8 rows × one chunk) and
//     every cp.async row hits distinct banks, and Q + two 64-key tiles fit in 227 KB;
//   * S = Q·Kᵀ: warp w takes rows 16(w % 4)..+15 (token w % 4) × keys 32(w / 4)..+31 of the
//     tile, A and B fragments by ldmatrix.x4: 3 ldmatrix per 4 mma (the 4-token kernel: 4
//     ldmatrix + 2 scalar loads per 4 mma), scores stay in registers;
//   * softmax on the score fragments (base 2, scale folded into one multiply, causal mask by
//     comparison — only the last tile of a CTA has masked keys); the two warps sharing a row
//     exchange row maxima through shared memory and each keeps its own partial row sum (the
//     same running max in both, so the partials add up at the end in a fixed order);
//   * O += P·V as in MlaLatentMmaKernel: warp w latent channels 64w..64w+63 for all 64 rows,
//     P (bf16) through shared memory, V fragments by ldmatrix.trans.
// Three barriers a tile. Needs kv_lora_rank and the row width multiples of 64 (whole swizzle
// groups, whole 64-channel warps) and ~227 KB of shared memory (sm_90; not sm_80's 163 KB).
// Element offset of 16-byte chunk `chunk` of row `row` in a swizzled [rows][width] array.
__device__ __forceinline__ int SwzOffset(int row, int chunk, int width) {
  return row * width + ((chunk ^ (row & 7)) << 3);
}

// Four 8×8 bf16 matrices, not transposed; lane l addresses row l%8 of matrix l/8.
__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SmemAddr(p))
               : "memory");
}

__global__ void __launch_bounds__(kTcThreads, 1) MlaPrefillMmaKernel(const MlaArgs args) {
  static_assert(kHeads == 16 && kPfRows == 64 && kTcThreads == 256, "4 row groups × 2 key halves");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int width = args.width;
  const int chunks = width / 8;
  bf16* q_s = reinterpret_cast<bf16*>(smem_raw);                        // [64][width] swizzled
  bf16* ring = q_s + kPfRows * width;                                   // [2][64][width] swizzled
  bf16* p_s = ring + 2 * kPfTile * width;                               // [64][kPfPPitch]
  float* red_s = reinterpret_cast<float*>(p_s + kPfRows * kPfPPitch);  // [2][64] per key half
  float* alpha_s = red_s + 2 * kPfRows;                                 // [64] this tile's rescale
  float* m_s = alpha_s + kPfRows;                                       // [64] final max
  float* l_s = m_s + kPfRows;                                           // [64] final sum

  const int seq = blockIdx.z;
  // Longest causal rows first, as in MlaLatentMmaKernel.
  const int q_tiles = gridDim.x / args.num_splits;
  const int qi0 = (q_tiles - 1 - static_cast<int>(blockIdx.x) / args.num_splits) * kPfTokens;
  const int split = blockIdx.x % args.num_splits;
  const int q_begin = args.query_start_loc[seq];
  const int q_len = args.query_start_loc[seq + 1] - q_begin;
  if (qi0 >= q_len) return;
  const int tokens = min(kPfTokens, q_len - qi0);
  const int pos0 = args.context_lens[seq] + qi0;
  const int2 kv =
      SplitRange<kPfTile>(args, split, args.context_lens[seq] + q_len, pos0 + tokens);
  const int kv_begin = kv.x, kv_end = kv.y;
  const int h0 = blockIdx.y * kHeads;
  const int heads = min(kHeads, args.num_heads - h0);
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int32_t* block_table = args.block_tables + seq * args.max_blocks_per_seq;

  // Q rows (zeros past `tokens` or `heads`): the oldest copy group, so the first wait covers it.
  const bf16* q_base = args.q + static_cast<int64_t>(q_begin + qi0) * args.q_token_stride +
                       static_cast<int64_t>(h0) * width;
  for (int c = threadIdx.x; c < kPfRows * chunks; c += kTcThreads) {
    const int r = c / chunks, ch = c - r * chunks;
    const int t = r / kHeads, h = r % kHeads;
    const bool live = t < tokens && h < heads;
    const bf16* src = live ? q_base + t * args.q_token_stride + h * width + ch * 8 : args.q;
    bf16* dst = q_s + SwzOffset(r, ch, width);
    if (args.q_vec) {
      CpAsync16(dst, src, live ? 16 : 0);
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) dst[e] = live ? src[e] : __float2bfloat16_rn(0.0f);
    }
  }
  CpAsyncCommit();

  // Tile i → ring buffer i % 2 as one copy group; warp w copies rows 8w..8w+7.
  constexpr int kR = kPfTile / (kTcThreads / 32);
  const int ntiles = kv_end > kv_begin ? (kv_end - kv_begin + kPfTile - 1) / kPfTile : 0;
  auto load = [&](int i) {
    bf16* dst = ring + (i & 1) * kPfTile * width;
    int64_t slot[kR];
    LookupRows<kR>(args, block_table, kv_begin + i * kPfTile + warp * kR, kv_end, slot);
#pragma unroll
    for (int r = 0; r < kR; ++r) {
      const int row = warp * kR + r;
      const bool live = slot[r] >= 0;
      const bf16* src = args.cache + (live ? slot[r] * width : 0);
      for (int ch = lane; ch < chunks; ch += 32) {
        CpAsync16(dst + SwzOffset(row, ch, width), src + ch * 8, live ? 16 : 0);
      }
    }
    CpAsyncCommit();
  };
  if (ntiles > 0) load(0);

  const int mi = warp % 4;  // S: token mi of the CTA (rows 16mi..16mi+15)
  const int ni = warp / 4;  // S: keys 32ni..32ni+31 of the tile
  const int g = lane / 4, q4 = lane % 4;
  // This thread's S rows: 16mi + g (head h0 + g) and 16mi + g + 8 (head h0 + g + 8).
  const bool live0 = mi < tokens && g < heads, live1 = mi < tokens && g + 8 < heads;
  const int causal_end = min(kv_end, pos0 + mi + 1);  // keys < this are visible to token mi
  float m_run[2] = {-INFINITY, -INFINITY};
  float l_run[2] = {0.0f, 0.0f};  // over this warp's key half only
  float acc[kPfTokens][8][4];
#pragma unroll
  for (int t = 0; t < kPfTokens; ++t) {
#pragma unroll
    for (int n = 0; n < 8; ++n) acc[t][n][0] = acc[t][n][1] = acc[t][n][2] = acc[t][n][3] = 0.0f;
  }
  const int col0 = warp * 64;  // P·V: latent channels [col0, col0 + 64)
  // Per-lane ldmatrix rows; all of them ≡ lane (mod 8), so the swizzle term is lane & 7.
  const int sw = lane & 7;
  const bf16* a_row = q_s + (mi * 16 + lane % 16) * width;  // A: row lane%16, chunk + lane/16
  const int a_ch = lane / 16;
  const int b_key = ni * 32 + lane % 8 + (lane / 16) * 8;  // B: keys, chunk + (lane/8)%2
  const int b_ch = (lane / 8) & 1;
  const int v_key = lane % 8 + ((lane / 8) & 1) * 8;  // V (trans): keys, channel chunk + lane/16

  for (int it = 0; it < ntiles; ++it) {
    CpAsyncWait<0>();
    __syncthreads();  // tile `it` (and Q) visible; buffer (it + 1) % 2, p_s, alpha_s free
    if (it + 1 < ntiles) load(it + 1);
    const bf16* k_s = ring + (it & 1) * kPfTile * width;
    const int tile = kv_begin + it * kPfTile;

    float s[4][4];  // n-tile j: keys 32ni + 8j + 2q4 (+1); [0..1] row g, [2..3] row g + 8
#pragma unroll
    for (int j = 0; j < 4; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
    {
      const bf16* b0_row = k_s + b_key * width;
      const bf16* b1_row = b0_row + 16 * width;
#pragma unroll 2
      for (int kc = 0; kc < chunks; kc += 2) {  // 16 channels per step
        uint32_t a[4], b0[4], b1[4];
        LdMatrixX4(a, a_row + (((kc + a_ch) ^ sw) << 3));
        LdMatrixX4(b0, b0_row + (((kc + b_ch) ^ sw) << 3));
        LdMatrixX4(b1, b1_row + (((kc + b_ch) ^ sw) << 3));
        Mma(s[0], a, b0[0], b0[1]);
        Mma(s[1], a, b0[2], b0[3]);
        Mma(s[2], a, b1[0], b1[1]);
        Mma(s[3], a, b1[2], b1[3]);
      }
    }

    // Scale to log2 units and mask: keys at or past causal_end (and rows of absent tokens or
    // heads) are −inf; the zero-filled rows past kv_end read as finite scores first.
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = tile + ni * 32 + j * 8 + 2 * q4 + (e & 1);
        const bool live = (e < 2 ? live0 : live1) && key < causal_end;
        s[j][e] = live ? s[j][e] * args.scale_log2 : -INFINITY;
        mx[e / 2] = fmaxf(mx[e / 2], s[j][e]);
      }
    }
#pragma unroll
    for (int hi = 0; hi < 2; ++hi) {
      mx[hi] = fmaxf(mx[hi], __shfl_xor_sync(0xffffffffu, mx[hi], 1));
      mx[hi] = fmaxf(mx[hi], __shfl_xor_sync(0xffffffffu, mx[hi], 2));
      if (q4 == 0) red_s[ni * kPfRows + mi * 16 + g + 8 * hi] = mx[hi];
    }
    __syncthreads();  // both key halves' row maxima

#pragma unroll
    for (int hi = 0; hi < 2; ++hi) {
      const int r = mi * 16 + g + 8 * hi;
      const float new_max = fmaxf(m_run[hi], fmaxf(red_s[r], red_s[kPfRows + r]));
      const float base = new_max == -INFINITY ? 0.0f : new_max;
      const float alpha = Exp2(m_run[hi] - base);
      m_run[hi] = new_max;
      float sum = 0.0f;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const __nv_bfloat162 p =
            __floats2bfloat162_rn(Exp2(s[j][2 * hi] - base), Exp2(s[j][2 * hi + 1] - base));
        *reinterpret_cast<__nv_bfloat162*>(p_s + r * kPfPPitch + ni * 32 + j * 8 + 2 * q4) = p;
        // The sum uses the rounded weights P·V multiplies, so the normalization matches.
        sum += __low2float(p) + __high2float(p);
      }
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      l_run[hi] = l_run[hi] * alpha + sum;
      if (ni == 0 && q4 == 0) alpha_s[r] = alpha;
    }
    __syncthreads();  // p_s, alpha_s

    if (col0 < args.rank) {  // O = O·alpha + P·V over this warp's 64 channels
      RescaleRows<kPfTokens>(acc, alpha_s, lane);
#pragma unroll
      for (int ks = 0; ks < kPfTile; ks += 16) {
        uint32_t a[kPfTokens][4];
#pragma unroll
        for (int t = 0; t < kPfTokens; ++t) {
          LoadA(a[t], p_s + t * 16 * kPfPPitch + ks, kPfPPitch, lane);
        }
        const bf16* v = k_s + (ks + v_key) * width;
#pragma unroll
        for (int np = 0; np < 4; ++np) {
          uint32_t b[4];
          LdMatrixX4Trans(b, v + ((((col0 + np * 16) / 8 + lane / 16) ^ sw) << 3));
#pragma unroll
          for (int t = 0; t < kPfTokens; ++t) {
            Mma(acc[t][2 * np], a[t], b[0], b[1]);
            Mma(acc[t][2 * np + 1], a[t], b[2], b[3]);
          }
        }
      }
    }
  }
  CpAsyncWait<0>();  // no copy may land after the CTA exits (Q when no tile ran)
  // Every read of red_s precedes the last tile's second barrier, so it can take the sums now.
#pragma unroll
  for (int hi = 0; hi < 2; ++hi) {
    if (q4 == 0) red_s[ni * kPfRows + mi * 16 + g + 8 * hi] = l_run[hi];
  }
  __syncthreads();
  if (ni == 0 && q4 == 0) {
#pragma unroll
    for (int hi = 0; hi < 2; ++hi) {
      const int r = mi * 16 + g + 8 * hi;
      m_s[r] = m_run[hi];
      l_s[r] = red_s[r] + red_s[kPfRows + r];
    }
  }
  __syncthreads();
  StoreRows<kPfTokens>(args, acc, m_s, l_s, tokens, heads, q_begin + qi0, h0, split, warp, lane);
}

}  // namespace

absl::Status LaunchMlaFp32(const MlaArgs& args, dim3 grid, cudaStream_t stream) {
  const size_t smem = SmemBytes(args.width);
  if (smem > 48 * 1024) {
    SLUICE_CUDA_RETURN_IF_ERROR(
        cudaFuncSetAttribute(&MlaLatentKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(SmemBytes(kMaxWidth))),
        "MlaLatentAttentionCuda: cudaFuncSetAttribute");
  }
  MlaLatentKernel<<<grid, kThreads, smem, stream>>>(args);
  return absl::OkStatus();
}

absl::Status LaunchMlaPrefillTc(const MlaArgs& args, dim3 grid, bool pipelined,
                                cudaStream_t stream) {
  if (pipelined) {
    const size_t smem = PrefillSmemBytes(args.width);
    SLUICE_CUDA_RETURN_IF_ERROR(
        cudaFuncSetAttribute(&MlaPrefillMmaKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(smem)),
        "MlaLatentAttentionCuda: cudaFuncSetAttribute");
    MlaPrefillMmaKernel<<<grid, kTcThreads, smem, stream>>>(args);
    return absl::OkStatus();
  }
  const size_t smem = TcSmemBytes(kTcPrefillTokens, args.width);
  SLUICE_CUDA_RETURN_IF_ERROR(
      cudaFuncSetAttribute(&MlaLatentMmaKernel<kTcPrefillTokens>,
                           cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)),
      "MlaLatentAttentionCuda: cudaFuncSetAttribute");
  MlaLatentMmaKernel<kTcPrefillTokens><<<grid, kTcThreads, smem, stream>>>(args);
  return absl::OkStatus();
}

}  // namespace sluice::kernels::mla_detail
