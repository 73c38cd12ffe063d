// Request and output types exchanged between the engine and its front ends.
#ifndef SLUICE_ENGINE_SCHED_REQUEST_H_
#define SLUICE_ENGINE_SCHED_REQUEST_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "engine/kv/block_hash.h"
#include "engine/sample/sampler.h"
#include "engine/sample/sampling_params.h"

namespace sluice {

namespace grammar {
class CompiledGrammar;  // engine/grammar/compiled_grammar.h
}  // namespace grammar

// MultimodalInput: one image's embeddings and the prompt tokens they replace (vision-language
// models; engine/vision). The prompt holds `num_tokens` placeholder tokens at
// [offset, offset + num_tokens) whose input embeddings are the rows of `embeddings`.
struct MultimodalInput {
  int32_t offset = 0;
  int32_t num_tokens = 0;
  // [num_tokens, hidden_size] float32; shared, read-only (an encoder cache may hold it too).
  std::shared_ptr<const std::vector<float>> embeddings;
  // Content address of the image (its bytes and the preprocessing config): an extra key of
  // every KV block the placeholder run overlaps (engine/kv/block_hash.h).
  BlockHash content_hash;
  // The encoded image (PNG/JPEG/WebP bytes) while `embeddings` is still to be computed
  // elsewhere: the router's requests, whose images an encoder worker encodes before prefill.
  // Engines take inputs with embeddings, or, with EngineOptions::image_encoder, with the image
  // alone: its embeddings are then computed when a step needs them (engine/sched/image_encoder.h).
  std::shared_ptr<const std::string> image;
};

// KvLayerObserver: follows, layer by layer, how a request's prompt KV becomes complete in the
// engine's cache during the step that computes its last prompt tokens (a prefill worker's
// layer-by-layer push, services/prefill). Called on the engine thread; must not block.
class KvLayerObserver {
 public:
  virtual ~KvLayerObserver() = default;
  // OnPromptBlocks: the step about to run computes the last prompt tokens; `block_ids` are the
  // blocks that will hold the prompt's KV, in sequence order (RequestOutput::held_block_ids).
  // Called once, before the step's forward.
  virtual void OnPromptBlocks(absl::Span<const int32_t> block_ids) = 0;
  // OnLayerReady: every prompt token's K/V of `layer` is complete once `wait` (null: already)
  // returns OK. Called for each layer in order after OnPromptBlocks: during the forward when
  // the model has the per-layer hook (Model::SupportsLayerKvHook), else all after it. If the
  // step fails, the calls stop and the request ends with kError.
  virtual void OnLayerReady(int32_t layer, std::function<absl::Status()> wait) = 0;
};

// EngineRequest: a tokenized prompt and its sampling parameters.
struct EngineRequest {
  std::string request_id;                // unique among in-flight requests
  std::vector<int32_t> prompt_token_ids;
  SamplingParams sampling;
  // Prefill mode (disaggregated serving): run the prompt, sample only the first token, then
  // finish the request but keep its KV blocks pinned (RequestOutput::kv_held) until
  // ReleaseHeldBlocks, an abort, or the engine's kv_hold_timeout_ms. If the first token already
  // ends the request (EOS, stop id, max_tokens == 1) it finishes normally and nothing is held.
  bool hold_kv_blocks = false;
  // Prefix-cache namespace: requests share cached KV only with requests of the same salt
  // (per-tenant isolation; empty = the shared namespace). Part of every block hash.
  std::string cache_salt;
  // Structured output: tokens are sampled only where this grammar allows them, and EOS is
  // forced once it is complete (engine/grammar). Null: unconstrained. Such rows are sampled on
  // the host (the mask is built there).
  std::shared_ptr<const grammar::CompiledGrammar> grammar;
  // Migration (a request continued on another engine after its first one failed mid-stream):
  // the output tokens already generated and delivered elsewhere. The engine computes the KV of
  // prompt + these (prefix cache and KV connector first) and continues with the next token, as
  // after a preemption; they count toward max_tokens, min_tokens and the penalties, are not
  // emitted again, and seeded draws stay keyed by position. Empty for a new request; must be
  // shorter than max_tokens. With hold_kv_blocks (a migration re-prefilled on a prefill worker)
  // the request samples the next output token and pins the KV of prompt + these; with
  // ReserveForTransfer the reservation and the transfer cover prompt + these.
  std::vector<int32_t> resumed_output_token_ids;
  // Images (vision-language models), ordered by offset, non-overlapping, inside the prompt.
  // Only for models with Model::SupportsInputEmbeddings.
  std::vector<MultimodalInput> mm_inputs;
  // Scheduling class (vLLM's `priority`): with SchedulingPolicy kPriority or
  // kShortestPrefillFirst a lower value is prefilled first; ignored with kFcfs.
  int32_t priority = 0;
  // Prefill mode (with hold_kv_blocks): told as each layer of the prompt's KV is complete, for a
  // layer-by-layer push that overlaps the compute of the later layers. Null: none.
  std::shared_ptr<KvLayerObserver> kv_layer_observer;
};

enum class FinishReason { kNone, kStop, kLength, kAbort, kError };
const char* FinishReasonName(FinishReason reason);  // "stop" | "length" | "abort" | "error"

// RequestOutput: what one engine step produced for one request.
struct RequestOutput {
  std::string request_id;
  std::vector<SampledToken> new_tokens;  // usually one per step
  FinishReason finish_reason = FinishReason::kNone;
  absl::Status status;                   // non-OK with kError
  int32_t num_prompt_tokens = 0;
  int32_t num_cached_tokens = 0;         // prompt tokens served from the prefix cache
  int32_t num_output_tokens = 0;         // total so far
  // Seconds from the request's arrival at the engine (AddRequest / ReserveForTransfer) to the
  // first step that scheduled it (vLLM's queue time); -1 while it has not been scheduled.
  double queue_seconds = -1;
  // With SamplingParams::prompt_logprobs: on the output carrying the first token, one entry per
  // prompt token after the first (prompt_token_ids[1..]); empty otherwise.
  std::vector<PromptLogprob> prompt_logprobs;
  // Prefill mode only (EngineRequest::hold_kv_blocks): true on the last output when the request
  // stopped after its first token with its prompt KV pinned in `held_block_ids` (in sequence
  // order: token t is in held_block_ids[t / block_size]; NumBlocksFor(num_prompt_tokens) ids).
  // finish_reason stays kNone then: generation continues elsewhere.
  bool kv_held = false;
  std::vector<int32_t> held_block_ids;
  bool finished() const { return finish_reason != FinishReason::kNone || kv_held; }
};

// OutputCallback receives a request's outputs in order; the last one has finished() true.
// Called from the engine thread: it must not block.
using OutputCallback = std::function<void(const RequestOutput&)>;

}  // namespace sluice

#endif  // SLUICE_ENGINE_SCHED_REQUEST_H_
