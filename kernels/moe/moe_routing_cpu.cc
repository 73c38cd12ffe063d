// CPU MoE routing; see moe_routing.h for the formula and its source.
#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/common/parallel.h"
#include "kernels/moe/moe_routing.h"

namespace sluice::kernels {
namespace {

// Better(a, b): a ranks before b when its score is higher, ties broken by the lower index.
inline bool Better(float score_a, int64_t a, float score_b, int64_t b) {
  return score_a > score_b || (score_a == score_b && a < b);
}

// RouteOne routes one token using caller-provided scratch of 2 * num_experts + n_group floats.
void RouteOne(const float* logits, const float* bias, const MoeRoutingParams& p, float* scratch,
              int32_t* ids, float* weights) {
  const int64_t e_count = p.num_experts;
  float* scores = scratch;             // [E] unbiased
  float* choice = scratch + e_count;   // [E] biased, masked
  float* group_score = choice + e_count;  // [n_group]
  if (p.scoring == MoeScoring::kSigmoid) {
    for (int64_t e = 0; e < e_count; ++e) scores[e] = 1.0f / (1.0f + std::exp(-logits[e]));
  } else {
    float max_logit = logits[0];
    for (int64_t e = 1; e < e_count; ++e) max_logit = std::max(max_logit, logits[e]);
    float sum = 0.0f;
    for (int64_t e = 0; e < e_count; ++e) {
      scores[e] = std::exp(logits[e] - max_logit);
      sum += scores[e];
    }
    for (int64_t e = 0; e < e_count; ++e) scores[e] /= sum;
  }
  for (int64_t e = 0; e < e_count; ++e) choice[e] = scores[e] + (bias ? bias[e] : 0.0f);

  if (p.n_group > 1 && p.topk_group < p.n_group) {
    const int64_t per_group = e_count / p.n_group;
    for (int64_t g = 0; g < p.n_group; ++g) {
      const float* c = choice + g * per_group;
      if (per_group == 1) {
        group_score[g] = c[0];
        continue;
      }
      // Sum of the two highest (topk(2) over the group), or the highest (group_score_max).
      float best = -INFINITY, second = -INFINITY;
      for (int64_t i = 0; i < per_group; ++i) {
        if (c[i] > best) {
          second = best;
          best = c[i];
        } else if (c[i] > second) {
          second = c[i];
        }
      }
      group_score[g] = p.group_score_max ? best : best + second;
    }
    // Keep the topk_group best groups; zero the choice scores of the others.
    for (int64_t g = 0; g < p.n_group; ++g) {
      int64_t rank = 0;  // groups strictly better than g
      for (int64_t o = 0; o < p.n_group; ++o) {
        if (o != g && Better(group_score[o], o, group_score[g], g)) ++rank;
      }
      if (rank >= p.topk_group) {
        for (int64_t i = 0; i < per_group; ++i) choice[g * per_group + i] = 0.0f;
      }
    }
  }

  // Top-k by choice score (k is small: repeated selection).
  for (int64_t k = 0; k < p.top_k; ++k) {
    int64_t best = -1;
    for (int64_t e = 0; e < e_count; ++e) {
      bool taken = false;
      for (int64_t j = 0; j < k; ++j) taken |= (ids[j] == e);
      if (taken) continue;
      if (best < 0 || Better(choice[e], e, choice[best], best)) best = e;
    }
    ids[k] = static_cast<int32_t>(best);
    weights[k] = scores[best];
  }
  if (p.norm_topk_prob) {
    float sum = 0.0f;
    for (int64_t k = 0; k < p.top_k; ++k) sum += weights[k];
    sum += 1e-20f;
    for (int64_t k = 0; k < p.top_k; ++k) weights[k] /= sum;
  }
  for (int64_t k = 0; k < p.top_k; ++k) weights[k] *= p.routed_scaling_factor;
}

}  // namespace

absl::Status MoeRoutingCpu(const float* router_logits, const float* correction_bias,
                           int64_t num_tokens, const MoeRoutingParams& params, int32_t* topk_ids,
                           float* topk_weights) {
  if (absl::Status s = ValidateMoeRoutingParams(params); !s.ok()) return s;
  const int64_t e_count = params.num_experts;
  ParallelFor(num_tokens, 16, [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> scratch;
    scratch.resize(2 * e_count + params.n_group);
    for (int64_t t = begin; t < end; ++t) {
      RouteOne(router_logits + t * e_count, correction_bias, params, scratch.data(),
               topk_ids + t * params.top_k, topk_weights + t * params.top_k);
    }
  });
  return absl::OkStatus();
}

}  // namespace sluice::kernels
