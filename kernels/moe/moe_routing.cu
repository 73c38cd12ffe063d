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
using moe_detail::RouteArgs;
using moe_detail::WarpDotRows;

constexpr int kLogitsWarps = 8;  // warps (experts) per block of the router-logits kernel
constexpr int kRouteWarps = 4;   // warps (tokens) per block of the routing kernel

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

// One warp per token; shared memory per warp: moe_detail::RouteScratchFloats floats.
template <typename L>
__global__ void __launch_bounds__(kRouteWarps * 32)
    MoeRoutingKernel(const L* __restrict__ router_logits, RouteArgs args) {
  extern __shared__ float smem[];
  const int warp = threadIdx.x >> 5;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kRouteWarps + warp;
  if (t >= args.num_tokens) return;  // whole warps exit; the kernel has no block barrier
  moe_detail::RouteToken(router_logits + t * args.num_experts,
                         smem + warp * moe_detail::RouteScratchFloats(args), args, t);
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
  const RouteArgs args =
      moe_detail::MakeRouteArgs(params, correction_bias, num_tokens, topk_ids, topk_weights);
  // At most 4 · (2·1024 + 1024) floats = 48 KiB: within the default dynamic shared limit.
  const size_t smem = sizeof(float) * kRouteWarps * moe_detail::RouteScratchFloats(args);
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
