// Strided sliding windows for the perplexity of a token sequence longer than what one request
// may hold (Hugging Face, "Perplexity of fixed-length models"): each window sends at most
// max_length tokens and scores the tokens no earlier window scored, so every token is scored
// once; after the first window each scored token sees at least max_length - stride tokens of
// context. A sequence of at most max_length tokens is one window scoring tokens 1..n-1, the
// same as scoring it whole.
#ifndef SLUICE_SERVICES_SERVE_PPL_WINDOWS_H_
#define SLUICE_SERVICES_SERVE_PPL_WINDOWS_H_

#include <algorithm>
#include <cstdint>
#include <vector>

namespace sluice {

struct PplWindow {
  int64_t begin = 0;         // first token sent
  int64_t end = 0;           // one past the last token sent (and scored)
  int64_t first_scored = 0;  // tokens [first_scored, end) are scored; begin < first_scored

  friend bool operator==(const PplWindow&, const PplWindow&) = default;
};

// PlanPplWindows covers tokens 1..num_tokens-1 (token 0 has no prediction). Requires
// max_length >= 2 and 1 <= stride < max_length (the caller validates); empty when
// num_tokens < 2.
inline std::vector<PplWindow> PlanPplWindows(int64_t num_tokens, int64_t max_length,
                                             int64_t stride) {
  std::vector<PplWindow> windows;
  if (num_tokens < 2) return windows;
  int64_t scored_to = std::min(num_tokens, max_length);
  windows.push_back(PplWindow{0, scored_to, 1});
  while (scored_to < num_tokens) {
    const int64_t end = std::min(scored_to + stride, num_tokens);
    windows.push_back(PplWindow{end - max_length, end, scored_to});
    scored_to = end;
  }
  return windows;
}

}  // namespace sluice

#endif  // SLUICE_SERVICES_SERVE_PPL_WINDOWS_H_
