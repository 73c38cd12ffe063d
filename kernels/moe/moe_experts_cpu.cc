// CPU routed-expert compute by token permutation; see moe_experts.h.
#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/activation/activation.h"
#include "kernels/common/parallel.h"
#include "kernels/linear/linear.h"
#include "kernels/moe/moe_experts.h"

namespace sluice::kernels {

absl::Status MoeExpertsCpu(const float* x, int64_t num_tokens, int64_t hidden,
                           int64_t intermediate, const int32_t* topk_ids,
                           const float* topk_weights, int64_t top_k,
                           absl::Span<const MoeExpertWeights> experts, float* out,
                           MoeWorkspace& ws) {
  const int64_t num_experts = static_cast<int64_t>(experts.size());
  const int64_t num_rows = num_tokens * top_k;
  if (num_rows == 0) {
    std::memset(out, 0, num_tokens * hidden * sizeof(float));
    return absl::OkStatus();
  }

  // Counting sort of (token, k) rows by expert; stable, so rows of one expert stay in token order.
  ws.expert_offsets.assign(num_experts + 1, 0);
  for (int64_t r = 0; r < num_rows; ++r) {
    const int32_t e = topk_ids[r];
    if (e < 0 || e >= num_experts) {
      return absl::InvalidArgumentError(absl::StrCat("moe experts: token ", r / top_k,
                                                     " routed to expert ", e, " outside [0, ",
                                                     num_experts, ")"));
    }
    const MoeExpertWeights& ew = experts[e];
    if ((ew.gate_up == nullptr) == (ew.gate_up_bf16 == nullptr) ||
        (ew.down == nullptr) == (ew.down_bf16 == nullptr)) {
      return absl::InvalidArgumentError(
          absl::StrCat("moe experts: expert ", e,
                       " needs one float32 or bfloat16 matrix each for gate_up and down"));
    }
    ++ws.expert_offsets[e + 1];
  }
  for (int64_t e = 0; e < num_experts; ++e) ws.expert_offsets[e + 1] += ws.expert_offsets[e];
  ws.sorted_rows.resize(num_rows);
  ws.row_to_sorted.resize(num_rows);
  // Walk rows in order, placing each at its expert's next free position.
  ws.cursor.assign(ws.expert_offsets.begin(), ws.expert_offsets.end() - 1);
  for (int64_t r = 0; r < num_rows; ++r) {
    const int32_t pos = ws.cursor[topk_ids[r]]++;
    ws.sorted_rows[pos] = static_cast<int32_t>(r);
    ws.row_to_sorted[r] = pos;
  }

  ws.gathered.resize(num_rows * hidden);
  ws.gate_up.resize(num_rows * 2 * intermediate);
  ws.act.resize(num_rows * intermediate);
  ws.expert_out.resize(num_rows * hidden);
  for (int64_t s = 0; s < num_rows; ++s) {
    const int64_t token = ws.sorted_rows[s] / top_k;
    std::memcpy(ws.gathered.data() + s * hidden, x + token * hidden, hidden * sizeof(float));
  }

  for (int64_t e = 0; e < num_experts; ++e) {
    const int64_t begin = ws.expert_offsets[e];
    const int64_t m = ws.expert_offsets[e + 1] - begin;
    if (m == 0) continue;
    float* gu = ws.gate_up.data() + begin * 2 * intermediate;
    float* act = ws.act.data() + begin * intermediate;
    const MoeExpertWeights& ew = experts[e];
    const float* xe = ws.gathered.data() + begin * hidden;
    if (ew.gate_up_bf16 != nullptr) {
      LinearBf16Cpu(xe, ew.gate_up_bf16, nullptr, gu, m, 2 * intermediate, hidden);
    } else {
      LinearCpu(xe, ew.gate_up, nullptr, gu, m, 2 * intermediate, hidden);
    }
    SiluMulCpu(gu, act, m, intermediate);
    float* ye = ws.expert_out.data() + begin * hidden;
    if (ew.down_bf16 != nullptr) {
      LinearBf16Cpu(act, ew.down_bf16, nullptr, ye, m, hidden, intermediate);
    } else {
      LinearCpu(act, ew.down, nullptr, ye, m, hidden, intermediate);
    }
  }

  // Combine per token in k order (fixed summation order: batch invariant).
  ParallelFor(num_tokens, 8, [&](int64_t t_begin, int64_t t_end) {
    for (int64_t t = t_begin; t < t_end; ++t) {
      float* o = out + t * hidden;
      for (int64_t k = 0; k < top_k; ++k) {
        const float w = topk_weights[t * top_k + k];
        const float* y = ws.expert_out.data() + ws.row_to_sorted[t * top_k + k] * hidden;
        if (k == 0) {
          for (int64_t i = 0; i < hidden; ++i) o[i] = w * y[i];
        } else {
          for (int64_t i = 0; i < hidden; ++i) o[i] += w * y[i];
        }
      }
    }
  });
  return absl::OkStatus();
}

}  // namespace sluice::kernels
