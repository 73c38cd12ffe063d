// CUDA router logits and top-k routing; see moe_cuda.h for the API and moe_routing.h for the
// formula. The routing kernel mirrors moe_routing_cpu.cc's RouteOne step by step (one warp per
// token) so that the chosen ids are the same, ties included.
#include <cmath>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/moe/moe_cuda.h"
#include "kernels/moe/moe_cuda_detail.cuh"

namespace sluice::kernels {
namespace {

using cuda_detail::Aligned16;
using moe_detail::kWarpDotRows;
using moe_detail::WarpDotRows;

constexpr int kLogitsWarps = 8;  // warps (experts) per block of the router-logits kernel
constexpr int kRouteWarps = 4;   // warps (tokens) per block of the routing kernel
constexpr unsigned kFullMask = 0xffffffffu;

// One warp per (expert, group of kWarpDotRows tokens): the gate row is read once per group.
__global__ void __launch_bounds__(kLogitsWarps * 32)
    RouterLogitsKernel(const bf16* __restrict__ x, const bf16* __restrict__ w_gate, int num_tokens,
                       int hidden, int num_experts, float* __restrict__ logits) {
  const int lane = threadIdx.x & 31;
  const int e = blockIdx.y * kLogitsWarps + (threadIdx.x >> 5);
  if (e >= num_experts) return;
  const int t0 = blockIdx.x * kWarpDotRows;
  const int rows = min(kWarpDotRows, num_tokens - t0);
  const bf16* w[1] = {w_gate + static_cast<int64_t>(e) * hidden};
  const bf16* a[kWarpDotRows];
#pragma unroll
  for (int j = 0; j < kWarpDotRows; ++j) {
    a[j] = x + static_cast<int64_t>(t0 + (j < rows ? j : 0)) * hidden;
  }
  float acc[1][kWarpDotRows];
  WarpDotRows<1, kWarpDotRows>(w, a, rows, hidden, acc);
#pragma unroll
  for (int j = 0; j < kWarpDotRows; ++j) {
    if (j < rows && lane == j) logits[static_cast<int64_t>(t0 + j) * num_experts + e] = acc[0][j];
  }
}

__device__ __forceinline__ float LogitToFloat(float v) { return v; }
__device__ __forceinline__ float LogitToFloat(bf16 v) { return __bfloat162float(v); }

// Better(a, b): a ranks before b when its score is higher, ties broken by the lower index (the
// CPU reference's order).
__device__ __forceinline__ bool Better(float score_a, int a, float score_b, int b) {
  return score_a > score_b || (score_a == score_b && a < b);
}

struct RouteArgs {
  const float* bias;
  int num_tokens, num_experts, top_k, n_group, topk_group;
  bool sigmoid, norm_topk_prob;
  float routed_scaling_factor;
  int32_t* topk_ids;
  float* topk_weights;
};

// One warp per token; shared memory per warp: scores [E], choice [E], group scores [n_group].
// Lane l owns experts l, l + 32, ... (E <= 32·32, so a lane's taken set fits one bitmask).
template <typename L>
__global__ void __launch_bounds__(kRouteWarps * 32)
    MoeRoutingKernel(const L* __restrict__ router_logits, RouteArgs args) {
  extern __shared__ float smem[];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kRouteWarps + warp;
  if (t >= args.num_tokens) return;  // whole warps exit; the kernel has no block barrier
  const int e_count = args.num_experts;
  float* scores = smem + warp * (2 * e_count + args.n_group);
  float* choice = scores + e_count;
  float* group_score = choice + e_count;
  const L* logits = router_logits + t * e_count;

  if (args.sigmoid) {
    for (int e = lane; e < e_count; e += 32) {
      scores[e] = 1.0f / (1.0f + expf(-LogitToFloat(logits[e])));
    }
  } else {
    float max_logit = -INFINITY;
    for (int e = lane; e < e_count; e += 32) max_logit = fmaxf(max_logit, LogitToFloat(logits[e]));
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
      max_logit = fmaxf(max_logit, __shfl_xor_sync(kFullMask, max_logit, off));
    }
    for (int e = lane; e < e_count; e += 32) scores[e] = expf(LogitToFloat(logits[e]) - max_logit);
    __syncwarp();
    // The CPU sums in expert order; so does lane 0 (E adds), for bit-equal scores.
    float sum = 0.0f;
    if (lane == 0) {
      for (int e = 0; e < e_count; ++e) sum += scores[e];
    }
    sum = __shfl_sync(kFullMask, sum, 0);
    for (int e = lane; e < e_count; e += 32) scores[e] /= sum;
  }
  for (int e = lane; e < e_count; e += 32) {
    choice[e] = scores[e] + (args.bias != nullptr ? args.bias[e] : 0.0f);
  }
  __syncwarp();

  if (args.n_group > 1 && args.topk_group < args.n_group) {
    const int per_group = e_count / args.n_group;
    for (int g = lane; g < args.n_group; g += 32) {
      const float* c = choice + g * per_group;
      if (per_group == 1) {
        group_score[g] = c[0];
        continue;
      }
      float best = -INFINITY, second = -INFINITY;  // the CPU's scan, verbatim
      for (int i = 0; i < per_group; ++i) {
        if (c[i] > best) {
          second = best;
          best = c[i];
        } else if (c[i] > second) {
          second = c[i];
        }
      }
      group_score[g] = best + second;
    }
    __syncwarp();
    // Every group score is final (barrier above) before any lane zeroes its groups' choices.
    for (int g = lane; g < args.n_group; g += 32) {
      int rank = 0;
      for (int o = 0; o < args.n_group; ++o) {
        if (o != g && Better(group_score[o], o, group_score[g], g)) ++rank;
      }
      if (rank >= args.topk_group) {
        for (int i = 0; i < per_group; ++i) choice[g * per_group + i] = 0.0f;
      }
    }
    __syncwarp();
  }

  // Top-k by repeated warp-wide argmax under Better (a strict total order on (score, index)).
  int32_t* ids = args.topk_ids + t * args.top_k;
  float* weights = args.topk_weights + t * args.top_k;
  uint32_t taken = 0;  // bit j: expert lane + 32·j already chosen
  for (int k = 0; k < args.top_k; ++k) {
    int best = -1;
    float best_score = 0.0f;
    for (int j = 0, e = lane; e < e_count; ++j, e += 32) {
      if ((taken >> j) & 1u) continue;
      if (best < 0 || Better(choice[e], e, best_score, best)) {
        best = e;
        best_score = choice[e];
      }
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
      const int other = __shfl_xor_sync(kFullMask, best, off);
      const float other_score = __shfl_xor_sync(kFullMask, best_score, off);
      if (other >= 0 && (best < 0 || Better(other_score, other, best_score, best))) {
        best = other;
        best_score = other_score;
      }
    }
    // top_k <= E, so some expert is left: best >= 0 on every lane.
    if ((best & 31) == lane) taken |= 1u << (best >> 5);
    if (lane == 0) {
      ids[k] = best;
      weights[k] = scores[best];
    }
  }
  if (lane == 0) {
    // Same operations, same order as the CPU: sum, + 1e-20, divide, then scale.
    if (args.norm_topk_prob) {
      float sum = 0.0f;
      for (int k = 0; k < args.top_k; ++k) sum += weights[k];
      sum += 1e-20f;
      for (int k = 0; k < args.top_k; ++k) weights[k] /= sum;
    }
    for (int k = 0; k < args.top_k; ++k) weights[k] *= args.routed_scaling_factor;
  }
}

template <typename L>
absl::Status LaunchRouting(const L* router_logits, const float* correction_bias, int64_t num_tokens,
                           const MoeRoutingParams& params, int32_t* topk_ids, float* topk_weights,
                           cudaStream_t stream) {
  if (absl::Status s = ValidateMoeRoutingParams(params); !s.ok()) return s;
  if (num_tokens < 0 || num_tokens > 0x7fffffff) {
    return absl::InvalidArgumentError(
        absl::StrCat("MoeRoutingCuda: num_tokens ", num_tokens, " must be in [0, 2^31)"));
  }
  if (params.num_experts > kMoeCudaMaxExperts) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MoeRoutingCuda: num_experts ", params.num_experts, " exceeds ", kMoeCudaMaxExperts));
  }
  if (num_tokens == 0) return absl::OkStatus();
  if (router_logits == nullptr || topk_ids == nullptr || topk_weights == nullptr) {
    return absl::InvalidArgumentError("MoeRoutingCuda: null router_logits or output pointer");
  }
  RouteArgs args;
  args.bias = correction_bias;
  args.num_tokens = static_cast<int>(num_tokens);
  args.num_experts = static_cast<int>(params.num_experts);
  args.top_k = static_cast<int>(params.top_k);
  args.n_group = static_cast<int>(params.n_group);
  args.topk_group = static_cast<int>(params.topk_group);
  args.sigmoid = params.scoring == MoeScoring::kSigmoid;
  args.norm_topk_prob = params.norm_topk_prob;
  args.routed_scaling_factor = params.routed_scaling_factor;
  args.topk_ids = topk_ids;
  args.topk_weights = topk_weights;
  // At most 4 · (2·1024 + 1024) floats = 48 KiB: within the default dynamic shared limit.
  const size_t smem = sizeof(float) * kRouteWarps * (2 * params.num_experts + params.n_group);
  const unsigned grid = static_cast<unsigned>((num_tokens + kRouteWarps - 1) / kRouteWarps);
  MoeRoutingKernel<L><<<grid, kRouteWarps * 32, smem, stream>>>(router_logits, args);
  return CudaLaunchStatus("MoeRoutingCuda launch");
}

}  // namespace

absl::Status MoeRouterLogitsCuda(const bf16* x, const bf16* w_gate, int64_t num_tokens,
                                 int64_t hidden, int64_t num_experts, float* logits,
                                 cudaStream_t stream) {
  if (num_tokens < 0 || num_tokens > 0x7fffffff - kWarpDotRows || num_experts < 1 ||
      num_experts > kMoeCudaMaxExperts || hidden < 8 || hidden % 8 != 0 || hidden > 0x7fffffff) {
    return absl::InvalidArgumentError(
        absl::StrCat("MoeRouterLogitsCuda: bad shape num_tokens=", num_tokens, " hidden=", hidden,
                     " num_experts=", num_experts, " (hidden must be a positive multiple of 8)"));
  }
  if (num_tokens == 0) return absl::OkStatus();
  if (x == nullptr || w_gate == nullptr || logits == nullptr || !Aligned16(x) ||
      !Aligned16(w_gate)) {
    return absl::InvalidArgumentError(
        "MoeRouterLogitsCuda: x and w_gate must be non-null and 16-byte aligned, logits non-null");
  }
  const dim3 grid(static_cast<unsigned>((num_tokens + kWarpDotRows - 1) / kWarpDotRows),
                  static_cast<unsigned>((num_experts + kLogitsWarps - 1) / kLogitsWarps));
  RouterLogitsKernel<<<grid, kLogitsWarps * 32, 0, stream>>>(
      x, w_gate, static_cast<int>(num_tokens), static_cast<int>(hidden),
      static_cast<int>(num_experts), logits);
  return CudaLaunchStatus("MoeRouterLogitsCuda launch");
}

absl::Status MoeRoutingCuda(const float* router_logits, const float* correction_bias,
                            int64_t num_tokens, const MoeRoutingParams& params, int32_t* topk_ids,
                            float* topk_weights, cudaStream_t stream) {
  return LaunchRouting(router_logits, correction_bias, num_tokens, params, topk_ids, topk_weights,
                       stream);
}

absl::Status MoeRoutingCuda(const bf16* router_logits, const float* correction_bias,
                            int64_t num_tokens, const MoeRoutingParams& params, int32_t* topk_ids,
                            float* topk_weights, cudaStream_t stream) {
  return LaunchRouting(router_logits, correction_bias, num_tokens, params, topk_ids, topk_weights,
                       stream);
}

}  // namespace sluice::kernels
