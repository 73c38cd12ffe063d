// Token bitmask application on the host: the CPU reference for masking logits by a grammar.
#ifndef SLUICE_ENGINE_GRAMMAR_TOKEN_BITMASK_H_
#define SLUICE_ENGINE_GRAMMAR_TOKEN_BITMASK_H_

#include <algorithm>
#include <bit>
#include <cstdint>
#include <limits>

#include "absl/types/span.h"

namespace sluice::grammar {

// ApplyTokenBitmask sets logits[i] = -inf for every token i whose bit is clear in `bitmask`
// (bit i of word i/32; tokens past the mask's words count as clear). logits: [vocab], float32.
inline void ApplyTokenBitmask(absl::Span<const uint32_t> bitmask, absl::Span<float> logits) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const size_t n = logits.size();
  for (size_t w = 0; w * 32 < n; ++w) {
    const uint32_t bits = w < bitmask.size() ? bitmask[w] : 0u;
    if (bits == 0xFFFFFFFFu) continue;
    const size_t end = std::min(n, w * 32 + 32);
    for (size_t i = w * 32; i < end; ++i) {
      if (!((bits >> (i - w * 32)) & 1u)) logits[i] = kNegInf;
    }
  }
}

// SingleAllowedToken: the token whose bit is set when exactly one bit is; -1 otherwise (none,
// or several). A grammar that allows one token forces it whatever the logits (jump-forward).
inline int32_t SingleAllowedToken(absl::Span<const uint32_t> bitmask) {
  int32_t found = -1;
  for (size_t w = 0; w < bitmask.size(); ++w) {
    const uint32_t bits = bitmask[w];
    if (bits == 0) continue;
    if (found >= 0 || (bits & (bits - 1)) != 0) return -1;
    found = static_cast<int32_t>(w * 32 + static_cast<size_t>(std::countr_zero(bits)));
  }
  return found;
}

}  // namespace sluice::grammar

#endif  // SLUICE_ENGINE_GRAMMAR_TOKEN_BITMASK_H_
