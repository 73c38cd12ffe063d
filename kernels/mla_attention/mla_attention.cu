// CUDA MLA attention core over the paged latent cache (mla_attention_cuda.h).
//
// One CTA serves one query token, a group of up to kHeads heads and one key partition. All
// heads attend over the same latent rows, so each row is loaded once per CTA (cp.async into
// shared memory) and used by every head of the group: the decode step reads each cached row
// once per (token, head group) instead of once per head.
//   scores: warp w computes heads w and w + 8, lane j key j of the 32-key tile (16-byte shared
//           loads of the row, the pre-scaled fp32 query broadcast from shared memory);
//   softmax: online (running max and sum per head, FlashAttention-2 style), base-2;
//   values: thread t accumulates latent channels 2t, 2t+1 for every head of the group.
// Long contexts with few CTAs split the keys across CTAs and merge the normalized partials
// with SplitKvCombineKernel (attention_device.cuh; Flash-Decoding).
// Plain fp32 FMAs, no tensor cores: a correctness-first kernel (decode of DeepSeek-V2-Lite's
// 16 heads is compute-bound here at ~17k FMA per cached row and token).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
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
  bf16* out;
  float* partial_out;
  float2* partial_ml;
};

// Row pitch of the key tile in shared memory: +8 bf16 (16 bytes) shifts consecutive rows by
// 4 banks, so the 8 lanes of each quarter-warp phase of a 16-byte load hit distinct banks.
__host__ __device__ constexpr int TilePitch(int width) { return width + 8; }

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
  int kv_begin = 0, kv_end = pos + 1;
  if (args.num_splits > 1) {
    kv_begin = split * args.partition_tokens;
    kv_end = min(kv_end, kv_begin + args.partition_tokens);
  }
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
  const int chunks = width / 8;

  for (int tile = kv_begin; tile < kv_end; tile += kKeys) {
    for (int c = threadIdx.x; c < kKeys * chunks; c += kThreads) {
      const int key = c / chunks;
      const int off = (c - key * chunks) * 8;
      const int j = tile + key;
      const bool live = j < kv_end;
      const bf16* src = args.cache;
      if (live) {
        const int64_t slot =
            static_cast<int64_t>(block_table[j / args.block_size]) * args.block_size +
            j % args.block_size;
        src += slot * width + off;
      }
      CpAsync16(k_s + key * TilePitch(width) + off, src, live ? 16 : 0);
    }
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

struct MlaPlan {
  int num_splits = 1;
  int partition_tokens = 0;
  int head_chunks = 1;
};

MlaPlan Plan(const PagedAttentionCudaBatch& b, const MlaDims& d) {
  MlaPlan plan;
  plan.head_chunks = static_cast<int>((d.num_heads + kHeads - 1) / kHeads);
  int device = 0, sms = 132;
  if (cudaGetDevice(&device) == cudaSuccess) {
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  }
  // Split only when the CTAs fall short of ~2 per SM and partitions keep ≥ kMinPartition keys.
  const int64_t ctas = b.max_query_len * plan.head_chunks * b.num_sequences;
  const int64_t target = 2LL * sms;
  if (ctas < target && b.max_seq_len >= 2 * kMinPartition) {
    int64_t splits = std::min<int64_t>({(target + ctas - 1) / ctas, b.max_seq_len / kMinPartition,
                                        attention_detail::kMaxSplitsDevice});
    if (splits > 1) {
      int64_t part = (b.max_seq_len + splits - 1) / splits;
      part = (part + kKeys - 1) / kKeys * kKeys;
      plan.partition_tokens = static_cast<int>(part);
      plan.num_splits = static_cast<int>((b.max_seq_len + part - 1) / part);
    }
  }
  if (plan.num_splits == 1) plan.partition_tokens = 0;
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

size_t MlaLatentAttentionCudaWorkspaceBytes(const PagedAttentionCudaBatch& batch,
                                            const MlaDims& dims) {
  if (!Validate(batch, dims, 1).ok()) return 0;
  const MlaPlan plan = Plan(batch, dims);
  return attention_detail::SplitKvWorkspaceBytes(plan.num_splits, batch.num_tokens, dims.num_heads,
                                                 dims.kv_lora_rank);
}

absl::Status MlaLatentAttentionCuda(const bf16* q_latent, int64_t q_token_stride, const bf16* cache,
                                    int64_t block_size, const PagedAttentionCudaBatch& batch,
                                    const MlaDims& dims, void* workspace, bf16* out_latent,
                                    cudaStream_t stream) {
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
  if (absl::Status s = CudaLaunchStatus("MlaLatentAttentionCuda"); !s.ok()) return s;
  if (plan.num_splits == 1) return absl::OkStatus();
  attention_detail::LaunchSplitKvCombine(combine, batch.max_query_len, batch.num_sequences, stream);
  return CudaLaunchStatus("MlaLatentAttentionCuda combine");
}

}  // namespace sluice::kernels
