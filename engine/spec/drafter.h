// Drafter: proposes draft tokens for speculative decoding; the target model verifies them.
//
// Per step the engine hands the drafter every decode sequence it wants drafts for, with the
// sequence's tokens so far; the drafter returns up to `max_draft_tokens` tokens per sequence,
// each with the drafter's confidence (its own probability of the token) and, when the proposal
// was sampled, the full draft distribution it was sampled from (rejection sampling needs q).
// A drafter with state per sequence (a draft model's KV) keys it by request id and rolls it back
// by comparing its tokens with the sequence's: nothing tells it which drafts were accepted.
#ifndef SLUICE_ENGINE_SPEC_DRAFTER_H_
#define SLUICE_ENGINE_SPEC_DRAFTER_H_

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "engine/sample/sampler.h"
#include "engine/sample/sampling_params.h"
#include "engine/sched/step_cost_model.h"

namespace sluice {

struct DraftInput {
  std::string_view request_id;
  absl::Span<const int32_t> token_ids;  // prompt + outputs so far (all real tokens)
  int32_t num_prompt_tokens = 0;
  std::string_view cache_salt;        // the drafter's prefix cache honours the request's namespace
  const SamplingParams* sampling = nullptr;
  // Key of the first draft's position (Sequence::NextDrawKey): a sampled proposal at draft index
  // j draws DrawUniform({seed, choice, position + j}, kDraftDraw), its own stream per position.
  SampleDrawKey first_draft_key;
  int32_t max_draft_tokens = 0;       // 0: no drafts for this sequence
};

struct DraftOutput {
  std::vector<int32_t> tokens;
  // confidence[i]: the drafter's probability of tokens[i] given the tokens before it (1 for
  // deterministic proposals, e.g. n-gram lookup).
  std::vector<float> confidence;
  // Empty: tokens are deterministic given the context (q is one-hot). Else [tokens.size()]
  // vectors of [vocab] probabilities: the distribution tokens[i] was sampled from.
  std::vector<std::vector<float>> probs;
  void Clear() {
    tokens.clear();
    confidence.clear();
    probs.clear();
  }
};

// DraftContinue(i, j, confidence): asked after draft token j (0-based) of input i was proposed,
// with that token's confidence (DraftOutput::confidence); false stops drafting that sequence
// (the confidence scheduler's early exit). Null: draft max_draft_tokens.
using DraftContinue = std::function<bool(size_t input, int32_t j, float confidence)>;

class Drafter {
 public:
  virtual ~Drafter() = default;
  // "draft_model" | "ngram" | "mtp": names the method in logs and metrics.
  virtual std::string_view method() const = 0;
  // Propose fills outputs[i] (resized to inputs.size()) for each input. A sequence the drafter
  // cannot serve this step (e.g. its KV blocks ran out) gets no tokens, not an error.
  // Errors: Internal / InvalidArgument from a draft model's forward (no drafts then).
  virtual absl::Status Propose(absl::Span<const DraftInput> inputs,
                               const DraftContinue& keep_going,
                               std::vector<DraftOutput>* outputs) = 0;
  // Release drops the drafter's state for a finished, aborted or preempted request.
  virtual void Release(std::string_view request_id) {}
  // True when Propose runs a model (its time is worth modelling per step).
  virtual bool HasModel() const { return false; }
  // The fitted cost of one draft round (tokens = sequences drafting in it); null when drafting
  // costs next to nothing (n-gram lookup).
  virtual const StepCostModel* round_cost() const { return nullptr; }
  // True when the drafter reads the target's final hidden states (MTP): after each step the
  // engine then calls ObserveHiddenStates with the positions the target computed and kept.
  virtual bool WantsHiddenStates() const { return false; }
  // ObserveHiddenStates: rows of hidden_size floats, the target's final hidden states
  // (Model::final_hidden_states) of request_id's positions [first_position, + rows), computed
  // over its real tokens (rejected drafts' rows are never handed over).
  virtual void ObserveHiddenStates(std::string_view request_id, int32_t first_position,
                                   absl::Span<const float> hidden) {}
};

}  // namespace sluice

#endif  // SLUICE_ENGINE_SPEC_DRAFTER_H_
