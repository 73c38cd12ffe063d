// Draft-token choice shared by the drafters that run a model (draft_model_drafter, mtp_drafter):
// greedy argmax or a draw from softmax(logits / temperature), with the draft's probability of
// the chosen token as its confidence.
#ifndef SLUICE_ENGINE_SPEC_DRAFT_SAMPLING_H_
#define SLUICE_ENGINE_SPEC_DRAFT_SAMPLING_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "engine/sample/philox.h"

namespace sluice {

// vLLM's _SAMPLING_EPS, as SampleToken: below it a request is greedy.
inline constexpr float kDraftGreedyTemperature = 1e-5f;

// DraftSoftmax: softmax of logits / temperature into probs (float64 accumulation).
void DraftSoftmax(absl::Span<const float> logits, float temperature, std::vector<float>* probs);
// DraftArgmax: the lowest index of the largest value.
int32_t DraftArgmax(absl::Span<const float> v);
// DraftDraw: draws from probs with one uniform u in [0, 1): the first index whose cumulative
// mass exceeds u · total (zero-probability entries are never drawn).
int32_t DraftDraw(const std::vector<float>& probs, double u);

// DraftPick: the chosen column of a logits row and the draft's probability of it (its
// confidence).
struct DraftPick {
  int32_t column = 0;
  float confidence = 0.0f;
};
// PickDraft chooses a draft token from `row`: below kDraftGreedyTemperature the argmax, its
// confidence from the softmax at temperature 1; else a draw DrawUniform(key, kDraftDraw) from
// softmax(row / temperature). *probs holds the softmax the confidence came from (for a draw:
// the draft distribution q that rejection sampling needs).
DraftPick PickDraft(absl::Span<const float> row, float temperature, const SampleDrawKey& key,
                    std::vector<float>* probs);

}  // namespace sluice

#endif  // SLUICE_ENGINE_SPEC_DRAFT_SAMPLING_H_
