// CUDA MLA attention core over the paged latent cache (mla_attention_cuda.h).
//
// Four kernels; all serve a group of up to kHeads heads per CTA, so every head of the group
// reuses each latent row the CTA loads (all heads attend over the same rows).
//
// MlaDecodeKernel (decode: one query token per sequence, tensor-core dims): the 16 heads of a
// token are the mma M dimension and the latent rows of the CTA's key partition stream through
// a cp.async ring of 32-row tiles (see its comment); the split plan sizes partitions so the
// CTAs fill the SMs (batch 1: one tile per CTA).
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
// T = 4 serves prefill chunks, T = 1 decode when SetMlaLatentAttentionDecodeKernel(1). Short work
// (decode at small batch) splits the keys across CTAs in 64-row partitions and merges the
// partials with SplitKvCombineKernel (attention_device.cuh; Flash-Decoding).
//
// MlaPrefillMmaKernel (SetMlaPrefillKernel(1)): the 4-token prefill CTA of MlaLatentMmaKernel
// with a 2-deep tile ring, swizzled shared memory and the scores kept in registers (see its
// comment).
//
// MlaLatentKernel (plain fp32 FMAs, any even rank ≤ 512 and width ≤ 1024, e.g. the tiny test
// fixtures): one CTA per query token and head group; scores: warp w computes heads w and
// w + 8, lane j key j of the 32-key tile; values: thread t accumulates channels 2t, 2t+1.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/attention/attention_device.cuh"
#include "kernels/mla_attention/mla_attention_cuda.h"

namespace sluice::kernels {
namespace {

using attention_detail::CpAsync16;
using attention_detail::CpAsyncCommit;
using attention_detail::CpAsyncWait;
using attention_detail::Exp2;
using attention_detail::SmemAddr;

constexpr int kHeads = 16;     // heads per CTA
constexpr int kThreads = 256;  // 8 warps; thread t owns latent channels 2t, 2t+1
constexpr int kKeys = 32;      // keys per tile (one per lane)
constexpr int kMaxRank = 2 * kThreads;
constexpr int kMaxWidth = 1024;
constexpr int kMinPartition = 256;
constexpr float kLog2e = 1.4426950408889634f;

struct MlaArgs {
  const bf16* q;
  int64_t q_token_stride;
  const bf16* cache;
  const int32_t* query_start_loc;
  const int32_t* context_lens;
  const int32_t* block_tables;
  int64_t max_blocks_per_seq;
  int block_size;
  int num_heads;
  int rank;   // kv_lora_rank
  int width;  // rank + qk_rope_head_dim
  float scale_log2;
  int num_splits;
  int partition_tokens;
  int num_tokens;
  bool q_vec;  // q and q_token_stride allow 16-byte copies
  bf16* out;
  float* partial_out;
  float2* partial_ml;
  // MlaL2Prefetch's spans (MlaDecodeKernel only; bytes 0: none).
  const char* pf_ptr[2];
  uint32_t pf_bytes[2];
  // MlaDecodeKernel: LaunchDependents right after the wait (else at exit: kMlaPdlAttnLateTrigger).
  bool trigger;
  bool early_kv;  // MlaDecodeKernel: SetMlaDecodeEarlyKv
};

// Chunk of one L2 prefetch instruction (bytes, a multiple of 16).
constexpr uint32_t kL2PrefetchChunk = 16 * 1024;

// The grid's CTAs ask L2 for the spans ptr[r], bytes[r] (r < 2; bytes 0: none), chunk c by
// thread c / ctas of CTA c % ctas (cp.async.bulk.prefetch.L2: no registers held, nothing to
// wait for). Weights only: may run before the dependency wait.
__device__ __forceinline__ void PrefetchSpansL2(const char* const (&ptr)[2],
                                                const uint32_t (&span_bytes)[2]) {
  const uint32_t ctas = gridDim.x * gridDim.y * gridDim.z;
  const uint32_t cta = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const uint32_t bytes = span_bytes[r] & ~15u;
    const uint32_t chunks = (bytes + kL2PrefetchChunk - 1) / kL2PrefetchChunk;
    for (uint32_t c = cta + ctas * threadIdx.x; c < chunks; c += ctas * blockDim.x) {
      const uint32_t off = c * kL2PrefetchChunk;
      cuda_detail::PrefetchL2(ptr[r] + off, min(kL2PrefetchChunk, bytes - off));
    }
  }
}

// Row pitch of the key tile in shared memory: +8 bf16 (16 bytes) shifts consecutive rows by
// 4 banks, so the 8 lanes of each quarter-warp phase of a 16-byte load hit distinct banks.
__host__ __device__ constexpr int TilePitch(int width) { return width + 8; }

// Keys [x, y) of partition `split` among keys [0, causal_end) (all of them without a split).
// Partitions follow the sequence's own length (seq_len keys, whole kTile tiles each), not the
// host bound the split count was planned for: a CUDA graph captured for max_model_len still
// spreads a short context over all its splits. They never exceed partition_tokens (the
// planned size for max_seq_len), and num_splits of them cover seq_len.
template <int kTile>
__device__ __forceinline__ int2 SplitRange(const MlaArgs& args, int split, int seq_len,
                                           int causal_end) {
  if (args.num_splits == 1) return make_int2(0, causal_end);
  int part = (seq_len + args.num_splits - 1) / args.num_splits;
  part = min((part + kTile - 1) / kTile * kTile, args.partition_tokens);
  const int begin = split * part;
  return make_int2(begin, min(causal_end, begin + part));
}

// Tiles are copied warp by warp: warp w copies rows [w·kR, (w + 1)·kR) of the tile, whose
// cache slots every lane looks up first (kR independent, broadcast block-table loads), so the
// 16-byte copies never wait on a block-table load one by one. LookupRows: slot[r] of row
// row0 + r, −1 at or past kv_end.
template <int kR>
__device__ __forceinline__ void LookupRows(const MlaArgs& args, const int32_t* block_table,
                                           int row0, int kv_end, int64_t (&slot)[kR]) {
#pragma unroll
  for (int r = 0; r < kR; ++r) {
    const int j = row0 + r;
    slot[r] = j < kv_end ? static_cast<int64_t>(__ldg(block_table + j / args.block_size)) *
                                   args.block_size +
                               j % args.block_size
                         : -1;
  }
}

// CopyRows: cp.async copies of the kR rows `slot` into dst ([kR][TilePitch(width)]); rows with
// slot −1 read as zeros (src size 0), so padded keys are finite; rows with slot kSkipRow are
// left alone (the caller fills them). The caller commits and waits.
constexpr int64_t kSkipRow = -2;
template <int kR>
__device__ __forceinline__ void CopyRows(const MlaArgs& args, const int64_t (&slot)[kR], bf16* dst,
                                         int lane) {
  const int width = args.width;
#pragma unroll
  for (int r = 0; r < kR; ++r) {
    if (slot[r] == kSkipRow) continue;
    const bool live = slot[r] >= 0;
    const bf16* src = args.cache + (live ? slot[r] * width : 0);
    for (int off = lane * 8; off < width; off += 256) {
      CpAsync16(dst + r * TilePitch(width) + off, src + off, live ? 16 : 0);
    }
  }
}

// Issues the copies of cached rows tile .. tile+kRows-1 of a sequence into k_s
// ([kRows][TilePitch(width)]), rows at or past kv_end as zeros.
template <int kRows, int kThreadsPerCta>
__device__ __forceinline__ void LoadLatentTile(const MlaArgs& args, const int32_t* block_table,
                                               int tile, int kv_end, bf16* k_s) {
  constexpr int kR = kRows / (kThreadsPerCta / 32);
  static_assert(kR * (kThreadsPerCta / 32) == kRows, "whole rows per warp");
  const int warp = threadIdx.x / 32;
  int64_t slot[kR];
  LookupRows<kR>(args, block_table, tile + warp * kR, kv_end, slot);
  CopyRows<kR>(args, slot, k_s + warp * kR * TilePitch(args.width), threadIdx.x % 32);
}

size_t SmemBytes(int width) {
  return sizeof(float) * (static_cast<size_t>(kHeads) * width + kHeads * kKeys + 3 * kHeads) +
         sizeof(bf16) * static_cast<size_t>(kKeys) * TilePitch(width);
}

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

// ---- Tensor-core kernel (MlaLatentMmaKernel) ----
constexpr int kTcThreads = 256;   // 8 warps
constexpr int kTcTile = 64;       // latent rows per tile: 8 warps × 8 keys of an mma n-tile
constexpr int kTcMaxRank = 512;   // 8 warps × 64 latent channels
constexpr int kTcMaxWidth = 768;  // keeps T = 4 within 227 KB of shared memory
constexpr int kTcPrefillTokens = 4;
constexpr int kSPitch = kTcTile + 4;  // fp32 scores: +4 words keeps the float2 stores spread
constexpr int kPPitch = kTcTile + 8;  // bf16 probabilities: +16 bytes, conflict-free A loads

bool UseTensorCores(const MlaDims& d) {
  const int64_t width = d.LatentWidth();
  return d.kv_lora_rank % 16 == 0 && d.kv_lora_rank <= kTcMaxRank && width % 16 == 0 &&
         width <= kTcMaxWidth;
}

size_t TcSmemBytes(int tokens, int width) {
  const size_t rows = 16 * static_cast<size_t>(tokens);
  return sizeof(bf16) * (rows + kTcTile) * TilePitch(width) + sizeof(float) * rows * kSPitch +
         sizeof(bf16) * rows * kPPitch + sizeof(float) * 3 * rows;
}

__device__ __forceinline__ uint32_t Ld32(const bf16* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

// d += a·b for one m16n8k16 tile (PTX ISA, "Matrix Fragments for mma.m16n8k16": with
// g = lane/4, q = lane%4, a holds A(g, 2q..2q+1), A(g+8, ..), A(g, 2q+8..), A(g+8, 2q+8..);
// b holds B(2q..2q+1, g), B(2q+8..2q+9, g); d holds D(g, 2q..2q+1), D(g+8, 2q..2q+1)).
__device__ __forceinline__ void Mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// A fragment of rows [0, 16) × columns [0, 16) from `base` (row-major bf16 shared array, pitch
// elements, 16-byte aligned rows): ldmatrix.x4 matrices 0..3 = (rows 0-7, cols 0-7),
// (rows 8-15, cols 0-7), (rows 0-7, cols 8-15), (rows 8-15, cols 8-15) land in a[0..3] as the
// mma A layout wants; lane l addresses row l%16 at column 8·(l/16).
__device__ __forceinline__ void LoadA(uint32_t (&a)[4], const bf16* base, int pitch, int lane) {
  const bf16* p = base + (lane % 16) * pitch + (lane / 16) * 8;
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3])
               : "r"(SmemAddr(p))
               : "memory");
}

// Four transposed 8×8 bf16 matrices; lane l addresses row l%8 of matrix l/8.
__device__ __forceinline__ void LdMatrixX4Trans(uint32_t (&r)[4], const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SmemAddr(p))
               : "memory");
}

// Epilogue shared by the tensor-core kernels: warp w holds latent channels [64w, 64w + 64) of
// the M = 16·T rows (row t·16 + h: token t of the CTA, head h0 + h) as mma C fragments; divide
// by the row sums and write bf16 `out`, or, with a split, the fp32 partial and (max, sum).
template <int T>
__device__ __forceinline__ void StoreRows(const MlaArgs& args, const float (&acc)[T][8][4],
                                          const float* m_s, const float* l_s, int tokens, int heads,
                                          int token0, int h0, int split, int warp, int lane) {
  const int col0 = warp * 64;
  if (col0 >= args.rank) return;
#pragma unroll
  for (int t = 0; t < T; ++t) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int h = lane / 4 + 8 * half;
      if (t >= tokens || h >= heads) continue;
      const int r = t * 16 + h;
      const float l = l_s[r];
      const float inv = l > 0.0f ? 1.0f / l : 0.0f;
      const int64_t row = static_cast<int64_t>(token0 + t) * args.num_heads + h0 + h;
      const int64_t part = static_cast<int64_t>(split) * args.num_tokens * args.num_heads + row;
#pragma unroll
      for (int n = 0; n < 8; ++n) {
        const int col = col0 + n * 8 + 2 * (lane % 4);
        if (col >= args.rank) continue;
        const float o0 = acc[t][n][2 * half] * inv, o1 = acc[t][n][2 * half + 1] * inv;
        if (args.num_splits == 1) {
          *reinterpret_cast<__nv_bfloat162*>(args.out + row * args.rank + col) =
              __floats2bfloat162_rn(o0, o1);
        } else {
          *reinterpret_cast<float2*>(args.partial_out + part * args.rank + col) =
              make_float2(o0, o1);
        }
      }
      if (args.num_splits > 1 && warp == 0 && lane % 4 == 0) {
        args.partial_ml[part] = make_float2(m_s[r], l);
      }
    }
  }
}

// Online-softmax rescale of the O fragments of rows t·16 + h (mma C layout: lane holds rows
// lane/4 and lane/4 + 8 of each 16-row m-tile) by this tile's alpha_s[row].
template <int T>
__device__ __forceinline__ void RescaleRows(float (&acc)[T][8][4], const float* alpha_s,
                                            int lane) {
#pragma unroll
  for (int t = 0; t < T; ++t) {
    const float lo = alpha_s[t * 16 + lane / 4], hi = alpha_s[t * 16 + lane / 4 + 8];
#pragma unroll
    for (int n = 0; n < 8; ++n) {
      acc[t][n][0] *= lo;
      acc[t][n][1] *= lo;
      acc[t][n][2] *= hi;
      acc[t][n][3] *= hi;
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
      RescaleRows<T>(acc, alpha_s, lane);
#pragma unroll
      for (int ks = 0; ks < kTcTile; ks += 16) {
        uint32_t a[T][4];
#pragma unroll
        for (int t = 0; t < T; ++t) LoadA(a[t], p_s + t * 16 * kPPitch + ks, kPPitch, lane);
        // Matrices 0/1: keys ks..ks+7 / ks+8..ks+15 at channels n..n+7; 2/3: channels n+8..
        const bf16* v =
            k_s + (ks + (lane & 7) + ((lane >> 3) & 1) * 8) * pitch + col0 + (lane >> 4) * 8;
#pragma unroll
        for (int np = 0; np < 4; ++np) {
          if (col0 + np * 16 < args.rank) {
            uint32_t b[4];
            LdMatrixX4Trans(b, v + np * 16);
#pragma unroll
            for (int t = 0; t < T; ++t) {
              Mma(acc[t][2 * np], a[t], b[0], b[1]);
              Mma(acc[t][2 * np + 1], a[t], b[2], b[3]);
            }
          }
        }
      }
    }
    __syncthreads();  // k_s, s_s, p_s and alpha_s are rewritten by the next tile
  }
  __syncthreads();  // m_s, l_s when no tile ran
  StoreRows<T>(args, acc, m_s, l_s, tokens, heads, q_begin + qi0, h0, split, warp, lane);
}

// ---- Prefill kernel 1 (MlaPrefillMmaKernel; SetMlaPrefillKernel(1)) ----
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
constexpr int kPfTokens = kTcPrefillTokens;  // query tokens per CTA
constexpr int kPfRows = 16 * kPfTokens;      // M: row r = token r / 16, head h0 + r % 16
constexpr int kPfTile = kTcTile;             // keys per tile (the split plan's granule)
constexpr int kPfPPitch = kPfTile + 8;       // bf16 probabilities: conflict-free ldmatrix rows

size_t PrefillSmemBytes(int width) {
  return sizeof(bf16) * ((kPfRows + 2 * static_cast<size_t>(kPfTile)) * width +
                         static_cast<size_t>(kPfRows) * kPfPPitch) +
         sizeof(float) * 5 * kPfRows;
}

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

// ---- Pipelined decode kernel (MlaDecodeKernel) ----
// One query token per sequence (max_query_len 1): M = the 16 heads of a group, and the latent
// rows stream through a kDecStages-deep cp.async ring of kDecTile-row tiles, so kDecStages − 1
// tiles (37 KB each at DeepSeek widths) are in flight while one is used; each CTA reads every
// latent row of its partition once for all its heads. Per tile, 8 warps (three barriers; on
// the H200 a 32-row tile costs a CTA ~2.8 µs of this chain, so the kernel is latency-bound,
// not byte-bound — hence the 2-deep ring with two CTAs per SM at larger batches):
//   S = Q·Kᵀ: warp w takes keys 8(w%4)..+7 and half w/4 of the row width (two accumulator
//     chains), the halves summed in shared memory;
//   softmax: warp w rows w and w + 8, lane = key;
//   O += P·V: warp w latent channels 64w..64w+63 (as in MlaLatentMmaKernel).
constexpr int kDecTile = 32;
// Ring depths: 4 (one CTA per SM, 3 tiles in flight) or 2 (two CTAs per SM, each with one
// tile in flight while it computes; one CTA's barriers hide behind the other's work).
constexpr int kDecStagesDeep = 4, kDecStagesShallow = 2;
constexpr int kDecSPitch = kDecTile + 4;  // fp32 scores
constexpr int kDecPPitch = kDecTile + 8;  // bf16 probabilities: conflict-free ldmatrix rows

size_t DecodeSmemBytes(int width, int stages) {
  const size_t pitch = TilePitch(width);
  return sizeof(bf16) * (kHeads + static_cast<size_t>(stages) * kDecTile) * pitch +
         sizeof(float) * 2 * kHeads * kDecSPitch + sizeof(bf16) * kHeads * kDecPPitch +
         sizeof(float) * 3 * kHeads;
}

template <int kDecStages>
__global__ void __launch_bounds__(kTcThreads, 1) MlaDecodeKernel(const MlaArgs args) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int width = args.width;
  const int pitch = TilePitch(width);
  bf16* q_s = reinterpret_cast<bf16*>(smem_raw);  // [16][pitch]
  bf16* ring = q_s + kHeads * pitch;              // [stages][tile][pitch]
  float* s_s = reinterpret_cast<float*>(ring + kDecStages * kDecTile * pitch);  // [2][16][SP]
  bf16* p_s = reinterpret_cast<bf16*>(s_s + 2 * kHeads * kDecSPitch);           // [16][PP]
  float* m_s = reinterpret_cast<float*>(p_s + kHeads * kDecPPitch);             // [16] running max
  float* l_s = m_s + kHeads;                                                    // [16] running sum
  float* alpha_s = l_s + kHeads;                                                // [16] tile rescale

  PrefetchSpansL2(args.pf_ptr, args.pf_bytes);  // SetMlaDecodeL2Prefetch's (none by default)
  // With SetMlaDecodeFusion(3) a programmatic dependent launch: everything below may read what
  // the previous kernel wrote (q, the latent rows just appended). The combine + W_UV kernel
  // after this one may then get resident while this grid runs (it waits on griddepcontrol too).
  // args.early_kv (SetMlaDecodeEarlyKv): the wait comes after the step metadata reads and the
  // copies of the first tiles' rows older than the query's own (pos), which no kernel of the
  // step writes; Q and row pos are then read after it.
  const bool early = args.early_kv;
  auto wait = [&] {
    attention_detail::GridDependencyWait();
    if (args.trigger) attention_detail::LaunchDependents();
  };
  if (!early) wait();
  const int seq = blockIdx.z;
  const int split = blockIdx.x;
  const int q_begin = args.query_start_loc[seq];
  if (args.query_start_loc[seq + 1] <= q_begin) {  // no query token (uniform)
    if (early) wait();  // every path waits (pdl.cuh)
    return;
  }
  const int pos = args.context_lens[seq];
  const int2 kv = SplitRange<kDecTile>(args, split, pos + 1, pos + 1);
  const int kv_begin = kv.x, kv_end = kv.y;
  const int h0 = blockIdx.y * kHeads;
  const int heads = min(kHeads, args.num_heads - h0);
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int32_t* block_table = args.block_tables + seq * args.max_blocks_per_seq;

  // Q rows (16-byte copies, rows past `heads` zero): the oldest copy group, so the ring's
  // first wait covers it (early: an empty group; Q is loaded after the wait below).
  const bf16* q_row = args.q + static_cast<int64_t>(q_begin) * args.q_token_stride +
                      static_cast<int64_t>(h0) * width;
  if (early) {
    // Q after the dependency wait, below.
  } else if (args.q_vec) {
    const int chunks = width / 8;
    for (int c = threadIdx.x; c < kHeads * chunks; c += kTcThreads) {
      const int h = c / chunks;
      const int off = (c - h * chunks) * 8;
      const bool live = h < heads;
      CpAsync16(q_s + h * pitch + off, live ? q_row + h * width + off : args.q, live ? 16 : 0);
    }
  } else {
    for (int c = threadIdx.x; c < kHeads * width; c += kTcThreads) {
      const int h = c / width;
      q_s[h * pitch + c - h * width] = h < heads ? q_row[c] : __float2bfloat16_rn(0.0f);
    }
  }
  CpAsyncCommit();
  if (threadIdx.x < kHeads) {
    m_s[threadIdx.x] = -INFINITY;
    l_s[threadIdx.x] = 0.0f;
  }
  // Ring: tile i is copy group i (after Q's) in buffer i % kDecStages; every iteration commits
  // one group (empty past the end), so at iteration i's wait tile i has landed once at most
  // kDecStages − 2 newer groups are pending. The refill after the barrier reuses the buffer
  // every warp finished with in iteration i − 1.
  const int ntiles = kv_end > kv_begin ? (kv_end - kv_begin + kDecTile - 1) / kDecTile : 0;
  // This warp's rows of each tile, their slots looked up one copy ahead of use.
  constexpr int kR = kDecTile / (kTcThreads / 32);
  const int warp_row = (threadIdx.x / 32) * kR;
  int64_t next_slot[kR];
  LookupRows<kR>(args, block_table, kv_begin + warp_row, kv_end, next_slot);
  // copies tile t (if any) as one group, then looks up tile t + 1. skip_new: row pos is not
  // copied (before the dependency wait: the prologue may still be writing it).
  auto load = [&](int t, bool skip_new) {
    if (t < ntiles) {
      int64_t slot[kR];
#pragma unroll
      for (int r = 0; r < kR; ++r) {
        const int j = kv_begin + t * kDecTile + warp_row + r;
        slot[r] = skip_new && j == pos && next_slot[r] >= 0 ? kSkipRow : next_slot[r];
      }
      CopyRows<kR>(args, slot, ring + ((t % kDecStages) * kDecTile + warp_row) * pitch,
                   threadIdx.x % 32);
      LookupRows<kR>(args, block_table, kv_begin + (t + 1) * kDecTile + warp_row, kv_end,
                     next_slot);
    }
    CpAsyncCommit();
  };
#pragma unroll
  for (int st = 0; st < kDecStages - 1; ++st) load(st, early);
  if (early) {
    wait();
    // Q rows as above, with plain loads (the loop's first barrier publishes them).
    if (args.q_vec) {
      const int chunks = width / 8;
      for (int c = threadIdx.x; c < kHeads * chunks; c += kTcThreads) {
        const int h = c / chunks;
        const int off = (c - h * chunks) * 8;
        uint4 v = make_uint4(0u, 0u, 0u, 0u);
        if (h < heads) v = *reinterpret_cast<const uint4*>(q_row + h * width + off);
        *reinterpret_cast<uint4*>(q_s + h * pitch + off) = v;
      }
    } else {
      for (int c = threadIdx.x; c < kHeads * width; c += kTcThreads) {
        const int h = c / width;
        q_s[h * pitch + c - h * width] = h < heads ? q_row[c] : __float2bfloat16_rn(0.0f);
      }
    }
    // Row pos, when its tile was among those copied before the wait (later tiles copy it in
    // the loop): 16-byte plain loads into the ring slot the copies skipped.
    const int rel = pos - kv_begin;
    if (pos >= kv_begin && pos < kv_end && rel / kDecTile < kDecStages - 1) {
      const int64_t slot = static_cast<int64_t>(block_table[pos / args.block_size]) *
                               args.block_size + pos % args.block_size;
      const bf16* src = args.cache + slot * width;
      bf16* dst = ring + ((rel / kDecTile) * kDecTile + rel % kDecTile) * pitch;
      for (int off = threadIdx.x * 8; off < width; off += kTcThreads * 8) {
        *reinterpret_cast<uint4*>(dst + off) = *reinterpret_cast<const uint4*>(src + off);
      }
    }
  }

  float acc[1][8][4];
#pragma unroll
  for (int n = 0; n < 8; ++n) acc[0][n][0] = acc[0][n][1] = acc[0][n][2] = acc[0][n][3] = 0.0f;
  const int col0 = warp * 64;
  const int ksteps = width / 16;
  const int khalf = (ksteps + 1) / 2;
  const int ks_begin = (warp / 4) * khalf;
  const int ks_end = min(ksteps, ks_begin + khalf);

  for (int it = 0; it < ntiles; ++it) {
    CpAsyncWait<kDecStages - 2>();
    __syncthreads();  // tile `it` (and Q, m_s, l_s) visible; buffer (it − 1) free
    load(it + kDecStages - 1, false);
    const bf16* k_s = ring + (it % kDecStages) * kDecTile * pitch;
    const int tile = kv_begin + it * kDecTile;

    {  // Partial S over this warp's half of the width.
      float c0[4] = {0.0f, 0.0f, 0.0f, 0.0f}, c1[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      const bf16* kb = k_s + ((warp % 4) * 8 + lane / 4) * pitch + 2 * (lane % 4);
      int ks = ks_begin;
      for (; ks + 1 < ks_end; ks += 2) {
        uint32_t a0[4], a1[4];
        LoadA(a0, q_s + ks * 16, pitch, lane);
        LoadA(a1, q_s + ks * 16 + 16, pitch, lane);
        Mma(c0, a0, Ld32(kb + ks * 16), Ld32(kb + ks * 16 + 8));
        Mma(c1, a1, Ld32(kb + ks * 16 + 16), Ld32(kb + ks * 16 + 24));
      }
      if (ks < ks_end) {
        uint32_t a0[4];
        LoadA(a0, q_s + ks * 16, pitch, lane);
        Mma(c0, a0, Ld32(kb + ks * 16), Ld32(kb + ks * 16 + 8));
      }
      float* s0 = s_s + (warp / 4) * kHeads * kDecSPitch + (lane / 4) * kDecSPitch +
                  (warp % 4) * 8 + 2 * (lane % 4);
      *reinterpret_cast<float2*>(s0) = make_float2(c0[0] + c1[0], c0[1] + c1[1]);
      *reinterpret_cast<float2*>(s0 + 8 * kDecSPitch) = make_float2(c0[2] + c1[2], c0[3] + c1[3]);
    }
    __syncthreads();

    // Online softmax: rows warp and warp + 8, key `lane`. Keys past kv_end (the causal end of
    // this partition) are masked; the zero-filled rows they read are finite.
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int r = warp + 8 * i;
      const int visible = r < heads ? kv_end - tile : 0;
      const float x = lane < visible
                          ? (s_s[r * kDecSPitch + lane] + s_s[(kHeads + r) * kDecSPitch + lane]) *
                                args.scale_log2
                          : -INFINITY;
      float mx = x;
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
      const float old_max = m_s[r];
      const float new_max = fmaxf(old_max, mx);
      const float base = new_max == -INFINITY ? 0.0f : new_max;
      const bf16 p = __float2bfloat16_rn(Exp2(x - base));
      p_s[r * kDecPPitch + lane] = p;
      // The sum uses the rounded weights P·V multiplies, so the normalization matches.
      const float sum = cuda_detail::WarpSum(__bfloat162float(p));
      __syncwarp();  // every lane has read m_s[r] before lane 0 rewrites it
      if (lane == 0) {
        const float alpha = Exp2(old_max - base);
        alpha_s[r] = alpha;
        l_s[r] = l_s[r] * alpha + sum;
        m_s[r] = new_max;
      }
    }
    __syncthreads();

    if (col0 < args.rank) {  // O = O·alpha + P·V over this warp's 64 channels
      const float lo = alpha_s[lane / 4], hi = alpha_s[lane / 4 + 8];
#pragma unroll
      for (int n = 0; n < 8; ++n) {
        acc[0][n][0] *= lo;
        acc[0][n][1] *= lo;
        acc[0][n][2] *= hi;
        acc[0][n][3] *= hi;
      }
#pragma unroll
      for (int ks = 0; ks < kDecTile; ks += 16) {
        uint32_t a[4];
        LoadA(a, p_s + ks, kDecPPitch, lane);
        const bf16* v =
            k_s + (ks + (lane & 7) + ((lane >> 3) & 1) * 8) * pitch + col0 + (lane >> 4) * 8;
#pragma unroll
        for (int np = 0; np < 4; ++np) {
          if (col0 + np * 16 < args.rank) {
            uint32_t b[4];
            LdMatrixX4Trans(b, v + np * 16);
            Mma(acc[0][2 * np], a, b[0], b[1]);
            Mma(acc[0][2 * np + 1], a, b[2], b[3]);
          }
        }
      }
    }
  }
  CpAsyncWait<0>();  // no copy may land after the CTA exits (empty groups only, or Q)
  __syncthreads();   // m_s, l_s final (also when no tile ran)
  StoreRows<1>(args, acc, m_s, l_s, 1, heads, q_begin, h0, split, warp, lane);
}

// Decode attention's epilogue under SetMlaDecodeFusion(2): the split-KV combine of one (query
// token, head) row and the W_UV value projection of a slice of its output in one CTA. Grid
// (max_query_len, num_sequences, num_heads · slices) like SplitKvCombineKernel's, rows past a
// sequence's query tokens idle. The merge is SplitKvCombineKernel's arithmetic in its order (so
// the merged row equals the bf16 out_latent the combine writes), or, without a split, the bf16
// row the attention kernel wrote; then, from those bf16 values in shared memory,
//   out[token, h·dv + j] = bf16(Σ_c w[h·w_head_stride + j·rank + c] · o[c])   (fp32)
// for the slice's kVUpRows rows j, warp w rows j0 + w and j0 + w + 8, lanes over channels.
// Every slice merges its row again (an L2 read of the partials: cheap next to a launch).
constexpr int kVUpThreads = 256;
constexpr int kVUpRows = 16;

struct VUpArgs {
  const int32_t* query_start_loc;
  const float2* partial_ml;  // [num_splits, num_tokens, num_heads] (num_splits > 1)
  const float* partial_out;  // [num_splits, num_tokens, num_heads, rank]
  const bf16* latent;        // [num_tokens, num_heads, rank] (num_splits == 1)
  const bf16* w;             // W_UV of head h: w + h·w_head_stride, [dv, rank]
  int64_t w_head_stride;
  bf16* out;  // token t, head h: out + t·out_token_stride + h·dv, dv values
  int64_t out_token_stride;
  int num_splits, num_tokens, num_heads, rank, dv, slices;
  bool w_vec;    // w, w_head_stride and rank allow 16-byte weight loads
  bool trigger;  // LaunchDependents right after the wait (kMlaPdlVUpTrigger), else at exit
  // SetMlaDecodeL2Prefetch bit 4: spans this grid asks L2 for after its wait (bytes 0: none).
  const char* pf_ptr[2];
  uint32_t pf_bytes[2];
};

// kEarly (MlaDecodePdlBits() & kMlaPdlVUpPreload): the block's W_UV vectors (w_vec; no kernel of
// the step writes them) are loaded into registers before GridDependencyWait, in flight while the
// attention kernel finishes; a.trigger (kMlaPdlVUpTrigger): once past the wait the kernel lets
// its own dependent (o_proj) launch. The same values in the same order: the same outputs.
template <bool kEarly>
__global__ void __launch_bounds__(kVUpThreads) MlaCombineVUpKernel(const VUpArgs a) {
  __shared__ float o_s[kMaxRank];
  __shared__ float weight[attention_detail::kMaxSplitsDevice];
  __shared__ float shared_inv;
  constexpr int kWarps = kVUpThreads / 32;
  static_assert(kVUpRows == 2 * kWarps, "two rows per warp");
  constexpr int kChunks = kMaxRank / 8 / 32;
  const int h = static_cast<int>(blockIdx.z) / a.slices;
  const int slice = static_cast<int>(blockIdx.z) % a.slices;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int j0 = slice * kVUpRows + warp;
  const bf16* w_head = a.w + static_cast<int64_t>(h) * a.w_head_stride;
  // Lane l: 8-channel chunks l and l + 32 of rows j0 and j0 + kWarps (zeros past dv / rank).
  auto load_w = [&](cuda_detail::Bf16x8 (&wv)[2][kChunks]) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
#pragma unroll
      for (int k = 0; k < kChunks; ++k) {
        const int j = j0 + r * kWarps, chunk = lane + 32 * k;
        if (j < a.dv && chunk * 8 < a.rank) {
          wv[r][k] = cuda_detail::LoadVec(w_head + static_cast<int64_t>(j) * a.rank + chunk * 8);
        } else {
          wv[r][k] = cuda_detail::Bf16x8{};
        }
      }
    }
  };
  cuda_detail::Bf16x8 early_w[2][kChunks];
  if constexpr (kEarly) {
    if (a.w_vec) load_w(early_w);
  }
  attention_detail::GridDependencyWait();  // the partials come from the kernel just before
  if (a.trigger) attention_detail::LaunchDependents();
  PrefetchSpansL2(a.pf_ptr, a.pf_bytes);
  const int seq = blockIdx.y;
  const int q_begin = a.query_start_loc[seq];
  const int q_len = a.query_start_loc[seq + 1] - q_begin;
  if (static_cast<int>(blockIdx.x) >= q_len) return;  // uniform
  const int token = q_begin + static_cast<int>(blockIdx.x);
  const int64_t row = static_cast<int64_t>(token) * a.num_heads + h;
  if (a.num_splits > 1) {
    const int64_t split_stride = static_cast<int64_t>(a.num_tokens) * a.num_heads;
    if (warp == 0) {  // weights: empty partitions (sum 0, max −inf) weigh 0
      const float2* ml = a.partial_ml + row;
      float global_max = -INFINITY;
      for (int sp = lane; sp < a.num_splits; sp += 32) {
        const float2 v = ml[sp * split_stride];
        if (v.y > 0.0f) global_max = fmaxf(global_max, v.x);
      }
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) {
        global_max = fmaxf(global_max, __shfl_xor_sync(0xffffffffu, global_max, off));
      }
      float den = 0.0f;
      for (int sp = lane; sp < a.num_splits; sp += 32) {
        const float2 v = ml[sp * split_stride];
        const float wt = v.y > 0.0f ? v.y * Exp2(v.x - global_max) : 0.0f;
        weight[sp] = wt;
        den += wt;
      }
      den = cuda_detail::WarpSum(den);
      if (lane == 0) shared_inv = den > 0.0f ? 1.0f / den : 0.0f;
    }
    __syncthreads();
    // Thread t merges channels 2t, 2t + 1 (rank ≤ 2 · kVUpThreads, even) with 8-byte loads, 16
    // splits in flight: the merge is a chain of L2 round trips, not bytes.
    const float inv = shared_inv;
    const int c = 2 * static_cast<int>(threadIdx.x);
    if (c < a.rank) {
      const float2* src = reinterpret_cast<const float2*>(a.partial_out + row * a.rank + c);
      const int64_t stride2 = split_stride * a.rank / 2;
      float2 num = make_float2(0.0f, 0.0f);
#pragma unroll 16
      for (int sp = 0; sp < a.num_splits; ++sp) {
        const float wt = weight[sp];
        const float2 v = src[sp * stride2];
        num.x += wt * v.x;
        num.y += wt * v.y;
      }
      o_s[c] = __bfloat162float(__float2bfloat16_rn(num.x * inv));
      o_s[c + 1] = __bfloat162float(__float2bfloat16_rn(num.y * inv));
    }
  } else {
    for (int c = threadIdx.x; c < a.rank; c += kVUpThreads) {
      o_s[c] = __bfloat162float(a.latent[row * a.rank + c]);
    }
  }
  __syncthreads();  // o_s complete
  bf16* out = a.out + static_cast<int64_t>(token) * a.out_token_stride +
              static_cast<int64_t>(h) * a.dv;
  // Warp w: rows j0 + w and j0 + w + 8 of the slice.
  if (a.w_vec) {
    // Lane l: 8-channel chunks l and l + 32 of both rows (rank ≤ 512), all four 16-byte loads
    // issued before the first FMA (kEarly: before the wait).
    cuda_detail::Bf16x8 wv[2][kChunks];
    if constexpr (kEarly) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
#pragma unroll
        for (int k = 0; k < kChunks; ++k) wv[r][k] = early_w[r][k];
      }
    } else {
      load_w(wv);
    }
    float wf[2][kChunks][8];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
#pragma unroll
      for (int k = 0; k < kChunks; ++k) cuda_detail::ToFloat8(wv[r][k], wf[r][k]);
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float acc = 0.0f;
#pragma unroll
      for (int k = 0; k < kChunks; ++k) {
        const int chunk = lane + 32 * k;
        if (chunk * 8 >= a.rank) continue;
#pragma unroll
        for (int u = 0; u < 8; ++u) acc = fmaf(wf[r][k][u], o_s[chunk * 8 + u], acc);
      }
      acc = cuda_detail::WarpSum(acc);
      const int j = j0 + r * kWarps;
      if (lane == 0 && j < a.dv) out[j] = __float2bfloat16_rn(acc);
    }
  } else {
    for (int r = 0; r < 2; ++r) {
      const int j = j0 + r * kWarps;
      if (j >= a.dv) break;  // warp-uniform
      const __nv_bfloat162* wr =
          reinterpret_cast<const __nv_bfloat162*>(w_head + static_cast<int64_t>(j) * a.rank);
      float acc = 0.0f;
      for (int c2 = lane; c2 < a.rank / 2; c2 += 32) {
        const float2 wf = __bfloat1622float2(wr[c2]);
        acc = fmaf(wf.x, o_s[2 * c2], acc);
        acc = fmaf(wf.y, o_s[2 * c2 + 1], acc);
      }
      acc = cuda_detail::WarpSum(acc);
      if (lane == 0) out[j] = __float2bfloat16_rn(acc);
    }
  }
}

struct MlaPlan {
  bool tensor_cores = false;
  bool decode = false;     // MlaDecodeKernel
  int decode_stages = 0;   // its ring depth
  int tokens_per_cta = 1;  // T of MlaLatentMmaKernel
  int num_splits = 1;
  int partition_tokens = 0;
  int head_chunks = 1;
  bool prefill_mma = false;  // MlaPrefillMmaKernel instead of MlaLatentMmaKernel<4>
};

// SetMlaLatentAttentionDecodeKernel's and SetMlaPrefillKernel's settings.
std::atomic<int> g_decode_kernel{0};
std::atomic<int> g_prefill_kernel{1};
std::atomic<int> g_decode_fusion{3};  // SetMlaDecodeFusion's
std::atomic<int> g_decode_pdl_mask{-1};     // SetMlaDecodePdlMask's
std::atomic<int> g_decode_l2_prefetch{0};  // SetMlaDecodeL2Prefetch's
std::atomic<int> g_decode_early_kv{1};      // SetMlaDecodeEarlyKv's

// Whether decode launches go out as programmatic dependents: SetMlaDecodeFusion(3) on an sm_90+
// device (griddepcontrol compiles to nothing below sm_90). Asked per launch plan, which graph
// capture does once.
bool MlaDecodePdl() {
  return g_decode_fusion.load(std::memory_order_relaxed) >= 3 && PdlSupported();
}

// Whether this device lets a CTA opt in to `bytes` of dynamic shared memory.
bool SmemFits(size_t bytes) {
  int device = 0, optin = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) !=
          cudaSuccess) {
    return false;
  }
  return bytes <= static_cast<size_t>(optin);
}

int MultiprocessorCount() {
  int device = 0, sms = 132;
  if (cudaGetDevice(&device) == cudaSuccess) {
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  }
  return std::max(sms, 1);
}

// The decode kernel's split plan. CTAs come in waves of SMs × resident CTAs per SM (1 with the
// deep ring's ~170 KB of shared memory, 2 with the shallow one's ~97 KB). Among partitions of whole
// tiles pick the one whose waves are fullest, preferring fewer splits (each costs a partial write
// and combine input) unless more fill the waves ≥ 10% better. Partitions keep ≥ 4 tiles, except
// when the batch is far too small to fill the GPU (latency-bound: batch 1 reads one 32-row tile per
// CTA, 32 CTAs at 1k context). Host bounds only, so captured graphs stay valid.
void PlanDecodeSplits(const PagedAttentionCudaBatch& b, const MlaDims& d, MlaPlan* plan) {
  // Resident CTAs per SM (228 KiB of shared memory, 1 KiB of it reserved per CTA): 1 with the
  // deep ring, 2 with the shallow one at DeepSeek widths.
  const size_t per_cta =
      DecodeSmemBytes(static_cast<int>(d.LatentWidth()), plan->decode_stages) + 1024;
  const int64_t per_sm = std::max<int64_t>(1, static_cast<int64_t>(228 * 1024 / per_cta));
  const int64_t slots = MultiprocessorCount() * per_sm;
  const int64_t ctas = static_cast<int64_t>(plan->head_chunks) * b.num_sequences;
  if (ctas >= 4 * slots || b.max_seq_len < 2 * kDecTile) return;
  const bool latency_bound = ctas * 4 < slots;
  const int64_t min_part = latency_bound ? kDecTile : 4 * kDecTile;
  auto fill = [&](int64_t splits) {
    const int64_t total = ctas * splits;
    const int64_t waves = (total + slots - 1) / slots;
    return static_cast<double>(total) / static_cast<double>(waves * slots);
  };
  double best_fill = fill(1);
  int64_t best_part = 0;
  for (int64_t part = (b.max_seq_len + kDecTile - 1) / kDecTile * kDecTile; part >= min_part;
       part -= kDecTile) {
    const int64_t splits = (b.max_seq_len + part - 1) / part;
    if (splits < 2) continue;
    if (splits > attention_detail::kMaxSplitsDevice || ctas * splits > 16 * slots) break;
    const double f = fill(splits);
    if (f > best_fill * 1.1) {
      best_fill = f;
      best_part = part;
    }
  }
  if (best_part > 0) {
    plan->partition_tokens = static_cast<int>(best_part);
    plan->num_splits = static_cast<int>((b.max_seq_len + best_part - 1) / best_part);
  }
}

MlaPlan Plan(const PagedAttentionCudaBatch& b, const MlaDims& d) {
  MlaPlan plan;
  plan.tensor_cores = UseTensorCores(d);
  const int decode_kernel = g_decode_kernel.load(std::memory_order_relaxed);
  plan.decode = plan.tensor_cores && b.max_query_len == 1 && decode_kernel != 1;
  plan.tokens_per_cta = plan.tensor_cores && b.max_query_len > 1 ? kTcPrefillTokens : 1;
  plan.head_chunks = static_cast<int>((d.num_heads + kHeads - 1) / kHeads);
  // Ring depth (automatic): the decode kernel is bound by its per-tile latency chain (three
  // barriers a tile), not by bytes, so two CTAs per SM (shallow rings) overlap one's barriers
  // with the other's work — H200, DeepSeek-V2-Lite: batch 64 × 1k 39.6 µs vs 53.5 deep,
  // 64 × 8k 239 vs 373 — except for latency-bound grids (a few sequences), whose many short
  // partitions do better one CTA per SM: batch 1 × 8k 20.7 µs deep vs 31.1 (1k: 10.5 both).
  const bool few =
      static_cast<int64_t>(plan.head_chunks) * b.num_sequences * 4 < MultiprocessorCount();
  plan.decode_stages =
      decode_kernel == 2 || (decode_kernel == 0 && !few) ? kDecStagesShallow : kDecStagesDeep;
  if (plan.decode) {
    PlanDecodeSplits(b, d, &plan);
    return plan;
  }
  // Partitions are whole key tiles; the tensor-core kernel's tile costs little, so decode at
  // small batch splits finely (a 1k context over 16 CTAs) and leans on the combine.
  const int tile = plan.tensor_cores ? kTcTile : kKeys;
  const int min_partition = plan.tensor_cores ? kTcTile : kMinPartition;
  const int sms = MultiprocessorCount();
  // Split only when the CTAs fall short of ~2 per SM and partitions keep ≥ min_partition keys.
  const int64_t q_tiles = (b.max_query_len + plan.tokens_per_cta - 1) / plan.tokens_per_cta;
  const int64_t ctas = q_tiles * plan.head_chunks * b.num_sequences;
  const int64_t target = 2LL * sms;
  if (ctas < target && b.max_seq_len >= 2 * min_partition) {
    int64_t splits = std::min<int64_t>({(target + ctas - 1) / ctas, b.max_seq_len / min_partition,
                                        attention_detail::kMaxSplitsDevice});
    if (splits > 1) {
      int64_t part = (b.max_seq_len + splits - 1) / splits;
      part = (part + tile - 1) / tile * tile;
      plan.partition_tokens = static_cast<int>(part);
      plan.num_splits = static_cast<int>((b.max_seq_len + part - 1) / part);
    }
  }
  if (plan.num_splits == 1) plan.partition_tokens = 0;
  // Prefill kernel 1 shares the 4-token kernel's grid and split plan (so the workspace does
  // not depend on the setting); dims or devices it cannot serve keep the 4-token kernel.
  plan.prefill_mma = g_prefill_kernel.load(std::memory_order_relaxed) == 1 &&
                     plan.tensor_cores && plan.tokens_per_cta == kPfTokens &&
                     d.kv_lora_rank % 64 == 0 && d.LatentWidth() % 64 == 0 &&
                     SmemFits(PrefillSmemBytes(static_cast<int>(d.LatentWidth())));
  return plan;
}

absl::Status Validate(const PagedAttentionCudaBatch& b, const MlaDims& d, int64_t block_size) {
  if (d.num_heads < 1 || d.kv_lora_rank < 1 || d.qk_rope_head_dim < 0 || block_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("MlaLatentAttentionCuda: sizes must be >= 1 (num_heads ", d.num_heads,
                     ", kv_lora_rank ", d.kv_lora_rank, ", qk_rope_head_dim ", d.qk_rope_head_dim,
                     ", block_size ", block_size, ")"));
  }
  const int64_t width = d.LatentWidth();
  if (d.kv_lora_rank % 2 != 0 || d.kv_lora_rank > kMaxRank || width % 8 != 0 || width > kMaxWidth) {
    return absl::InvalidArgumentError(
        absl::StrCat("MlaLatentAttentionCuda: unsupported dims (kv_lora_rank ", d.kv_lora_rank,
                     " must be even and <= ", kMaxRank, "; kv_lora_rank + qk_rope_head_dim ", width,
                     " a multiple of 8, <= ", kMaxWidth, ")"));
  }
  if (d.num_heads > 65535 * kHeads) {
    return absl::InvalidArgumentError("MlaLatentAttentionCuda: too many heads");
  }
  if (b.num_sequences < 1 || b.num_tokens < 1 || b.max_query_len < 1 || b.max_seq_len < 1 ||
      b.max_blocks_per_seq < 1 || b.max_query_len > b.max_seq_len) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MlaLatentAttentionCuda: bad batch bounds (num_sequences ", b.num_sequences,
        ", num_tokens ", b.num_tokens, ", max_query_len ", b.max_query_len, ", max_seq_len ",
        b.max_seq_len, ", max_blocks_per_seq ", b.max_blocks_per_seq, ")"));
  }
  if (b.num_sequences > 65535 || b.num_tokens > INT32_MAX ||
      b.max_query_len * attention_detail::kMaxSplitsDevice > INT32_MAX ||
      b.max_seq_len > INT32_MAX / 2) {
    return absl::InvalidArgumentError("MlaLatentAttentionCuda: batch too large");
  }
  if (b.query_start_loc == nullptr || b.context_lens == nullptr || b.block_tables == nullptr) {
    return absl::InvalidArgumentError("MlaLatentAttentionCuda: null batch metadata pointer");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status SetMlaLatentAttentionDecodeKernel(int kernel) {
  if (kernel < 0 || kernel > 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("SetMlaLatentAttentionDecodeKernel: kernel ", kernel, " is not in 0..3"));
  }
  g_decode_kernel.store(kernel, std::memory_order_relaxed);
  return absl::OkStatus();
}

int MlaLatentAttentionDecodeKernel() { return g_decode_kernel.load(std::memory_order_relaxed); }

absl::Status SetMlaPrefillKernel(int kernel) {
  if (kernel < 0 || kernel > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("SetMlaPrefillKernel: kernel ", kernel, " is not in 0..1"));
  }
  g_prefill_kernel.store(kernel, std::memory_order_relaxed);
  return absl::OkStatus();
}

int MlaPrefillKernel() { return g_prefill_kernel.load(std::memory_order_relaxed); }

absl::Status SetMlaDecodeFusion(int level) {
  if (level < 0 || level > 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("SetMlaDecodeFusion: level ", level, " is not in 0..3"));
  }
  g_decode_fusion.store(level, std::memory_order_relaxed);
  return absl::OkStatus();
}

int MlaDecodeFusion() { return g_decode_fusion.load(std::memory_order_relaxed); }

absl::Status SetMlaDecodePdlMask(int mask) {
  if (mask < -1 || mask > 63) {
    return absl::InvalidArgumentError(
        absl::StrCat("SetMlaDecodePdlMask: mask ", mask, " is not in -1..63"));
  }
  g_decode_pdl_mask.store(mask, std::memory_order_relaxed);
  return absl::OkStatus();
}

int MlaDecodePdlMask() { return g_decode_pdl_mask.load(std::memory_order_relaxed); }

int MlaDecodePdlBits() {
  const int mask = g_decode_pdl_mask.load(std::memory_order_relaxed);
  if (mask < 0) {
    return DecodePdlModelKernels() ? kMlaPdlLevel2 : DecodePdl() ? kMlaPdlLevel1 : 0;
  }
  return PdlSupported() ? mask : 0;
}

absl::Status SetMlaDecodeL2Prefetch(int mode) {
  if (mode < 0 || mode > 15 || (mode & 12) == 12) {
    return absl::InvalidArgumentError(absl::StrCat("SetMlaDecodeL2Prefetch: mode ", mode,
                                                   " is not in 0..15 without both 4 and 8"));
  }
  g_decode_l2_prefetch.store(mode, std::memory_order_relaxed);
  return absl::OkStatus();
}

int MlaDecodeL2Prefetch() { return g_decode_l2_prefetch.load(std::memory_order_relaxed); }

absl::Status SetMlaDecodeEarlyKv(int mode) {
  if (mode < 0 || mode > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("SetMlaDecodeEarlyKv: mode ", mode, " is not 0 or 1"));
  }
  g_decode_early_kv.store(mode, std::memory_order_relaxed);
  return absl::OkStatus();
}

int MlaDecodeEarlyKv() { return g_decode_early_kv.load(std::memory_order_relaxed); }

size_t MlaLatentAttentionCudaWorkspaceBytes(const PagedAttentionCudaBatch& batch,
                                            const MlaDims& dims) {
  if (!Validate(batch, dims, 1).ok()) return 0;
  const MlaPlan plan = Plan(batch, dims);
  return attention_detail::SplitKvWorkspaceBytes(plan.num_splits, batch.num_tokens, dims.num_heads,
                                                 dims.kv_lora_rank);
}

namespace {

// The kernel arguments of MlaL2Prefetch's spans for the kernel at `site` (none elsewhere, and
// none for spans that are not 16-byte aligned).
void PrefetchArgs(const MlaL2Prefetch* pf, MlaL2PrefetchSite site, const char* (&ptr)[2],
                  uint32_t (&bytes)[2]) {
  for (int r = 0; r < 2; ++r) {
    const bool ok = pf != nullptr && pf->site == site && pf->ptr[r] != nullptr &&
                    cuda_detail::Aligned16(pf->ptr[r]);
    ptr[r] = ok ? static_cast<const char*>(pf->ptr[r]) : nullptr;
    bytes[r] = ok ? static_cast<uint32_t>(std::min<size_t>(pf->bytes[r], 0xffff0000u)) : 0u;
  }
}

// MlaLatentAttentionCuda up to its split-KV combine: validates, launches the attention kernel
// of the plan, and returns the combine's arguments in *combine (num_splits 1: nothing to merge).
absl::Status EnqueueLatentAttention(const bf16* q_latent, int64_t q_token_stride,
                                    const bf16* cache, int64_t block_size,
                                    const PagedAttentionCudaBatch& batch, const MlaDims& dims,
                                    void* workspace, bf16* out_latent, cudaStream_t stream,
                                    attention_detail::SplitKvCombineArgs* combine_out,
                                    const MlaL2Prefetch* l2_prefetch = nullptr) {
  if (absl::Status s = Validate(batch, dims, block_size); !s.ok()) return s;
  if (q_latent == nullptr || cache == nullptr || out_latent == nullptr) {
    return absl::InvalidArgumentError("MlaLatentAttentionCuda: null q, cache or out pointer");
  }
  const int64_t width = dims.LatentWidth();
  if (q_token_stride < dims.num_heads * width) {
    return absl::InvalidArgumentError(
        absl::StrCat("MlaLatentAttentionCuda: q_token_stride ", q_token_stride,
                     " < num_heads · (kv_lora_rank + qk_rope_head_dim) ", dims.num_heads * width));
  }
  if (!cuda_detail::Aligned16(cache) || (reinterpret_cast<uintptr_t>(out_latent) & 3u) != 0) {
    return absl::InvalidArgumentError(
        "MlaLatentAttentionCuda: cache must be 16-byte aligned, out_latent 4-byte aligned");
  }
  const MlaPlan plan = Plan(batch, dims);
  const size_t ws_bytes = MlaLatentAttentionCudaWorkspaceBytes(batch, dims);
  if (ws_bytes > 0 && (workspace == nullptr || !cuda_detail::Aligned16(workspace))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MlaLatentAttentionCuda: needs a 16-byte aligned workspace of ", ws_bytes, " bytes"));
  }
  MlaArgs args;
  args.q = q_latent;
  args.q_token_stride = q_token_stride;
  args.cache = cache;
  args.query_start_loc = batch.query_start_loc;
  args.context_lens = batch.context_lens;
  args.block_tables = batch.block_tables;
  args.max_blocks_per_seq = batch.max_blocks_per_seq;
  args.block_size = static_cast<int>(block_size);
  args.num_heads = static_cast<int>(dims.num_heads);
  args.rank = static_cast<int>(dims.kv_lora_rank);
  args.width = static_cast<int>(width);
  args.scale_log2 = dims.softmax_scale * kLog2e;
  args.num_splits = plan.num_splits;
  args.partition_tokens = plan.partition_tokens;
  args.num_tokens = static_cast<int>(batch.num_tokens);
  args.out = out_latent;
  const attention_detail::SplitKvCombineArgs combine = attention_detail::MakeSplitKvCombineArgs(
      ws_bytes > 0 ? workspace : nullptr, batch.query_start_loc, plan.num_splits, args.num_tokens,
      args.num_heads, args.rank, out_latent);
  args.partial_ml = combine.partial_ml;
  args.partial_out = combine.partial_out;
  PrefetchArgs(l2_prefetch, MlaL2PrefetchSite::kAttention, args.pf_ptr, args.pf_bytes);
  args.trigger = (MlaDecodePdlBits() & kMlaPdlAttnLateTrigger) == 0;
  args.early_kv = g_decode_early_kv.load(std::memory_order_relaxed) != 0;

  args.q_vec = cuda_detail::Aligned16(q_latent) && q_token_stride % 8 == 0;
  if (plan.decode) {
    const dim3 grid(static_cast<unsigned>(plan.num_splits), static_cast<unsigned>(plan.head_chunks),
                    static_cast<unsigned>(batch.num_sequences));
    const size_t smem = DecodeSmemBytes(args.width, plan.decode_stages);
    auto* kernel = plan.decode_stages == kDecStagesShallow ? &MlaDecodeKernel<kDecStagesShallow>
                                                           : &MlaDecodeKernel<kDecStagesDeep>;
    SLUICE_CUDA_RETURN_IF_ERROR(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(smem)),
        "MlaLatentAttentionCuda: cudaFuncSetAttribute");
    // kernels::DecodePdlModelKernels(): a programmatic dependent at every fusion level (the kernel waits
    // before its first read).
    const bool pdl = MlaDecodePdl() || DecodePdlModelKernels();
    SLUICE_CUDA_RETURN_IF_ERROR(attention_detail::LaunchKernelMaybePdl(
                                    kernel, grid, dim3(kTcThreads), smem, stream, pdl, args),
                                "MlaLatentAttentionCuda: decode launch");
  } else if (plan.prefill_mma) {
    const int64_t q_tiles = (batch.max_query_len + kPfTokens - 1) / kPfTokens;
    const dim3 grid(static_cast<unsigned>(q_tiles * plan.num_splits),
                    static_cast<unsigned>(plan.head_chunks),
                    static_cast<unsigned>(batch.num_sequences));
    const size_t smem = PrefillSmemBytes(args.width);
    SLUICE_CUDA_RETURN_IF_ERROR(
        cudaFuncSetAttribute(&MlaPrefillMmaKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(smem)),
        "MlaLatentAttentionCuda: cudaFuncSetAttribute");
    MlaPrefillMmaKernel<<<grid, kTcThreads, smem, stream>>>(args);
  } else if (plan.tensor_cores) {
    const int64_t q_tiles = (batch.max_query_len + plan.tokens_per_cta - 1) / plan.tokens_per_cta;
    const dim3 grid(static_cast<unsigned>(q_tiles * plan.num_splits),
                    static_cast<unsigned>(plan.head_chunks),
                    static_cast<unsigned>(batch.num_sequences));
    const size_t smem = TcSmemBytes(plan.tokens_per_cta, args.width);
    if (plan.tokens_per_cta == 1) {
      SLUICE_CUDA_RETURN_IF_ERROR(
          cudaFuncSetAttribute(&MlaLatentMmaKernel<1>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(smem)),
          "MlaLatentAttentionCuda: cudaFuncSetAttribute");
      MlaLatentMmaKernel<1><<<grid, kTcThreads, smem, stream>>>(args);
    } else {
      SLUICE_CUDA_RETURN_IF_ERROR(
          cudaFuncSetAttribute(&MlaLatentMmaKernel<kTcPrefillTokens>,
                               cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)),
          "MlaLatentAttentionCuda: cudaFuncSetAttribute");
      MlaLatentMmaKernel<kTcPrefillTokens><<<grid, kTcThreads, smem, stream>>>(args);
    }
  } else {
    const size_t smem = SmemBytes(args.width);
    if (smem > 48 * 1024) {
      SLUICE_CUDA_RETURN_IF_ERROR(
          cudaFuncSetAttribute(&MlaLatentKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(SmemBytes(kMaxWidth))),
          "MlaLatentAttentionCuda: cudaFuncSetAttribute");
    }
    const dim3 grid(static_cast<unsigned>(batch.max_query_len * plan.num_splits),
                    static_cast<unsigned>(plan.head_chunks),
                    static_cast<unsigned>(batch.num_sequences));
    MlaLatentKernel<<<grid, kThreads, smem, stream>>>(args);
  }
  *combine_out = combine;
  return CudaLaunchStatus("MlaLatentAttentionCuda");
}

}  // namespace

absl::Status MlaLatentAttentionCuda(const bf16* q_latent, int64_t q_token_stride, const bf16* cache,
                                    int64_t block_size, const PagedAttentionCudaBatch& batch,
                                    const MlaDims& dims, void* workspace, bf16* out_latent,
                                    cudaStream_t stream) {
  attention_detail::SplitKvCombineArgs combine;
  if (absl::Status s = EnqueueLatentAttention(q_latent, q_token_stride, cache, block_size, batch,
                                              dims, workspace, out_latent, stream, &combine);
      !s.ok()) {
    return s;
  }
  if (combine.num_splits <= 1) return absl::OkStatus();
  attention_detail::LaunchSplitKvCombine(combine, batch.max_query_len, batch.num_sequences, stream);
  return CudaLaunchStatus("MlaLatentAttentionCuda combine");
}

absl::Status MlaLatentAttentionVUpCuda(const bf16* q_latent, int64_t q_token_stride,
                                       const bf16* cache, int64_t block_size,
                                       const PagedAttentionCudaBatch& batch, const MlaDims& dims,
                                       void* workspace, bf16* out_latent, const bf16* w_uv,
                                       int64_t w_head_stride, int64_t v_head_dim, bf16* out,
                                       int64_t out_token_stride, cudaStream_t stream,
                                       const MlaL2Prefetch* l2_prefetch) {
  if (v_head_dim < 1 || w_uv == nullptr || out == nullptr ||
      (reinterpret_cast<uintptr_t>(w_uv) & 3u) != 0 || w_head_stride % 2 != 0 ||
      w_head_stride < v_head_dim * dims.kv_lora_rank ||
      out_token_stride < dims.num_heads * v_head_dim ||
      (batch.num_sequences > 0 && dims.num_heads > 0 &&
       dims.num_heads * ((v_head_dim + kVUpRows - 1) / kVUpRows) > 65535)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MlaLatentAttentionVUpCuda: needs v_head_dim >= 1, non-null 4-byte aligned w_uv with an "
        "even w_head_stride >= v_head_dim · kv_lora_rank, out_token_stride >= num_heads · "
        "v_head_dim, num_heads · ⌈v_head_dim / ",
        kVUpRows, "⌉ <= 65535"));
  }
  attention_detail::SplitKvCombineArgs combine;
  if (absl::Status s = EnqueueLatentAttention(q_latent, q_token_stride, cache, block_size, batch,
                                              dims, workspace, out_latent, stream, &combine,
                                              l2_prefetch);
      !s.ok()) {
    return s;
  }
  VUpArgs a;
  a.query_start_loc = batch.query_start_loc;
  a.partial_ml = combine.partial_ml;
  a.partial_out = combine.partial_out;
  a.latent = out_latent;
  a.w = w_uv;
  a.w_head_stride = w_head_stride;
  a.out = out;
  a.out_token_stride = out_token_stride;
  a.num_splits = combine.num_splits;
  a.num_tokens = static_cast<int>(batch.num_tokens);
  a.num_heads = static_cast<int>(dims.num_heads);
  a.rank = static_cast<int>(dims.kv_lora_rank);
  a.dv = static_cast<int>(v_head_dim);
  a.slices = static_cast<int>((v_head_dim + kVUpRows - 1) / kVUpRows);
  a.w_vec = cuda_detail::Aligned16(w_uv) && w_head_stride % 8 == 0 && a.rank % 8 == 0;
  PrefetchArgs(l2_prefetch, MlaL2PrefetchSite::kCombine, a.pf_ptr, a.pf_bytes);
  const dim3 grid(static_cast<unsigned>(batch.max_query_len),
                  static_cast<unsigned>(batch.num_sequences),
                  static_cast<unsigned>(dims.num_heads * a.slices));
  const int bits = MlaDecodePdlBits();
  const bool early = (bits & kMlaPdlVUpPreload) != 0;
  a.trigger = (bits & kMlaPdlVUpTrigger) != 0;
  SLUICE_CUDA_RETURN_IF_ERROR(
      attention_detail::LaunchKernelMaybePdl(
          early ? &MlaCombineVUpKernel<true> : &MlaCombineVUpKernel<false>, grid,
          dim3(kVUpThreads), 0, stream,
          MlaDecodePdl() || (bits & (kMlaPdlVUpPreload | kMlaPdlVUpTrigger)) != 0, a),
      "MlaLatentAttentionVUpCuda: launch");
  return CudaLaunchStatus("MlaLatentAttentionVUpCuda combine + W_UV");
}

}  // namespace sluice::kernels
