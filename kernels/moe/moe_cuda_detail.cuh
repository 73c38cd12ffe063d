// Device helpers shared by the MoE .cu files (router logits and the decode GEMV path): a warp
// computing the dot products of a few weight rows with a few activation rows, streaming the
// weights once.
#ifndef SLUICE_KERNELS_MOE_MOE_CUDA_DETAIL_CUH_
#define SLUICE_KERNELS_MOE_MOE_CUDA_DETAIL_CUH_

#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/cuda/device_utils.cuh"
#include "kernels/moe/moe_routing.h"

namespace sluice::kernels::moe_detail {

using bf16 = __nv_bfloat16;
constexpr unsigned kFullMask = 0xffffffffu;

// Most activation rows a warp multiplies per pass over the weights.
constexpr int kWarpDotRows = 8;

// Weight vectors are read once per call: the streaming load (ld.global.cs) keeps them from
// evicting the activation rows that every warp re-reads from L1/L2.
__device__ __forceinline__ cuda_detail::Bf16x8 LoadWeightVec(const __nv_bfloat16* p) {
  const uint4 r = __ldcs(reinterpret_cast<const uint4*>(p));
  cuda_detail::Bf16x8 v;
  static_assert(sizeof(v) == sizeof(r));
  memcpy(&v, &r, sizeof(v));
  return v;
}

template <int kCols, int kRows>
__device__ __forceinline__ void ZeroAcc(float (&acc)[kCols][kRows]) {
#pragma unroll
  for (int c = 0; c < kCols; ++c) {
#pragma unroll
    for (int j = 0; j < kRows; ++j) acc[c][j] = 0.0f;
  }
}

// Every lane's partial sums → the warp's sums on every lane (fixed butterfly order).
template <int kCols, int kRows>
__device__ __forceinline__ void WarpSumAcc(float (&acc)[kCols][kRows]) {
#pragma unroll
  for (int c = 0; c < kCols; ++c) {
#pragma unroll
    for (int j = 0; j < kRows; ++j) acc[c][j] = cuda_detail::WarpSum(acc[c][j]);
  }
}

// FmaVec: acc[c][j] += Σ_q wf[c][q] · a[j][8·i + q] for j < rows, in q order (the one
// per-lane accumulation order of the warp dot products below).
template <int kCols, int kRows>
__device__ __forceinline__ void FmaVec(const float (&wf)[kCols][8],
                                       const __nv_bfloat16* const (&a)[kRows], int i, int rows,
                                       float (&acc)[kCols][kRows]) {
#pragma unroll
  for (int j = 0; j < kRows; ++j) {
    if (j < rows) {
      float af[8];
      cuda_detail::LoadBf16x8(a[j] + i * 8, af);
#pragma unroll
      for (int c = 0; c < kCols; ++c) {
#pragma unroll
        for (int q = 0; q < 8; ++q) acc[c][j] = fmaf(wf[c][q], af[q], acc[c][j]);
      }
    }
  }
}

// WarpDotRows: acc[c][j] = Σ_i w[c][i] · a[j][i] over i < k for c < kCols weight rows and
// j < rows (<= kRows <= kWarpDotRows) activation rows, fp32 products and sums. Every lane of the
// warp must call it; every lane gets the sums (fixed butterfly order: deterministic). A row's
// sums do not depend on `rows` or kRows. k % 8 == 0 and all rows 16-byte aligned; a[j] for
// j >= rows is never read.
template <int kCols, int kRows>
__device__ __forceinline__ void WarpDotRows(const __nv_bfloat16* const (&w)[kCols],
                                            const __nv_bfloat16* const (&a)[kRows], int rows, int k,
                                            float (&acc)[kCols][kRows]) {
  static_assert(kRows >= 1 && kRows <= kWarpDotRows);
  const int lane = threadIdx.x & 31;
  ZeroAcc(acc);
  const int vecs = k / 8;
  // Unrolled so that several 16-byte weight loads per lane are in flight (bandwidth-bound).
#pragma unroll 4
  for (int i = lane; i < vecs; i += 32) {
    float wf[kCols][8];
#pragma unroll
    for (int c = 0; c < kCols; ++c) cuda_detail::ToFloat8(LoadWeightVec(w[c] + i * 8), wf[c]);
    FmaVec(wf, a, i, rows, acc);
  }
  WarpSumAcc(acc);
}

// WarpDotChunked: WarpDotRows (same arguments, same contract, bit-equal sums: each lane adds
// the same products in the same order), with the weight loads of kVecs consecutive lane-strided
// 16-byte vectors per weight row issued before any of them is used, so kCols · kVecs loads per
// lane are in flight (WarpDotRows keeps at most 4 · kCols). For k <= 256 · kVecs one round
// trip to memory per call instead of several: decode GEMVs are latency-bound per warp.
template <int kCols, int kRows, int kVecs>
__device__ __forceinline__ void WarpDotChunked(const __nv_bfloat16* const (&w)[kCols],
                                               const __nv_bfloat16* const (&a)[kRows], int rows,
                                               int k, float (&acc)[kCols][kRows]) {
  static_assert(kRows >= 1 && kRows <= kWarpDotRows);
  const int lane = threadIdx.x & 31;
  ZeroAcc(acc);
  const int vecs = k / 8;
  for (int v0 = 0; v0 < vecs; v0 += 32 * kVecs) {
    cuda_detail::Bf16x8 wv[kCols][kVecs];
#pragma unroll
    for (int u = 0; u < kVecs; ++u) {
      const int i = v0 + u * 32 + lane;
#pragma unroll
      for (int c = 0; c < kCols; ++c) {
        if (i < vecs) wv[c][u] = LoadWeightVec(w[c] + i * 8);
      }
    }
#pragma unroll
    for (int u = 0; u < kVecs; ++u) {
      const int i = v0 + u * 32 + lane;
      if (i >= vecs) break;  // lane-local: no warp-wide operation below before the sums
      float wf[kCols][8];
#pragma unroll
      for (int c = 0; c < kCols; ++c) cuda_detail::ToFloat8(wv[c][u], wf[c]);
      FmaVec(wf, a, i, rows, acc);
    }
  }
  WarpSumAcc(acc);
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
  bool sigmoid, norm_topk_prob, group_score_max;
  float routed_scaling_factor;
  int32_t* topk_ids;
  float* topk_weights;
};

// The kernel arguments of one routing call (params validated by the caller).
inline RouteArgs MakeRouteArgs(const MoeRoutingParams& params, const float* correction_bias,
                               int64_t num_tokens, int32_t* topk_ids, float* topk_weights) {
  RouteArgs args;
  args.bias = correction_bias;
  args.num_tokens = static_cast<int>(num_tokens);
  args.num_experts = static_cast<int>(params.num_experts);
  args.top_k = static_cast<int>(params.top_k);
  args.n_group = static_cast<int>(params.n_group);
  args.topk_group = static_cast<int>(params.topk_group);
  args.sigmoid = params.scoring == MoeScoring::kSigmoid;
  args.norm_topk_prob = params.norm_topk_prob;
  args.group_score_max = params.group_score_max;
  args.routed_scaling_factor = params.routed_scaling_factor;
  args.topk_ids = topk_ids;
  args.topk_weights = topk_weights;
  return args;
}

// Floats of shared scratch RouteToken needs: scores [E], choice [E], group scores [n_group].
__host__ __device__ __forceinline__ int RouteScratchFloats(const RouteArgs& args) {
  return 2 * args.num_experts + args.n_group;
}

// RouteToken: MoeRoutingCpu's RouteOne for token t on one warp (every lane calls it; only
// __syncwarp inside), from that token's E logits (global or shared memory) into
// args.topk_ids / args.topk_weights row t. `scratch`: RouteScratchFloats(args) floats of
// shared memory private to the warp. Lane l owns experts l, l + 32, ... (E <= 32·32, so a
// lane's taken set fits one bitmask). Ids and weights are written by lane 0; a barrier of the
// caller makes them visible to other warps.
template <typename L>
__device__ __forceinline__ void RouteToken(const L* logits, float* scratch, const RouteArgs& args,
                                           int64_t t) {
  const int lane = threadIdx.x & 31;
  const int e_count = args.num_experts;
  float* scores = scratch;
  float* choice = scores + e_count;
  float* group_score = choice + e_count;

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
    // The CPU sums in expert order; so does lane 0 (E adds), for bit-equal scores. The
    // shared-memory loads go 8 at a time ahead of their adds (same adds, same order), so the
    // dependent chain is E adds rather than E load latencies (~1 us at E = 64).
    float sum = 0.0f;
    if (lane == 0) {
      int e = 0;
      for (; e + 8 <= e_count; e += 8) {
        float v[8];
#pragma unroll
        for (int q = 0; q < 8; ++q) v[q] = scores[e + q];
#pragma unroll
        for (int q = 0; q < 8; ++q) sum += v[q];
      }
      for (; e < e_count; ++e) sum += scores[e];
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
      group_score[g] = args.group_score_max ? best : best + second;
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

}  // namespace sluice::kernels::moe_detail

#endif  // SLUICE_KERNELS_MOE_MOE_CUDA_DETAIL_CUH_
