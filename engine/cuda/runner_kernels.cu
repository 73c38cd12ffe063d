#include "engine/cuda/runner_kernels.h"

#include <cfloat>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/cuda/pdl.cuh"

namespace sluice::cuda_runner {
namespace {

// PdlEnter starts the kernels of a decode step below: as programmatic dependents
// (the launchers' `pdl`, kernels/cuda/pdl.cuh) the next kernel may launch once every block has
// started, and nothing is read (earlier kernels' outputs) or written (an earlier kernel may
// still read the buffer) before the previous kernel has completed. No-ops in a normal launch.
__device__ __forceinline__ void PdlEnter() {
  kernels::cuda_detail::LaunchDependents();
  kernels::cuda_detail::GridDependencyWait();
}

__global__ void ResolveTokenIdsKernel(int32_t* ids, int64_t n, const int32_t* sampled) {
  const int64_t t = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (t < n && ids[t] < 0) ids[t] = sampled[-ids[t] - 1];
}

// One block per output row; 16-byte vectors when the row allows (dim % 8 == 0, aligned).
__global__ void GatherRowsKernel(const bf16* in, const int32_t* idx, int64_t dim, bf16* out,
                                 bool vec) {
  PdlEnter();
  const int64_t r = blockIdx.x;
  const bf16* src = in + int64_t{idx[r]} * dim;
  bf16* dst = out + r * dim;
  if (vec) {
    const int4* s = reinterpret_cast<const int4*>(src);
    int4* d = reinterpret_cast<int4*>(dst);
    for (int64_t i = threadIdx.x; i < dim / 8; i += blockDim.x) d[i] = s[i];
  } else {
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) dst[i] = src[i];
  }
}

// Keeps the larger value, the lower index on ties; NaN compares false so never replaces.
__device__ __forceinline__ void ArgmaxCombine(float& best, int32_t& best_idx, float v,
                                              int32_t i) {
  if (v > best || (v == best && i < best_idx)) {
    best = v;
    best_idx = i;
  }
}

constexpr int kArgmaxThreads = 1024;
constexpr int kArgmaxUnroll = 8;

// One block per row. The row (128k bf16 for Llama-3 = 256 KiB, fresh in L2 from the LM head)
// is read in 16-byte vectors, kArgmaxUnroll independent loads per thread in flight: a scalar
// loop keeps one 2-byte load per thread outstanding and took 49 us on an H200 (latency-bound
// on one SM); the vector loop with 4 loads in flight needed ~4 round trips and took 10 us (22 us
// for 256 rows, eager with events); 8 in flight halve the rounds (4 KiB per warp per round,
// 32 registers). Each thread walks its indices in increasing
// order, so ArgmaxCombine keeps the lowest index on ties within a thread and across the
// reductions below.
__global__ void ArgmaxRowsKernel(const bf16* logits, int64_t vocab, bool vec, int32_t* out) {
  PdlEnter();
  const bf16* row = logits + blockIdx.x * vocab;
  float best = -FLT_MAX;
  int32_t best_idx = INT32_MAX;
  int64_t scalar_begin = 0;
  if (vec) {
    const auto* row8 = reinterpret_cast<const kernels::cuda_detail::Bf16x8*>(row);
    const int64_t n8 = vocab / 8;
    const int64_t step = blockDim.x;
    // Every round issues kArgmaxUnroll predicated loads (a separate remainder loop would
    // serialize up to kArgmaxUnroll - 1 further round trips).
    for (int64_t c = threadIdx.x; c < n8; c += kArgmaxUnroll * step) {
      kernels::cuda_detail::Bf16x8 v[kArgmaxUnroll];
#pragma unroll
      for (int u = 0; u < kArgmaxUnroll; ++u) {
        if (c + u * step < n8) v[u] = kernels::cuda_detail::LoadVec(row8 + c + u * step);
      }
#pragma unroll
      for (int u = 0; u < kArgmaxUnroll; ++u) {
        if (c + u * step >= n8) break;
        float f[8];
        kernels::cuda_detail::ToFloat8(v[u], f);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          ArgmaxCombine(best, best_idx, f[e], static_cast<int32_t>((c + u * step) * 8 + e));
        }
      }
    }
    scalar_begin = n8 * 8;
  }
  for (int64_t j = scalar_begin + threadIdx.x; j < vocab; j += blockDim.x) {
    ArgmaxCombine(best, best_idx, __bfloat162float(row[j]), static_cast<int32_t>(j));
  }
  for (int off = 16; off > 0; off >>= 1) {
    const float v = __shfl_xor_sync(0xffffffffu, best, off);
    const int32_t i = __shfl_xor_sync(0xffffffffu, best_idx, off);
    ArgmaxCombine(best, best_idx, v, i);
  }
  __shared__ float s_val[kArgmaxThreads / 32];
  __shared__ int32_t s_idx[kArgmaxThreads / 32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    s_val[warp] = best;
    s_idx[warp] = best_idx;
  }
  __syncthreads();
  if (warp == 0) {
    const int warps = blockDim.x / 32;
    best = lane < warps ? s_val[lane] : -FLT_MAX;
    best_idx = lane < warps ? s_idx[lane] : INT32_MAX;
    for (int off = 16; off > 0; off >>= 1) {
      const float v = __shfl_xor_sync(0xffffffffu, best, off);
      const int32_t i = __shfl_xor_sync(0xffffffffu, best_idx, off);
      ArgmaxCombine(best, best_idx, v, i);
    }
    // A row of only NaN/-inf: fall back to token 0 rather than an invalid id.
    if (lane == 0) out[blockIdx.x] = best_idx == INT32_MAX ? 0 : best_idx;
  }
}

constexpr int kLogprobThreads = 256;

// One block per row. The chosen token is the row's argmax (ArgmaxRowsKernel), so its logit m is
// the maximum and logit_m - logsumexp = -log(sum_j exp(x_j - m)): no max pass, every term <= 1,
// the sum >= 1. NaN and -inf entries are skipped (x > -inf is false for both), as the host
// sampler's LogSumExp does. A row whose chosen logit is not > -inf (all -inf/NaN) gets NaN, as
// the host's raw[0] - (-inf) of such a row is NaN or inf - inf.
__global__ void GreedyLogprobRowsKernel(const bf16* logits, const int32_t* ids, int64_t vocab,
                                        bool vec, float* out) {
  const bf16* row = logits + blockIdx.x * vocab;
  const float m = __bfloat162float(row[ids[blockIdx.x]]);
  if (!(m > -INFINITY)) {  // uniform over the block: every thread returns
    if (threadIdx.x == 0) out[blockIdx.x] = NAN;
    return;
  }
  float sum = 0.0f;
  int64_t scalar_begin = 0;
  if (vec) {
    const auto* row8 = reinterpret_cast<const kernels::cuda_detail::Bf16x8*>(row);
    const int64_t n8 = vocab / 8;
    for (int64_t c = threadIdx.x; c < n8; c += blockDim.x) {
      float f[8];
      kernels::cuda_detail::ToFloat8(kernels::cuda_detail::LoadVec(row8 + c), f);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        if (f[e] > -INFINITY) sum += expf(f[e] - m);
      }
    }
    scalar_begin = n8 * 8;
  }
  for (int64_t j = scalar_begin + threadIdx.x; j < vocab; j += blockDim.x) {
    const float x = __bfloat162float(row[j]);
    if (x > -INFINITY) sum += expf(x - m);
  }
  for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  __shared__ float s_sum[kLogprobThreads / 32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) s_sum[warp] = sum;
  __syncthreads();
  if (warp == 0) {
    sum = lane < kLogprobThreads / 32 ? s_sum[lane] : 0.0f;
    for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    if (lane == 0) out[blockIdx.x] = -logf(sum);
  }
}

__global__ void FillDummyKernel(bf16* out, int64_t n, uint64_t seed, int init) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += stride) {
    float v = 0.0f;
    if (init == static_cast<int>(DummyInit::kNormal)) {
      v = DummyNormal(seed, static_cast<uint64_t>(i));
    } else if (init == static_cast<int>(DummyInit::kOnes)) {
      v = 1.0f;
    }
    out[i] = __float2bfloat16_rn(v);
  }
}

constexpr int kHeadNormThreads = 256;

// One warp per (token, head): heads [0, num_heads) are q (q_weight), the next num_kv_heads are
// k (k_weight), contiguous in the row. The warp index is uniform across a warp (blockDim is a
// multiple of 32), so the early exit leaves whole warps and the full-mask shuffles stay valid.
// Each lane reads and writes only its own channels (i ≡ lane mod 32), so in place is race-free.
__global__ void QkHeadRmsNormKernel(bf16* qkv, int64_t num_tokens, int64_t token_stride,
                                    int num_heads, int num_kv_heads, int head_dim,
                                    const bf16* q_weight, const bf16* k_weight, float eps) {
  PdlEnter();  // before the early exit below
  const int heads = num_heads + num_kv_heads;
  const int64_t warp = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (warp >= num_tokens * heads) return;
  const int64_t t = warp / heads;
  const int h = static_cast<int>(warp % heads);
  bf16* x = qkv + t * token_stride + int64_t{h} * head_dim;
  const bf16* w = h < num_heads ? q_weight : k_weight;
  float ss = 0.0f;
  for (int i = lane; i < head_dim; i += 32) {
    const float v = __bfloat162float(x[i]);
    ss += v * v;
  }
  for (int off = 16; off > 0; off >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
  const float inv = rsqrtf(ss / static_cast<float>(head_dim) + eps);
  for (int i = lane; i < head_dim; i += 32) {
    x[i] = __float2bfloat16_rn(__bfloat162float(x[i]) * inv * __bfloat162float(w[i]));
  }
}

__device__ __forceinline__ uint64_t GlobalTimerNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void SpinKernel(int64_t ns) {
  const uint64_t start = GlobalTimerNs();
  while (GlobalTimerNs() - start < static_cast<uint64_t>(ns)) __nanosleep(1000);
}

}  // namespace

__global__ void HoldSmKernel(int64_t ns) {
  extern __shared__ unsigned char hold_smem[];
  if (threadIdx.x == 0) hold_smem[0] = 0;
  const uint64_t start = GlobalTimerNs();
  while (GlobalTimerNs() - start < static_cast<uint64_t>(ns)) __nanosleep(1000);
}

absl::Status HoldSmsCuda(int64_t ctas, int64_t ns, cudaStream_t stream) {
  if (ctas < 1 || ns < 0) return absl::InvalidArgumentError("HoldSmsCuda: ctas < 1 or ns < 0");
  int device = 0, smem = 0;
  SLUICE_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device), "cudaGetDevice");
  SLUICE_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device),
      "cudaDeviceGetAttribute");
  SLUICE_CUDA_RETURN_IF_ERROR(
      cudaFuncSetAttribute(&HoldSmKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
      "cudaFuncSetAttribute");
  HoldSmKernel<<<static_cast<unsigned>(ctas), 32, static_cast<size_t>(smem), stream>>>(ns);
  return kernels::CudaLaunchStatus("HoldSmKernel");
}

absl::Status SpinCuda(int64_t ns, cudaStream_t stream) {
  if (ns < 0) return absl::InvalidArgumentError("SpinCuda: ns < 0");
  SpinKernel<<<1, 1, 0, stream>>>(ns);
  return kernels::CudaLaunchStatus("SpinKernel");
}

absl::Status ResolveTokenIdsCuda(int32_t* ids, int64_t n, const int32_t* sampled,
                                 cudaStream_t stream) {
  if (n < 0) return absl::InvalidArgumentError("ResolveTokenIdsCuda: n < 0");
  if (n == 0) return absl::OkStatus();
  ResolveTokenIdsKernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(ids, n,
                                                                                      sampled);
  return kernels::CudaLaunchStatus("ResolveTokenIdsKernel");
}

absl::Status GatherRowsCuda(const bf16* in, const int32_t* idx, int64_t rows, int64_t dim,
                            bf16* out, cudaStream_t stream, bool pdl) {
  if (rows < 0 || dim < 1) {
    return absl::InvalidArgumentError(absl::StrCat("GatherRowsCuda: rows ", rows, " dim ", dim));
  }
  if (rows == 0) return absl::OkStatus();
  const bool vec = dim % 8 == 0 && (reinterpret_cast<uintptr_t>(in) & 15) == 0 &&
                   (reinterpret_cast<uintptr_t>(out) & 15) == 0;
  (void)kernels::cuda_detail::LaunchKernelMaybePdl(&GatherRowsKernel, dim3(static_cast<unsigned>(rows)),
                                                   dim3(256), 0, stream, pdl, in,
                                                   idx, dim, out, vec);
  return kernels::CudaLaunchStatus("GatherRowsKernel");
}

absl::Status ArgmaxRowsCuda(const bf16* logits, int64_t rows, int64_t vocab, int32_t* out,
                            cudaStream_t stream, bool pdl) {
  if (rows < 0 || vocab < 1 || vocab > INT32_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("ArgmaxRowsCuda: rows ", rows, " vocab ", vocab));
  }
  if (rows == 0) return absl::OkStatus();
  const bool vec = kernels::cuda_detail::Aligned16(logits) && vocab % 8 == 0;
  (void)kernels::cuda_detail::LaunchKernelMaybePdl(
      &ArgmaxRowsKernel, dim3(static_cast<unsigned>(rows)), dim3(kArgmaxThreads), 0, stream,
      pdl, logits, vocab, vec, out);
  return kernels::CudaLaunchStatus("ArgmaxRowsKernel");
}

absl::Status GreedyLogprobRowsCuda(const bf16* logits, const int32_t* ids, int64_t rows,
                                   int64_t vocab, float* out, cudaStream_t stream) {
  if (rows < 0 || vocab < 1 || vocab > INT32_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("GreedyLogprobRowsCuda: rows ", rows, " vocab ", vocab));
  }
  if (rows == 0) return absl::OkStatus();
  if (logits == nullptr || ids == nullptr || out == nullptr) {
    return absl::InvalidArgumentError("GreedyLogprobRowsCuda: null pointer");
  }
  const bool vec = kernels::cuda_detail::Aligned16(logits) && vocab % 8 == 0;
  GreedyLogprobRowsKernel<<<static_cast<unsigned>(rows), kLogprobThreads, 0, stream>>>(
      logits, ids, vocab, vec, out);
  return kernels::CudaLaunchStatus("GreedyLogprobRowsKernel");
}

absl::Status QkHeadRmsNormCuda(bf16* qkv, int64_t num_tokens, int64_t token_stride,
                               int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                               const bf16* q_weight, const bf16* k_weight, float eps,
                               cudaStream_t stream, bool pdl) {
  if (num_tokens < 0 || num_heads < 1 || num_kv_heads < 1 || head_dim < 1 ||
      num_heads + num_kv_heads > INT32_MAX / head_dim ||
      token_stride < (num_heads + num_kv_heads) * head_dim) {
    return absl::InvalidArgumentError(absl::StrCat(
        "QkHeadRmsNormCuda: num_tokens ", num_tokens, " token_stride ", token_stride,
        " heads ", num_heads, "+", num_kv_heads, " head_dim ", head_dim));
  }
  if (qkv == nullptr || q_weight == nullptr || k_weight == nullptr) {
    return absl::InvalidArgumentError("QkHeadRmsNormCuda: null pointer");
  }
  if (num_tokens == 0) return absl::OkStatus();
  const int64_t warps = num_tokens * (num_heads + num_kv_heads);
  const int64_t blocks = (warps * 32 + kHeadNormThreads - 1) / kHeadNormThreads;
  (void)kernels::cuda_detail::LaunchKernelMaybePdl(
      &QkHeadRmsNormKernel, dim3(static_cast<unsigned>(blocks)), dim3(kHeadNormThreads), 0,
      stream, pdl, qkv, num_tokens, token_stride, static_cast<int>(num_heads),
      static_cast<int>(num_kv_heads), static_cast<int>(head_dim), q_weight, k_weight, eps);
  return kernels::CudaLaunchStatus("QkHeadRmsNormKernel");
}

absl::Status FillDummyCuda(bf16* out, int64_t n, uint64_t tensor_seed, DummyInit init,
                           cudaStream_t stream) {
  if (n < 0) return absl::InvalidArgumentError("FillDummyCuda: n < 0");
  if (n == 0) return absl::OkStatus();
  const int64_t blocks = std::min<int64_t>((n + 255) / 256, 65536);
  FillDummyKernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(out, n, tensor_seed,
                                                                     static_cast<int>(init));
  return kernels::CudaLaunchStatus("FillDummyKernel");
}

}  // namespace sluice::cuda_runner
