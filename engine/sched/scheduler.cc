#include "engine/sched/scheduler.h"

#include <algorithm>
#include <cmath>
#include <chrono>
#include <limits>
#include <optional>
#include <tuple>
#include <utility>

namespace sluice {
namespace {

void SetHashRoots(const BlockHasher& hasher, Sequence& seq) {
  seq.root_hash = hasher.RootHash(seq.request.cache_salt);
  seq.extra_key_spans.clear();
  for (const MultimodalInput& mm : seq.request.mm_inputs) {
    seq.extra_key_spans.push_back(
        {mm.offset, int64_t{mm.offset} + mm.num_tokens, mm.content_hash});
  }
}

// IsPrefilling: more than one token of the sequence's own left to compute (a prompt, or a
// recompute after preemption or migration); a decode has exactly one, plus drafts.
bool IsPrefilling(const Sequence& seq) {
  return seq.num_tokens() - seq.num_computed_tokens > 1;
}

// Under the fair policies, the rows after the step's first prompt to end its prefill may together
// cost at most what its step alone would (the fixed cost and its row; CapAfterFirstToken), so
// that no long prompt's final chunk rides along with a short prompt's first token either: a
// short prompt's TTFT stays within the step running when it arrived plus about twice its own
// step (issue 22's bound: 2 x unloaded TTFT + one step budget), while short prompts arriving
// together still share one step.
//
// StepTimeBudget prices the rows of the step being planned with the fitted cost(q, c) and cuts
// prefill chunks to what is left of the per-step time budget, shrunk by the model's recent
// overrun (QcCostModel::OverrunRatio) so that most steps, not just the average one, end within
// it. The rows always get at least half the budget: where the fixed cost nears or passes the
// budget (an overloaded machine) a step still batches the short prompts waiting, instead of
// taking one prompt per step and queueing the others behind each other. Inactive (no cut)
// without a budget or before the model is fitted.
class StepTimeBudget {
 public:
  StepTimeBudget(const QcCostModel* model, double budget_seconds)
      : model_(model != nullptr && budget_seconds > 0 && model->Fitted() ? model : nullptr),
        left_(model_ != nullptr
                  ? std::max(budget_seconds / 2, budget_seconds / model_->OverrunRatio() -
                                                     model_->fixed_seconds())
                  : 0.0) {}

  void Charge(int32_t q, int32_t c) {
    if (model_ != nullptr) left_ -= model_->RowSeconds(q, c);
  }
  // CapAfterFirstToken: the row (q, c) just charged samples the step's first first token; the
  // rows after it may cost at most what that step alone would (the fixed cost and that row),
  // so that first token waits for at most as much work again as its own.
  void CapAfterFirstToken(int32_t q, int32_t c) {
    if (model_ != nullptr) {
      left_ = std::min(left_, model_->fixed_seconds() + model_->RowSeconds(q, c));
    }
  }
  // MaxChunk: the most tokens, at most `want`, that a chunk after `c` computed tokens may take
  // within what is left; at least min(floor, want).
  int32_t MaxChunk(int32_t want, int32_t c, int32_t floor) const {
    if (model_ == nullptr) return want;
    int32_t lo = 0, hi = want;  // RowSeconds grows with q: the largest q that fits
    while (lo < hi) {
      const int32_t mid = lo + (hi - lo + 1) / 2;
      if (model_->RowSeconds(mid, c) <= left_) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    return std::max(lo, std::min(floor, want));
  }

 private:
  const QcCostModel* model_;
  double left_;
};

}  // namespace

int32_t NumLogitsRows(const Sequence& seq, int32_t num_new_tokens) {
  if (num_new_tokens <= 0) return 0;
  const int32_t c = seq.num_computed_tokens;
  const int32_t end = c + num_new_tokens;
  int32_t rows = 0;
  if (seq.NeedsPromptLogprobs()) {
    rows += std::max(0, std::min(end, seq.num_prompt_tokens() - 1) - c);
  }
  if (end >= seq.num_tokens()) rows += end - seq.num_tokens() + 1;
  return rows;
}

int32_t FitLogitsRows(const Sequence& seq, int32_t num_new_tokens, int64_t max_rows) {
  if (NumLogitsRows(seq, num_new_tokens) <= max_rows) return num_new_tokens;
  int32_t lo = 0, hi = num_new_tokens - 1;  // NumLogitsRows grows with the tokens: the largest
  while (lo < hi) {                            // count that fits
    const int32_t mid = lo + (hi - lo + 1) / 2;
    if (NumLogitsRows(seq, mid) <= max_rows) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

const char* SchedulingPolicyName(SchedulingPolicy policy) {
  switch (policy) {
    case SchedulingPolicy::kFcfs:
      return "fcfs";
    case SchedulingPolicy::kPriority:
      return "priority";
    case SchedulingPolicy::kShortestPrefillFirst:
      return "shortest_prefill_first";
  }
  return "fcfs";
}

bool ParseSchedulingPolicy(const std::string& name, SchedulingPolicy& policy) {
  for (SchedulingPolicy p : {SchedulingPolicy::kFcfs, SchedulingPolicy::kPriority,
                             SchedulingPolicy::kShortestPrefillFirst}) {
    if (name == SchedulingPolicyName(p)) {
      policy = p;
      return true;
    }
  }
  return false;
}

Scheduler::Scheduler(const SchedulerConfig& config, int64_t num_kv_blocks,
                     std::shared_ptr<KvEventLog> events)
    : config_(config),
      hasher_(config.kv_identity, config.block_size),
      cache_(num_kv_blocks, config.enable_prefix_caching, std::move(events)) {}

void Scheduler::Add(std::unique_ptr<Sequence> seq) {
  SetHashRoots(hasher_, *seq);
  seq->arrival_seconds = Now();
  waiting_.push_back(std::move(seq));
}

double Scheduler::Now() const {
  if (config_.clock) return config_.clock();
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

double Scheduler::PrefillLeftTokens(const Sequence& s) const {
  return static_cast<double>(s.num_tokens() - std::max(s.num_computed_tokens,
                                                       s.num_cached_tokens_estimate));
}

double Scheduler::PrefillLeftSeconds(const Sequence& s) const {
  const QcCostModel& cost = *config_.step_cost;
  const double c = static_cast<double>(std::max(s.num_computed_tokens,
                                                s.num_cached_tokens_estimate));
  const double q = static_cast<double>(s.num_tokens()) - c;
  const double variable = cost.RowSeconds(q, c);
  // The fixed cost is paid once per step the prefill needs: the step time budget (or the token
  // budget) splits it into chunks.
  const double fixed = cost.fixed_seconds();
  const double budget = config_.step_time_budget_seconds;
  double steps = std::ceil(q / std::max(1, config_.max_num_batched_tokens));
  if (budget > fixed) steps = std::max(steps, std::ceil(variable / (budget - fixed)));
  return fixed * std::max(1.0, steps) + variable;
}

bool Scheduler::PolicyBefore(const Sequence& a, const Sequence& b, double now) const {
  // kShortestPrefillFirst: with a fitted cost model, the seconds of prefill left (cost(q, c))
  // minus prefill_aging x seconds waited; before it, the tokens left and no aging.
  const QcCostModel* cost = config_.step_cost;
  const bool timed = config_.policy == SchedulingPolicy::kShortestPrefillFirst &&
                     cost != nullptr && cost->Fitted();
  auto key = [&](const Sequence& s) {
    double score = s.arrival_seconds;
    if (timed) {
      const double waited = now - s.arrival_seconds - s.prefill_served_seconds;
      score = PrefillLeftSeconds(s) - config_.prefill_aging * std::max(0.0, waited);
    } else if (config_.policy == SchedulingPolicy::kShortestPrefillFirst) {
      score = PrefillLeftTokens(s);
    }
    return std::make_tuple(s.request.priority, score, s.arrival_seconds);
  };
  return key(a) < key(b);
}

double Scheduler::PlanCost(int32_t q, int32_t c) const {
  const QcCostModel* cost = config_.step_cost;
  if (cost != nullptr && cost->Fitted()) return cost->RowSeconds(q, c);
  return static_cast<double>(q);
}

void Scheduler::ChargeService(double now) {
  const int64_t last = num_plans_ - 1;
  if (last >= 0 && last_plan_cost_ > 0) {
    const double seconds = std::max(0.0, now - last_plan_seconds_);
    auto charge = [&](Sequence& s) {
      if (s.last_prefill_plan == last) {
        s.prefill_served_seconds += seconds * s.last_prefill_cost / last_plan_cost_;
      }
    };
    for (auto& s : running_) charge(*s);
    for (auto& s : waiting_) charge(*s);  // preempted since
  }
  ++num_plans_;
  last_plan_seconds_ = now;
  last_plan_cost_ = 0;
}

void Scheduler::OrderQueues(double now) {
  if (config_.policy == SchedulingPolicy::kShortestPrefillFirst && cache_.enabled()) {
    // A waiting prompt whose prefix is cached computes only the rest: rank it by that.
    for (auto& s : waiting_) {
      if (!s->block_table.empty() || s->NeedsPromptLogprobs()) continue;
      hasher_.ExtendFullBlockHashes(s->root_hash, s->token_ids, s->extra_key_spans,
                                    s->block_hashes);
      const int64_t max_blocks = (s->num_tokens() - 1) / config_.block_size;
      s->num_cached_tokens_estimate = static_cast<int32_t>(
          cache_.CountCachedPrefix(s->block_hashes, max_blocks) * config_.block_size);
    }
  }
  std::stable_sort(running_.begin(), running_.end(), [&](const auto& a, const auto& b) {
    const bool pa = IsPrefilling(*a), pb = IsPrefilling(*b);
    if (pa != pb) return pb;  // decodes first
    if (!pa) return a->admission_order < b->admission_order;
    return PolicyBefore(*a, *b, now);
  });
  std::stable_sort(waiting_.begin(), waiting_.end(), [&](const auto& a, const auto& b) {
    return PolicyBefore(*a, *b, now);
  });
}

std::vector<Sequence*> Scheduler::running() const {
  std::vector<Sequence*> out;
  out.reserve(running_.size());
  for (const auto& s : running_) out.push_back(s.get());
  return out;
}

Sequence* Scheduler::Find(const std::string& request_id) {
  for (auto& s : running_) {
    if (s->request.request_id == request_id) return s.get();
  }
  for (auto& s : waiting_) {
    if (s->request.request_id == request_id) return s.get();
  }
  for (auto& s : reserved_) {
    if (s->request.request_id == request_id) return s.get();
  }
  for (auto& s : loading_) {
    if (s->request.request_id == request_id) return s.get();
  }
  for (auto& s : encoding_) {
    if (s->request.request_id == request_id) return s.get();
  }
  return nullptr;
}

bool Scheduler::Reserve(std::unique_ptr<Sequence>& seq, int64_t num_tokens) {
  if (!EnsureBlocks(*seq, num_tokens)) return false;
  SetHashRoots(hasher_, *seq);
  seq->arrival_seconds = Now();
  reserved_.push_back(std::move(seq));
  return true;
}

bool Scheduler::Activate(const std::string& request_id) {
  auto it = std::find_if(reserved_.begin(), reserved_.end(), [&](const auto& s) {
    return s->request.request_id == request_id;
  });
  if (it == reserved_.end()) return false;
  waiting_.push_front(std::move(*it));
  reserved_.erase(it);
  return true;
}

bool Scheduler::ActivateForRecompute(const std::string& request_id) {
  auto it = std::find_if(reserved_.begin(), reserved_.end(), [&](const auto& s) {
    return s->request.request_id == request_id;
  });
  if (it == reserved_.end()) return false;
  DropBlocks(**it);
  (*it)->num_saved_blocks = 0;
  waiting_.push_front(std::move(*it));
  reserved_.erase(it);
  return true;
}

std::unique_ptr<Sequence> Scheduler::Remove(const std::string& request_id) {
  std::unique_ptr<Sequence> out = Detach(request_id);
  if (out != nullptr) {
    cache_.Free(out->block_table);
    out->block_table.clear();
  }
  return out;
}

std::unique_ptr<Sequence> Scheduler::Detach(const std::string& request_id) {
  std::unique_ptr<Sequence> out;
  auto match = [&](const std::unique_ptr<Sequence>& s) {
    return s->request.request_id == request_id;
  };
  if (auto it = std::find_if(running_.begin(), running_.end(), match); it != running_.end()) {
    out = std::move(*it);
    running_.erase(it);
  } else if (auto wit = std::find_if(waiting_.begin(), waiting_.end(), match);
             wit != waiting_.end()) {
    out = std::move(*wit);
    waiting_.erase(wit);
  } else if (auto rit = std::find_if(reserved_.begin(), reserved_.end(), match);
             rit != reserved_.end()) {
    out = std::move(*rit);
    reserved_.erase(rit);
  } else if (auto lit = std::find_if(loading_.begin(), loading_.end(), match);
             lit != loading_.end()) {
    out = std::move(*lit);  // a load still running for it is dropped by FinishLoad
    loading_.erase(lit);
  } else if (auto eit = std::find_if(encoding_.begin(), encoding_.end(), match);
             eit != encoding_.end()) {
    out = std::move(*eit);  // an encode still running for it is dropped by FinishImageEncode
    encoding_.erase(eit);
  }
  return out;
}

bool Scheduler::EnsureBlocks(Sequence& seq, int64_t num_tokens) {
  const int64_t needed =
      NumBlocksFor(num_tokens, config_.block_size) - static_cast<int64_t>(seq.block_table.size());
  if (needed <= 0) return true;
  return cache_.Allocate(needed, seq.block_table);
}

void Scheduler::DropBlocks(Sequence& seq) {
  cache_.Free(seq.block_table);
  seq.block_table.clear();
  seq.num_computed_tokens = 0;
  seq.num_cached_tokens = 0;
  seq.num_committed_blocks = 0;
  seq.sliding_kv_start = 0;
  seq.draft.Clear();
}

int32_t Scheduler::PreemptWaitingHolders(SchedulerOutput& out) {
  int32_t n = 0;
  for (size_t k = 1; k < waiting_.size(); ++k) {
    if (waiting_[k]->block_table.empty()) continue;
    Preempt(*waiting_[k], RecomputeCause::kWaitingHeadBlocked,
            waiting_.front()->request.request_id, out);
    ++n;
  }
  return n;
}

void Scheduler::Preempt(Sequence& seq, RecomputeCause cause, const std::string& needed_by,
                        SchedulerOutput& out) {
  RecomputeEvent& e = out.preempted.emplace_back();
  e.request_id = seq.request.request_id;
  e.cause = cause;
  e.num_blocks_freed = static_cast<int64_t>(seq.block_table.size());
  e.num_tokens_to_recompute = seq.num_computed_tokens;
  e.needed_by = needed_by;
  DropBlocks(seq);
  ++seq.num_preemptions;
  ++num_preemptions_;
}

void Scheduler::ReuseCachedPrefix(Sequence& seq) {
  if (!cache_.enabled()) return;
  hasher_.ExtendFullBlockHashes(seq.root_hash, seq.token_ids, seq.extra_key_spans,
                                seq.block_hashes);
  // Leave at least one token to compute: its logits sample the next token. Prompt logprobs
  // need every prompt position computed: nothing is reused then.
  const int64_t max_blocks =
      seq.NeedsPromptLogprobs() ? 0 : (seq.num_tokens() - 1) / config_.block_size;
  seq.block_table = cache_.AcquirePrefix(seq.block_hashes, max_blocks);
  const int32_t cached = static_cast<int32_t>(seq.block_table.size() * config_.block_size);
  seq.num_computed_tokens = cached;
  seq.num_cached_tokens = std::min(cached, seq.num_prompt_tokens());
  seq.num_committed_blocks = static_cast<int32_t>(seq.block_table.size());
  seq.num_saved_blocks = seq.num_committed_blocks;
  seq.num_cached_tokens_estimate = 0;  // the hit is in num_computed_tokens now
}

bool Scheduler::StartExternalLoad(Sequence& seq) {
  if (config_.kv_connector == nullptr || !cache_.enabled() || seq.kv_lookup_done ||
      seq.NeedsPromptLogprobs()) {
    return false;
  }
  seq.kv_lookup_done = true;  // once per request: a preempted one recomputes locally
  const int64_t max_blocks = (seq.num_tokens() - 1) / config_.block_size;
  const int64_t local = static_cast<int64_t>(seq.block_table.size());
  if (max_blocks <= local) return false;
  seq.kv_load_ticket = next_load_ticket_++;
  config_.kv_connector->StartLoad(
      seq.kv_load_ticket,
      std::vector<BlockHash>(seq.block_hashes.begin() + local,
                             seq.block_hashes.begin() + max_blocks));
  return true;
}

bool Scheduler::StartImageEncode(Sequence& seq) {
  if (config_.image_encoder == nullptr ||
      !NeedsImageEncode(seq.request, seq.num_computed_tokens)) {
    return false;
  }
  seq.image_encode_ticket = next_encode_ticket_++;
  config_.image_encoder->StartEncode(seq.image_encode_ticket, seq.request.mm_inputs);
  return true;
}

Sequence* Scheduler::FinishImageEncode(uint64_t ticket,
                                       absl::StatusOr<std::vector<MultimodalInput>> inputs,
                                       std::unique_ptr<Sequence>& failed) {
  auto it = std::find_if(encoding_.begin(), encoding_.end(),
                         [&](const auto& s) { return s->image_encode_ticket == ticket; });
  if (it == encoding_.end()) return nullptr;
  std::unique_ptr<Sequence> seq = std::move(*it);
  encoding_.erase(it);
  seq->image_encode_ticket = 0;
  if (!inputs.ok()) {
    cache_.Free(seq->block_table);
    seq->block_table.clear();
    failed = std::move(seq);
    return nullptr;
  }
  seq->request.mm_inputs = *std::move(inputs);
  Sequence* out = seq.get();
  waiting_.push_front(std::move(seq));
  return out;
}

Sequence* Scheduler::FinishLoad(uint64_t ticket, int64_t num_blocks,
                                absl::FunctionRef<absl::Status(absl::Span<const int32_t>)> fill,
                                std::vector<int32_t>& load_blocks) {
  load_blocks.clear();
  auto it = std::find_if(loading_.begin(), loading_.end(),
                         [&](const auto& s) { return s->kv_load_ticket == ticket; });
  if (it == loading_.end()) return nullptr;
  Sequence& seq = **it;
  const int64_t local = static_cast<int64_t>(seq.block_table.size());
  const int64_t max_blocks = (seq.num_tokens() - 1) / config_.block_size;
  int64_t n = std::clamp<int64_t>(num_blocks, 0, max_blocks - local);
  if (n > 0 && !cache_.Allocate(n, seq.block_table)) n = 0;  // no room: compute instead
  load_blocks.assign(seq.block_table.begin() + local, seq.block_table.end());
  if (n > 0 && !fill(load_blocks).ok()) {  // the copy failed: compute those blocks instead
    seq.block_table.resize(static_cast<size_t>(local));
    cache_.Free(load_blocks);
    load_blocks.clear();
    n = 0;
  }
  const int32_t loaded = static_cast<int32_t>(n * config_.block_size);
  seq.num_computed_tokens += loaded;
  seq.num_cached_tokens = std::min(seq.num_computed_tokens, seq.num_prompt_tokens());
  seq.num_external_cached_tokens = loaded;
  num_external_cached_prompt_tokens_ += loaded;
  // Loaded blocks are outside already: never written back.
  seq.num_saved_blocks = static_cast<int32_t>(local + n);
  // The caller fills the blocks before the next step; registering now is safe because nothing
  // reads the cache in between (one engine thread). Partial blocks are never registered.
  if (config_.loaded_blocks_partial) {
    seq.num_committed_blocks = seq.num_saved_blocks;
  } else {
    CommitBlocks(seq);
  }
  // A sequence with blocks is not fresh at admission: count its cached tokens here.
  if (!seq.block_table.empty()) num_cached_prompt_tokens_ += seq.num_cached_tokens;
  waiting_.push_front(std::move(*it));
  loading_.erase(it);
  return &seq;
}

void Scheduler::CommitBlocks(Sequence& seq) {
  if (!cache_.enabled()) return;
  const int32_t full = seq.num_computed_tokens / static_cast<int32_t>(config_.block_size);
  const int32_t from = seq.num_committed_blocks;
  if (full <= from) return;
  hasher_.ExtendFullBlockHashes(seq.root_hash, seq.token_ids, seq.extra_key_spans,
                                seq.block_hashes);
  const std::optional<BlockHash> parent =
      from == 0 ? std::nullopt : std::optional<BlockHash>(seq.block_hashes[from - 1]);
  cache_.Register(absl::MakeConstSpan(seq.block_table).subspan(from, full - from),
                  absl::MakeConstSpan(seq.block_hashes).subspan(from, full - from), parent);
  seq.num_committed_blocks = full;
}

SchedulerOutput Scheduler::Schedule() {
  SchedulerOutput out;
  int32_t budget = config_.max_num_batched_tokens;
  StepTimeBudget time(config_.step_cost, config_.step_time_budget_seconds);
  const bool ordered = config_.policy != SchedulingPolicy::kFcfs;
  const double now = ordered ? Now() : 0.0;
  if (ordered) {
    ChargeService(now);
    OrderQueues(now);
  }
  const int64_t plan = num_plans_ - 1;
  const int32_t block_size = static_cast<int32_t>(config_.block_size);
  bool prefill_scheduled = false;  // the step's first prefill chunk gets at least block_size
  bool first_token_scheduled = false;  // a prefill this step ends its prompt (fair policies)
  // Logits rows left in this step. A sequence may take those beyond one for each of the
  // `reserved` running sequences still to be planned: as running_ never holds more than
  // max_num_seqs <= max_num_logits sequences, each of them finds at least one row left.
  const bool rows_limited = config_.max_num_logits > 0;
  int64_t rows_left = config_.max_num_logits;
  auto rows_free = [&](size_t reserved) {
    return rows_limited ? std::max<int64_t>(0, rows_left - static_cast<int64_t>(reserved))
                        : std::numeric_limits<int64_t>::max();
  };
  // The prefill chunk `seq` may take this step: its uncomputed tokens within the budgets (tokens,
  // time, logits rows beyond `reserved`); 0: none this step. With a fair policy a step that
  // already ends some prompt's prefill (a first token) takes no chunk that does not end its
  // own: that first token would wait for it.
  auto prefill_chunk = [&](const Sequence& seq, size_t reserved) {
    const int32_t left = seq.num_tokens() - seq.num_computed_tokens;
    const int32_t want = std::min(left, budget);
    int32_t chunk = want;
    if (want > 1) {
      chunk = time.MaxChunk(want, seq.num_computed_tokens, prefill_scheduled ? 0 : block_size);
    }
    // Prompt logprobs ask for a row per position: the chunk ends where the rows do.
    chunk = FitLogitsRows(seq, chunk, rows_free(reserved));
    if (want > 1 && ordered && first_token_scheduled && chunk < left) return 0;
    return chunk;
  };
  // Running sequences after index `k` (each keeps a row while `k` is planned).
  auto after = [&](size_t k) { return running_.size() > k ? running_.size() - k - 1 : 0; };
  auto add = [&](Sequence& seq, int32_t n) {
    rows_left -= NumLogitsRows(seq, n);
    time.Charge(n, seq.num_computed_tokens);
    if (ordered) {
      const double cost = PlanCost(n, seq.num_computed_tokens);
      last_plan_cost_ += cost;
      if (IsPrefilling(seq)) {
        seq.last_prefill_plan = plan;
        seq.last_prefill_cost = cost;
      }
    }
    if (IsPrefilling(seq)) {
      prefill_scheduled = true;
      if (seq.num_computed_tokens + n >= seq.num_tokens() && !first_token_scheduled) {
        first_token_scheduled = true;
        if (ordered) time.CapAfterFirstToken(n, seq.num_computed_tokens);
      }
    }
    out.scheduled.push_back({&seq, n});
    budget -= n;
  };
  // Preempt the last running sequence (in serving order) at or after index `from` for
  // running_[from]'s tokens; true if that was running_[from] itself.
  auto preempt_last = [&](size_t from) {
    const std::string needed_by = running_[from]->request.request_id;
    std::unique_ptr<Sequence> victim = std::move(running_.back());
    running_.pop_back();
    Preempt(*victim, RecomputeCause::kOutOfKvBlocks, needed_by, out);
    waiting_.push_front(std::move(victim));
    return running_.size() == from;
  };

  // 1. Running sequences, oldest first (with a fair policy: those decoding); preempt from the
  // back when blocks run out.
  size_t i = 0;
  while (i < running_.size() && budget > 0) {
    Sequence& seq = *running_[i];
    if (ordered && IsPrefilling(seq)) break;  // served with the waiting ones, in policy order
    // Draft tokens ride behind the uncomputed ones and are cut first when the budget is short.
    const int32_t uncomputed = seq.num_tokens() - seq.num_computed_tokens;
    int32_t n = uncomputed > 1
                    ? prefill_chunk(seq, after(i))
                    : FitLogitsRows(
                          seq,
                          std::min(uncomputed + static_cast<int32_t>(seq.draft.tokens.size()),
                                   budget),
                          rows_free(after(i)));
    seq.TruncateDraft(static_cast<size_t>(std::max(0, n - uncomputed)));
    if (n <= 0 || seq.finish_pending) {
      ++i;
      continue;
    }
    bool fits = EnsureBlocks(seq, seq.num_computed_tokens + n);
    if (!fits && n > uncomputed) {  // drafts never cost another sequence its blocks
      seq.TruncateDraft(0);
      n = uncomputed;
      fits = EnsureBlocks(seq, seq.num_computed_tokens + n);
    }
    while (!fits) {
      if (preempt_last(i)) break;  // `seq` itself: everything after it is gone too
      fits = EnsureBlocks(seq, seq.num_computed_tokens + n);
    }
    if (!fits) break;
    add(seq, n);
    ++i;
  }

  // 2. Prefills: running sequences still prefilling (from index i, fair policies only) and
  // waiting ones, merged in policy order. Waiting ones are admitted only if this step had to
  // preempt nothing (avoid thrashing); admitted ones join running_ at the end.
  size_t r = ordered ? i : running_.size();
  std::vector<std::unique_ptr<Sequence>> admitted;
  bool admit = out.preempted.empty();
  // Admits the first waiting sequence behind the head that holds KV blocks with computed tokens
  // and whose next tokens fit; false if none does.
  auto admit_holder_behind_head = [&]() {
    for (size_t k = 1; k < waiting_.size() && budget > 0; ++k) {
      if (static_cast<int32_t>(running_.size() + admitted.size()) >= config_.max_num_seqs) break;
      Sequence& holder = *waiting_[k];
      if (holder.block_table.empty() || holder.num_computed_tokens == 0) continue;
      // Its images are encoded once it reaches the head.
      if (config_.image_encoder != nullptr &&
          NeedsImageEncode(holder.request, holder.num_computed_tokens)) {
        continue;
      }
      const int32_t n = prefill_chunk(holder, running_.size() - std::min(r, running_.size()));
      if (n <= 0 || !EnsureBlocks(holder, holder.num_computed_tokens + n)) continue;
      holder.admission_order = next_admission_++;
      admitted.push_back(std::move(waiting_[k]));
      waiting_.erase(waiting_.begin() + static_cast<std::ptrdiff_t>(k));
      add(*admitted.back(), n);
      return true;
    }
    return false;
  };
  while (budget > 0) {
    Sequence* run = r < running_.size() ? running_[r].get() : nullptr;
    const bool can_admit =
        admit && !waiting_.empty() &&
        static_cast<int32_t>(running_.size() + admitted.size()) < config_.max_num_seqs;
    Sequence* wait = can_admit ? waiting_.front().get() : nullptr;
    if (run == nullptr && wait == nullptr) break;
    if (run != nullptr && (wait == nullptr || !PolicyBefore(*wait, *run, now))) {
      const int32_t n = prefill_chunk(*run, after(r));
      if (n <= 0) {  // not this step (time spent, or it would delay a first token)
        ++r;
        continue;
      }
      bool fits = EnsureBlocks(*run, run->num_computed_tokens + n);
      while (!fits) {
        admit = false;
        if (preempt_last(r)) break;
        fits = EnsureBlocks(*run, run->num_computed_tokens + n);
      }
      if (!fits) continue;  // `run` preempted itself: no running prefill is left
      add(*run, n);
      ++r;
      continue;
    }
    Sequence& seq = *wait;
    const bool fresh = seq.block_table.empty();  // new or preempted (reserved ones have blocks)
    if (fresh) {
      ReuseCachedPrefix(seq);
      if (StartExternalLoad(seq)) {  // parked until FinishLoad; the next one goes on
        loading_.push_back(std::move(waiting_.front()));
        waiting_.pop_front();
        continue;
      }
    }
    // Positions to compute that an image without embeddings covers: parked until they are
    // encoded (a fresh sequence gives its shared prefix blocks back meanwhile); the next one goes
    // on.
    if (StartImageEncode(seq)) {
      if (fresh) DropBlocks(seq);
      encoding_.push_back(std::move(waiting_.front()));
      waiting_.pop_front();
      continue;
    }
    const int32_t n = prefill_chunk(seq, running_.size() - std::min(r, running_.size()));
    if (n <= 0) {  // not this step (time or logits rows spent, or it would delay a first token)
      if (fresh) DropBlocks(seq);
      admit = false;
      continue;
    }
    if (!EnsureBlocks(seq, seq.num_computed_tokens + n)) {
      if (fresh) DropBlocks(seq);  // give the shared blocks back; retried next step
      // Sequences behind the head that hold their KV already (a completed KV transfer
      // activated before a preemption put the head in front) need only their next tokens'
      // blocks: run them now instead of leaving them queued behind the head (or, with nothing
      // running, preempting them below and recomputing KV that arrived intact). They finish
      // and free their blocks for the head.
      if (admit_holder_behind_head()) continue;
      // Nothing runs and nothing will free blocks, yet sequences behind the head hold some
      // that cannot even take their next tokens: the head would wait forever. Preempt those
      // holders (they recompute) and retry the head.
      if (running_.empty() && out.scheduled.empty()) {
        if (PreemptWaitingHolders(out) > 0) continue;
      }
      admit = false;
      continue;
    }
    if (fresh) num_cached_prompt_tokens_ += seq.num_cached_tokens;
    seq.admission_order = next_admission_++;
    admitted.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
    add(seq, n);
  }
  for (auto& seq : admitted) running_.push_back(std::move(seq));
  out.num_batched_tokens = config_.max_num_batched_tokens - budget;
  return out;
}

}  // namespace sluice
