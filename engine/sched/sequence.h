// Sequence: the engine's state for one request (one choice).
#ifndef SLUICE_ENGINE_SCHED_SEQUENCE_H_
#define SLUICE_ENGINE_SCHED_SEQUENCE_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "engine/grammar/grammar_matcher.h"
#include "engine/kv/block_hash.h"
#include "engine/sample/sampler.h"
#include "engine/sched/request.h"
#include "engine/spec/drafter.h"

namespace sluice {

struct Sequence {
  EngineRequest request;
  std::vector<int32_t> output_token_ids;
  // All tokens whose KV the sequence needs: prompt then outputs. Kept in sync by AppendToken.
  std::vector<int32_t> token_ids;
  std::vector<int32_t> block_table;  // KV blocks in order
  int32_t num_computed_tokens = 0;   // tokens of token_ids whose KV is in the cache
  int32_t num_cached_tokens = 0;     // prompt tokens served from a prefix cache
  // While waiting without blocks: prompt tokens the prefix cache holds (kShortestPrefillFirst
  // ranks it by the rest; Scheduler::OrderQueues).
  int32_t num_cached_tokens_estimate = 0;
  // Prefix caching: chained hashes of token_ids' full blocks so far (under root_hash, from the
  // request's cache_salt), and how many leading blocks of block_table were already offered to
  // the cache (registered, found there, or left out on purpose).
  BlockHash root_hash;
  std::vector<BlockHash> block_hashes;
  // The images' content hashes over their placeholder runs (request.mm_inputs), extra keys of
  // the block hashes.
  std::vector<BlockExtraKeySpan> extra_key_spans;
  int32_t num_committed_blocks = 0;
  // KV connector (engine/kv/kv_connector.h): whether the external lookup at admission was done,
  // its ticket while it runs, prompt tokens it served, and how many leading blocks are known to
  // be outside already (written through, or loaded from there).
  bool kv_lookup_done = false;
  uint64_t kv_load_ticket = 0;
  int32_t num_external_cached_tokens = 0;
  int32_t num_saved_blocks = 0;
  // ImageEncoder (image_encoder.h): the ticket of the encode of the request's images while it
  // runs.
  uint64_t image_encode_ticket = 0;
  // Prompt logprobs (SamplingParams::prompt_logprobs): entry p - 1 for prompt position p,
  // filled as prefill chunks run (a recompute overwrites), handed out with the first token.
  std::vector<PromptLogprob> prompt_logprobs;
  bool prompt_logprobs_sent = false;
  // True while prefill still has prompt logprobs to compute: every prompt position must run
  // through the model here (no prefix-cache or external KV reuse).
  bool NeedsPromptLogprobs() const {
    return request.sampling.prompt_logprobs.has_value() && !prompt_logprobs_sent;
  }
  // Structured output (request.grammar set): the grammar state after output_token_ids, and the
  // scratch bitmask of allowed next tokens.
  std::unique_ptr<grammar::GrammarMatcher> matcher;
  std::vector<uint32_t> grammar_bitmask;
  // grammar_bitmask already holds the mask of the matcher's current state (jump-forward
  // computed it and found more than one token allowed): the next sample reuses it.
  bool grammar_bitmask_current = false;
  int64_t admission_order = 0;       // larger = admitted later = preempted first
  double arrival_seconds = 0;        // the scheduler's clock when it was added (aging)
  // Aging counts only the time a prefill waited, not the time the engine spent computing it:
  // seconds of steps that computed its chunks (its share of each step, by the chunk's cost),
  // and which plan last gave it a chunk and at what share (Scheduler::ChargeService).
  double prefill_served_seconds = 0;
  int64_t last_prefill_plan = -1;
  double last_prefill_cost = 0;
  // Arrival at the engine, and seconds from it to the first step that scheduled the sequence
  // (-1 before): RequestOutput::queue_seconds.
  std::chrono::steady_clock::time_point arrival_time = std::chrono::steady_clock::now();
  double queue_seconds = -1;
  int32_t num_preemptions = 0;
  // SWA bounded replay with R < sliding window: the first position whose sliding-layer K/V is
  // in the cache (ForwardInput::sliding_kv_start) while a window still reaches below it; 0:
  // none (also after a preemption: the recompute is local and complete).
  int32_t sliding_kv_start = 0;

  // Async scheduling (LLMEngine): the token a step in flight samples is appended as a
  // placeholder -(r + 1) (row r of that step) until its value is read back; when that token
  // ends the sequence by length whatever its value, the sequence is not scheduled again.
  bool finish_pending = false;

  // Speculative decoding: draft tokens proposed for positions num_tokens() onwards, verified by
  // the next step (the scheduler computes them after the last real token and may cut them to
  // the step's budget; preemption drops them). Never part of token_ids.
  DraftOutput draft;
  void TruncateDraft(size_t n) {
    if (draft.tokens.size() <= n) return;
    draft.tokens.resize(n);
    draft.confidence.resize(n);
    if (draft.probs.size() > n) draft.probs.resize(n);
  }

  int32_t num_tokens() const { return static_cast<int32_t>(token_ids.size()); }
  int32_t num_prompt_tokens() const {
    return static_cast<int32_t>(request.prompt_token_ids.size());
  }
  int32_t num_output_tokens() const { return static_cast<int32_t>(output_token_ids.size()); }
  // The draw key of the token sampled next (at position num_tokens()); the engine resolves an
  // unset seed at admission, so request.sampling.seed is always set here.
  SampleDrawKey NextDrawKey() const {
    return SampleDrawKey{request.sampling.seed.value_or(0), request.sampling.choice_index,
                         num_tokens()};
  }
  void AppendToken(int32_t token) {
    output_token_ids.push_back(token);
    token_ids.push_back(token);
  }
};

}  // namespace sluice

#endif  // SLUICE_ENGINE_SCHED_SEQUENCE_H_
