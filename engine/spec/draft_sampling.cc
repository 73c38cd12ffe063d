#include "engine/spec/draft_sampling.h"

#include <algorithm>
#include <cmath>

namespace sluice {

void DraftSoftmax(absl::Span<const float> logits, float temperature, std::vector<float>* probs) {
  probs->resize(logits.size());
  float max_logit = -INFINITY;
  for (float l : logits) max_logit = std::max(max_logit, l);
  double total = 0.0;
  for (size_t i = 0; i < logits.size(); ++i) {
    const double e = std::exp((static_cast<double>(logits[i]) - max_logit) / temperature);
    (*probs)[i] = static_cast<float>(e);
    total += e;
  }
  for (float& p : *probs) p = static_cast<float>(p / total);
}

int32_t DraftArgmax(absl::Span<const float> v) {
  return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

int32_t DraftDraw(const std::vector<float>& probs, double u) {
  double total = 0.0;
  for (float p : probs) total += p;
  const double target = u * total;
  double cumulative = 0.0;
  int32_t last = 0;
  for (size_t i = 0; i < probs.size(); ++i) {
    if (probs[i] <= 0.0f) continue;
    cumulative += probs[i];
    last = static_cast<int32_t>(i);
    if (cumulative > target) return last;
  }
  return last;
}

DraftPick PickDraft(absl::Span<const float> row, float temperature, const SampleDrawKey& key,
                    std::vector<float>* probs) {
  DraftPick pick;
  if (temperature < kDraftGreedyTemperature) {
    pick.column = DraftArgmax(row);
    DraftSoftmax(row, 1.0f, probs);
  } else {
    DraftSoftmax(row, temperature, probs);
    pick.column = DraftDraw(*probs, DrawUniform(key, kDraftDraw));
  }
  pick.confidence = (*probs)[pick.column];
  return pick;
}

}  // namespace sluice
