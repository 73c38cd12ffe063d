#include "engine/spec/draft_model_drafter.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/spec/draft_sampling.h"

namespace sluice {
namespace {

// FR-Spec re-ranking: after this many counted tokens, then each time the count doubles.
constexpr int64_t kFirstRerank = 256;

}  // namespace

absl::StatusOr<std::unique_ptr<DraftModelDrafter>> DraftModelDrafter::Create(
    std::unique_ptr<Model> model, const DraftModelOptions& options) {
  if (model == nullptr) return absl::InvalidArgumentError("draft model is null");
  if (options.block_size <= 0 || options.num_kv_blocks <= 0) {
    return absl::InvalidArgumentError("draft KV cache needs block_size > 0 and num_kv_blocks > 0");
  }
  if (options.bf16_weights) {
    const absl::Status st = model->StoreWeightsBf16();
    if (!st.ok() && !absl::IsUnimplemented(st)) return st;
  }
  std::unique_ptr<DraftModelDrafter> drafter(new DraftModelDrafter(std::move(model), options));
  const int64_t vocab = drafter->model_->config().vocab_size;
  if (options.draft_vocab > 0 && options.draft_vocab < vocab) {
    drafter->token_counts_.assign(static_cast<size_t>(vocab), 0);
    drafter->next_rerank_ = kFirstRerank;
    if (absl::Status st = drafter->Rerank(); !st.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--speculative-draft-vocab: the draft model cannot restrict its LM head (",
                       st.message(), ")"));
    }
  }
  return drafter;
}

void DraftModelDrafter::CountTokens(SeqState& s, absl::Span<const int32_t> tokens) {
  if (token_counts_.empty()) return;
  const int32_t n = static_cast<int32_t>(tokens.size());
  for (int32_t i = std::min(s.num_counted, n); i < n; ++i) ++token_counts_[tokens[i]];
  if (n > s.num_counted) num_counted_ += n - s.num_counted;
  s.num_counted = std::max(s.num_counted, n);
}

absl::Status DraftModelDrafter::Rerank() {
  const int64_t vocab = static_cast<int64_t>(token_counts_.size());
  std::vector<int32_t> order(static_cast<size_t>(vocab));
  for (int64_t i = 0; i < vocab; ++i) order[i] = static_cast<int32_t>(i);
  // Most counted first; ties (and never-seen tokens) by id.
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return token_counts_[a] > token_counts_[b];
  });
  order.resize(static_cast<size_t>(options_.draft_vocab));
  // Ascending ids: an argmax tie in the subset resolves to the lowest id, as over the full
  // vocabulary.
  std::sort(order.begin(), order.end());
  if (order == vocab_ids_) return absl::OkStatus();
  SLUICE_RETURN_IF_ERROR(model_->RestrictLogits(order));
  vocab_ids_ = std::move(order);
  return absl::OkStatus();
}

DraftModelDrafter::DraftModelDrafter(std::unique_ptr<Model> model,
                                     const DraftModelOptions& options)
    : model_(std::move(model)),
      options_(options),
      kv_(model_->kv_cache_spec(), absl::StrCat("draft:", options.model_id), options.block_size,
          options.num_kv_blocks, options.enable_prefix_caching, options.host_kv_storage) {}

absl::Status DraftModelDrafter::CatchUp(absl::Span<SeqState* const> states) {
  const int64_t limit = options_.max_tokens_per_forward;
  if (static_cast<int64_t>(states.size()) > limit) {
    return absl::InvalidArgumentError(absl::StrCat(
        "draft model: ", states.size(), " sequences exceed max_tokens_per_forward ", limit));
  }
  const auto pending = [&] {
    int64_t total = 0;
    for (const SeqState* s : states) total += static_cast<int64_t>(s->tokens.size()) - s->num_computed;
    return total;
  };
  // Each forward computes up to `limit` of the tokens before each sequence's last (round 0
  // feeds the last one with its logits row), until round 0 fits.
  while (pending() > limit) {
    ForwardInput& in = input_;
    in.token_ids.clear();
    in.positions.clear();
    in.slot_mapping.clear();
    in.sequences.clear();
    in.logits_indices.clear();
    std::vector<std::pair<SeqState*, int32_t>> advanced;
    int64_t room = limit;
    for (SeqState* s : states) {
      const int32_t last = static_cast<int32_t>(s->tokens.size()) - 1;
      const int32_t take = static_cast<int32_t>(std::min<int64_t>(last - s->num_computed, room));
      if (take <= 0) continue;
      SequenceSlice slice;
      slice.query_start = static_cast<int32_t>(in.token_ids.size());
      slice.num_context_tokens = s->num_computed;
      slice.num_query_tokens = take;
      slice.block_table = absl::MakeConstSpan(s->blocks.table);
      for (int32_t pos = s->num_computed; pos < s->num_computed + take; ++pos) {
        in.token_ids.push_back(s->tokens[pos]);
        in.positions.push_back(pos);
        in.slot_mapping.push_back(kv_.Slot(s->blocks, pos));
      }
      in.sequences.push_back(slice);
      advanced.emplace_back(s, take);
      room -= take;
      if (room == 0) break;
    }
    const double start = CostClockSeconds(options_.cost_clock);
    SLUICE_RETURN_IF_ERROR(model_->Forward(in, kv_.kv_cache(), absl::Span<float>()));
    round_cost_.Observe(static_cast<double>(in.token_ids.size()),
                        CostClockSeconds(options_.cost_clock) - start);
    for (auto& [s, take] : advanced) s->num_computed += take;
  }
  return absl::OkStatus();
}

void DraftModelDrafter::Release(std::string_view request_id) {
  auto it = states_.find(std::string(request_id));
  if (it == states_.end()) return;
  kv_.Free(it->second.blocks);
  states_.erase(it);
}

void DraftModelDrafter::Commit(SeqState& s) {
  kv_.Commit(s.blocks, s.tokens, s.num_computed / static_cast<int32_t>(options_.block_size));
}

bool DraftModelDrafter::Prepare(SeqState& s, absl::Span<const int32_t> tokens,
                                int64_t num_kv_tokens) {
  const int32_t n = static_cast<int32_t>(tokens.size());
  // Keep the KV of the common prefix (accepted drafts included); at least the last real token
  // is recomputed so its logits propose the first draft.
  const auto mismatch = std::mismatch(s.tokens.begin(), s.tokens.end(), tokens.begin(),
                                      tokens.end());
  const int32_t common = static_cast<int32_t>(mismatch.first - s.tokens.begin());
  s.num_computed = std::min({s.num_computed, common, n - 1});
  s.tokens.assign(tokens.begin(), tokens.end());
  const int32_t bs = static_cast<int32_t>(options_.block_size);
  // A fresh state starts from the cached prefix (at least the last token is computed).
  if (s.blocks.table.empty()) {
    s.num_computed = kv_.AcquirePrefix(s.blocks, tokens, (n - 1) / bs);
  }
  // A committed block's tokens never change (they are real), so rollback stays above them.
  s.num_computed = std::max(s.num_computed, std::min(s.blocks.num_committed * bs, n - 1));
  Commit(s);
  return kv_.Grow(s.blocks, num_kv_tokens);
}

absl::Status DraftModelDrafter::Propose(absl::Span<const DraftInput> inputs,
                                        const DraftContinue& keep_going,
                                        std::vector<DraftOutput>* outputs) {
  outputs->resize(inputs.size());
  for (DraftOutput& out : *outputs) out.Clear();
  const int64_t vocab = model_->config().vocab_size;
  const int64_t max_pos = model_->config().max_position_embeddings;
  std::vector<size_t> active;
  std::vector<SeqState*> states;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const DraftInput& in = inputs[i];
    const int64_t n = static_cast<int64_t>(in.token_ids.size());
    const int32_t k = static_cast<int32_t>(std::min<int64_t>(in.max_draft_tokens, max_pos - n + 1));
    if (k <= 0 || n == 0) continue;
    auto [it, fresh] = states_.try_emplace(std::string(in.request_id));
    if (fresh) it->second.blocks.root = kv_.hasher().RootHash(in.cache_salt);
    CountTokens(it->second, in.token_ids);
    // KV for positions up to n + k - 2 (the last draft is never fed).
    if (!Prepare(it->second, in.token_ids, n + k - 1)) {
      Release(in.request_id);
      continue;
    }
    active.push_back(i);
    states.push_back(&it->second);
  }

  if (!token_counts_.empty() && num_counted_ >= next_rerank_) {
    next_rerank_ = 2 * num_counted_;
    SLUICE_RETURN_IF_ERROR(Rerank());
  }
  if (options_.max_tokens_per_forward > 0) {
    if (absl::Status st = CatchUp(states); !st.ok()) {
      for (size_t i : active) Release(inputs[i].request_id);
      return st;
    }
  }
  // Logits rows are over vocab_ids_ (FR-Spec) or every id.
  const int64_t width = model_->logits_width();
  const auto token_of = [&](int64_t column) {
    return vocab_ids_.empty() ? static_cast<int32_t>(column) : vocab_ids_[column];
  };
  std::vector<float> probs;
  // Round 0 feeds each sequence's catch-up chunk; round j > 0 feeds draft j - 1.
  for (int32_t round = 0; !active.empty(); ++round) {
    input_.token_ids.clear();
    input_.positions.clear();
    input_.slot_mapping.clear();
    input_.sequences.clear();
    input_.logits_indices.clear();
    for (size_t a = 0; a < active.size(); ++a) {
      SeqState& s = *states[a];
      const int32_t end = static_cast<int32_t>(s.tokens.size());
      SequenceSlice slice;
      slice.query_start = static_cast<int32_t>(input_.token_ids.size());
      slice.num_context_tokens = s.num_computed;
      slice.num_query_tokens = end - s.num_computed;
      slice.block_table = absl::MakeConstSpan(s.blocks.table);
      for (int32_t pos = s.num_computed; pos < end; ++pos) {
        input_.token_ids.push_back(s.tokens[pos]);
        input_.positions.push_back(pos);
        input_.slot_mapping.push_back(kv_.Slot(s.blocks, pos));
      }
      input_.logits_indices.push_back(slice.query_start + slice.num_query_tokens - 1);
      input_.sequences.push_back(slice);
    }
    logits_.resize(active.size() * width);
    const double start = CostClockSeconds(options_.cost_clock);
    const absl::Status st = model_->Forward(input_, kv_.kv_cache(), absl::MakeSpan(logits_));
    // Catch-up rounds (prefill chunks) are priced like any other: the fit has a per-token slope.
    round_cost_.Observe(static_cast<double>(input_.token_ids.size()),
                        CostClockSeconds(options_.cost_clock) - start);
    if (!st.ok()) {
      for (size_t a = 0; a < active.size(); ++a) Release(inputs[active[a]].request_id);
      for (DraftOutput& out : *outputs) out.Clear();
      return st;
    }
    std::vector<size_t> next_active;
    std::vector<SeqState*> next_states;
    for (size_t a = 0; a < active.size(); ++a) {
      const DraftInput& in = inputs[active[a]];
      SeqState& s = *states[a];
      DraftOutput& out = (*outputs)[active[a]];
      s.num_computed = static_cast<int32_t>(s.tokens.size());
      const absl::Span<const float> row(logits_.data() + a * width, width);
      const float temperature = in.sampling->temperature;
      SampleDrawKey key = in.first_draft_key;
      key.position += static_cast<int64_t>(out.tokens.size());
      const DraftPick pick = PickDraft(row, temperature, key, &probs);
      const int32_t token = token_of(pick.column);
      const float confidence = pick.confidence;
      if (temperature >= kDraftGreedyTemperature) {
        if (vocab_ids_.empty()) {
          out.probs.push_back(probs);
        } else {  // q over the full vocabulary: 0 off the subset
          std::vector<float> full(static_cast<size_t>(vocab), 0.0f);
          for (int64_t c = 0; c < width; ++c) full[vocab_ids_[c]] = probs[c];
          out.probs.push_back(std::move(full));
        }
      }
      out.tokens.push_back(token);
      out.confidence.push_back(confidence);
      const int32_t j = static_cast<int32_t>(out.tokens.size()) - 1;
      const int64_t n = static_cast<int64_t>(in.token_ids.size());
      const int32_t k =
          static_cast<int32_t>(std::min<int64_t>(in.max_draft_tokens, max_pos - n + 1));
      if (j + 1 >= k || (keep_going && !keep_going(active[a], j, confidence))) continue;
      s.tokens.push_back(token);  // fed next round
      next_active.push_back(active[a]);
      next_states.push_back(&s);
    }
    active.swap(next_active);
    states.swap(next_states);
  }
  return absl::OkStatus();
}

}  // namespace sluice
