// Internal to kernels/mla_attention (not an API): what the MLA attention kernels
// (mla_prefill.cu, mla_decode.cu) and their planner (mla_attention.cu) share: the kernel
// arguments, tile shapes, shared-memory sizes and the device helpers for latent tiles and
// tensor-core fragments, and the host launchers each kernel file defines.
#ifndef SLUICE_KERNELS_MLA_ATTENTION_MLA_ATTENTION_DEVICE_CUH_
#define SLUICE_KERNELS_MLA_ATTENTION_MLA_ATTENTION_DEVICE_CUH_

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "kernels/attention/attention_device.cuh"
#include "kernels/mla_attention/mla_attention_cuda.h"

namespace sluice::kernels::mla_detail {

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
};

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

inline size_t SmemBytes(int width) {
  return sizeof(float) * (static_cast<size_t>(kHeads) * width + kHeads * kKeys + 3 * kHeads) +
         sizeof(bf16) * static_cast<size_t>(kKeys) * TilePitch(width);
}

// ---- Tensor-core helpers (MlaLatentMmaKernel, MlaPrefillMmaKernel, MlaDecodeKernel) ----
constexpr int kTcThreads = 256;   // 8 warps
constexpr int kTcTile = 64;       // latent rows per tile: 8 warps × 8 keys of an mma n-tile
constexpr int kTcMaxRank = 512;   // 8 warps × 64 latent channels
constexpr int kTcMaxWidth = 768;  // keeps T = 4 within 227 KB of shared memory
constexpr int kTcPrefillTokens = 4;
constexpr int kSPitch = kTcTile + 4;  // fp32 scores: +4 words keeps the float2 stores spread
constexpr int kPPitch = kTcTile + 8;  // bf16 probabilities: +16 bytes, conflict-free A loads

inline bool UseTensorCores(const MlaDims& d) {
  const int64_t width = d.LatentWidth();
  return d.kv_lora_rank % 16 == 0 && d.kv_lora_rank <= kTcMaxRank && width % 16 == 0 &&
         width <= kTcMaxWidth;
}

inline size_t TcSmemBytes(int tokens, int width) {
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

// RescalePv: O = O·alpha + P·V over this warp's 64 latent channels [col0, col0 + 64) (those
// below `rank`) of T 16-row m-tiles and a kTile-key tile: alpha_s[row] (RescaleRows), P the
// bf16 probabilities at p_s (row pitch kPPitch, m-tile t at row 16·t), V the tile's latent
// rows at k_s (row pitch `pitch`).
template <int T, int kTile, int kPPitch>
__device__ __forceinline__ void RescalePv(float (&acc)[T][8][4], const float* alpha_s,
                                          const bf16* p_s, const bf16* k_s, int pitch, int col0,
                                          int rank, int lane) {
  RescaleRows<T>(acc, alpha_s, lane);
#pragma unroll
  for (int ks = 0; ks < kTile; ks += 16) {
    uint32_t a[T][4];
#pragma unroll
    for (int t = 0; t < T; ++t) LoadA(a[t], p_s + t * 16 * kPPitch + ks, kPPitch, lane);
    // Matrices 0/1: keys ks..ks+7 / ks+8..ks+15 at channels n..n+7; 2/3: channels n+8..
    const bf16* v =
        k_s + (ks + (lane & 7) + ((lane >> 3) & 1) * 8) * pitch + col0 + (lane >> 4) * 8;
#pragma unroll
    for (int np = 0; np < 4; ++np) {
      if (col0 + np * 16 < rank) {
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

// ---- MlaPrefillMmaKernel's shape (mla_prefill.cu) ----
constexpr int kPfTokens = kTcPrefillTokens;  // query tokens per CTA
constexpr int kPfRows = 16 * kPfTokens;      // M: row r = token r / 16, head h0 + r % 16
constexpr int kPfTile = kTcTile;             // keys per tile (the split plan's granule)
constexpr int kPfPPitch = kPfTile + 8;       // bf16 probabilities: conflict-free ldmatrix rows

inline size_t PrefillSmemBytes(int width) {
  return sizeof(bf16) * ((kPfRows + 2 * static_cast<size_t>(kPfTile)) * width +
                         static_cast<size_t>(kPfRows) * kPfPPitch) +
         sizeof(float) * 5 * kPfRows;
}

// ---- MlaDecodeKernel's shape (mla_decode.cu) ----
constexpr int kDecTile = 32;
// Ring depths: 4 (one CTA per SM, 3 tiles in flight) or 2 (two CTAs per SM, each with one
// tile in flight while it computes; one CTA's barriers hide behind the other's work).
constexpr int kDecStagesDeep = 4, kDecStagesShallow = 2;
constexpr int kDecSPitch = kDecTile + 4;  // fp32 scores
constexpr int kDecPPitch = kDecTile + 8;  // bf16 probabilities: conflict-free ldmatrix rows

inline size_t DecodeSmemBytes(int width, int stages) {
  const size_t pitch = TilePitch(width);
  return sizeof(bf16) * (kHeads + static_cast<size_t>(stages) * kDecTile) * pitch +
         sizeof(float) * 2 * kHeads * kDecSPitch + sizeof(bf16) * kHeads * kDecPPitch +
         sizeof(float) * 3 * kHeads;
}

// ---- MlaCombineVUpKernel's arguments (mla_decode.cu) ----
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
};

// Host launchers (errors of cudaFuncSetAttribute or of the launch call; a kernel's own launch
// error shows in the caller's CudaLaunchStatus). Grids as the planner computes them.
// mla_prefill.cu: MlaLatentKernel (fp32 FMAs, any dims it serves), and the tensor-core
// prefill kernels: MlaPrefillMmaKernel when `pipelined`, else MlaLatentMmaKernel<4>.
absl::Status LaunchMlaFp32(const MlaArgs& args, dim3 grid, cudaStream_t stream);
absl::Status LaunchMlaPrefillTc(const MlaArgs& args, dim3 grid, bool pipelined,
                                cudaStream_t stream);
// mla_decode.cu: MlaDecodeKernel with a ring of `stages` (kDecStagesDeep or kDecStagesShallow)
// and MlaCombineVUpKernel (`early`: W_UV loaded before its dependency wait); `pdl`: as
// programmatic dependent launches.
absl::Status LaunchMlaDecode(const MlaArgs& args, dim3 grid, int stages, bool pdl,
                             cudaStream_t stream);
absl::Status LaunchMlaCombineVUp(const VUpArgs& a, dim3 grid, bool early, bool pdl,
                                 cudaStream_t stream);

}  // namespace sluice::kernels::mla_detail

#endif  // SLUICE_KERNELS_MLA_ATTENTION_MLA_ATTENTION_DEVICE_CUH_
