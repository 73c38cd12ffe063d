#include "engine/sched/llm_engine.h"

#include <algorithm>
#include <chrono>
#include <ctime>
#include <deque>
#include <optional>
#include <unordered_set>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/grammar/token_bitmask.h"
#include "engine/kv/kv_block_allocator.h"
#include "engine/kv/swa_replay.h"
#include "engine/sample/philox.h"
#include "engine/sample/sampler.h"
#include "engine/sched/scheduler.h"
#include "engine/sched/step_cost_model.h"
#include "engine/spec/rejection_sampler.h"
#include "engine/spec/speculation_regime.h"

namespace sluice {
namespace {

// EffectiveMaxNumLogits: the logits-row limit the scheduler keeps to, the smaller of the
// options' and the model's (0: none).
int64_t EffectiveMaxNumLogits(const Model& model, const EngineOptions& options) {
  const int64_t given = options.max_num_logits, backend = model.max_num_logits();
  if (given > 0 && backend > 0) return std::min(given, backend);
  return std::max<int64_t>({given, backend, 0});
}

class LLMEngineImpl final : public LLMEngine {
 public:
  LLMEngineImpl(std::unique_ptr<Model> model, const EngineOptions& options, int64_t num_blocks,
                int32_t max_model_len)
      : model_(std::move(model)),
        options_(options),
        max_model_len_(max_model_len),
        kv_cache_(model_->kv_cache_spec(), num_blocks, options.block_size,
                  options.allocate_host_kv_cache),
        kv_identity_(KvIdentity(*model_, options)),
        kv_events_(std::make_shared<KvEventLog>(
            static_cast<size_t>(std::max<int64_t>(1, options.kv_event_buffer_size)))),
        scheduler_(MakeSchedulerConfig(*model_, options, kv_identity_, &qc_cost_), num_blocks,
                   kv_events_),
        confidence_(options.speculative.verify, options.speculative.num_speculative_tokens) {
    // The steps the budget cuts are those near it: their overrun shrinks the budget's use.
    if (options.step_time_budget_seconds > 0) {
      qc_cost_.TrackOverrun(options.step_time_budget_seconds / 2);
    }
    rejection_rule_ = options.speculative.rejection_rule != nullptr
                          ? options.speculative.rejection_rule
                          : std::make_shared<const RejectionRule>();
    const auto& eos = model_->config().eos_token_ids;
    eos_token_ids_.assign(eos.begin(), eos.end());
    const auto& sliding = model_->config().layer_is_sliding;
    has_sliding_layers_ = std::find(sliding.begin(), sliding.end(), true) != sliding.end();
    swa_replay_tokens_ = EffectiveSwaReplayTokens(*model_, options.swa_replay_tokens);
    if (swa_replay_tokens_ > 0) stored_layers_ = FullAttentionLayers(model_->config());
    // Auto verification on a model with asynchronous steps weighs speculation against plain
    // pipelined steps (engine/spec/speculation_regime.h). Not for a drafter that reads each
    // step's hidden states (MTP): pipelined steps hand none over.
    if (options.speculative.enabled() && options.speculative.verify == VerifyMode::kAuto &&
        options.async_scheduling && model_->SupportsAsyncSteps() &&
        !options.speculative.drafter->WantsHiddenStates()) {
      regime_.emplace();
    }
    // A model with its own (device) KV cache moves connector blocks itself, in its dtype.
    device_kv_copies_ = model_->SupportsKvBlockCopies();
    connector_block_bytes_ =
        KvBlockBytes(model_->kv_cache_spec(), options.block_size, stored_layers_,
                     device_kv_copies_ ? model_->KvDtypeBytes() : 4);
  }

  static SchedulerConfig MakeSchedulerConfig(const Model& model, const EngineOptions& options,
                                             const std::string& kv_identity,
                                             const QcCostModel* step_cost) {
    SchedulerConfig c;
    c.block_size = options.block_size;
    c.max_num_seqs = options.max_num_seqs;
    c.max_num_batched_tokens = options.max_num_batched_tokens;
    c.max_num_logits = EffectiveMaxNumLogits(model, options);
    c.enable_prefix_caching = options.enable_prefix_caching;
    c.kv_identity = kv_identity;
    c.kv_connector = options.kv_connector.get();
    c.image_encoder = options.image_encoder.get();
    c.loaded_blocks_partial = EffectiveSwaReplayTokens(model, options.swa_replay_tokens) > 0;
    c.policy = options.scheduling_policy;
    c.prefill_aging = options.prefill_aging;
    c.step_time_budget_seconds = options.step_time_budget_seconds;
    c.step_cost = step_cost;
    return c;
  }

  // ConnectorLayout: what the KV connector stores per block. With SWA replay only the
  // full-attention layers, under an identity that says so (the store's layout id and keys then
  // differ from those of engines storing every layer).
  KvConnectorLayout ConnectorLayout() const {
    std::string identity = kv_identity_;
    if (!stored_layers_.empty()) {
      absl::StrAppend(&identity, ";stored_layers=", absl::StrJoin(stored_layers_, ","));
    }
    return KvConnectorLayout{identity, options_.block_size, connector_block_bytes_};
  }

  static std::string KvIdentity(const Model& model, const EngineOptions& options) {
    const ModelConfig& c = model.config();
    const KvCacheSpec spec = model.kv_cache_spec();
    const std::string model_id =
        !options.model_id.empty()
            ? options.model_id
            : absl::StrCat(c.model_type, "/", c.architecture_name, "/vocab", c.vocab_size,
                           "/hidden", c.hidden_size, "/layers", c.num_hidden_layers);
    // The stored dtype: bf16 for the CUDA runners' device caches, float32 for the host cache.
    const char* dtype = model.SupportsKvBlockCopies() && model.KvDtypeBytes() == 2 ? "bf16"
                                                                                   : "f32";
    return KvLayoutIdentity(model_id, options.block_size, dtype, spec.num_layers,
                            spec.k_floats_per_token, spec.v_floats_per_token);
  }

  absl::Status ValidateMultimodal(const EngineRequest& request) const {
    if (request.mm_inputs.empty()) return absl::OkStatus();
    if (!model_->SupportsInputEmbeddings()) {
      return absl::InvalidArgumentError("this model does not accept image inputs");
    }
    const int64_t hidden = model_->config().hidden_size;
    int64_t next_free = 0;
    for (size_t i = 0; i < request.mm_inputs.size(); ++i) {
      const MultimodalInput& mm = request.mm_inputs[i];
      if (mm.num_tokens <= 0 || mm.offset < next_free ||
          int64_t{mm.offset} + mm.num_tokens >
              static_cast<int64_t>(request.prompt_token_ids.size())) {
        return absl::InvalidArgumentError(absl::StrCat(
            "image ", i, ": placeholder tokens [", mm.offset, ", ", mm.offset + mm.num_tokens,
            ") overlap another image or leave the prompt"));
      }
      const bool encodable =
          mm.embeddings == nullptr && options_.image_encoder != nullptr && mm.image != nullptr;
      if (!encodable && (mm.embeddings == nullptr || static_cast<int64_t>(mm.embeddings->size()) !=
                                                         int64_t{mm.num_tokens} * hidden)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "image ", i, ": embeddings must be ", mm.num_tokens, " x ", hidden, " floats"));
      }
      next_free = int64_t{mm.offset} + mm.num_tokens;
    }
    return absl::OkStatus();
  }

  absl::Status ValidateRequest(const EngineRequest& request) const override {
    const int32_t vocab = static_cast<int32_t>(model_->config().vocab_size);
    const int64_t num_prompt = static_cast<int64_t>(request.prompt_token_ids.size());
    if (num_prompt == 0) return absl::InvalidArgumentError("prompt must not be empty");
    if (request.priority != 0 && options_.scheduling_policy == SchedulingPolicy::kFcfs) {
      // As vLLM: a priority nobody honours is an error, not silently dropped.
      return absl::InvalidArgumentError(absl::StrCat(
          "priority ", request.priority, " was given, but priority scheduling is not enabled "
          "(--scheduling-policy fcfs; use priority or shortest_prefill_first)"));
    }
    for (int32_t id : request.prompt_token_ids) {
      if (id < 0 || id >= vocab) {
        return absl::InvalidArgumentError(
            absl::StrCat("prompt token id ", id, " is outside the vocabulary [0, ", vocab, ")"));
      }
    }
    if (num_prompt >= max_model_len_) {
      return absl::InvalidArgumentError(
          absl::StrCat("This model's maximum context length is ", max_model_len_,
                       " tokens, but the prompt has ", num_prompt, " tokens"));
    }
    const int64_t num_resumed = static_cast<int64_t>(request.resumed_output_token_ids.size());
    if (num_resumed > 0) {
      if (num_resumed >= request.sampling.max_tokens) {
        return absl::InvalidArgumentError(absl::StrCat(
            "a resumed request must have fewer resumed output tokens (", num_resumed,
            ") than max_tokens (", request.sampling.max_tokens, ")"));
      }
      for (int32_t id : request.resumed_output_token_ids) {
        if (id < 0 || id >= vocab) {
          return absl::InvalidArgumentError(absl::StrCat(
              "resumed output token id ", id, " is outside the vocabulary [0, ", vocab, ")"));
        }
      }
    }
    if (absl::Status s = ValidateMultimodal(request); !s.ok()) return s;
    if (num_prompt + request.sampling.max_tokens > max_model_len_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "This model's maximum context length is ", max_model_len_, " tokens. However, you ",
          "requested ", num_prompt + request.sampling.max_tokens, " tokens (", num_prompt,
          " in the prompt, ", request.sampling.max_tokens,
          " for the completion). Please reduce the prompt or max_tokens."));
    }
    return request.sampling.Validate(vocab);
  }

  absl::Status AddRequest(EngineRequest request) override {
    if (absl::Status s = ValidateRequest(request); !s.ok()) return s;
    if (absl::Status s = CheckNewId(request.request_id); !s.ok()) return s;
    if (scheduler_.num_waiting() >= options_.max_waiting_requests) {
      return absl::ResourceExhaustedError("too many waiting requests; retry later");
    }
    std::unique_ptr<Sequence> seq = NewSequence(std::move(request));
    ids_.insert(seq->request.request_id);
    scheduler_.Add(std::move(seq));
    return absl::OkStatus();
  }

  void AbortRequest(const std::string& request_id) override {
    if (ids_.contains(request_id)) {
      pending_aborts_.push_back(request_id);
    } else if (held_.contains(request_id)) {
      FreeHeld(request_id);
      ++counters_.num_held_released;
    }
  }

  absl::Status ReleaseHeldBlocks(const std::string& request_id) override {
    if (!held_.contains(request_id)) {
      return absl::NotFoundError(
          absl::StrCat("no KV blocks are held for request '", request_id, "'"));
    }
    FreeHeld(request_id);
    ++counters_.num_held_released;
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<int32_t>> ReserveForTransfer(
      EngineRequest request, std::optional<SampledToken> first_token) override {
    if (absl::Status s = ValidateRequest(request); !s.ok()) return s;
    if (absl::Status s = CheckNewId(request.request_id); !s.ok()) return s;
    if (request.hold_kv_blocks) {
      return absl::InvalidArgumentError("a transfer reservation cannot hold its KV blocks");
    }
    const std::string id = request.request_id;
    std::unique_ptr<Sequence> seq = NewSequence(std::move(request));
    // The transfer brings the KV of every token so far: the prompt, and for a migrated request
    // re-prefilled elsewhere its resumed outputs too (NewSequence appended them).
    seq->num_computed_tokens = seq->num_tokens();
    // The transferred prompt blocks join the prefix cache after the first decode step (only
    // after CompleteTransfer(OK), so a block still being written is never shared). Not for
    // sliding-window models: the sender may move only the full-attention layers' KV and have
    // the sliding layers rebuilt for the last tokens only (SWA replay), which a later request
    // reusing the prefix would read. After a preemption the recompute is local and cacheable.
    if (has_sliding_layers_) {
      seq->num_committed_blocks = seq->num_tokens() / static_cast<int32_t>(block_size());
      seq->num_saved_blocks = seq->num_committed_blocks;
    }
    const int64_t num_tokens = seq->num_tokens() + 1;
    if (!scheduler_.Reserve(seq, num_tokens)) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "not enough free KV blocks to reserve ", NumBlocksFor(num_tokens, options_.block_size),
          " blocks (", scheduler_.allocator().num_free_blocks(), " free)"));
    }
    Sequence* parked = scheduler_.Find(id);
    ids_.insert(id);
    reservations_[id] = Reservation{Now() + Ms(options_.kv_reserve_timeout_ms),
                                    std::move(first_token)};
    return parked->block_table;
  }

  absl::Status CompleteTransfer(const std::string& request_id, absl::Status status,
                                std::optional<SampledToken> first_token) override {
    auto it = reservations_.find(request_id);
    if (it == reservations_.end()) {
      return absl::NotFoundError(
          absl::StrCat("no KV transfer reservation for request '", request_id, "'"));
    }
    if (first_token.has_value()) it->second.first_token = std::move(first_token);
    if (status.ok()) {
      if (!it->second.first_token.has_value()) {
        return absl::InvalidArgumentError(
            absl::StrCat("request '", request_id, "': the first token was not given"));
      }
    }
    std::optional<SampledToken> token = std::move(it->second.first_token);
    reservations_.erase(it);
    bool recompute = !status.ok() && options_.recompute_failed_transfers &&
                     token.has_value() &&
                     (absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status));
    // The first token comes from the peer that prefilled (the wire): one outside the vocabulary
    // would index the embedding and penalty tables out of bounds in the next step.
    const int64_t vocab = model_->config().vocab_size;
    if ((status.ok() || recompute) && (token->token_id < 0 || token->token_id >= vocab)) {
      absl::Status bad = absl::InvalidArgumentError(
          absl::StrCat("request '", request_id, "': first token id ", token->token_id,
                       " is outside the vocabulary [0, ", vocab, ")"));
      FailReserved(request_id, bad);
      return bad;
    }
    if (!status.ok() && !recompute) {
      FailReserved(request_id, std::move(status));
      return absl::OkStatus();
    }
    Sequence* seq = scheduler_.Find(request_id);
    // Only the full-attention layers arrived: rebuild the sliding layers before the sequence
    // runs. A replay that fails leaves unusable KV, like a failed transfer: recompute.
    absl::Status replay;
    if (!recompute && swa_replay_tokens_ > 0) {
      replay = RebuildSlidingKv(*seq, seq->num_computed_tokens, swa_replay_tokens_);
      recompute = !replay.ok();
      if (recompute) ++counters_.num_swa_replay_recomputes;
    }
    seq->AppendToken(token->token_id);
    AdvanceGrammar(*seq, token->token_id);
    ++(recompute ? counters_.num_transfers_recomputed : counters_.num_transfers_completed);
    if (FinishReason reason = CheckFinished(*seq); reason != FinishReason::kNone) {
      std::unique_ptr<Sequence> done = RemoveSequence(request_id);
      pending_outputs_.push_back(FinalOutput(*done, reason, absl::OkStatus()));
      ids_.erase(request_id);
      return absl::OkStatus();
    }
    if (recompute) {
      if (!replay.ok()) {
        RecomputeEvent e;
        e.request_id = request_id;
        e.cause = RecomputeCause::kSwaReplayFailed;
        e.num_blocks_freed = static_cast<int64_t>(seq->block_table.size());
        e.num_tokens_to_recompute = seq->num_prompt_tokens();
        e.detail = std::string(replay.message());
        ReportRecompute(e);
      }
      scheduler_.ActivateForRecompute(request_id);
    } else {
      scheduler_.Activate(request_id);
    }
    return absl::OkStatus();
  }

  bool HasPendingTimers() const override {
    // Connector loads finish off-thread: Step() polls them.
    // Image encodes too.
    return !held_.empty() || !reservations_.empty() || scheduler_.num_loading() > 0 ||
           scheduler_.num_encoding() > 0;
  }
  bool HasStepWork() const override {
    return scheduler_.num_waiting() > 0 || scheduler_.num_running() > 0 ||
           !pending_aborts_.empty() || !pending_outputs_.empty() || !in_flight_.empty();
  }
  int64_t num_held_blocks() const override { return num_held_blocks_; }
  int64_t num_reserved() const override { return scheduler_.num_reserved(); }
  int64_t num_steps_enqueued() const override { return num_steps_enqueued_; }
  int64_t num_steps_read() const override { return num_steps_read_; }
  KvCache& kv_cache() override { return kv_cache_; }

  std::vector<RequestOutput> Step() override {
    std::vector<RequestOutput> outputs;
    outputs.swap(pending_outputs_);
    removed_.clear();
    for (const std::string& id : pending_aborts_) {
      if (std::unique_ptr<Sequence> seq = RemoveSequence(id)) {
        if (reservations_.erase(id) > 0) ++counters_.num_transfers_failed;
        outputs.push_back(FinalOutput(*seq, FinishReason::kAbort, absl::OkStatus()));
        ids_.erase(id);
      }
    }
    pending_aborts_.clear();
    ExpireTimers(outputs);
    FinishConnectorLoads();
    FinishImageEncodes(outputs);
    if (regime_.has_value()) {
      ObserveRegime();
      // Back to speculation: drafting needs the real tokens of the step still in flight.
      if (!regime_->Pipelined() && !in_flight_.empty()) {
        FinishInFlight(outputs);
        removed_.clear();  // no plan holds them yet
      }
    }
    ProposeDrafts();

    SchedulerOutput plan = scheduler_.Schedule();
    for (const RecomputeEvent& e : plan.preempted) {
      ++counters_.num_preemptions;
      if (e.cause == RecomputeCause::kWaitingHeadBlocked) ++counters_.num_preemptions_waiting_head;
      ReportRecompute(e);
    }
    NoteFirstScheduled(plan);
    if (!in_flight_.empty()) {
      // Async scheduling: this plan was built while the step in flight runs, its sampled
      // tokens standing in as placeholders. Enqueue it behind that step, then read that step.
      if (!plan.scheduled.empty() && AsyncPlan(plan)) {
        // Grammar rows: the forward now, the masks once the read below gave their tokens.
        const bool defer = HasGrammar(plan);
        absl::Status enqueued = EnqueuePlan(plan, defer);
        FinishInFlight(outputs);
        if (enqueued.ok() && defer) enqueued = EnqueueDeferredSampling();
        if (!enqueued.ok()) {
          DropRemoved(plan);  // the read may have finished some of the plan's sequences
          FailRequests(PlanIds(plan), enqueued, outputs);
        } else {
          AppendPlaceholders();
        }
        return outputs;
      }
      // Not pipelined (host sampling needed, or nothing to run): the step in flight completes
      // first, so this plan sees real tokens; sequences it finished leave the plan.
      FinishInFlight(outputs);
      DropRemoved(plan);
    }
    if (plan.scheduled.empty()) return outputs;
    if (AsyncPlan(plan)) {
      if (absl::Status s = EnqueuePlan(plan); !s.ok()) {
        FailRequests(PlanIds(plan), s, outputs);
      } else {
        AppendPlaceholders();
      }
      return outputs;
    }
    RunPlan(plan, outputs);
    return outputs;
  }

  bool HasUnfinishedRequests() const override { return !ids_.empty(); }
  const Model& model() const override { return *model_; }
  int32_t max_model_len() const override { return max_model_len_; }
  int64_t num_waiting() const override { return scheduler_.num_waiting(); }
  int64_t num_running() const override { return scheduler_.num_running(); }
  int64_t num_total_blocks() const override {
    return scheduler_.allocator().num_total_blocks();
  }
  int64_t num_free_blocks() const override { return scheduler_.allocator().num_free_blocks(); }
  int64_t block_size() const override { return options_.block_size; }
  int64_t swa_replay_tokens() const override { return swa_replay_tokens_; }
  EngineCounters counters() const override {
    EngineCounters c = counters_;
    const PrefixCacheStats& pc = scheduler_.prefix_cache_stats();
    c.num_prompt_tokens_cached = scheduler_.num_cached_prompt_tokens();
    c.num_prompt_tokens_cached_external = scheduler_.num_external_cached_prompt_tokens();
    c.num_image_encodes = scheduler_.num_image_encodes();
    if (options_.kv_connector != nullptr) c.kv_connector = options_.kv_connector->stats();
    c.num_prefix_cache_queried_blocks = pc.num_queried_blocks;
    c.num_prefix_cache_hit_blocks = pc.num_hit_blocks;
    c.num_prefix_cache_evicted_blocks = pc.num_evicted_blocks;
    if (qc_cost_.Fitted()) {
      c.step_cost_fixed_seconds = qc_cost_.fixed_seconds();
      c.step_cost_token_seconds = qc_cost_.per_token_seconds();
      c.step_cost_pair_seconds = qc_cost_.per_pair_seconds();
    }
    return c;
  }
  int64_t num_cached_blocks() const override {
    return scheduler_.prefix_cache_stats().num_cached_blocks;
  }
  void ResetPrefixCache() override { scheduler_.ResetPrefixCache(); }
  const std::string& kv_identity() const override { return kv_identity_; }
  std::shared_ptr<const KvEventLog> kv_events() const override { return kv_events_; }

 private:
  // Per scheduled sequence of the step built last: which logits rows are its (BuildForwardInput).
  struct LogitsRows {
    int32_t first_prompt_row = 0;  // prompt-logprob rows, for positions first_prompt_pos...
    int32_t num_prompt_rows = 0;
    int32_t first_prompt_pos = 0;
    int32_t sample_row = -1;  // the row it samples from; -1: none
  };

  // BeginTrace describes `plan` before it runs (EngineOptions::on_step).
  StepTrace BeginTrace(const SchedulerOutput& plan, double step_tokens, double step_pairs) {
    StepTrace t;
    t.step = counters_.num_steps;
    t.predicted_seconds = qc_cost_.Fitted() ? qc_cost_.Predict(step_tokens, step_pairs) : 0.0;
    t.budget_seconds = options_.step_time_budget_seconds;
    const double now = scheduler_.Now();
    for (const ScheduledSequence& s : plan.scheduled) {
      StepTraceRow row;
      row.request_id = s.seq->request.request_id;
      row.num_prompt_tokens = s.seq->num_prompt_tokens();
      row.num_new_tokens = s.num_new_tokens;
      row.num_computed_before = s.seq->num_computed_tokens;
      row.prefill = s.seq->num_computed_tokens < s.seq->num_prompt_tokens();
      row.samples = s.samples();
      row.waited_seconds = now - s.seq->arrival_seconds;
      t.rows.push_back(std::move(row));
    }
    return t;
  }

  // RunPlan runs `plan` synchronously: forward, sampling (on the device for plain greedy
  // rows, else on the host over the logits), outputs.
  void RunPlan(const SchedulerOutput& plan, std::vector<RequestOutput>& outputs) {
    ++counters_.num_steps;
    BuildForwardInput(plan);
    double step_tokens = 0, step_pairs = 0;  // cost(q, c) features, before the step advances
    for (const ScheduledSequence& s : plan.scheduled) {
      step_tokens += s.num_new_tokens;
      step_pairs += QcCostModel::Pairs(s.num_new_tokens, s.seq->num_computed_tokens);
    }
    std::optional<StepTrace> trace;
    if (options_.on_step) trace = BeginTrace(plan, step_tokens, step_pairs);
    const int64_t vocab = model_->config().vocab_size;
    const bool device_greedy = DeviceGreedyStep(plan);
    ArmLayerObservers(plan);
    absl::Status status;
    const Clock::time_point start = Now();
    const double cpu_start = CpuSeconds();
    const double clock_start = options_.speculative.clock ? options_.speculative.clock() : 0.0;
    if (device_greedy) {
      greedy_.resize(input_.logits_indices.size());
      status = model_->ForwardGreedy(input_, kv_cache_, absl::MakeSpan(greedy_));
    } else {
      logits_.resize(input_.logits_indices.size() * vocab);
      status = model_->Forward(input_, kv_cache_, absl::MakeSpan(logits_));
    }
    const double seconds = std::chrono::duration<double>(Now() - start).count();
    // A model without the per-layer hook: every layer is complete once the forward returned.
    if (status.ok() && !layer_observers_.empty() && !model_->SupportsLayerKvHook()) {
      for (int32_t l = 0; l < static_cast<int32_t>(kv_cache_.spec().num_layers); ++l) {
        for (KvLayerObserver* o : layer_observers_) o->OnLayerReady(l, nullptr);
      }
    }
    input_.on_layer_kv_written = nullptr;
    layer_observers_.clear();
    // The confidence scheduler prices decode steps: prompt chunks (a cheaper per-token rate in
    // one large GEMM) would bend the fit. Beside SpeculationRegime it prices verify steps only:
    // plain steps are the regime's (pipelined), and a synchronous plain step takes another path
    // (a plain decode graph, against a verify step's padded multi-token one) whose cost would
    // bend the verify steps' line.
    if (IsDecodeStep(plan) && (!regime_.has_value() || HasDrafts(plan))) {
      step_cost_.Observe(static_cast<double>(input_.token_ids.size()),
                         options_.speculative.clock
                             ? options_.speculative.clock() - clock_start
                         : options_.speculative.cost_clock == CostClock::kProcessCpu
                             ? CpuSeconds() - cpu_start
                             : seconds);
    }
    if (status.ok()) qc_cost_.Observe(step_tokens, step_pairs, seconds);
    if (trace.has_value()) {
      trace->seconds = seconds;
      options_.on_step(*trace);
    }
    StepTotals& totals = IsDecodeStep(plan) ? counters_.decode_steps : counters_.prefill_steps;
    ++totals.num_steps;
    totals.num_tokens += static_cast<int64_t>(input_.token_ids.size());
    totals.seconds += seconds;
    if (HasDrafts(plan)) {
      counters_.spec_verify_seconds += seconds;
      counters_.spec_verify_cpu_seconds += CpuSeconds() - cpu_start;
    }
    if (!status.ok()) {
      // A failed step fails the requests in it; the others go on.
      FailRequests(PlanIds(plan), status, outputs);
      return;
    }

    std::vector<std::string> finished;
    for (size_t i = 0; i < plan.scheduled.size(); ++i) {
      const ScheduledSequence& s = plan.scheduled[i];
      const LogitsRows& rows = logits_rows_[i];
      Sequence& seq = *s.seq;
      const bool samples = s.samples();
      if (rows.num_prompt_rows > 0) CollectPromptLogprobs(seq, rows, vocab);
      const int32_t computed_before = seq.num_computed_tokens;
      if (s.num_draft_tokens() > 0) {
        VerifyDrafts(s, device_greedy, static_cast<size_t>(rows.sample_row), outputs, finished);
        HandHiddenStates(i, seq, computed_before);
        continue;
      }
      AdvanceComputed(seq, s.num_new_tokens);
      HandHiddenStates(i, seq, computed_before);
      scheduler_.CommitBlocks(seq);
      WriteThrough(seq);
      if (!samples) continue;
      const size_t logits_row = static_cast<size_t>(rows.sample_row);
      SampledToken token;
      if (device_greedy) {
        token.token_id = greedy_[logits_row].token_id;
        token.logprob = greedy_[logits_row].logprob;
      } else {
        token = Sample(seq, absl::Span<float>(logits_.data() + logits_row * vocab, vocab));
      }
      seq.AppendToken(token.token_id);
      std::vector<SampledToken> tokens;
      tokens.push_back(std::move(token));
      JumpForward(seq, tokens);
      EmitTokens(seq, std::move(tokens), outputs, finished);
    }
    FlushWriteThrough();  // before finished sequences free their blocks
    RemoveFinished(finished, outputs);
  }

  // HandHiddenStates gives a drafter that reads them (MTP) the target's final hidden states of
  // the positions this step computed for plan sequence i and kept: a verification keeps the
  // last real token's and the accepted drafts' rows only.
  void HandHiddenStates(size_t i, const Sequence& seq, int32_t computed_before) {
    if (!options_.speculative.enabled() || !options_.speculative.drafter->WantsHiddenStates()) {
      return;
    }
    const absl::Span<const float> hidden = model_->final_hidden_states();
    const int64_t h = model_->config().hidden_size;
    const int64_t rows = seq.num_computed_tokens - computed_before;
    const int64_t start = input_.sequences[i].query_start;
    if (rows <= 0 || static_cast<int64_t>(hidden.size()) < (start + rows) * h) return;
    options_.speculative.drafter->ObserveHiddenStates(seq.request.request_id, computed_before,
                                                      hidden.subspan(start * h, rows * h));
  }

  // JumpForward appends to seq (and `tokens`) the tokens its grammar forces after its newest
  // token (EngineOptions::grammar_jump_forward): while the mask allows exactly one token,
  // sampling would return it whatever the logits, so it needs no model step. A forced stop id
  // before min_tokens is left to the sampler (which suppresses it).
  void JumpForward(Sequence& seq, std::vector<SampledToken>& tokens) {
    if (!options_.grammar_jump_forward || seq.matcher == nullptr) return;
    const SamplingParams& p = seq.request.sampling;
    if (p.logprobs.has_value() || !p.allowed_token_ids.empty() ||
        !p.bad_words_token_ids.empty() || seq.request.hold_kv_blocks) {
      return;
    }
    while (CheckFinished(seq) == FinishReason::kNone) {
      const int32_t forced = grammar::SingleAllowedToken(GrammarMask(seq));
      if (forced < 0) return;
      if (seq.num_output_tokens() < p.min_tokens) {
        auto contains = [&](const auto& ids) {
          return std::find(ids.begin(), ids.end(), forced) != ids.end();
        };
        if (contains(p.stop_token_ids) || (!p.ignore_eos && contains(eos_token_ids_))) return;
      }
      seq.AppendToken(forced);
      AdvanceGrammar(seq, forced);
      SampledToken token;
      token.token_id = forced;
      tokens.push_back(std::move(token));
      ++counters_.num_jump_forward_tokens;
    }
  }

  // ArmLayerObservers: the sequences of `plan` that compute their last prompt tokens and carry
  // a KvLayerObserver get their prompt blocks now and, through the forward's per-layer hook,
  // each layer as it completes.
  void ArmLayerObservers(const SchedulerOutput& plan) {
    layer_observers_.clear();
    for (const ScheduledSequence& s : plan.scheduled) {
      Sequence& seq = *s.seq;
      KvLayerObserver* observer = seq.request.kv_layer_observer.get();
      if (observer == nullptr || !s.samples() || seq.num_output_tokens() > 0 ||
          seq.num_computed_tokens >= seq.num_prompt_tokens()) {
        continue;
      }
      const size_t n = static_cast<size_t>(
          NumBlocksFor(seq.num_prompt_tokens(), options_.block_size));
      observer->OnPromptBlocks(
          absl::MakeConstSpan(seq.block_table).subspan(0, std::min(n, seq.block_table.size())));
      layer_observers_.push_back(observer);
    }
    if (layer_observers_.empty() || !model_->SupportsLayerKvHook()) return;
    input_.on_layer_kv_written = [this](int32_t layer, const LayerKvWait& wait) {
      for (KvLayerObserver* o : layer_observers_) o->OnLayerReady(layer, wait);
    };
  }

  // IsDecodeStep: every scheduled sequence computes only its last token (and drafts).
  static bool IsDecodeStep(const SchedulerOutput& plan) {
    for (const ScheduledSequence& s : plan.scheduled) {
      if (s.num_new_tokens - s.num_draft_tokens() != 1 || !s.samples()) return false;
    }
    return true;
  }

  static bool HasDrafts(const SchedulerOutput& plan) {
    for (const ScheduledSequence& s : plan.scheduled) {
      if (s.num_draft_tokens() > 0) return true;
    }
    return false;
  }

  // ObserveRegime hands the speculation regime the step that ran since the last Step(): its
  // engine time (Step() to Step(): the host's work between steps counts), the tokens it
  // emitted and the decode sequences it ran, then counts the next step if it runs pipelined.
  void ObserveRegime() {
    const double now = options_.speculative.clock
                           ? options_.speculative.clock()
                           : std::chrono::duration<double>(Now().time_since_epoch()).count();
    // A step that computed prompt tokens, and the step after it (a pipelined step reads its
    // predecessor, so that is where a pipelined prefill's time shows), count prefill time that
    // either regime pays alike: not observed, or a batch's arrival would decide the regime.
    // Under prefill in every step, one step in kMeasureSteps + 1 is observed all the same.
    const bool prefilled = counters_.num_prompt_tokens_computed != regime_last_prompt_tokens_;
    const bool skip = (prefilled || regime_prefilled_before_) &&
                      regime_skipped_ < SpeculationRegime::kMeasureSteps;
    // Kernel set-up for shapes met the first time (verify steps meet new token counts for a
    // while; on an H100 such steps took 1.4-8.9 ms against 0.4 ms) is a one-off cost: netted
    // out of the step's time rather than the step left out, which would keep only the
    // cheaper, familiar shapes.
    const double setup = model_->kernel_setup_seconds();
    const double one_off = setup - regime_last_setup_;
    regime_last_setup_ = setup;
    if (regime_last_step_.has_value() && regime_last_sequences_ > 0) {
      if (skip) {
        ++regime_skipped_;
      } else {
        regime_skipped_ = 0;
        const double seconds = now - *regime_last_step_;
        regime_->Observe(std::max(seconds - one_off, 0.1 * seconds),
                         counters_.num_generation_tokens - regime_last_tokens_,
                         regime_last_sequences_);
      }
    }
    regime_prefilled_before_ = prefilled;
    regime_last_prompt_tokens_ = counters_.num_prompt_tokens_computed;
    regime_last_step_ = now;
    regime_last_tokens_ = counters_.num_generation_tokens;
    int64_t decoding = 0, fresh = 0;
    for (const Sequence* seq : scheduler_.running()) {
      decoding += seq->num_computed_tokens >= seq->num_prompt_tokens() ? 1 : 0;
      // Its prompt computed, its first sampled token not yet: it decodes from this step on.
      fresh += seq->num_computed_tokens == seq->num_prompt_tokens() ? 1 : 0;
    }
    regime_->NoteNewSequences(fresh, decoding);
    regime_last_sequences_ = decoding;
    if (regime_->Pipelined() && decoding > 0) ++counters_.num_spec_pipelined_steps;
  }

  // ProposeDrafts asks the drafter for the running decode sequences' drafts (speculative
  // decoding), as many as the confidence scheduler finds worth verifying.
  void ProposeDrafts() {
    if (!options_.speculative.enabled()) return;
    if (regime_.has_value() && regime_->Pipelined()) {
      for (Sequence* seq : scheduler_.running()) seq->draft.Clear();
      return;
    }
    std::vector<Sequence*> candidates;
    std::vector<int32_t> room;
    for (Sequence* seq : scheduler_.running()) {
      seq->draft.Clear();
      // Structured-output rows draft too: their drafts are checked against the grammar when
      // verified (VerifyDrafts masks each row with the grammar's state before it).
      if (seq->finish_pending || seq->request.hold_kv_blocks ||
          seq->num_computed_tokens != seq->num_tokens() - 1) {
        continue;
      }
      // Drafts beyond what the request may still emit (max_tokens, max_model_len) are wasted:
      // the token after the last draft is emitted too.
      const int32_t left =
          std::min(seq->request.sampling.max_tokens - seq->num_output_tokens(),
                   max_model_len_ - seq->num_tokens()) - 1;
      if (left <= 0) continue;
      candidates.push_back(seq);
      room.push_back(left);
    }
    if (candidates.empty()) return;
    Drafter& drafter = *options_.speculative.drafter;
    bool probe_only = false;
    ConfidenceScheduler::Baseline baseline = ConfidenceScheduler::Baseline::kSynchronous;
    // Beside SpeculationRegime: speculation's first measurement and a retry for new sequences
    // draft in full; another retry runs the scheduler's own plan (no drafts when they do not
    // pay: a cheap retry); speculation that won runs at least one draft (no drafts at all is the
    // pipelined regime).
    if (regime_.has_value() && regime_->DraftsInFull()) {
      baseline = ConfidenceScheduler::Baseline::kMeasuring;
    } else if (regime_.has_value() && !regime_->Retrying()) {
      baseline = ConfidenceScheduler::Baseline::kPipelined;
    }
    const int32_t depth =
        confidence_.BeginStep(static_cast<int32_t>(candidates.size()), step_cost_,
                              drafter.round_cost(), &probe_only, baseline);
    if (depth <= 0) return;
    if (probe_only && candidates.size() > ConfidenceScheduler::kProbeSequences) {
      candidates.resize(ConfidenceScheduler::kProbeSequences);
    }
    draft_inputs_.clear();
    for (size_t i = 0; i < candidates.size(); ++i) {
      Sequence& seq = *candidates[i];
      DraftInput in;
      in.request_id = seq.request.request_id;
      in.token_ids = absl::MakeConstSpan(seq.token_ids);
      in.num_prompt_tokens = seq.num_prompt_tokens();
      in.cache_salt = seq.request.cache_salt;
      in.sampling = &seq.request.sampling;
      in.first_draft_key = seq.NextDrawKey();
      in.max_draft_tokens = std::min(depth, room[i]);
      draft_inputs_.push_back(in);
    }
    std::vector<double> products(candidates.size(), 1.0);
    const DraftContinue keep_going = [&](size_t i, int32_t j, float confidence) {
      return confidence_.KeepGoing(j, confidence, &products[i]);
    };
    const Clock::time_point start = Now();
    const double cpu_start = CpuSeconds();
    const absl::Status st = drafter.Propose(draft_inputs_, keep_going, &draft_outputs_);
    counters_.spec_draft_seconds += std::chrono::duration<double>(Now() - start).count();
    counters_.spec_draft_cpu_seconds += CpuSeconds() - cpu_start;
    if (!st.ok()) return;  // a drafter failure only costs this step its drafts
    for (size_t i = 0; i < candidates.size(); ++i) {
      Sequence& seq = *candidates[i];
      seq.draft = std::move(draft_outputs_[i]);
      confidence_.ObserveDrafts(seq.draft.confidence);
      seq.TruncateDraft(static_cast<size_t>(confidence_.VerifyLength(seq.draft.confidence)));
    }
  }

  // VerifyDrafts verifies the drafts of `s` (a decode sequence with draft tokens) from its logits
  // rows starting at `row` (or its greedy tokens on the device): tokens are taken row by row
  // while the drafts are accepted, each through SampleToken's processing with the tokens before
  // it as context, until a rejection (whose row gives the corrected token), the bonus row, or a
  // finish (EOS, stop id, length). A structured-output row's logits are masked with its
  // grammar's state after the tokens before it (the matcher takes each token as it is kept), so
  // a draft the grammar refuses has probability 0 there: rejected, and the corrected token is
  // drawn from the masked distribution. Returns the next sequence's first row.
  size_t VerifyDrafts(const ScheduledSequence& s, bool device_greedy, size_t row,
                      std::vector<RequestOutput>& outputs, std::vector<std::string>& finished) {
    Sequence& seq = *s.seq;
    const int32_t num_drafts = s.num_draft_tokens();
    const int64_t vocab = model_->config().vocab_size;
    DraftOutput draft = std::move(seq.draft);
    seq.draft.Clear();
    std::vector<SampledToken> tokens;
    int32_t accepted = 0;
    bool rejected = false;
    for (int32_t i = 0; i <= num_drafts; ++i) {
      std::optional<DraftToken> offered;
      if (i < num_drafts) {
        offered = DraftToken{draft.tokens[i], draft.probs.empty()
                                                  ? absl::Span<const float>()
                                                  : absl::MakeConstSpan(draft.probs[i])};
      }
      VerifiedToken v;
      if (device_greedy) {
        v.token.token_id = greedy_[row + i].token_id;
        v.token.logprob = greedy_[row + i].logprob;
        v.accepted = offered.has_value() && v.token.token_id == offered->token_id;
      } else {
        const absl::Span<float> logits(logits_.data() + (row + i) * vocab, vocab);
        if (seq.matcher != nullptr) grammar::ApplyTokenBitmask(GrammarMask(seq), logits);
        v = VerifyRow(logits, seq.request.sampling, Context(seq), offered, seq.NextDrawKey(),
                      *rejection_rule_);
      }
      seq.AppendToken(v.token.token_id);
      if (seq.matcher != nullptr) AdvanceGrammar(seq, v.token.token_id);
      tokens.push_back(std::move(v.token));
      if (v.accepted) ++accepted;
      if (offered.has_value() && !v.accepted) rejected = true;
      if (!v.accepted || CheckFinished(seq) != FinishReason::kNone) break;
    }
    counters_.num_spec_draft_tokens += num_drafts;
    counters_.num_spec_accepted_tokens += accepted;
    ++counters_.num_spec_verifications;
    confidence_.ObserveVerification(draft.confidence, accepted + (rejected ? 1 : 0), accepted);
    // KV is valid through the last real token and the accepted drafts.
    AdvanceComputed(seq, s.num_new_tokens - num_drafts + accepted);
    scheduler_.CommitBlocks(seq);
    WriteThrough(seq);
    JumpForward(seq, tokens);
    EmitTokens(seq, std::move(tokens), outputs, finished);
    return row + num_drafts + 1;
  }

  // CollectPromptLogprobs scores the prompt positions `rows` covers (their logits predict the
  // next prompt token) into seq.prompt_logprobs.
  void CollectPromptLogprobs(Sequence& seq, const LogitsRows& rows, int64_t vocab) {
    const int32_t num_top = seq.request.sampling.prompt_logprobs.value_or(0);
    seq.prompt_logprobs.resize(std::max(0, seq.num_prompt_tokens() - 1));
    for (int32_t r = 0; r < rows.num_prompt_rows; ++r) {
      const int32_t pos = rows.first_prompt_pos + r;
      const absl::Span<const float> row(logits_.data() + (rows.first_prompt_row + r) * vocab,
                                        static_cast<size_t>(vocab));
      seq.prompt_logprobs[pos] = PromptLogprobAt(row, seq.request.prompt_token_ids[pos + 1],
                                                 num_top);
    }
  }

  // AdvanceComputed counts `n` more computed tokens of seq (and the prompt tokens among them).
  void AdvanceComputed(Sequence& seq, int32_t n) {
    const int32_t before = std::min(seq.num_computed_tokens, seq.num_prompt_tokens());
    seq.num_computed_tokens += n;
    counters_.num_prompt_tokens_computed +=
        std::min(seq.num_computed_tokens, seq.num_prompt_tokens()) - before;
  }

  // EmitToken reports seq's newest token (already appended) and notes a finished request.
  void EmitToken(Sequence& seq, SampledToken token, std::vector<RequestOutput>& outputs,
                 std::vector<std::string>& finished) {
    std::vector<SampledToken> tokens;
    tokens.push_back(std::move(token));
    EmitTokens(seq, std::move(tokens), outputs, finished);
  }
  // EmitTokens reports seq's newest tokens (already appended) in one output.
  void EmitTokens(Sequence& seq, std::vector<SampledToken> tokens,
                  std::vector<RequestOutput>& outputs, std::vector<std::string>& finished) {
    counters_.num_generation_tokens += static_cast<int64_t>(tokens.size());
    RequestOutput out;
    out.request_id = seq.request.request_id;
    out.new_tokens = std::move(tokens);
    out.num_prompt_tokens = seq.num_prompt_tokens();
    out.num_cached_tokens = seq.num_cached_tokens;
    out.num_output_tokens = seq.num_output_tokens();
    out.queue_seconds = seq.queue_seconds;
    out.finish_reason = CheckFinished(seq);
    if (seq.NeedsPromptLogprobs()) {
      out.prompt_logprobs = std::move(seq.prompt_logprobs);
      seq.prompt_logprobs_sent = true;
    }
    if (out.finish_reason == FinishReason::kNone && seq.request.hold_kv_blocks) {
      // Prefill mode: stop after the first token, keep the prompt's blocks pinned.
      out.kv_held = true;
      out.held_block_ids = seq.block_table;
    }
    if (out.finished()) finished.push_back(out.request_id);
    outputs.push_back(std::move(out));
  }

  void RemoveFinished(const std::vector<std::string>& finished,
                      const std::vector<RequestOutput>& outputs) {
    for (const std::string& id : finished) {
      if (scheduler_.Find(id)->request.hold_kv_blocks && IsHeldOutput(outputs, id)) {
        std::unique_ptr<Sequence> seq = scheduler_.Detach(id);
        num_held_blocks_ += static_cast<int64_t>(seq->block_table.size());
        held_[id] = Held{std::move(seq->block_table), Now() + Ms(options_.kv_hold_timeout_ms)};
      } else {
        RemoveSequence(id);
      }
      ids_.erase(id);
    }
  }

  // NoteFirstScheduled records the queue time of sequences scheduled for the first time.
  static void NoteFirstScheduled(const SchedulerOutput& plan) {
    Clock::time_point now{};
    for (const ScheduledSequence& s : plan.scheduled) {
      if (s.seq->queue_seconds >= 0) continue;
      if (now == Clock::time_point{}) now = Now();
      s.seq->queue_seconds =
          std::max(0.0, std::chrono::duration<double>(now - s.seq->arrival_time).count());
    }
  }

  static std::vector<std::string> PlanIds(const SchedulerOutput& plan) {
    std::vector<std::string> ids;
    ids.reserve(plan.scheduled.size());
    for (const ScheduledSequence& s : plan.scheduled) ids.push_back(s.seq->request.request_id);
    return ids;
  }

  // FailRequests finishes the listed requests that still exist with kError and `status`.
  void FailRequests(const std::vector<std::string>& ids, const absl::Status& status,
                    std::vector<RequestOutput>& outputs) {
    for (const std::string& id : ids) {
      std::unique_ptr<Sequence> seq = RemoveSequence(id);
      if (seq == nullptr) continue;
      outputs.push_back(FinalOutput(*seq, FinishReason::kError, status));
      ids_.erase(id);
    }
  }

  // RemoveSequence is scheduler_.Remove that also forgets the sequence in steps in flight.
  std::unique_ptr<Sequence> RemoveSequence(const std::string& id) {
    std::unique_ptr<Sequence> seq = scheduler_.Remove(id);
    if (seq == nullptr) return seq;
    if (options_.speculative.enabled()) options_.speculative.drafter->Release(id);
    // Recorded even with nothing in flight: FinishInFlight pops its step before removing the
    // sequences it finished, and a plan built before it must drop them (DropRemoved).
    removed_.push_back(seq.get());
    if (!in_flight_.empty()) {
      for (InFlightStep& step : in_flight_) {
        for (InFlightRow& row : step.rows) {
          if (row.seq == seq.get()) row.seq = nullptr;
        }
      }
    }
    return seq;
  }

  // ---- Async scheduling (EngineOptions::async_scheduling) ----
  // A step is enqueued with its sampling on the device (Model::EnqueueSampledStep) and read
  // back one Step() later: meanwhile the next step is scheduled with each sampled token as a
  // placeholder -(r + 1), which the model resolves on the device. Sequences the read shows
  // finished (EOS, stop ids) computed one token in the next step for nothing; that row is
  // dropped. Sequences whose length ends them are marked finish_pending and not scheduled.

  struct InFlightRow {
    Sequence* seq = nullptr;  // null once the sequence was removed
    bool samples = false;
    int32_t num_new_tokens = 0;  // K/V positions the step writes for it
  };
  struct InFlightStep {
    std::vector<InFlightRow> rows;  // plan order
    int32_t num_sampled = 0;
    bool top_logprobs = false;  // read with ReadSampledStepWithTop
  };

  // AsyncPlan: the plan may run as an asynchronous step — the model supports it, async
  // scheduling is on, and every sampling row can be sampled on the device: any row when the
  // model does SampleToken's logits processing and top logprobs there
  // (SupportsDeviceLogitsProcessing), else only IsDeviceSamplable rows (greedy or
  // temperature/top-k/top-p/min-p, no penalties, min_tokens or top logprobs). A plan with
  // grammar rows runs so only with device logits processing (the mask is applied there). Its
  // masks need every row's newest token: with a step in flight, only when the model takes the
  // processing after the forward (SupportsDeferredSampling), so the forward runs while the
  // host reads that step and builds the masks (Step()); else the step in flight is read first.
  bool AsyncPlan(const SchedulerOutput& plan) {
    // A KV connector needs no exclusion: write-through gathers what a read step committed
    // (FinishInFlight), and the model orders its copies after the steps on the device.
    if (!options_.async_scheduling || !model_->SupportsAsyncSteps() ||
        (options_.speculative.enabled() && !(regime_.has_value() && regime_->Pipelined()))) {
      return false;
    }
    if (HasGrammar(plan) &&
        (!model_->SupportsDeviceLogitsProcessing() ||
         (!in_flight_.empty() && !model_->SupportsDeferredSampling()))) {
      return false;
    }
    const bool any_row = model_->SupportsDeviceLogitsProcessing();
    for (const ScheduledSequence& s : plan.scheduled) {
      if (s.seq->request.hold_kv_blocks) return false;
      // Token constraints have no device form: such rows are sampled on the host. Prompt
      // logprobs need the logits of every prompt position on the host.
      if (s.samples() && s.seq->request.sampling.HasTokenConstraints()) return false;
      if (s.seq->NeedsPromptLogprobs()) return false;
      if (s.samples() && !any_row &&
          !IsDeviceSamplable(s.seq->request.sampling, Context(*s.seq))) {
        return false;
      }
    }
    return true;
  }

  // BuildDeviceProcessing fills processing_ for the plan's sampling rows (plan order) when some
  // row needs SampleToken's logits processing, a grammar mask or top logprobs; false
  // (processing_ empty) when every row is IsDeviceSamplable. Without `fill_masks` the grammar
  // rows' masks are left to FillDeferredMasks.
  bool BuildDeviceProcessing(const SchedulerOutput& plan, bool fill_masks = true) {
    processing_.rows.clear();
    processing_.ids.clear();
    processing_.masks.clear();
    processing_.top_logprobs.clear();
    if (!model_->SupportsDeviceLogitsProcessing()) return false;
    bool penalized = false, top = false;
    for (const ScheduledSequence& s : plan.scheduled) {
      if (!s.samples()) continue;
      const SamplingParams& p = s.seq->request.sampling;
      penalized = penalized || HasLogitsProcessing(p, Context(*s.seq)) ||
                  s.seq->matcher != nullptr;
      top = top || (p.logprobs.has_value() && *p.logprobs > 0);
    }
    if (!penalized && !top) return false;
    const int64_t mask_words = kernels::MaskWords(model_->config().vocab_size);
    for (const ScheduledSequence& s : plan.scheduled) {
      if (!s.samples()) continue;
      const SamplingParams& p = s.seq->request.sampling;
      if (penalized) {
        processing_.rows.push_back(DeviceLogitsProcessingRow(p, Context(*s.seq), &processing_.ids));
      }
      if (s.seq->matcher != nullptr) AppendGrammarMask(*s.seq, mask_words, fill_masks);
      if (top) processing_.top_logprobs.push_back(p.logprobs.value_or(0));
    }
    return true;
  }

  // AppendGrammarMask points the newest processing row at mask_words new words of
  // processing_.masks and, with `fill`, writes seq's next-token bitmask there (WriteGrammarMask).
  void AppendGrammarMask(Sequence& seq, int64_t mask_words, bool fill) {
    const size_t begin = processing_.masks.size();
    processing_.rows.back().mask_begin = static_cast<int32_t>(begin);
    processing_.masks.resize(begin + mask_words, 0u);
    if (fill) WriteGrammarMask(seq, absl::MakeSpan(processing_.masks).subspan(begin, mask_words));
  }

  // WriteGrammarMask writes seq's next-token bitmask into `words`, sized to the model's vocab
  // (tokens past the tokenizer's are cleared, as ApplyTokenBitmask treats them).
  void WriteGrammarMask(Sequence& seq, absl::Span<uint32_t> words) {
    const std::vector<uint32_t>& mask = GrammarMask(seq);
    const size_t copied = std::min(words.size(), mask.size());
    std::copy_n(mask.begin(), copied, words.begin());
    std::fill(words.begin() + copied, words.end(), 0u);
  }

  // EnqueueDeferredSampling completes the newest step in flight, whose forward EnqueuePlan
  // enqueued alone: its grammar rows' masks are built now that the step before it was read
  // (the rows' matchers hold their newest tokens), then its processing and sampling enqueued.
  // A row whose sequence that read finished gets an all-allowed mask: its token is dropped. On
  // an error the step leaves in_flight_ unread (its sequences are failed by the caller).
  absl::Status EnqueueDeferredSampling() {
    const int64_t mask_words = kernels::MaskWords(model_->config().vocab_size);
    size_t r = 0;
    for (const InFlightRow& row : in_flight_.back().rows) {
      if (!row.samples) continue;
      const int32_t begin = processing_.rows[r++].mask_begin;
      if (begin < 0) continue;
      const absl::Span<uint32_t> words = absl::MakeSpan(processing_.masks).subspan(begin, mask_words);
      if (row.seq != nullptr && row.seq->matcher != nullptr) {
        WriteGrammarMask(*row.seq, words);
      } else {
        std::fill(words.begin(), words.end(), ~0u);
      }
    }
    absl::Status st = model_->EnqueueStepSampling(sampling_rows_, processing_);
    if (!st.ok()) {
      in_flight_.pop_back();
      ++num_steps_read_;  // never readable: the reservation fence must not wait for it
    }
    return st;
  }

  // EnqueuePlan enqueues `plan` as an asynchronous step and advances its sequences' computed
  // tokens; block commits wait until the step's tokens are read (FinishInFlight). `defer_sampling`:
  // only the forward (Model::EnqueueForwardStep); EnqueueDeferredSampling completes the step.
  absl::Status EnqueuePlan(const SchedulerOutput& plan, bool defer_sampling = false) {
    BuildForwardInput(plan);
    sampling_rows_.clear();
    InFlightStep step;
    step.rows.reserve(plan.scheduled.size());
    for (const ScheduledSequence& s : plan.scheduled) {
      const bool samples = s.samples();
      step.rows.push_back(InFlightRow{s.seq, samples, s.num_new_tokens});
      step.num_sampled += samples ? 1 : 0;
      // A sampled row's draw is keyed by its position (placeholders of steps in flight count),
      // the same SampleToken would use, so a seeded request gives the same tokens either way.
      if (samples) {
        sampling_rows_.push_back(
            DeviceSamplingRow(s.seq->request.sampling, s.seq->NextDrawKey()));
      }
    }
    // Placeholders in the rows' output lists refer to the step in flight, as in input_.
    const bool processed = BuildDeviceProcessing(plan, /*fill_masks=*/!defer_sampling);
    step.top_logprobs = !processing_.top_logprobs.empty();
    absl::Status st;
    if (defer_sampling) {
      st = model_->EnqueueForwardStep(input_, kv_cache_);
    } else if (processed) {
      st = model_->EnqueueProcessedSampledStep(input_, kv_cache_, sampling_rows_, processing_);
    } else {
      st = model_->EnqueueSampledStep(input_, kv_cache_, sampling_rows_);
    }
    if (!st.ok()) return st;
    ++counters_.num_steps;
    for (const ScheduledSequence& s : plan.scheduled) AdvanceComputed(*s.seq, s.num_new_tokens);
    in_flight_.push_back(std::move(step));
    ++num_steps_enqueued_;
    return absl::OkStatus();
  }

  // AppendPlaceholders appends the newest step's sampled tokens as placeholders, so the next
  // Schedule() plans their decode, and marks sequences that token ends by length.
  void AppendPlaceholders() {
    int32_t r = 0;
    for (InFlightRow& row : in_flight_.back().rows) {
      if (!row.samples) continue;
      const int32_t placeholder = -(r++ + 1);
      if (row.seq == nullptr) continue;
      row.seq->AppendToken(placeholder);
      // The placeholder matches no stop id: only a length finish is reported here.
      if (CheckFinished(*row.seq) != FinishReason::kNone) row.seq->finish_pending = true;
    }
  }

  // FinishInFlight reads the oldest step in flight: its placeholders become the sampled tokens,
  // blocks it completed are committed, outputs emitted, finished sequences removed.
  void FinishInFlight(std::vector<RequestOutput>& outputs) {
    InFlightStep step = std::move(in_flight_.front());
    in_flight_.pop_front();
    ++num_steps_read_;
    greedy_.resize(step.num_sampled);
    top_lists_.resize(step.num_sampled);
    const absl::Status read =
        step.top_logprobs
            ? model_->ReadSampledStepWithTop(absl::MakeSpan(greedy_), absl::MakeSpan(top_lists_))
            : model_->ReadSampledStep(absl::MakeSpan(greedy_));
    removed_.clear();
    // K/V positions of the steps still unread (enqueued behind this one): computed tokens count
    // them already, but their blocks are not written yet, so the write-through stops short.
    unread_tokens_.clear();
    if (options_.kv_connector != nullptr) {
      for (const InFlightStep& later : in_flight_) {
        for (const InFlightRow& row : later.rows) {
          if (row.seq != nullptr) unread_tokens_[row.seq] += row.num_new_tokens;
        }
      }
    }
    std::vector<std::string> finished;
    std::vector<std::string> failed;
    size_t r = 0;
    for (const InFlightRow& row : step.rows) {
      const size_t token_row = row.samples ? r++ : 0;
      if (row.seq == nullptr) continue;
      Sequence& seq = *row.seq;
      if (!read.ok()) {
        failed.push_back(seq.request.request_id);
        continue;
      }
      if (row.samples) {
        const int32_t id = greedy_[token_row].token_id;
        // The placeholder is the newest token unless the sequence was preempted meanwhile
        // (then it is still the newest: preemption keeps tokens).
        seq.token_ids.back() = id;
        seq.output_token_ids.back() = id;
        seq.finish_pending = false;
        // Sampled under the grammar's mask on the device (BuildDeviceProcessing).
        AdvanceGrammar(seq, id);
      }
      scheduler_.CommitBlocks(seq);
      const auto unread = unread_tokens_.find(&seq);
      WriteThrough(seq, unread == unread_tokens_.end() ? 0 : unread->second);
      if (!row.samples) continue;
      SampledToken token;
      token.token_id = greedy_[token_row].token_id;
      token.logprob = greedy_[token_row].logprob;
      if (step.top_logprobs) token.top_logprobs = std::move(top_lists_[token_row]);
      EmitToken(seq, std::move(token), outputs, finished);
    }
    // The blocks this read committed, gathered while the next step (enqueued already) runs;
    // before finished sequences free their blocks.
    FlushWriteThrough();
    RemoveFinished(finished, outputs);
    if (!read.ok()) FailRequests(failed, read, outputs);
  }

  // DropRemoved takes sequences removed since FinishInFlight began out of `plan`.
  void DropRemoved(SchedulerOutput& plan) {
    if (removed_.empty()) return;
    std::erase_if(plan.scheduled, [&](const ScheduledSequence& s) {
      return std::find(removed_.begin(), removed_.end(), s.seq) != removed_.end();
    });
  }

  void ReportRecompute(const RecomputeEvent& e) {
    if (options_.on_recompute) options_.on_recompute(e);
  }

  // RebuildSlidingKv: SWA bounded replay (engine/kv/swa_replay.h) of seq's first `num_tokens`
  // tokens, whose full-attention K/V arrived from outside (a transfer, the kvstore): the sliding
  // layers' K/V of the last `replay_tokens` of them are recomputed over that exact K/V.
  absl::Status RebuildSlidingKv(Sequence& seq, int32_t num_tokens, int64_t replay_tokens) {
    SwaReplayOptions replay;
    replay.replay_tokens = replay_tokens;
    absl::StatusOr<SwaReplayResult> r = ReplaySlidingWindowKv(
        *model_, kv_cache_, absl::MakeConstSpan(seq.token_ids).first(num_tokens),
        seq.block_table, replay);
    if (!r.ok()) return r.status();
    ++counters_.num_swa_replays;
    counters_.num_swa_replayed_tokens += r->num_replayed;
    // R < window: the first decode steps' windows reach below the replayed range, where the
    // sliding layers hold nothing; they must see keys from replay_start on only.
    const int32_t window = static_cast<int32_t>(model_->config().sliding_window);
    if (r->sliding_kv_start > 0 && num_tokens - window + 1 < r->sliding_kv_start) {
      seq.sliding_kv_start = r->sliding_kv_start;
    }
    // Blocks with positions below replay_start lack sliding-layer K/V: never offered to the
    // prefix cache or the kvstore (ReserveForTransfer already skips the full prompt blocks;
    // with R < block_size the partial last block is one of them too).
    const int32_t bs = static_cast<int32_t>(block_size());
    const int32_t absent = (r->replay_start + bs - 1) / bs;
    seq.num_committed_blocks = std::max(seq.num_committed_blocks, absent);
    seq.num_saved_blocks = std::max(seq.num_saved_blocks, absent);
    return absl::OkStatus();
  }

  // FinishConnectorLoads copies finished connector loads into their blocks (see
  // Scheduler::FinishLoad); loads of aborted requests are dropped. With SWA replay the loaded
  // blocks hold the full-attention layers only: the last swa_replay_tokens_ loaded tokens are
  // replayed (never into the local prefix-cache blocks before them, which other sequences
  // share) before the uncached tail is computed.
  void FinishConnectorLoads() {
    if (options_.kv_connector == nullptr) return;
    const int64_t block_bytes = connector_block_bytes_;
    for (const KvLoadResult& r : options_.kv_connector->PollLoads()) {
      const int64_t n = std::min<int64_t>(
          r.num_blocks, static_cast<int64_t>(r.bytes.size()) / block_bytes);
      const absl::Span<const uint8_t> load_bytes(r.bytes.data(), r.bytes.size());
      Sequence* seq = scheduler_.FinishLoad(
          r.ticket, n,
          [&](absl::Span<const int32_t> blocks) {
            return CopyBlocksIn(
                blocks, load_bytes.first(blocks.size() * static_cast<size_t>(block_bytes)));
          },
          load_blocks_);
      if (seq == nullptr) continue;
      if (swa_replay_tokens_ == 0 || load_blocks_.empty()) continue;
      const int32_t loaded = static_cast<int32_t>(load_blocks_.size() * options_.block_size);
      const int32_t end = seq->num_computed_tokens;
      if (absl::Status replay =
              RebuildSlidingKv(*seq, end, std::min<int64_t>(swa_replay_tokens_, loaded));
          !replay.ok()) {
        // Unusable without the sliding layers: compute the loaded tokens instead (their blocks
        // stay with the sequence and are overwritten).
        RecomputeEvent e;
        e.request_id = seq->request.request_id;
        e.cause = RecomputeCause::kKvstoreSwaReplayFailed;
        e.num_tokens_to_recompute = loaded;
        e.detail = std::string(replay.message());
        ++counters_.num_kvstore_swa_replay_recomputes;
        ReportRecompute(e);
        seq->num_computed_tokens = end - loaded;
        seq->num_cached_tokens = std::min(seq->num_computed_tokens, seq->num_prompt_tokens());
      }
    }
  }

  // FinishImageEncodes gives sequences parked for their images' embeddings (Scheduler::
  // FinishImageEncode) the results: checked against the model's hidden size, or the request
  // finishes with the encode's error. Encodes of aborted requests are dropped.
  void FinishImageEncodes(std::vector<RequestOutput>& outputs) {
    if (options_.image_encoder == nullptr) return;
    const int64_t hidden = model_->config().hidden_size;
    for (ImageEncodeResult& r : options_.image_encoder->PollEncodes()) {
      if (r.inputs.ok()) {
        for (size_t i = 0; i < r.inputs->size(); ++i) {
          const MultimodalInput& mm = (*r.inputs)[i];
          if (mm.embeddings == nullptr ||
              static_cast<int64_t>(mm.embeddings->size()) != int64_t{mm.num_tokens} * hidden) {
            r.inputs = absl::InternalError(absl::StrCat(
                "image ", i, ": the image encoder returned no ", mm.num_tokens, " x ", hidden,
                " embeddings"));
            break;
          }
        }
      }
      const absl::Status status = r.inputs.status();
      std::unique_ptr<Sequence> failed;
      scheduler_.FinishImageEncode(r.ticket, std::move(r.inputs), failed);
      if (failed == nullptr) continue;
      const std::string id = failed->request.request_id;
      if (options_.speculative.enabled()) options_.speculative.drafter->Release(id);
      outputs.push_back(FinalOutput(*failed, FinishReason::kError, status));
      ids_.erase(id);
    }
  }

  // WriteThrough queues seq's newly registered full blocks for the connector; FlushWriteThrough
  // (at the end of the step, before any block can be reused) copies the step's blocks out in one
  // batch — one staged device copy pipeline on a GPU cache — and hands them over, so the blocks
  // may be freed and reused while the connector writes.
  // `unread_tokens`: seq's last computed tokens whose step is still unread (async scheduling):
  // blocks they complete wait for a later call, once that step was read.
  void WriteThrough(Sequence& seq, int32_t unread_tokens = 0) {
    if (options_.kv_connector == nullptr) return;
    const int32_t from = seq.num_saved_blocks;
    const int32_t to = std::min<int32_t>(
        seq.num_committed_blocks,
        (seq.num_computed_tokens - unread_tokens) / static_cast<int32_t>(options_.block_size));
    if (to <= from) return;
    save_hashes_.insert(save_hashes_.end(), seq.block_hashes.begin() + from,
                        seq.block_hashes.begin() + to);
    save_blocks_.insert(save_blocks_.end(), seq.block_table.begin() + from,
                        seq.block_table.begin() + to);
    seq.num_saved_blocks = to;
  }

  void FlushWriteThrough() {
    if (save_blocks_.empty()) return;
    // Gathered straight into the connector's memory (registered for RMA with the kvstore's
    // UCX data path), so the bytes are copied once on the host.
    KvBlockBuffer bytes = options_.kv_connector->AllocateBlockBuffer(
        save_blocks_.size() * static_cast<size_t>(connector_block_bytes_));
    if (CopyBlocksOut(save_blocks_, bytes.span()).ok()) {
      options_.kv_connector->Save(std::move(save_hashes_), std::move(bytes));
    }  // else best effort: counted, the blocks are just not stored
    save_hashes_.clear();
    save_blocks_.clear();
  }

  // CopyBlocksOut / CopyBlocksIn: connector block bytes (stored_layers_) from and to the KV
  // cache — the host KvCache, or the model's device cache. A failure is counted.
  absl::Status CopyBlocksOut(absl::Span<const int32_t> blocks, absl::Span<uint8_t> out) {
    const size_t block_bytes = static_cast<size_t>(connector_block_bytes_);
    absl::Status s;
    if (device_kv_copies_) {
      s = model_->GatherKvBlocks(kv_cache_, blocks, stored_layers_, out);
    } else {
      for (size_t i = 0; i < blocks.size(); ++i) {
        GatherKvBlock(kv_cache_, blocks[i], out.subspan(i * block_bytes, block_bytes),
                      stored_layers_);
      }
    }
    if (!s.ok()) ++counters_.num_kv_connector_copy_errors;
    return s;
  }
  absl::Status CopyBlocksIn(absl::Span<const int32_t> blocks, absl::Span<const uint8_t> in) {
    const size_t block_bytes = static_cast<size_t>(connector_block_bytes_);
    absl::Status s;
    if (device_kv_copies_) {
      s = model_->ScatterKvBlocks(kv_cache_, blocks, stored_layers_, in);
    } else {
      for (size_t i = 0; i < blocks.size(); ++i) {
        ScatterKvBlock(in.subspan(i * block_bytes, block_bytes), blocks[i], kv_cache_,
                       stored_layers_);
      }
    }
    if (!s.ok()) ++counters_.num_kv_connector_copy_errors;
    return s;
  }

  void BuildForwardInput(const SchedulerOutput& plan) {
    input_.token_ids.clear();
    input_.positions.clear();
    input_.slot_mapping.clear();
    input_.sequences.clear();
    input_.logits_indices.clear();
    input_.sliding_kv_start.clear();
    input_.embedding_rows.clear();
    input_.embedding_values.clear();
    sliding_starts_.clear();
    logits_rows_.clear();
    has_prompt_rows_ = false;
    bool bounded = false;
    const int64_t bs = options_.block_size;
    const int64_t window = model_->config().sliding_window;
    for (const ScheduledSequence& s : plan.scheduled) {
      Sequence& seq = *s.seq;
      // After a replay with R < window: bound the sliding layers' keys until the first query's
      // window starts at or past the replayed range.
      if (seq.sliding_kv_start > 0 &&
          seq.num_computed_tokens - window + 1 >= seq.sliding_kv_start) {
        seq.sliding_kv_start = 0;
      }
      sliding_starts_.push_back(seq.sliding_kv_start);
      bounded = bounded || seq.sliding_kv_start > 0;
      SequenceSlice slice;
      slice.query_start = static_cast<int32_t>(input_.token_ids.size());
      slice.num_query_tokens = s.num_new_tokens;
      slice.num_context_tokens = seq.num_computed_tokens;
      slice.block_table = absl::MakeConstSpan(seq.block_table);
      const int32_t n = seq.num_tokens();
      for (int32_t k = 0; k < s.num_new_tokens; ++k) {
        const int32_t pos = seq.num_computed_tokens + k;
        input_.token_ids.push_back(pos < n ? seq.token_ids[pos] : seq.draft.tokens[pos - n]);
        input_.positions.push_back(pos);
        input_.slot_mapping.push_back(static_cast<int64_t>(seq.block_table[pos / bs]) * bs +
                                      pos % bs);
      }
      AddImageEmbeddings(seq, slice.query_start, s.num_new_tokens);
      LogitsRows rows;
      if (seq.NeedsPromptLogprobs()) {
        // Positions p < prompt length - 1 predict prompt token p + 1.
        rows.first_prompt_pos = seq.num_computed_tokens;
        rows.first_prompt_row = static_cast<int32_t>(input_.logits_indices.size());
        const int32_t end =
            std::min(seq.num_computed_tokens + s.num_new_tokens, seq.num_prompt_tokens() - 1);
        for (int32_t pos = seq.num_computed_tokens; pos < end; ++pos) {
          input_.logits_indices.push_back(slice.query_start + pos - seq.num_computed_tokens);
          ++rows.num_prompt_rows;
        }
        has_prompt_rows_ = has_prompt_rows_ || rows.num_prompt_rows > 0;
      }
      if (s.samples()) {
        // One row per draft plus the bonus row: the last real token's and each draft's logits.
        rows.sample_row = static_cast<int32_t>(input_.logits_indices.size());
        const int32_t num_rows = s.num_draft_tokens() + 1;
        for (int32_t r = num_rows; r >= 1; --r) {
          input_.logits_indices.push_back(slice.query_start + s.num_new_tokens - r);
        }
      }
      logits_rows_.push_back(rows);
      input_.sequences.push_back(slice);
    }
    if (bounded) input_.sliding_kv_start = sliding_starts_;
  }

  // The image embedding rows of `seq`'s scheduled positions [num_computed_tokens, + n), whose
  // first token is flattened row `row0`.
  void AddImageEmbeddings(const Sequence& seq, int32_t row0, int32_t n) {
    const int64_t hidden = model_->config().hidden_size;
    const int32_t begin = seq.num_computed_tokens, end = seq.num_computed_tokens + n;
    for (const MultimodalInput& mm : seq.request.mm_inputs) {
      const int32_t from = std::max(begin, mm.offset);
      const int32_t to = std::min(end, mm.offset + mm.num_tokens);
      for (int32_t pos = from; pos < to; ++pos) {
        input_.embedding_rows.push_back(row0 + pos - begin);
        const float* e = mm.embeddings->data() + int64_t{pos - mm.offset} * hidden;
        input_.embedding_values.insert(input_.embedding_values.end(), e, e + hidden);
      }
    }
  }

  // Context is what SampleToken sees of `seq` (its stop ids live in stop_ids_ until the next
  // call).
  SequenceContext Context(const Sequence& seq) {
    const SamplingParams& p = seq.request.sampling;
    stop_ids_.clear();
    if (!p.ignore_eos) stop_ids_.assign(eos_token_ids_.begin(), eos_token_ids_.end());
    stop_ids_.insert(stop_ids_.end(), p.stop_token_ids.begin(), p.stop_token_ids.end());
    return SequenceContext{absl::MakeConstSpan(seq.request.prompt_token_ids),
                           absl::MakeConstSpan(seq.output_token_ids),
                           absl::MakeConstSpan(stop_ids_)};
  }

  SampledToken Sample(Sequence& seq, absl::Span<float> logits) {
    if (seq.matcher == nullptr) {
      return SampleToken(logits, seq.request.sampling, Context(seq), seq.NextDrawKey());
    }
    // Structured output: only the tokens the grammar allows (EOS alone once it is complete).
    grammar::ApplyTokenBitmask(GrammarMask(seq), logits);
    SampledToken token = SampleToken(logits, seq.request.sampling, Context(seq), seq.NextDrawKey());
    AdvanceGrammar(seq, token.token_id);
    return token;
  }

  // GrammarMask: seq's next-token bitmask (seq has a matcher), built once per grammar state:
  // AdvanceGrammar marks it stale.
  static const std::vector<uint32_t>& GrammarMask(Sequence& seq) {
    if (!seq.grammar_bitmask_current) {
      seq.grammar_bitmask.resize(seq.matcher->num_bitmask_words());
      seq.matcher->FillNextTokenBitmask(absl::MakeSpan(seq.grammar_bitmask));
      seq.grammar_bitmask_current = true;
    }
    return seq.grammar_bitmask;
  }

  // AdvanceGrammar moves seq's matcher past `token`. A token the grammar refuses (only when
  // every allowed logit was -inf or min_tokens suppressed the forced EOS) leaves the matcher
  // as it was; the request then ends by length or EOS as usual.
  static void AdvanceGrammar(Sequence& seq, int32_t token) {
    seq.grammar_bitmask_current = false;
    if (seq.matcher != nullptr) seq.matcher->AcceptToken(token);
  }

  // HasGrammar: some sampling row of the plan is constrained by a grammar (its mask is built
  // on the host, so the step samples there).
  static bool HasGrammar(const SchedulerOutput& plan) {
    for (const ScheduledSequence& s : plan.scheduled) {
      if (s.samples() && s.seq->matcher != nullptr) return true;
    }
    return false;
  }

  // DeviceGreedyStep: the step's tokens may come from Model::ForwardGreedy — the model supports
  // it and every sampling row would be a plain argmax on the host (IsPlainGreedy), so the
  // tokens and logprobs are those of the full-logits path and no [rows, vocab] logits cross.
  bool DeviceGreedyStep(const SchedulerOutput& plan) {
    if (!model_->SupportsDeviceGreedy() || input_.logits_indices.empty() || HasGrammar(plan)) {
      return false;
    }
    if (has_prompt_rows_) return false;  // prompt logprobs need those rows' full logits
    for (const ScheduledSequence& s : plan.scheduled) {
      if (s.samples() && !IsPlainGreedy(s.seq->request.sampling, Context(*s.seq))) return false;
    }
    return true;
  }

  FinishReason CheckFinished(const Sequence& seq) const {
    const SamplingParams& p = seq.request.sampling;
    const int32_t last = seq.output_token_ids.back();
    if (seq.num_output_tokens() >= p.min_tokens) {
      if (std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), last) !=
          p.stop_token_ids.end()) {
        return FinishReason::kStop;
      }
      if (!p.ignore_eos &&
          std::find(eos_token_ids_.begin(), eos_token_ids_.end(), last) != eos_token_ids_.end()) {
        return FinishReason::kStop;
      }
    }
    if (seq.num_output_tokens() >= p.max_tokens || seq.num_tokens() >= max_model_len_) {
      return FinishReason::kLength;
    }
    return FinishReason::kNone;
  }

  using Clock = std::chrono::steady_clock;
  static Clock::time_point Now() { return Clock::now(); }
  static Clock::duration Ms(int64_t ms) { return std::chrono::milliseconds(ms); }
  static double CpuSeconds() {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
  }

  // Held: a prefill request's pinned blocks. Reservation: a decode request waiting for KV.
  struct Held {
    std::vector<int32_t> blocks;
    Clock::time_point deadline;
  };
  struct Reservation {
    Clock::time_point deadline;
    std::optional<SampledToken> first_token;
  };

  absl::Status CheckNewId(const std::string& id) const {
    if (ids_.contains(id) || held_.contains(id)) {
      return absl::AlreadyExistsError(absl::StrCat("request id '", id, "' is already in flight"));
    }
    return absl::OkStatus();
  }

  std::unique_ptr<Sequence> NewSequence(EngineRequest request) const {
    auto seq = std::make_unique<Sequence>();
    seq->request = std::move(request);
    seq->token_ids = seq->request.prompt_token_ids;
    // Front ends assign and report seeds; a request that still has none gets one here.
    if (!seq->request.sampling.seed.has_value()) seq->request.sampling.seed = NewRandomSeed();
    if (seq->request.grammar != nullptr) {
      // The grammar ends the output with any id that stops the request.
      std::vector<int32_t> stop_ids = eos_token_ids_;
      const std::vector<int32_t>& extra = seq->request.sampling.stop_token_ids;
      stop_ids.insert(stop_ids.end(), extra.begin(), extra.end());
      seq->matcher = std::make_unique<grammar::GrammarMatcher>(seq->request.grammar, stop_ids);
    }
    // A resumed request continues like a preempted sequence: its outputs so far are recomputed
    // with the prompt (draws are keyed by position, so a seeded continuation draws what the
    // first engine would have).
    std::vector<int32_t> resumed = std::move(seq->request.resumed_output_token_ids);
    seq->request.resumed_output_token_ids.clear();
    for (int32_t token : resumed) {
      seq->AppendToken(token);
      if (seq->matcher != nullptr) seq->matcher->AcceptToken(token);
    }
    return seq;
  }

  static bool IsHeldOutput(const std::vector<RequestOutput>& outputs, const std::string& id) {
    for (auto it = outputs.rbegin(); it != outputs.rend(); ++it) {
      if (it->request_id == id) return it->kv_held;
    }
    return false;
  }

  void FreeHeld(const std::string& id) {
    auto it = held_.find(id);
    num_held_blocks_ -= static_cast<int64_t>(it->second.blocks.size());
    scheduler_.FreeBlocks(it->second.blocks);
    held_.erase(it);
  }

  void FailReserved(const std::string& id, absl::Status status) {
    std::unique_ptr<Sequence> seq = scheduler_.Remove(id);
    ++counters_.num_transfers_failed;
    pending_outputs_.push_back(FinalOutput(*seq, FinishReason::kError, std::move(status)));
    ids_.erase(id);
  }

  // ExpireTimers frees held blocks and fails reservations past their deadlines.
  void ExpireTimers(std::vector<RequestOutput>& outputs) {
    if (held_.empty() && reservations_.empty()) return;
    const Clock::time_point now = Now();
    std::vector<std::string> expired;
    for (const auto& [id, h] : held_) {
      if (h.deadline <= now) expired.push_back(id);
    }
    for (const std::string& id : expired) {
      FreeHeld(id);
      ++counters_.num_held_expired;
    }
    expired.clear();
    for (const auto& [id, r] : reservations_) {
      if (r.deadline <= now) expired.push_back(id);
    }
    for (const std::string& id : expired) {
      reservations_.erase(id);
      FailReserved(id, absl::DeadlineExceededError(absl::StrCat(
                           "KV transfer for request '", id, "' not completed within ",
                           options_.kv_reserve_timeout_ms, " ms")));
    }
    for (RequestOutput& out : pending_outputs_) outputs.push_back(std::move(out));
    pending_outputs_.clear();
  }

  RequestOutput FinalOutput(const Sequence& seq, FinishReason reason, absl::Status status) {
    RequestOutput out;
    out.request_id = seq.request.request_id;
    out.finish_reason = reason;
    out.status = std::move(status);
    out.num_prompt_tokens = seq.num_prompt_tokens();
    out.num_cached_tokens = seq.num_cached_tokens;
    out.num_output_tokens = seq.num_output_tokens();
    out.queue_seconds = seq.queue_seconds;
    return out;
  }

  std::unique_ptr<Model> model_;
  EngineOptions options_;
  int32_t max_model_len_;
  KvCache kv_cache_;
  std::string kv_identity_;
  std::shared_ptr<KvEventLog> kv_events_;
  Scheduler scheduler_;
  bool has_sliding_layers_ = false;
  int64_t swa_replay_tokens_ = 0;  // EffectiveSwaReplayTokens(options.swa_replay_tokens)
  // Layers the KV connector stores (empty: all; with SWA replay the full-attention ones) and
  // the bytes of one stored block.
  std::vector<int32_t> stored_layers_;
  int64_t connector_block_bytes_ = 0;
  bool device_kv_copies_ = false;  // connector blocks move through Model::Gather/ScatterKvBlocks
  // Write-through of the step being run (WriteThrough, FlushWriteThrough).
  std::vector<BlockHash> save_hashes_;
  std::vector<int32_t> save_blocks_;
  absl::flat_hash_map<const Sequence*, int32_t> unread_tokens_;  // scratch: FinishInFlight
  std::vector<int32_t> eos_token_ids_;
  std::unordered_set<std::string> ids_;  // in-flight request ids
  std::vector<std::string> pending_aborts_;
  std::vector<RequestOutput> pending_outputs_;  // produced between steps, emitted by Step()
  absl::flat_hash_map<std::string, Held> held_;
  absl::flat_hash_map<std::string, Reservation> reservations_;
  int64_t num_held_blocks_ = 0;
  // Observers of the step running now (ArmLayerObservers); owned by their requests.
  std::vector<KvLayerObserver*> layer_observers_;
  ForwardInput input_;
  std::vector<float> logits_;
  std::vector<GreedyToken> greedy_;  // [logits rows] of a DeviceGreedyStep / read step
  std::vector<std::vector<TokenLogprob>> top_lists_;  // [sampled rows] of a read step
  Model::DeviceLogitsProcessing processing_;          // of the step being enqueued
  std::vector<kernels::SamplingRow> sampling_rows_;  // scratch: EnqueuePlan
  std::deque<InFlightStep> in_flight_;  // async steps enqueued and not yet read, oldest first
  int64_t num_steps_enqueued_ = 0;      // async steps ever enqueued
  int64_t num_steps_read_ = 0;          // ... and read (or failed)
  std::vector<const Sequence*> removed_;  // sequences removed during FinishInFlight
  std::vector<int32_t> stop_ids_;
  std::vector<int32_t> load_blocks_;  // scratch
  std::vector<int32_t> sliding_starts_;  // scratch: ForwardInput::sliding_kv_start
  std::vector<LogitsRows> logits_rows_;
  bool has_prompt_rows_ = false;
  EngineCounters counters_;
  // Speculative decoding: the target's fitted step cost (priced by the confidence scheduler),
  // the scheduler itself, the rejection rule, and Propose's scratch.
  StepCostModel step_cost_;
  ConfidenceScheduler confidence_;
  // Auto verification with asynchronous steps: speculative or plain pipelined steps, and the
  // step it observes next (ObserveRegime).
  std::optional<SpeculationRegime> regime_;
  std::optional<double> regime_last_step_;  // seconds on the regime's clock
  int64_t regime_last_prompt_tokens_ = 0;
  bool regime_prefilled_before_ = false;  // the step before the last computed prompt tokens
  int64_t regime_skipped_ = 0;            // steps not observed in a row (prefill)
  double regime_last_setup_ = 0.0;        // Model::kernel_setup_seconds at the last Step()
  int64_t regime_last_tokens_ = 0;
  int64_t regime_last_sequences_ = 0;
  // Fair prefill: cost(q, c) of every synchronous step, for the scheduler's time budget.
  QcCostModel qc_cost_;
  std::shared_ptr<const RejectionRule> rejection_rule_;
  std::vector<DraftInput> draft_inputs_;
  std::vector<DraftOutput> draft_outputs_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<LLMEngine>> LLMEngine::Create(std::unique_ptr<Model> model,
                                                             const EngineOptions& options) {
  if (model == nullptr) return absl::InvalidArgumentError("model is null");
  if (options.block_size <= 0) return absl::InvalidArgumentError("block_size must be > 0");
  if (options.max_num_seqs <= 0) return absl::InvalidArgumentError("max_num_seqs must be > 0");
  if (options.max_num_batched_tokens <= 0) {
    return absl::InvalidArgumentError("max_num_batched_tokens must be > 0");
  }
  if (options.max_num_logits < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_num_logits must be >= 0, got ", options.max_num_logits));
  }
  // Every running sequence samples a row in a decode step.
  if (const int64_t rows = EffectiveMaxNumLogits(*model, options);
      rows > 0 && rows < options.max_num_seqs) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a step may ask for at most ", rows, " logits rows (",
        options.max_num_logits == rows ? "max_num_logits" : "the model's max_num_logits",
        "), fewer than max_num_seqs ", options.max_num_seqs,
        ": every running sequence samples one in a decode step"));
  }
  if (options.speculative.enabled()) {
    if (absl::Status s = options.speculative.Validate(); !s.ok()) return s;
  }
  if (!(options.prefill_aging >= 0) || !(options.step_time_budget_seconds >= 0)) {
    return absl::InvalidArgumentError("prefill_aging and step_time_budget_seconds must be >= 0");
  }
  const int64_t model_len = model->config().max_position_embeddings;
  const int32_t max_model_len =
      options.max_model_len > 0 ? options.max_model_len : static_cast<int32_t>(model_len);
  if (max_model_len > model_len) {
    return absl::InvalidArgumentError(absl::StrCat("max_model_len ", max_model_len,
                                                   " exceeds the model's max_position_embeddings ",
                                                   model_len));
  }
  if (options.batch_invariant) {
    if (!model->IsBatchInvariant()) {
      return absl::FailedPreconditionError(
          "batch-invariant mode: this model backend's kernels are not batch invariant (their "
          "reduction order depends on the batch); use the CPU backend");
    }
    const int64_t replay = EffectiveSwaReplayTokens(*model, options.swa_replay_tokens);
    const int64_t exact = ExactReplayTokens(model->config());
    if (replay > 0 && replay < exact) {
      return absl::InvalidArgumentError(absl::StrCat(
          "batch-invariant mode: swa_replay_tokens ", replay,
          " rebuilds sliding-window K/V approximately after a transfer; use 0 (move every "
          "layer) or at least ", exact));
    }
  }
  const KvCacheSpec spec = model->kv_cache_spec();
  const int64_t block_bytes = spec.BytesPerToken() * options.block_size;
  if (!options.allocate_host_kv_cache && options.num_kv_blocks <= 0) {
    return absl::InvalidArgumentError("without a host KV cache num_kv_blocks must be set");
  }
  if (!options.allocate_host_kv_cache && options.kv_connector != nullptr &&
      !model->SupportsKvBlockCopies()) {
    return absl::InvalidArgumentError(
        "a KV connector without a host KV cache needs a model that copies its KV blocks to and "
        "from host memory (Model::SupportsKvBlockCopies)");
  }
  int64_t num_blocks = options.num_kv_blocks;
  if (num_blocks <= 0) num_blocks = block_bytes > 0 ? options.kv_cache_bytes / block_bytes : 0;
  const int64_t needed = NumBlocksFor(max_model_len, options.block_size);
  if (num_blocks < needed) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV cache of ", num_blocks, " blocks cannot hold one sequence of max_model_len ",
        max_model_len, " tokens (needs ", needed, " blocks of ", options.block_size, " tokens)"));
  }
  auto engine = std::unique_ptr<LLMEngineImpl>(
      new LLMEngineImpl(std::move(model), options, num_blocks, max_model_len));
  if (options.kv_connector != nullptr) {
    absl::Status bound = options.kv_connector->Bind(engine->ConnectorLayout());
    if (!bound.ok()) return bound;
  }
  return std::unique_ptr<LLMEngine>(std::move(engine));
}

}  // namespace sluice
