// Routed-expert compute of a mixture-of-experts MLP (SwiGLU experts), by token permutation.
//
// For every token t with routed experts ids[t, k] and weights w[t, k]:
//   out[t] = Σ_k w[t, k] · down_e(silu(gate_e(x[t])) ⊙ up_e(x[t])),  e = ids[t, k]
// as in transformers' `DeepseekV3MoE.moe` (modeling_deepseek_v3.py). Tokens are grouped by
// expert (a stable counting sort), each expert runs its gate/up and down GEMMs once over its
// gathered tokens with the batch-invariant LinearCpu, and the results are combined per token in
// k order, so a token's output does not depend on the other tokens of the batch.
#ifndef SLUICE_KERNELS_MOE_MOE_EXPERTS_H_
#define SLUICE_KERNELS_MOE_MOE_EXPERTS_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace sluice::kernels {

// MoeExpertWeights points at one SwiGLU expert's weights (not owned), each matrix either float32
// or bfloat16 (the other pointer null). A bfloat16 matrix is computed as LinearBf16Cpu does: the
// same bits as its float32 values through LinearCpu, from half the bytes.
struct MoeExpertWeights {
  const float* gate_up = nullptr;  // [2 * intermediate, hidden]: gate_proj rows, then up_proj
  const float* down = nullptr;     // [hidden, intermediate]: down_proj
  const uint16_t* gate_up_bf16 = nullptr;  // gate_up as bfloat16 when gate_up is null
  const uint16_t* down_bf16 = nullptr;     // down as bfloat16 when down is null
};

// MoeWorkspace holds the scratch buffers of MoeExpertsCpu. Reuse one across calls so that a
// step allocates nothing once the buffers have grown to the largest batch. Not thread-safe.
struct MoeWorkspace {
  std::vector<int32_t> expert_offsets;  // [num_experts + 1]
  std::vector<int32_t> sorted_rows;     // [num_tokens * top_k], row = t * top_k + k
  std::vector<float> gathered;          // [num_tokens * top_k, hidden]
  std::vector<float> gate_up;           // [num_tokens * top_k, 2 * intermediate]
  std::vector<float> act;               // [num_tokens * top_k, intermediate]
  std::vector<float> expert_out;        // [num_tokens * top_k, hidden], sorted order
  std::vector<int32_t> row_to_sorted;   // [num_tokens * top_k]
  std::vector<int32_t> cursor;          // [num_experts]
};

// MoeExpertsCpu computes the routed-expert output.
//   x:            [num_tokens, hidden], float32
//   topk_ids:     [num_tokens, top_k], int32 expert ids in [0, experts.size())
//   topk_weights: [num_tokens, top_k], float32
//   experts:      per-expert weights, each [2 * intermediate, hidden] and [hidden, intermediate]
//   out:          [num_tokens, hidden], float32, overwritten (not accumulated)
// Errors: InvalidArgument for an expert id out of range or an expert a token uses with a matrix
// that has neither (or both) of its pointers (out is then unspecified).
absl::Status MoeExpertsCpu(const float* x, int64_t num_tokens, int64_t hidden,
                           int64_t intermediate, const int32_t* topk_ids,
                           const float* topk_weights, int64_t top_k,
                           absl::Span<const MoeExpertWeights> experts, float* out,
                           MoeWorkspace& workspace);

}  // namespace sluice::kernels

#endif  // SLUICE_KERNELS_MOE_MOE_EXPERTS_H_
