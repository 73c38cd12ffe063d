// MoE top-k routing with DeepSeek-V3 group-limited selection and score-correction bias.
//
// Formula (transformers' `DeepseekV3TopkRouter`, modeling_deepseek_v3.py; "DeepSeek-V3 Technical
// Report", arXiv:2412.19437 §2.1.2, auxiliary-loss-free balancing):
//   s      = sigmoid(router_logits)            (or softmax over the experts)
//   choice = s + e_score_correction_bias       (bias only steers the choice)
//   group score = sum of the 2 highest choice scores of each of n_group equal groups
//   keep the topk_group best groups; choice scores of experts in other groups are set to 0.0
//   (transformers' `masked_fill(~mask, 0.0)`: a masked expert is still a candidate with score 0)
//   ids    = top_k experts by choice score
//   w      = s[ids] (unbiased), divided by (sum + 1e-20) when norm_topk_prob, × routed_scaling_factor
#ifndef SLUICE_KERNELS_MOE_MOE_ROUTING_H_
#define SLUICE_KERNELS_MOE_MOE_ROUTING_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace sluice::kernels {

// MoeScoring selects how router logits become expert scores.
enum class MoeScoring { kSigmoid, kSoftmax };

// MoeRoutingParams configures MoeRoutingCpu. n_group = 1 disables group-limited selection.
struct MoeRoutingParams {
  int64_t num_experts = 0;  // n_routed_experts
  int64_t top_k = 0;        // num_experts_per_tok
  int64_t n_group = 1;      // experts split into n_group equal consecutive groups
  int64_t topk_group = 1;   // groups kept per token
  // A group's score: false, the sum of its two best choice scores (DeepSeek-V3's noaux_tc);
  // true, its best one (DeepSeek-V2's group_limited_greedy, "DeepSeek-V2", arXiv:2405.04434).
  bool group_score_max = false;
  MoeScoring scoring = MoeScoring::kSigmoid;
  bool norm_topk_prob = true;
  float routed_scaling_factor = 1.0f;
};

// ValidateMoeRoutingParams checks num_experts > 0, 0 < top_k <= num_experts,
// num_experts % n_group == 0, 0 < topk_group <= n_group, and that the kept groups hold at least
// top_k experts. Errors: InvalidArgument naming the bad field. Inline: the CUDA library
// (sluice_kernels_cuda, linked after sluice_kernels) calls it too.
inline absl::Status ValidateMoeRoutingParams(const MoeRoutingParams& p) {
  if (p.num_experts <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("moe routing: num_experts ", p.num_experts,
                                                   " must be positive"));
  }
  if (p.top_k <= 0 || p.top_k > p.num_experts) {
    return absl::InvalidArgumentError(absl::StrCat("moe routing: top_k ", p.top_k,
                                                   " must be in [1, num_experts=",
                                                   p.num_experts, "]"));
  }
  if (p.n_group <= 0 || p.num_experts % p.n_group != 0) {
    return absl::InvalidArgumentError(absl::StrCat("moe routing: n_group ", p.n_group,
                                                   " must divide num_experts ", p.num_experts));
  }
  if (p.topk_group <= 0 || p.topk_group > p.n_group) {
    return absl::InvalidArgumentError(absl::StrCat("moe routing: topk_group ", p.topk_group,
                                                   " must be in [1, n_group=", p.n_group, "]"));
  }
  if (p.topk_group * (p.num_experts / p.n_group) < p.top_k) {
    return absl::InvalidArgumentError(
        absl::StrCat("moe routing: topk_group ", p.topk_group, " groups of ",
                     p.num_experts / p.n_group, " experts cannot hold top_k ", p.top_k));
  }
  return absl::OkStatus();
}

// MoeRoutingCpu routes `num_tokens` tokens.
//   router_logits:   [num_tokens, num_experts], float32 (x · gate.weightᵀ)
//   correction_bias: [num_experts], float32, or null (no bias)
//   topk_ids:        [num_tokens, top_k], int32 out: chosen experts by descending choice score
//                    (ties: lower expert index first)
//   topk_weights:    [num_tokens, top_k], float32 out, aligned with topk_ids
// Each token is routed independently (batch invariant); parallel over tokens.
// Errors: those of ValidateMoeRoutingParams.
absl::Status MoeRoutingCpu(const float* router_logits, const float* correction_bias,
                           int64_t num_tokens, const MoeRoutingParams& params, int32_t* topk_ids,
                           float* topk_weights);

}  // namespace sluice::kernels

#endif  // SLUICE_KERNELS_MOE_MOE_ROUTING_H_
