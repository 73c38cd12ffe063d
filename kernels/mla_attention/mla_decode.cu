// MLA attention kernels of decode steps (mla_attention.cu plans them): the pipelined decode
// kernel (MlaDecodeKernel) and the split-KV combine fused with the W_UV value projection
// (MlaCombineVUpKernel, MlaLatentAttentionVUpCuda).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/mla_attention/mla_attention_device.cuh"

namespace sluice::kernels::mla_detail {
namespace {

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

  // Launched as a programmatic dependent on sm_90+: what the previous kernel wrote (q, the
  // latent rows just appended) is read only after the dependency wait. The wait comes after the
  // step metadata reads and the copies of the first tiles' rows older than the query's own
  // (pos), which no kernel of the step writes (mla_attention_cuda.h states that contract); Q
  // and row pos are read after it. The combine + W_UV kernel after this one may get resident
  // once this grid is past its wait.
  auto wait = [&] {
    attention_detail::GridDependencyWait();
    attention_detail::LaunchDependents();
  };
  const int seq = blockIdx.z;
  const int split = blockIdx.x;
  const int q_begin = args.query_start_loc[seq];
  if (args.query_start_loc[seq + 1] <= q_begin) {  // no query token (uniform)
    wait();  // every path waits (pdl.cuh)
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

  // Q rows are loaded after the dependency wait, below; this empty copy group keeps the
  // ring's group count (tile i is group i + 1).
  const bf16* q_row = args.q + static_cast<int64_t>(q_begin) * args.q_token_stride +
                      static_cast<int64_t>(h0) * width;
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
  for (int st = 0; st < kDecStages - 1; ++st) load(st, true);
  {
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
      RescalePv<1, kDecTile, kDecPPitch>(acc, alpha_s, p_s, k_s, pitch, col0, args.rank, lane);
    }
  }
  CpAsyncWait<0>();  // no copy may land after the CTA exits (empty groups only, or Q)
  __syncthreads();   // m_s, l_s final (also when no tile ran)
  StoreRows<1>(args, acc, m_s, l_s, 1, heads, q_begin, h0, split, warp, lane);
}

// Decode attention's epilogue (MlaLatentAttentionVUpCuda): the split-KV combine of one (query
// token, head) row and the W_UV value projection of a slice of its output in one CTA. Grid
// (max_query_len, num_sequences, num_heads · slices) like SplitKvCombineKernel's, rows past a
// sequence's query tokens idle. The merge is SplitKvCombineKernel's arithmetic in its order (so
// the merged row equals the bf16 out_latent the combine writes), or, without a split, the bf16
// row the attention kernel wrote; then, from those bf16 values in shared memory,
//   out[token, h·dv + j] = bf16(Σ_c w[h·w_head_stride + j·rank + c] · o[c])   (fp32)
// for the slice's kVUpRows rows j, warp w rows j0 + w and j0 + w + 8, lanes over channels.
// Every slice merges its row again (an L2 read of the partials: cheap next to a launch).
// kEarly (pdl_bits & kMlaPdlVUpPreload): the block's W_UV vectors (w_vec; no kernel of
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

}  // namespace

absl::Status LaunchMlaDecode(const MlaArgs& args, dim3 grid, int stages, bool pdl,
                             cudaStream_t stream) {
  const size_t smem = DecodeSmemBytes(args.width, stages);
  auto* kernel = stages == kDecStagesShallow ? &MlaDecodeKernel<kDecStagesShallow>
                                             : &MlaDecodeKernel<kDecStagesDeep>;
  SLUICE_CUDA_RETURN_IF_ERROR(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(smem)),
      "MlaLatentAttentionCuda: cudaFuncSetAttribute");
  SLUICE_CUDA_RETURN_IF_ERROR(attention_detail::LaunchKernelMaybePdl(
                                  kernel, grid, dim3(kTcThreads), smem, stream, pdl, args),
                              "MlaLatentAttentionCuda: decode launch");
  return absl::OkStatus();
}

absl::Status LaunchMlaCombineVUp(const VUpArgs& a, dim3 grid, bool early, bool pdl,
                                 cudaStream_t stream) {
  SLUICE_CUDA_RETURN_IF_ERROR(
      attention_detail::LaunchKernelMaybePdl(
          early ? &MlaCombineVUpKernel<true> : &MlaCombineVUpKernel<false>, grid,
          dim3(kVUpThreads), 0, stream, pdl, a),
      "MlaLatentAttentionVUpCuda: launch");
  return absl::OkStatus();
}

}  // namespace sluice::kernels::mla_detail
