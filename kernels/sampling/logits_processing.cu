// LogitsProcessingCuda and LogprobRowsCuda (logits_processing_cuda.h).
//
// Penalties without sorting: each row's CTA marks its tokens in a per-row uint32 workspace
// (bit 31: listed in prompt ∪ output for the repetition penalty; bits 0..30: the output count)
// with global atomics, then walks the lists again and claims each mark with atomicExch(0): the
// one thread that sees it non-zero owns that token, applies the penalties once with the count,
// and leaves the mark cleared, so the workspace is zero again for the next call and no token is
// written twice (deterministic).
//
// Top logprobs: each thread keeps its best N (value, id) pairs, sorted, while the CTA sums
// exp(raw - max); then N rounds of a block-wide arg-best over the threads' heads emit the
// entries in order. Ranking (value descending, lower id first) makes every pair distinct.
#include <cmath>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/sampling/logits_processing_cuda.h"

namespace sluice::kernels {
namespace {

constexpr int kThreads = 256;
constexpr uint32_t kListedBit = 0x80000000u;
constexpr uint32_t kCountMask = 0x7fffffffu;

// An id of a list resolved: placeholders read prev_sampled; -1 when unresolvable.
__device__ __forceinline__ int32_t ResolveId(int32_t id, const int32_t* prev_sampled,
                                             int64_t num_prev) {
  if (id >= 0) return id;
  const int64_t r = -static_cast<int64_t>(id) - 1;
  return prev_sampled != nullptr && r < num_prev ? prev_sampled[r] : -1;
}

__global__ void __launch_bounds__(kThreads)
    LogitsProcessingKernel(const bf16* logits, int64_t vocab, bool vec,
                           const LogitsProcessingRow* params, const int32_t* ids,
                           const uint32_t* masks, const int32_t* prev_sampled, int64_t num_prev,
                           float* out, uint32_t* workspace) {
  const int64_t r = blockIdx.x;
  const bf16* in_row = logits + r * vocab;
  float* out_row = out + r * vocab;
  uint32_t* marks = workspace + r * vocab;
  const LogitsProcessingRow p = params[r];

  // The row widened to fp32 (exact), -inf where the grammar mask clears the token.
  const uint32_t* mask = p.mask_begin >= 0 ? masks + p.mask_begin : nullptr;
  auto allowed = [mask](int64_t t) { return mask == nullptr || ((mask[t >> 5] >> (t & 31)) & 1u); };
  int64_t scalar_begin = 0;
  if (vec) {
    const int64_t n8 = vocab / 8;
    for (int64_t c = threadIdx.x; c < n8; c += blockDim.x) {
      float v[8];
      cuda_detail::LoadBf16x8(in_row + c * 8, v);
      if (mask != nullptr) {
        // The 8 tokens share one word (c * 8 is a multiple of 8).
        const uint32_t bits = mask[(c * 8) >> 5] >> ((c * 8) & 31);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          if (!((bits >> e) & 1u)) v[e] = -INFINITY;
        }
      }
      auto* o = reinterpret_cast<float4*>(out_row + c * 8);
      o[0] = make_float4(v[0], v[1], v[2], v[3]);
      o[1] = make_float4(v[4], v[5], v[6], v[7]);
    }
    scalar_begin = n8 * 8;
  }
  for (int64_t j = scalar_begin + threadIdx.x; j < vocab; j += blockDim.x) {
    out_row[j] = allowed(j) ? __bfloat162float(in_row[j]) : -INFINITY;
  }

  const bool repetition = p.repetition_penalty != 1.0f;
  const bool counted = p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f;
  if (repetition || counted) {
    // Mark. The prompt matters only to the repetition penalty.
    if (repetition) {
      for (int32_t i = p.prompt_begin + threadIdx.x; i < p.prompt_end; i += blockDim.x) {
        const int32_t id = ResolveId(ids[i], prev_sampled, num_prev);
        if (id >= 0 && id < vocab) atomicOr(&marks[id], kListedBit);
      }
    }
    for (int32_t i = p.output_begin + threadIdx.x; i < p.output_end; i += blockDim.x) {
      const int32_t id = ResolveId(ids[i], prev_sampled, num_prev);
      if (id < 0 || id >= vocab) continue;
      if (counted) {
        atomicAdd(&marks[id], 1u);
      } else {
        atomicOr(&marks[id], kListedBit);
      }
    }
    __syncthreads();  // marks and the widened row are visible to the whole CTA
    // Claim and apply, once per distinct token.
    auto apply = [&](int32_t id) {
      if (id < 0 || id >= vocab) return;
      const uint32_t mark = atomicExch(&marks[id], 0u);
      if (mark == 0) return;  // another thread owns it (or it was claimed already)
      float v = out_row[id];
      if (repetition) {
        v = v > 0.0f ? __fdiv_rn(v, p.repetition_penalty) : __fmul_rn(v, p.repetition_penalty);
      }
      const uint32_t count = mark & kCountMask;
      if (counted && count > 0) {
        v = __fsub_rn(v, __fmul_rn(p.frequency_penalty, static_cast<float>(count)));
        v = __fsub_rn(v, p.presence_penalty);
      }
      out_row[id] = v;
    };
    if (repetition) {
      for (int32_t i = p.prompt_begin + threadIdx.x; i < p.prompt_end; i += blockDim.x) {
        apply(ResolveId(ids[i], prev_sampled, num_prev));
      }
    }
    for (int32_t i = p.output_begin + threadIdx.x; i < p.output_end; i += blockDim.x) {
      apply(ResolveId(ids[i], prev_sampled, num_prev));
    }
  }
  if (p.suppress_end > p.suppress_begin) {
    __syncthreads();  // penalized values are written before suppression overrides them
    for (int32_t i = p.suppress_begin + threadIdx.x; i < p.suppress_end; i += blockDim.x) {
      const int32_t id = ResolveId(ids[i], prev_sampled, num_prev);
      if (id >= 0 && id < vocab) out_row[id] = -INFINITY;
    }
  }
}

// (value, id) ranking: higher value first, then the lower id. NaN is never ranked (callers
// skip it); the empty sentinel is (-inf, INT32_MAX), below every real entry.
__device__ __forceinline__ bool Better(float a, int32_t a_id, float b, int32_t b_id) {
  return a > b || (a == b && a_id < b_id);
}

template <typename F>
__device__ __forceinline__ void ForEachRaw(const bf16* row, int64_t vocab, bool vec, F&& f) {
  int64_t scalar_begin = 0;
  if (vec) {
    const int64_t n8 = vocab / 8;
    for (int64_t c = threadIdx.x; c < n8; c += blockDim.x) {
      float v[8];
      cuda_detail::LoadBf16x8(row + c * 8, v);
#pragma unroll
      for (int e = 0; e < 8; ++e) f(static_cast<int32_t>(c * 8 + e), v[e]);
    }
    scalar_begin = n8 * 8;
  }
  for (int64_t j = scalar_begin + threadIdx.x; j < vocab; j += blockDim.x) {
    f(static_cast<int32_t>(j), __bfloat162float(row[j]));
  }
}

__global__ void __launch_bounds__(kThreads)
    LogprobRowsKernel(const bf16* logits, int64_t vocab, bool vec,
                      const LogitsProcessingRow* mask_rows, const uint32_t* masks,
                      const int32_t* tokens,
                      const int32_t* top_counts, int32_t max_top, float* logprobs,
                      int32_t* top_ids, float* top_logprobs) {
  __shared__ float s_val[kThreads / 32];
  __shared__ int32_t s_id[kThreads / 32];
  __shared__ float s_scratch[32];
  const int64_t r = blockIdx.x;
  const bf16* row = logits + r * vocab;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int32_t mask_begin = mask_rows != nullptr ? mask_rows[r].mask_begin : -1;
  const uint32_t* mask = mask_begin >= 0 ? masks + mask_begin : nullptr;
  auto masked = [mask](int32_t id, float v) {
    return mask == nullptr || ((mask[id >> 5] >> (id & 31)) & 1u) ? v : -INFINITY;
  };

  // Pass 1: the maximum over entries > -inf.
  float row_max = -INFINITY;
  ForEachRaw(row, vocab, vec, [&](int32_t id, float v) {
    v = masked(id, v);
    if (v > row_max) row_max = v;
  });
  for (int off = 16; off > 0; off >>= 1) {
    row_max = fmaxf(row_max, __shfl_xor_sync(0xffffffffu, row_max, off));
  }
  if (lane == 0) s_val[warp] = row_max;
  __syncthreads();
  row_max = -INFINITY;
  for (int w = 0; w < kThreads / 32; ++w) row_max = fmaxf(row_max, s_val[w]);
  const bool any_finite = row_max > -INFINITY;
  __syncthreads();  // s_val is reused by the top-N rounds

  // Pass 2: Σ exp(raw - max) and each thread's best `count` entries.
  int32_t count = top_counts != nullptr ? min(max(top_counts[r], 0), max_top) : 0;
  if (static_cast<int64_t>(count) > vocab) count = static_cast<int32_t>(vocab);
  float best_v[kMaxTopLogprobs] = {};
  int32_t best_id[kMaxTopLogprobs] = {};
  int size = 0;
  float sum = 0.0f;
  ForEachRaw(row, vocab, vec, [&](int32_t id, float v) {
    v = masked(id, v);
    if (any_finite && v > -INFINITY) sum += expf(v - row_max);
    if (count == 0 || isnan(v)) return;
    if (size == count && !Better(v, id, best_v[size - 1], best_id[size - 1])) return;
    int k = size < count ? size++ : size - 1;  // the slot freed (the last one when full)
    while (k > 0 && Better(v, id, best_v[k - 1], best_id[k - 1])) {
      best_v[k] = best_v[k - 1];
      best_id[k] = best_id[k - 1];
      --k;
    }
    best_v[k] = v;
    best_id[k] = id;
  });
  sum = cuda_detail::BlockSum(sum, s_scratch);
  // log_softmax = (v - max) - log(sum), as SampleRowsCuda computes the chosen token's; with
  // nothing finite the CPU's v - (-inf) (NaN or +inf); here NaN-propagating v - (-inf).
  const float log_sum = any_finite ? logf(sum) : 0.0f;
  const float shift = any_finite ? row_max : -INFINITY;

  if (threadIdx.x == 0) {
    const int32_t t = tokens[r];
    logprobs[r] = any_finite && t >= 0 && t < vocab
                      ? (masked(t, __bfloat162float(row[t])) - row_max) - log_sum
                      : NAN;
  }
  // N rounds of a block arg-best over the threads' heads.
  int head = 0;
  int32_t j = 0;
  for (; j < count; ++j) {
    float v = head < size ? best_v[head] : -INFINITY;
    int32_t id = head < size ? best_id[head] : INT32_MAX;
    for (int off = 16; off > 0; off >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, v, off);
      const int32_t oid = __shfl_xor_sync(0xffffffffu, id, off);
      if (Better(ov, oid, v, id)) {
        v = ov;
        id = oid;
      }
    }
    if (lane == 0) {
      s_val[warp] = v;
      s_id[warp] = id;
    }
    __syncthreads();
    v = s_val[0];
    id = s_id[0];
    for (int w = 1; w < kThreads / 32; ++w) {
      if (Better(s_val[w], s_id[w], v, id)) {
        v = s_val[w];
        id = s_id[w];
      }
    }
    __syncthreads();  // s_val / s_id are rewritten next round
    if (id == INT32_MAX) break;  // uniform: no entries left (NaN rows)
    if (head < size && best_id[head] == id) ++head;
    if (threadIdx.x == 0) {
      top_ids[r * max_top + j] = id;
      top_logprobs[r * max_top + j] = (v - shift) - log_sum;
    }
  }
  if (threadIdx.x == 0) {
    for (; j < max_top; ++j) {
      top_ids[r * max_top + j] = -1;
      top_logprobs[r * max_top + j] = NAN;
    }
  }
}

}  // namespace

size_t LogitsProcessingCudaWorkspaceBytes(int64_t rows, int64_t vocab) {
  return rows > 0 && vocab > 0 ? static_cast<size_t>(rows) * static_cast<size_t>(vocab) * 4 : 0;
}

absl::Status LogitsProcessingCuda(const bf16* logits, int64_t rows, int64_t vocab,
                                  const LogitsProcessingRow* params, const int32_t* ids,
                                  const uint32_t* masks, const int32_t* prev_sampled,
                                  int64_t num_prev, float* out,
                                  void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  if (rows < 0 || rows > INT32_MAX || vocab < 1 || vocab > INT32_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("LogitsProcessingCuda: rows ", rows, " vocab ", vocab));
  }
  if (workspace_bytes < LogitsProcessingCudaWorkspaceBytes(rows, vocab)) {
    return absl::InvalidArgumentError(
        absl::StrCat("LogitsProcessingCuda: workspace ", workspace_bytes, " bytes < ",
                     LogitsProcessingCudaWorkspaceBytes(rows, vocab)));
  }
  if (rows == 0) return absl::OkStatus();
  if (logits == nullptr || params == nullptr || out == nullptr || workspace == nullptr) {
    return absl::InvalidArgumentError("LogitsProcessingCuda: null pointer");
  }
  const bool vec =
      cuda_detail::Aligned16(logits) && cuda_detail::Aligned16(out) && vocab % 8 == 0;
  LogitsProcessingKernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
      logits, vocab, vec, params, ids, masks, prev_sampled, num_prev < 0 ? 0 : num_prev, out,
      static_cast<uint32_t*>(workspace));
  return CudaLaunchStatus("LogitsProcessingKernel");
}

absl::Status LogprobRowsCuda(const bf16* logits, int64_t rows, int64_t vocab,
                             const LogitsProcessingRow* mask_rows, const uint32_t* masks,
                             const int32_t* tokens, const int32_t* top_counts, int32_t max_top,
                             float* logprobs, int32_t* top_ids, float* top_logprobs,
                             cudaStream_t stream) {
  if (rows < 0 || rows > INT32_MAX || vocab < 1 || vocab > INT32_MAX || max_top < 0 ||
      max_top > kMaxTopLogprobs) {
    return absl::InvalidArgumentError(absl::StrCat("LogprobRowsCuda: rows ", rows, " vocab ",
                                                   vocab, " max_top ", max_top));
  }
  if (rows == 0) return absl::OkStatus();
  if (logits == nullptr || tokens == nullptr || logprobs == nullptr ||
      (max_top > 0 && (top_ids == nullptr || top_logprobs == nullptr))) {
    return absl::InvalidArgumentError("LogprobRowsCuda: null pointer");
  }
  const bool vec = cuda_detail::Aligned16(logits) && vocab % 8 == 0;
  LogprobRowsKernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
      logits, vocab, vec, mask_rows, masks, tokens, top_counts, max_top, logprobs, top_ids,
      top_logprobs);
  return CudaLaunchStatus("LogprobRowsKernel");
}

}  // namespace sluice::kernels
