// Scheduler: decides, each step, which sequences run and how many tokens each computes.
//
// Policy (vLLM v1-style, one token budget for prefill and decode):
//  1. Running sequences first, in admission order: each gets all its uncomputed tokens (1 for a
//     decode, the rest of the prompt for a partly prefilled one) up to the remaining budget;
//     those marked finish_pending (their end is known, async scheduling) get none.
//     When the KV blocks they need are not free, the most recently admitted running sequence
//     is preempted (blocks freed, recomputed from scratch later) until they fit.
//  2. Waiting sequences in FIFO order (preempted ones go first) while budget, blocks and the
//     max_num_seqs limit allow; a long prompt is split into prefill chunks over several steps.
//     With prefix caching a sequence admitted without blocks (new, or preempted) first shares
//     the longest cached run of its leading full blocks and computes only the rest (at least
//     one token, so the step has logits to sample from).
// That is SchedulingPolicy::kFcfs. The other policies (fair prefill) keep step 1 for running
// sequences that decode (one token left to compute, plus drafts) and then serve every prefill
// — running sequences partly prefilled and waiting ones alike — in the policy's order, so that
// a short prompt arriving behind long ones is computed in the next step instead of after them:
//  - kPriority: lower EngineRequest::priority first, then earlier arrival (vLLM's "priority").
//  - kShortestPrefillFirst: lower priority first, then the least prefill left (shortest
//    remaining processing time first, which minimises mean response time (Schrage 1968)) minus
//    an aging credit. With step_cost fitted both are seconds: the prefill left is priced by
//    cost(q, c) — its per-token and attention terms, and the fixed term once per step the
//    prefill needs under the step budgets — and the credit is prefill_aging × seconds waited
//    since arrival, so a prompt whose prefill takes T seconds longer than a fresh one's
//    overtakes it after waiting T / prefill_aging seconds, which bounds a long prompt's wait
//    relative to its own prefill time on any hardware. Until it is fitted: tokens left, no
//    credit. The tokens left of a waiting prompt are net of its prefix-cache hit. Seconds
//    waited exclude the prompt's own service (its share of the steps that computed its chunks,
//    as in highest-response-ratio-next, Brinch Hansen 1971): a long prompt that is being
//    prefilled does not age, so near its end it cannot outrank a short prompt that just came
//    (which would then wait a long chunk more than the one running when it arrived); one that
//    short prompts keep from being served ages as before.
// Preemption then takes the last sequence in that order (the running prefill served last, else
// the newest decode). With a per-step time budget (step_time_budget_seconds and a fitted
// step_cost) each prefill chunk is also cut to what the fitted cost(q, c) leaves of the budget
// after the step's decodes and earlier chunks, so one step's time, and with it the wait of the
// next short prompt and the decodes' inter-token latency, stays near the budget; the step's
// first prefill chunk gets at least block_size tokens so prefill always progresses. Under the
// fair policies a step that ends some prompt's prefill (samples its first token) takes no
// chunk, after it in the order, that does not end its own prompt: a short prompt's first
// token then costs one short step, not a step filled up with a long prompt's chunk (the long
// prompt goes on in the next step; aging moves it ahead of the short ones if they keep coming).
// With a logits-row limit (SchedulerConfig::max_num_logits: a backend's fixed logits buffers) a
// step's rows — one per sampling sequence and per draft, one per prompt position of a chunk
// whose request wants prompt logprobs — stay within it: such chunks and drafts are cut to the
// rows left after one is kept for each running sequence still to be planned (a prompt-logprob
// prompt then takes more steps, at least one token each while it runs).
// Not thread-safe.
#ifndef SLUICE_ENGINE_SCHED_SCHEDULER_H_
#define SLUICE_ENGINE_SCHED_SCHEDULER_H_

#include <algorithm>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/types/span.h"
#include "engine/kv/block_hash.h"
#include "engine/kv/kv_block_allocator.h"
#include "engine/kv/kv_connector.h"
#include "engine/kv/kv_events.h"
#include "engine/kv/prefix_cache.h"
#include "engine/sched/image_encoder.h"
#include "engine/sched/qc_cost_model.h"
#include "engine/sched/recompute_event.h"
#include "engine/sched/sequence.h"

namespace sluice {

// SchedulingPolicy: the order in which prefills are served (see the banner above).
enum class SchedulingPolicy { kFcfs, kPriority, kShortestPrefillFirst };
// "fcfs" | "priority" | "shortest_prefill_first".
const char* SchedulingPolicyName(SchedulingPolicy policy);
// ParseSchedulingPolicy: the policy named `name` (as SchedulingPolicyName); false if unknown.
bool ParseSchedulingPolicy(const std::string& name, SchedulingPolicy& policy);

struct SchedulerConfig {
  int64_t block_size = 16;
  int32_t max_num_seqs = 256;
  int32_t max_num_batched_tokens = 512;
  // Logits rows per step (NumLogitsRows summed over the plan), >= max_num_seqs; 0: no limit.
  // Prompt-logprob prefill chunks and drafts are cut to the rows left after one row is kept
  // for every running sequence not yet planned, so each of those can still sample.
  int64_t max_num_logits = 0;
  bool enable_prefix_caching = false;
  // Seeds the block hashes (KvLayoutIdentity); used with prefix caching.
  std::string kv_identity;
  // Optional (not owned): blocks beyond the local prefix hit are looked up and loaded through it
  // at admission (needs prefix caching).
  KvConnector* kv_connector = nullptr;
  // Loaded blocks hold only some layers' K/V (SWA bounded replay): FinishLoad does not register
  // them in the prefix cache (the engine rebuilds the rest for the last tokens only).
  bool loaded_blocks_partial = false;
  // Optional (not owned): computes the embeddings of images a sequence carries as bytes when it
  // reaches the head of the waiting queue needing them (see image_encoder.h and
  // FinishImageEncode).
  ImageEncoder* image_encoder = nullptr;
  // Fair prefill (see the banner).
  SchedulingPolicy policy = SchedulingPolicy::kFcfs;
  // kShortestPrefillFirst: the aging credit, seconds of prefill per second waited (see the
  // banner), >= 0; 0: none.
  double prefill_aging = 0.1;
  // > 0 with `step_cost` fitted (QcCostModel::Fitted): the time one step should take, in
  // seconds; prefill chunks are cut to it. 0: only max_num_batched_tokens bounds a step.
  double step_time_budget_seconds = 0.0;
  const QcCostModel* step_cost = nullptr;  // not owned; may be null
  // Monotonic seconds for arrival times and aging; null: std::chrono::steady_clock.
  std::function<double()> clock;
};

// ScheduledSequence: `num_new_tokens` tokens of `seq` starting at seq->num_computed_tokens.
// When they reach the end of seq->token_ids the step samples a token for it. Tokens past the end
// are seq->draft's tokens (speculative decoding), verified by the step.
struct ScheduledSequence {
  Sequence* seq = nullptr;
  int32_t num_new_tokens = 0;
  bool samples() const { return seq->num_computed_tokens + num_new_tokens >= seq->num_tokens(); }
  int32_t num_draft_tokens() const {
    return std::max(0, seq->num_computed_tokens + num_new_tokens - seq->num_tokens());
  }
};

// NumLogitsRows: the logits rows a step computing `num_new_tokens` tokens of `seq` asks for
// (the engine's forward input): while seq wants prompt logprobs, one per prompt position
// before the last that it computes; when it samples, one per draft token plus one.
int32_t NumLogitsRows(const Sequence& seq, int32_t num_new_tokens);
// FitLogitsRows: the most tokens, at most `num_new_tokens`, that `seq` may compute with at most
// `max_rows` logits rows (0 when not even one token fits).
int32_t FitLogitsRows(const Sequence& seq, int32_t num_new_tokens, int64_t max_rows);

struct SchedulerOutput {
  std::vector<ScheduledSequence> scheduled;
  int32_t num_batched_tokens = 0;
  // The sequences this step preempted (blocks freed, queued to recompute), in order.
  std::vector<RecomputeEvent> preempted;
};

class Scheduler {
 public:
  // `events` (may be null) receives the prefix cache's changes.
  Scheduler(const SchedulerConfig& config, int64_t num_kv_blocks,
            std::shared_ptr<KvEventLog> events = nullptr);

  // Add queues a new sequence at the back of the waiting queue and stamps its arrival time.
  // Takes ownership.
  void Add(std::unique_ptr<Sequence> seq);
  // Schedule plans one step. Sequences stay owned by the scheduler.
  SchedulerOutput Schedule();
  // Remove takes a finished or aborted sequence out (waiting or running), frees its blocks and
  // returns it; nullptr if no sequence has that id.
  std::unique_ptr<Sequence> Remove(const std::string& request_id);
  Sequence* Find(const std::string& request_id);

  // Disaggregation hooks.
  // Reserve allocates blocks for `num_tokens` tokens and parks `seq` outside the waiting and
  // running queues (never scheduled) until Activate. Returns false (seq untouched, still owned
  // by the caller) when not enough blocks are free.
  bool Reserve(std::unique_ptr<Sequence>& seq, int64_t num_tokens);
  // Activate moves a reserved sequence to the front of the waiting queue (it keeps its blocks
  // and num_computed_tokens). False if no reserved sequence has that id.
  bool Activate(const std::string& request_id);
  // ActivateForRecompute drops a reserved sequence's blocks (nothing was computed into them that
  // can be trusted) and queues it at the front like a preempted sequence, to be recomputed from
  // its tokens. False if no reserved sequence has that id.
  bool ActivateForRecompute(const std::string& request_id);
  // Detach takes a sequence out (waiting, running or reserved) WITHOUT freeing its blocks; the
  // caller owns the blocks (returns them with FreeBlocks). nullptr if unknown.
  std::unique_ptr<Sequence> Detach(const std::string& request_id);
  // FreeBlocks drops one reference to each block (blocks from Detach, in sequence order).
  void FreeBlocks(const std::vector<int32_t>& blocks) { cache_.Free(blocks); }

  // --- Prefix caching ---
  // CommitBlocks registers seq's full blocks whose KV is computed (up to num_computed_tokens)
  // in the prefix cache. Call after every step that computed tokens of `seq`.
  void CommitBlocks(Sequence& seq);
  // ResetPrefixCache forgets every cached block (blocks in use stay with their sequences).
  void ResetPrefixCache() { cache_.Reset(); }
  const PrefixCacheStats& prefix_cache_stats() const { return cache_.stats(); }
  // Prompt tokens served from the cache at admissions so far (recomputes included).
  int64_t num_cached_prompt_tokens() const { return num_cached_prompt_tokens_; }
  int64_t num_reserved() const { return static_cast<int64_t>(reserved_.size()); }
  // Of those, prompt tokens loaded through the KV connector.
  int64_t num_external_cached_prompt_tokens() const { return num_external_cached_prompt_tokens_; }

  // --- KV connector loads ---
  // A fresh sequence reaching the head of the waiting queue whose prompt has full blocks past
  // the local hit is parked as "loading" (keeping its local prefix blocks) while
  // kv_connector->StartLoad runs; Schedule() skips it. FinishLoad takes a finished load back:
  // allocates blocks for its first `num_blocks` loaded blocks (fewer if blocks ran out), counts
  // them as computed, registers them in the prefix cache and queues the sequence at the front.
  // `fill` copies the loaded bytes into the new blocks (ids in order) before anything is
  // counted or registered; when it fails those blocks are freed and the sequence computes them
  // (never unfilled KV). `load_blocks` gets the filled block ids (empty when none). Null
  // (nothing changed) when no loading sequence has that ticket (aborted meanwhile); else the
  // sequence (still owned by the scheduler).
  Sequence* FinishLoad(uint64_t ticket, int64_t num_blocks,
                       absl::FunctionRef<absl::Status(absl::Span<const int32_t>)> fill,
                       std::vector<int32_t>& load_blocks);
  int64_t num_loading() const { return static_cast<int64_t>(loading_.size()); }

  // --- Image encodes (config.image_encoder) ---
  // A waiting sequence reaching the head that must compute positions of an image without
  // embeddings is parked as "encoding" (a fresh one gives back its prefix-cache blocks first)
  // while image_encoder->StartEncode runs; Schedule() skips it. FinishImageEncode takes the
  // encode of `ticket` back: with `inputs` the sequence's mm_inputs become them and it is queued
  // at the front (still owned by the scheduler; returned); with an error it is removed, its
  // blocks freed, and returned in `failed`. Null (nothing changed) when no encoding sequence has
  // that ticket (aborted meanwhile) or it failed.
  Sequence* FinishImageEncode(uint64_t ticket, absl::StatusOr<std::vector<MultimodalInput>> inputs,
                              std::unique_ptr<Sequence>& failed);
  int64_t num_encoding() const { return static_cast<int64_t>(encoding_.size()); }
  int64_t num_image_encodes() const { return next_encode_ticket_ - 1; }  // started so far

  int64_t num_waiting() const { return static_cast<int64_t>(waiting_.size()); }
  int64_t num_running() const { return static_cast<int64_t>(running_.size()); }
  // The running sequences (still owned by the scheduler): in admission order with kFcfs; else
  // decoding ones in admission order, then those still prefilling in the policy's order, as of
  // the last Schedule().
  std::vector<Sequence*> running() const;
  const KvBlockAllocator& allocator() const { return cache_.allocator(); }
  int64_t num_preemptions() const { return num_preemptions_; }
  // Now: monotonic seconds on the clock of Sequence::arrival_seconds (SchedulerConfig::clock).
  double Now() const;

 private:
  // EnsureBlocks grows seq's block table to hold `num_tokens` tokens; false if blocks ran out.
  bool EnsureBlocks(Sequence& seq, int64_t num_tokens);
  // Preempt frees seq's blocks and records why in `out` (`needed_by`: the request whose tokens
  // needed them).
  void Preempt(Sequence& seq, RecomputeCause cause, const std::string& needed_by,
               SchedulerOutput& out);
  // PreemptWaitingHolders drops the blocks of every waiting sequence but the head that holds
  // some; returns how many.
  int32_t PreemptWaitingHolders(SchedulerOutput& out);
  // ReuseCachedPrefix gives a sequence without blocks its cached leading blocks.
  void ReuseCachedPrefix(Sequence& seq);
  // StartExternalLoad parks a fresh sequence as loading (see FinishLoad); false if it has
  // nothing to load or there is no connector.
  bool StartExternalLoad(Sequence& seq);
  // StartImageEncode starts the encode of seq's images (see FinishImageEncode); false when seq
  // computes no position of an image without embeddings, or there is no encoder.
  bool StartImageEncode(Sequence& seq);
  // DropBlocks frees seq's blocks and resets it to "nothing computed".
  void DropBlocks(Sequence& seq);
  // PrefillLeftTokens: prompt tokens `s` has left to compute, net of its cached prefix (for a
  // waiting sequence, the prefix cache's hit as of the last OrderQueues).
  double PrefillLeftTokens(const Sequence& s) const;
  // PrefillLeftSeconds: what computing them costs by the fitted step_cost: the marginal
  // cost(q, c) plus the fixed cost once per step they need under the step budgets.
  double PrefillLeftSeconds(const Sequence& s) const;
  // PolicyBefore: `a` is served before `b` under config_.policy at time `now`.
  bool PolicyBefore(const Sequence& a, const Sequence& b, double now) const;
  // OrderQueues sorts running_ (decodes in admission order, then prefills) and waiting_ by the
  // policy (not kFcfs).
  void OrderQueues(double now);
  // ChargeService: the plan made last ran until `now` (the engine plans each step once the
  // previous one ran, or while it runs): its prefills get their share of that time as service
  // (Sequence::prefill_served_seconds). Starts the next plan.
  void ChargeService(double now);
  // PlanCost: what a row of q tokens after c costs, for sharing a step's time among its rows.
  double PlanCost(int32_t q, int32_t c) const;

  SchedulerConfig config_;
  BlockHasher hasher_;
  PrefixCache cache_;
  int64_t num_cached_prompt_tokens_ = 0;
  std::deque<std::unique_ptr<Sequence>> waiting_;
  std::vector<std::unique_ptr<Sequence>> running_;  // admission order
  std::vector<std::unique_ptr<Sequence>> reserved_;  // waiting for a KV transfer
  std::vector<std::unique_ptr<Sequence>> loading_;   // waiting for a KV connector load
  std::vector<std::unique_ptr<Sequence>> encoding_;  // waiting for image embeddings
  uint64_t next_encode_ticket_ = 1;
  uint64_t next_load_ticket_ = 1;
  int64_t num_external_cached_prompt_tokens_ = 0;
  int64_t next_admission_ = 0;
  int64_t num_preemptions_ = 0;
  // Service accounting (fair policies): the number of the plan being made, when the last one
  // was made, and the summed PlanCost of its rows.
  int64_t num_plans_ = 0;
  double last_plan_seconds_ = 0;
  double last_plan_cost_ = 0;
};

}  // namespace sluice

#endif  // SLUICE_ENGINE_SCHED_SCHEDULER_H_
