// Device helpers shared by the CUDA attention kernels (paged_decode_*.cu, paged_prefill_*.cu,
// mla_attention.cu): cp.async copies, exp2 on the SFU, and the split-KV combine.
//
// Split-KV (Dao et al., "Flash-Decoding for long-context inference", 2023): a row's keys are
// cut into partitions handled by separate CTAs; each writes its normalized partial output o_i
// and (m_i, l_i) = (running max of the log2-scaled scores, sum of 2^(s - m_i)). They merge as
//   o = Σ_i o_i·l_i·2^(m_i−M) / Σ_i l_i·2^(m_i−M),  M = max_i m_i
// (empty partitions have l_i = 0 and weigh nothing).
#ifndef SLUICE_KERNELS_ATTENTION_ATTENTION_DEVICE_CUH_
#define SLUICE_KERNELS_ATTENTION_ATTENTION_DEVICE_CUH_

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

#include "kernels/cuda/device_utils.cuh"
#include "kernels/cuda/pdl.cuh"

namespace sluice::kernels::attention_detail {

// Shared-memory addresses and plain cp.async copies (kernels/cuda/device_utils.cuh).
using cuda_detail::CpAsync16;
using cuda_detail::CpAsyncCommit;
using cuda_detail::CpAsyncWait;
using cuda_detail::SmemAddr;

// CpAsync16 carrying an L2 cache policy (PTX ISA, "Data Movement and Conversion Instructions:
// cp.async": cp.async.cg.shared.global.L2::cache_hint [dst], [src], 16, src-size,
// cache-policy): with L2EvictFirstPolicy streamed K/V lines are the first the L2 drops. No
// .L2::256B prefetch-size hint: where these copies run the attention is bound by L2 throughput,
// and the hint makes the L2 move more sectors between its partitions.
static __device__ __forceinline__ void CpAsync16EvictFirstNoPrefetch(void* smem, const void* gmem,
                                                                     int src_bytes,
                                                                     uint64_t policy) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(
                   SmemAddr(smem)),
               "l"(gmem), "r"(src_bytes), "l"(policy));
}
// An L2 cache policy marking every line it covers evict-first (PTX ISA, "Data Movement and
// Conversion Instructions: createpolicy"; fraction 1.0 = all accesses made with it).
static __device__ __forceinline__ uint64_t L2EvictFirstPolicy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}
// 2^x on the special-function unit (ex2.approx: ~2 ulp, 2^-inf = 0); inputs are ≤ 0 here.
static __device__ __forceinline__ float Exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Programmatic dependent launch helpers (kernels/cuda/pdl.cuh), under this namespace's names.
using cuda_detail::GridDependencyWait;
using cuda_detail::LaunchDependents;
using cuda_detail::LaunchKernelMaybePdl;

// SplitKvCombineArgs: the partial results of num_splits partitions for the rows
// (token, head) of a step, and where the merged rows go.
//   partial_ml:  [num_splits, num_tokens, num_heads] (m_i, l_i)
//   partial_out: [num_splits, num_tokens, num_heads, dim] normalized fp32
//   out:         [num_tokens, num_heads, dim] bf16
struct SplitKvCombineArgs {
  const int32_t* query_start_loc;  // [num_sequences + 1]
  float2* partial_ml;
  float* partial_out;
  __nv_bfloat16* out;
  int num_splits;
  int num_tokens;
  int num_heads;
  int dim;
};

// Most partitions one combine can merge (its weights live in static shared memory).
constexpr int kMaxSplitsDevice = 1024;

// One CTA per (query token of a sequence, sequence, head): merges the num_splits partial
// outputs of that row (log-sum-exp weights, see above) into bf16 `out`. The first warp stages
// the (m, l) pairs in shared memory (one read of them) and finds the max and the weight sum,
// the CTA turns them into per-split weights, then every thread owns output channels — four at
// a time with 16-byte loads when the partials allow — and keeps 16 splits' loads in flight
// (the merge is latency-bound: a 512-wide MLA row over 32 splits is 32 dependent rounds of
// loads with one channel and 8 loads per round).
static __global__ void SplitKvCombineKernel(const SplitKvCombineArgs args) {
  __shared__ float weight[kMaxSplitsDevice];  // split weight / total weight
  __shared__ float2 ml_s[kMaxSplitsDevice];
  __shared__ float shared_inv;
  GridDependencyWait();  // the partials come from the kernel just before
  LaunchDependents();    // a PDL-launched next kernel may get ready meanwhile
  const int seq = blockIdx.y;
  const int q_begin = args.query_start_loc[seq];
  const int q_len = args.query_start_loc[seq + 1] - q_begin;
  if (static_cast<int>(blockIdx.x) >= q_len) return;
  const int64_t row = static_cast<int64_t>(q_begin + blockIdx.x) * args.num_heads + blockIdx.z;
  const int64_t split_stride = static_cast<int64_t>(args.num_tokens) * args.num_heads;
  const float2* ml = args.partial_ml + row;
  if (threadIdx.x < 32) {
    // Empty partitions (sum 0, max −inf) weigh 0.
    float global_max = -INFINITY;
    for (int sp = threadIdx.x; sp < args.num_splits; sp += 32) {
      const float2 v = ml[sp * split_stride];
      ml_s[sp] = v;
      if (v.y > 0.0f) global_max = fmaxf(global_max, v.x);
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
      global_max = fmaxf(global_max, __shfl_xor_sync(0xffffffffu, global_max, off));
    }
    float den = 0.0f;
    for (int sp = threadIdx.x; sp < args.num_splits; sp += 32) {
      const float2 v = ml_s[sp];  // this lane's own entries
      const float w = v.y > 0.0f ? v.y * Exp2(v.x - global_max) : 0.0f;
      weight[sp] = w;
      den += w;
    }
    den = cuda_detail::WarpSum(den);
    if (threadIdx.x == 0) {
      shared_inv = den > 0.0f ? 1.0f / den : 0.0f;
    }
  }
  __syncthreads();
  const float inv = shared_inv;
  const int64_t stride = split_stride * args.dim;
  const float* src_row = args.partial_out + row * args.dim;
  __nv_bfloat16* out_row = args.out + row * args.dim;
  if (args.dim % 4 == 0 && (reinterpret_cast<uintptr_t>(src_row) & 15u) == 0) {
    const float4* src = reinterpret_cast<const float4*>(src_row);
    const int64_t stride4 = stride / 4;
    for (int d4 = threadIdx.x; d4 < args.dim / 4; d4 += blockDim.x) {
      float4 num = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 16
      for (int sp = 0; sp < args.num_splits; ++sp) {
        const float w = weight[sp];
        const float4 v = src[sp * stride4 + d4];
        num.x += w * v.x;
        num.y += w * v.y;
        num.z += w * v.z;
        num.w += w * v.w;
      }
      // out is 4-byte aligned: two bf16 pairs.
      auto* o = reinterpret_cast<__nv_bfloat162*>(out_row + 4 * d4);
      o[0] = __floats2bfloat162_rn(num.x * inv, num.y * inv);
      o[1] = __floats2bfloat162_rn(num.z * inv, num.w * inv);
    }
  } else {
    for (int d = threadIdx.x; d < args.dim; d += blockDim.x) {
      float num = 0.0f;
#pragma unroll 16
      for (int sp = 0; sp < args.num_splits; ++sp) num += weight[sp] * src_row[sp * stride + d];
      out_row[d] = __float2bfloat16_rn(num * inv);
    }
  }
}

// SplitWaveFill: how full the waves of `slots` resident CTAs are when `ctas` CTAs each split
// their keys into `splits` partitions (1: every wave full). The split planners (paged attention,
// MLA decode) keep more splits only where this improves by >= 10%.
inline double SplitWaveFill(int64_t ctas, int64_t splits, int64_t slots) {
  const int64_t total = ctas * splits;
  const int64_t waves = (total + slots - 1) / slots;
  return static_cast<double>(total) / static_cast<double>(waves * slots);
}

// SplitKvWorkspaceBytes: device bytes of the partial (m, l) pairs and partial outputs of
// `splits` partitions of tokens × heads rows of width dim (0 without a split).
inline size_t SplitKvWorkspaceBytes(int64_t splits, int64_t tokens, int64_t heads, int64_t dim) {
  if (splits <= 1) return 0;
  const size_t rows =
      static_cast<size_t>(splits) * static_cast<size_t>(tokens) * static_cast<size_t>(heads);
  return rows * sizeof(float2) + rows * static_cast<size_t>(dim) * sizeof(float);
}

// MakeSplitKvCombineArgs carves `workspace` (SplitKvWorkspaceBytes; partial_ml first, which
// keeps both arrays aligned) into the combine's inputs; null pointers without a split.
inline SplitKvCombineArgs MakeSplitKvCombineArgs(void* workspace, const int32_t* query_start_loc,
                                                 int splits, int tokens, int heads, int dim,
                                                 __nv_bfloat16* out) {
  SplitKvCombineArgs a;
  a.query_start_loc = query_start_loc;
  const bool split = splits > 1 && workspace != nullptr;
  a.partial_ml = split ? static_cast<float2*>(workspace) : nullptr;
  a.partial_out =
      split
          ? reinterpret_cast<float*>(static_cast<char*>(workspace) +
                                     static_cast<size_t>(splits) * tokens * heads * sizeof(float2))
          : nullptr;
  a.out = out;
  a.num_splits = splits;
  a.num_tokens = tokens;
  a.num_heads = heads;
  a.dim = dim;
  return a;
}

// Launches SplitKvCombineKernel for every query token of every sequence: grid
// (max_query_len, num_sequences, num_heads); `pdl`: as a programmatic dependent launch.
inline void LaunchSplitKvCombine(const SplitKvCombineArgs& args, int64_t max_query_len,
                                 int64_t num_sequences, cudaStream_t stream, bool pdl = false) {
  const dim3 grid(static_cast<unsigned>(max_query_len), static_cast<unsigned>(num_sequences),
                  static_cast<unsigned>(args.num_heads));
  LaunchKernelMaybePdl(&SplitKvCombineKernel, grid, dim3(128), 0, stream, pdl, args);
}

}  // namespace sluice::kernels::attention_detail

#endif  // SLUICE_KERNELS_ATTENTION_ATTENTION_DEVICE_CUH_
