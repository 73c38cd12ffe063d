// LLMEngine: continuous batching over a paged KV cache on one model.
//
// Each Step() schedules running decodes first, then prefill chunks of waiting requests within
// a per-step token budget (chunked prefill); when KV blocks run out the most recently admitted
// running request is preempted (its blocks freed, recomputed later). Not thread-safe: driven by
// one thread (see AsyncEngine).
#ifndef SLUICE_ENGINE_SCHED_LLM_ENGINE_H_
#define SLUICE_ENGINE_SCHED_LLM_ENGINE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/kv/kv_connector.h"
#include "engine/kv/kv_events.h"
#include "engine/model/model.h"
#include "engine/sched/image_encoder.h"
#include "engine/sched/recompute_event.h"
#include "engine/sched/request.h"
#include "engine/sched/scheduler.h"
#include "engine/sched/step_totals.h"
#include "engine/sched/step_trace.h"
#include "engine/spec/speculative.h"

namespace sluice {

struct EngineOptions {
  int64_t block_size = 16;             // tokens per KV block
  int64_t num_kv_blocks = 0;           // 0: derive from kv_cache_bytes
  int64_t kv_cache_bytes = 1LL << 30;  // KV memory budget when num_kv_blocks == 0
  int32_t max_num_seqs = 256;          // running sequences per step
  int32_t max_num_batched_tokens = 512;  // token budget per step (prefill chunk + decodes)
  // Logits rows per step: decode rows, speculative verify rows (a draft's and the bonus row)
  // and prompt-logprob rows (one per prompt position of a chunk of a request with
  // SamplingParams::prompt_logprobs). A step never asks for more: prompt-logprob prefill
  // chunks and drafts are cut to the rows left (such a prompt takes more steps), while every
  // running sequence keeps the row it samples from. 0: the model's limit (Model::
  // max_num_logits: the CUDA runners' logits buffers; none on the CPU); with both, the smaller.
  // Must be >= max_num_seqs.
  int64_t max_num_logits = 0;
  int32_t max_model_len = 0;           // 0: the model's max_position_embeddings
  int32_t max_waiting_requests = 4096;  // beyond this Submit returns ResourceExhausted
  // Disaggregation: prefill-held KV blocks are freed after this long without a release
  // (milliseconds); a decode reservation without CompleteTransfer fails after this long.
  int64_t kv_hold_timeout_ms = 30000;
  int64_t kv_reserve_timeout_ms = 30000;
  // A transfer that fails because its KV source is gone (CompleteTransfer with Unavailable or
  // DeadlineExceeded) after the first token is known: recompute the prompt here instead of
  // failing the request (vLLM's kv_load_failure_policy "recompute"). False: fail it.
  bool recompute_failed_transfers = true;
  // Prefix caching (engine/kv/prefix_cache.h): full KV blocks are content-addressed by chained
  // block hashes and reused by later requests with the same leading tokens (and cache_salt).
  bool enable_prefix_caching = true;
  // Names the weights in the block-hash seed (KvLayoutIdentity), e.g. the served model name;
  // empty: derived from the model config (architecture and shapes).
  std::string model_id;
  // KV events kept for ReadKvEvents readers before the oldest are dropped.
  int64_t kv_event_buffer_size = 4096;
  // KV outside this engine (engine/kv/kv_connector.h), e.g. the kvstore: with prefix caching,
  // prompt blocks past the local hit are loaded through it at admission and new full blocks are
  // written through after each step. Null: none.
  std::shared_ptr<KvConnector> kv_connector;
  // False: kv_cache() is geometry only (KvCache without storage), for models that keep their KV
  // elsewhere — the CUDA runners (engine/cuda/cuda_model.h) hold it in device memory. Then
  // num_kv_blocks must be set (kv_cache_bytes counts float32 host bytes), KV transfer moves the
  // model's device arrays (Model::DeviceKvArrays) instead of the host cache's, and a
  // kv_connector needs Model::SupportsKvBlockCopies (its blocks are gathered from and scattered
  // into the device cache through pinned staging, in the device dtype).
  bool allocate_host_kv_cache = true;
  // SWA bounded replay (engine/kv/swa_replay.h) for models with sliding-window layers: > 0 (R):
  // a KV transfer into this engine carries only the full-attention layers' K/V, and
  // CompleteTransfer(OK) rebuilds the sliding layers' K/V by replaying the last R prompt tokens
  // before the first decode step; 0: transfers carry every layer. Likewise kv_connector blocks
  // hold only the full-attention layers (under an identity ending in ";stored_layers=..."), and
  // a load replays the last min(R, loaded) loaded tokens before the tail is computed; loaded
  // blocks then stay out of the local prefix cache. Treated as 0 for models without sliding
  // layers or whose Forward cannot replay (EffectiveSwaReplayTokens).
  int64_t swa_replay_tokens = 0;
  // Async scheduling (models with Model::SupportsAsyncSteps, i.e. the CUDA runners): a step
  // whose rows can all be sampled on the device is enqueued and its tokens read back one
  // Step() later, while the next step is scheduled and enqueued behind it with the sampled
  // tokens fed back on the device — the GPU does not wait for the host between steps. Outputs
  // then arrive one Step() after the step that sampled them, and a sequence that stops on a
  // sampled EOS/stop id computes one extra token that is dropped. Steps that need host
  // sampling (penalties, top logprobs, ...) run synchronously. Ignored without the model's
  // support or with a kv_connector.
  bool async_scheduling = true;
  // Speculative decoding (engine/spec/): with a drafter, each step first drafts tokens for the
  // running decode sequences, then the target computes every decode sequence's last token and
  // its drafts in one forward and verifies them (greedy: exact; sampled: rejection sampling).
  // Steps then run synchronously (async_scheduling is ignored).
  SpeculativeOptions speculative;
  // Batch-invariant mode (--batch-invariant): a request's logits, logprobs and tokens are bit
  // for bit those it gets alone, whatever it is batched with, however its prompt is chunked,
  // and whether its prefix came from the cache or by transfer. Create fails with
  // FailedPrecondition unless Model::IsBatchInvariant, and with InvalidArgument when SWA
  // bounded replay would rebuild sliding-window K/V approximately (0 < effective
  // swa_replay_tokens < ExactReplayTokens).
  bool batch_invariant = false;
  // Fair prefill (engine/sched/scheduler.h): the order in which prefills are served, the aging
  // factor of kShortestPrefillFirst (SchedulerConfig::prefill_aging), and
  // the time one step should take (seconds, > 0): prefill chunks are cut to it with the
  // engine's cost(q, c) (QcCostModel), fitted from the synchronous steps it runs (until then,
  // and with 0, only max_num_batched_tokens bounds a step).
  SchedulingPolicy scheduling_policy = SchedulingPolicy::kFcfs;
  double prefill_aging = 0.1;
  double step_time_budget_seconds = 0.0;
  // Jump-forward decoding for structured output: after a grammar row samples a token, the
  // tokens its grammar then forces (exactly one allowed, so sampling would pick it whatever the
  // logits) are appended without a model step and computed with the row's next token, while
  // the request ends neither by length nor on a stop id. The output is the one the steps would
  // give. Not for rows with logprobs (forced tokens have none computed), allowed_token_ids or
  // bad words, nor for prefill-only requests (hold_kv_blocks). Saved steps:
  // EngineCounters::num_jump_forward_tokens.
  bool grammar_jump_forward = true;
  // Vision-language models: computes the embeddings of images requests carry as bytes
  // (MultimodalInput::image without embeddings), only once a step must compute positions of
  // their placeholder runs, off the engine thread (engine/sched/image_encoder.h). Null: every
  // input must come with its embeddings.
  std::shared_ptr<ImageEncoder> image_encoder;
  // Called on the engine thread after every synchronously timed step (RunPlan) with what it
  // ran (the worker's --log-steps); must not block. Null: nothing is recorded.
  std::function<void(const StepTrace&)> on_step;
  // Called on the engine thread for every recompute the engine decides (a preemption, a
  // sliding-window replay that failed; see RecomputeEvent), so each can be logged with its
  // cause; must not block. A failed KV transfer's recompute is not reported here: the caller
  // of CompleteTransfer knows why the transfer failed. Null: nothing is reported.
  std::function<void(const RecomputeEvent&)> on_recompute;
};

// EngineCounters: cumulative figures for metrics and tests.
struct EngineCounters {
  int64_t num_steps = 0;
  // Steps run synchronously (RunPlan), split: with prompt tokens (prefill, chunked or mixed) and
  // decode-only. Pipelined (async) steps overlap and are not timed here.
  StepTotals prefill_steps;
  StepTotals decode_steps;
  int64_t num_prompt_tokens_computed = 0;  // prefill tokens run through the model (incl. recompute)
  // Prompt tokens served from the prefix cache when a request was admitted (again after each
  // preemption). Without preemptions: computed + cached = Σ prompt tokens of prefilled requests.
  int64_t num_prompt_tokens_cached = 0;
  // Of those, tokens loaded through the KV connector (the rest came from the local cache).
  int64_t num_prompt_tokens_cached_external = 0;
  KvConnectorStats kv_connector;  // zeros without a connector
  // Connector block copies between the KV cache and host bytes that failed (a device KV cache:
  // Model::GatherKvBlocks / ScatterKvBlocks): those saves are dropped, those loads computed.
  int64_t num_kv_connector_copy_errors = 0;
  int64_t num_prefix_cache_queried_blocks = 0;  // full blocks looked up at admissions
  int64_t num_prefix_cache_hit_blocks = 0;      // of those, reused from the cache
  int64_t num_prefix_cache_evicted_blocks = 0;  // cached blocks evicted for new allocations
  int64_t num_generation_tokens = 0;
  // Of those, tokens a grammar forced and jump-forward appended without a model step.
  int64_t num_jump_forward_tokens = 0;
  int64_t num_preemptions = 0;  // every cause (RecomputeEvent: kOutOfKvBlocks, ...)
  // Of those, preemptions of waiting requests for the blocked waiting head
  // (RecomputeCause::kWaitingHeadBlocked).
  int64_t num_preemptions_waiting_head = 0;
  int64_t num_held_released = 0;   // prefill-held block sets freed by ReleaseHeldBlocks/abort
  int64_t num_held_expired = 0;    // prefill-held block sets freed by kv_hold_timeout_ms
  int64_t num_transfers_completed = 0;  // reservations completed OK
  int64_t num_transfers_failed = 0;     // reservations failed, aborted or timed out
  // Reservations whose transfer failed and whose prompt was recomputed locally instead
  // (recompute_failed_transfers); not counted as failed.
  int64_t num_transfers_recomputed = 0;
  // Of those, transfers that succeeded but whose sliding-window replay failed
  // (RecomputeCause::kSwaReplayFailed).
  int64_t num_swa_replay_recomputes = 0;
  // Connector (kvstore) loads whose sliding-window replay failed: the loaded tokens were
  // computed instead (RecomputeCause::kKvstoreSwaReplayFailed).
  int64_t num_kvstore_swa_replay_recomputes = 0;
  // Image encodes (EngineOptions::image_encoder) started: sequences that had to compute
  // positions of images they carried as bytes.
  int64_t num_image_encodes = 0;
  // SWA bounded replay: sliding-layer rebuilds run (after transfers and connector loads) and
  // prompt tokens they replayed. A replay that fails recomputes those tokens (after a transfer
  // counted in num_transfers_recomputed).
  int64_t num_swa_replays = 0;
  int64_t num_swa_replayed_tokens = 0;
  // Speculative decoding: draft tokens verified by the target, those accepted, and the
  // verifications (sequence-steps with at least one draft). Mean accepted length (tokens per
  // verification, the bonus token included) = (accepted + verifications) / verifications.
  int64_t num_spec_draft_tokens = 0;
  int64_t num_spec_accepted_tokens = 0;
  int64_t num_spec_verifications = 0;
  // Steps with decode sequences that ran plain and pipelined (no drafts, async scheduling)
  // because auto verification measured them faster than speculating (SpeculationRegime).
  int64_t num_spec_pipelined_steps = 0;
  double spec_draft_seconds = 0.0;   // in the drafter
  double spec_verify_seconds = 0.0;  // target forwards of steps that verified drafts
  // The same two spans in process CPU time (every thread of the process): on a shared machine
  // they measure the work done where wall-clock time also counts waiting for a core.
  double spec_draft_cpu_seconds = 0.0;
  double spec_verify_cpu_seconds = 0.0;
  // The fitted step cost(q, c) (QcCostModel): seconds per step, per new token and per
  // query-key pair; all 0 until fitted.
  double step_cost_fixed_seconds = 0.0;
  double step_cost_token_seconds = 0.0;
  double step_cost_pair_seconds = 0.0;
};

class LLMEngine {
 public:
  // `model` is owned. Errors: InvalidArgument for options that cannot hold one sequence, or
  // whose logits-row limit (max_num_logits or the model's) is below max_num_seqs.
  static absl::StatusOr<std::unique_ptr<LLMEngine>> Create(std::unique_ptr<Model> model,
                                                           const EngineOptions& options);
  virtual ~LLMEngine() = default;

  // AddRequest queues a request. Errors: InvalidArgument (empty prompt, prompt + max_tokens over
  // max_model_len — message gives both numbers —, token id outside the vocabulary, bad sampling
  // params), AlreadyExists (duplicate id), ResourceExhausted (waiting queue full).
  virtual absl::Status AddRequest(EngineRequest request) = 0;
  // ValidateRequest runs AddRequest's checks that depend only on the request and the model
  // (not on engine state). Thread-safe: reads immutable configuration only.
  virtual absl::Status ValidateRequest(const EngineRequest& request) const = 0;
  // AbortRequest finishes the request with kAbort in the next Step's outputs and frees its
  // blocks — also a reserved one (decode mode) and a held one (prefill mode: the blocks are
  // freed, no output since it already finished). Unknown ids are ignored.
  virtual void AbortRequest(const std::string& request_id) = 0;

  // --- Disaggregated serving hooks ---
  // Prefill side: EngineRequest::hold_kv_blocks makes the request stop after its first token
  // with its blocks pinned (see RequestOutput::kv_held).
  // ReleaseHeldBlocks frees the pinned blocks of a held request. NotFound if nothing is held
  // under that id (never held, already released, or expired).
  virtual absl::Status ReleaseHeldBlocks(const std::string& request_id) = 0;

  // Decode side: ReserveForTransfer validates `request` like AddRequest, allocates blocks for
  // prompt + 1 tokens and returns their ids in sequence order (the first
  // NumBlocksFor(prompt_len, block_size) receive the transferred prompt KV; the last slot takes
  // the first token's KV in the first decode step). A request with resumed_output_token_ids (a
  // migration re-prefilled elsewhere) counts them with the prompt throughout: blocks for
  // prompt + resumed + 1 tokens, the transfer brings the KV of prompt + resumed, and the
  // "first token" is the next output after them. The sequence is not scheduled until
  // CompleteTransfer. `first_token` may be given here or at CompleteTransfer (the router
  // reserves while prefill still runs). Errors: as AddRequest; ResourceExhausted when not enough
  // blocks are free (nothing changed).
  virtual absl::StatusOr<std::vector<int32_t>> ReserveForTransfer(
      EngineRequest request, std::optional<SampledToken> first_token) = 0;
  // CompleteTransfer: with an OK `status` the reserved sequence becomes schedulable with
  // num_computed_tokens = prompt length and the first token appended as its first output (it is
  // not emitted again and not recomputed; outputs resume with the second token; if the first
  // token already ends the request the next Step emits a final output without tokens). With an
  // error status the request finishes with kError and that status, its blocks freed — except,
  // with options.recompute_failed_transfers, an Unavailable or DeadlineExceeded status (the KV
  // source failed or was too slow) when the first token is known: then the reserved blocks are
  // dropped, the first token appended, and the sequence is scheduled like a preempted one (its
  // prompt recomputed here, prefix cache first); outputs resume with the second token as after
  // an OK transfer.
  // With options.swa_replay_tokens in effect (swa_replay_tokens() > 0) the transferred blocks
  // hold only the full-attention layers' K/V: an OK transfer first replays the last R prompt
  // tokens here (ReplaySlidingWindowKv) to rebuild the sliding layers' K/V; if that fails the
  // prompt is recomputed as after a failed transfer.
  // Errors: NotFound (no reservation under that id), InvalidArgument (OK status but no first
  // token given at either call; the reservation stays), InvalidArgument (a first token outside
  // the vocabulary: the request finishes with kError and that status, its blocks freed).
  virtual absl::Status CompleteTransfer(const std::string& request_id, absl::Status status,
                                        std::optional<SampledToken> first_token) = 0;
  // HasPendingTimers: held blocks or reservations exist, whose timeouts Step() enforces; a
  // driver should call Step() periodically (e.g. every 10 ms) while this is true.
  virtual bool HasPendingTimers() const = 0;
  // HasStepWork: a Step() now would compute or emit something (waiting/running sequences,
  // pending aborts or outputs). Reserved and held requests alone are not step work.
  virtual bool HasStepWork() const = 0;
  virtual int64_t num_held_blocks() const = 0;  // blocks pinned by held prefill requests
  virtual int64_t num_reserved() const = 0;     // requests waiting for a KV transfer
  // Async steps (EngineOptions::async_scheduling) enqueued and read so far. A block freed while
  // a step is in flight may still be written by it (the row of a sequence that finished, which
  // the step computes one token for nothing): a writer outside the engine's device stream (a
  // KV transfer into a reservation) may write blocks reserved now only once
  // num_steps_read() reaches the num_steps_enqueued() of now. Both 0 for synchronous engines.
  virtual int64_t num_steps_enqueued() const { return 0; }
  virtual int64_t num_steps_read() const { return 0; }
  // kv_cache: the paged KV storage (per layer k/v float32 [num_blocks, block_size, floats]).
  // Buffer addresses are fixed for the engine's lifetime (register them with the transfer
  // agent at start); contents are written only by Step().
  virtual KvCache& kv_cache() = 0;
  // Step runs one scheduling step and returns the outputs it produced.
  virtual std::vector<RequestOutput> Step() = 0;
  virtual bool HasUnfinishedRequests() const = 0;

  virtual const Model& model() const = 0;
  virtual int32_t max_model_len() const = 0;
  virtual int64_t num_waiting() const = 0;
  virtual int64_t num_running() const = 0;
  virtual int64_t num_total_blocks() const = 0;
  virtual int64_t num_free_blocks() const = 0;
  virtual int64_t block_size() const = 0;
  // The SWA replay length in effect (EffectiveSwaReplayTokens of options.swa_replay_tokens):
  // > 0 means transfers into this engine carry only full-attention layers.
  virtual int64_t swa_replay_tokens() const = 0;
  virtual EngineCounters counters() const = 0;

  // --- Prefix cache ---
  virtual int64_t num_cached_blocks() const = 0;  // blocks registered in the prefix cache
  // ResetPrefixCache forgets every cached block (running requests keep theirs, uncached) and
  // publishes all_cleared.
  virtual void ResetPrefixCache() = 0;
  // The identity string that seeds this engine's block hashes (see KvLayoutIdentity).
  virtual const std::string& kv_identity() const = 0;
  // kv_events: the prefix cache's event stream. The log is thread-safe (any thread may read it
  // while Step() runs) and lives as long as any holder of the pointer.
  virtual std::shared_ptr<const KvEventLog> kv_events() const = 0;
};

}  // namespace sluice

#endif  // SLUICE_ENGINE_SCHED_LLM_ENGINE_H_
