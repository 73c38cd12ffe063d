#include "engine/spec/mtp_drafter.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/sample/philox.h"
#include "engine/spec/draft_sampling.h"

namespace sluice {

absl::StatusOr<std::unique_ptr<MtpDrafter>> MtpDrafter::Create(Model* target,
                                                               const MtpOptions& options) {
  if (target == nullptr) return absl::InvalidArgumentError("MTP drafter: the target is null");
  if (options.block_size <= 0 || options.num_kv_blocks <= 0) {
    return absl::InvalidArgumentError("MTP KV cache needs block_size > 0 and num_kv_blocks > 0");
  }
  if (absl::Status st = target->MtpStatus(); !st.ok()) return st;
  return std::unique_ptr<MtpDrafter>(new MtpDrafter(target, options));
}

MtpDrafter::MtpDrafter(Model* target, const MtpOptions& options)
    : target_(target),
      options_(options),
      hidden_size_(target->config().hidden_size),
      kv_(target->mtp_kv_cache_spec(), absl::StrCat("mtp:", options.model_id),
          options.block_size, options.num_kv_blocks, options.enable_prefix_caching) {}

void MtpDrafter::Release(std::string_view request_id) {
  auto it = states_.find(std::string(request_id));
  if (it == states_.end()) return;
  kv_.Free(it->second.blocks);
  states_.erase(it);
}

void MtpDrafter::ObserveHiddenStates(std::string_view request_id, int32_t first_position,
                                     absl::Span<const float> hidden) {
  const int64_t h = hidden_size_;
  const int32_t rows = static_cast<int32_t>(static_cast<int64_t>(hidden.size()) / h);
  if (rows <= 0 || first_position < 0) return;
  SeqState& s = states_[std::string(request_id)];
  if (s.have.empty()) {
    s.hidden_begin = first_position;
    s.hidden.clear();
  }
  const int32_t end = first_position + rows;
  if (end <= s.hidden_begin) return;  // positions already consumed
  const size_t need = static_cast<size_t>(end - s.hidden_begin);
  if (s.have.size() < need) {
    s.have.resize(need, 0);
    s.hidden.resize(need * h);
  }
  for (int32_t p = std::max(first_position, s.hidden_begin); p < end; ++p) {
    const size_t at = static_cast<size_t>(p - s.hidden_begin);
    std::memcpy(s.hidden.data() + at * h, hidden.data() + (p - first_position) * h,
                h * sizeof(float));
    s.have[at] = 1;
  }
  const int32_t cap = std::max(1, options_.max_pending_positions);
  if (static_cast<int64_t>(s.have.size()) > cap) {
    const int32_t drop = static_cast<int32_t>(s.have.size()) - (cap - cap / 4);
    s.have.erase(s.have.begin(), s.have.begin() + drop);
    s.hidden.erase(s.hidden.begin(), s.hidden.begin() + static_cast<int64_t>(drop) * h);
    s.hidden_begin += drop;
  }
}

void MtpDrafter::Commit(SeqState& s) {
  const int32_t bs = static_cast<int32_t>(options_.block_size);
  // Block b holds positions [b·bs, (b+1)·bs), whose entries read tokens 1..(b+1)·bs.
  kv_.Commit(s.blocks, absl::MakeConstSpan(s.tokens).subspan(1),
             std::min(s.num_exact / bs, s.first_inexact_block));
}

bool MtpDrafter::Prepare(SeqState& s, absl::Span<const int32_t> tokens, int64_t num_kv_tokens) {
  const int32_t n = static_cast<int32_t>(tokens.size());
  const auto mismatch =
      std::mismatch(s.tokens.begin(), s.tokens.end(), tokens.begin(), tokens.end());
  const int32_t common = static_cast<int32_t>(mismatch.first - s.tokens.begin());
  // Entry i reads t_{i+1}: it stays final while the tokens agree through i + 1. The entry at
  // n - 2 is always computed: its logits propose the first draft.
  s.num_exact = std::max(0, std::min({s.num_exact, common - 1, n - 2}));
  s.tokens.assign(tokens.begin(), tokens.end());
  const int32_t bs = static_cast<int32_t>(options_.block_size);
  // A fresh state starts from the cached prefix (the entry at n - 2 is always computed).
  if (s.blocks.table.empty()) {
    s.num_exact = kv_.AcquirePrefix(s.blocks, tokens.subspan(1), (n - 2) / bs);
  }
  // A committed block's tokens never change (they are real), so rollback stays above them.
  s.num_exact = std::max(s.num_exact, std::min(s.blocks.num_committed * bs, n - 2));
  Commit(s);
  return kv_.Grow(s.blocks, num_kv_tokens);
}

absl::Status MtpDrafter::Propose(absl::Span<const DraftInput> inputs,
                                 const DraftContinue& keep_going,
                                 std::vector<DraftOutput>* outputs) {
  outputs->resize(inputs.size());
  for (DraftOutput& out : *outputs) out.Clear();
  const int64_t vocab = target_->config().vocab_size;
  const int64_t max_pos = target_->config().max_position_embeddings;
  const int64_t h = hidden_size_;
  const int32_t bs = static_cast<int32_t>(options_.block_size);
  std::vector<size_t> active;
  std::vector<SeqState*> states;
  std::vector<int32_t> depth;  // drafts wanted per active sequence
  for (size_t i = 0; i < inputs.size(); ++i) {
    const DraftInput& in = inputs[i];
    const int32_t n = static_cast<int32_t>(in.token_ids.size());
    // The last draft comes from position n + k - 3.
    const int32_t k = static_cast<int32_t>(std::min<int64_t>(in.max_draft_tokens, max_pos - n + 2));
    if (k <= 0 || n < 2) continue;
    SeqState& s = states_[std::string(in.request_id)];
    if (!s.rooted) {
      s.blocks.root =
          kv_.hasher().HashBlock(kv_.hasher().RootHash(in.cache_salt), in.token_ids.first(1));
      s.rooted = true;
    }
    if (!Prepare(s, in.token_ids, n + k - 2)) {
      Release(in.request_id);
      continue;
    }
    active.push_back(i);
    states.push_back(&s);
    depth.push_back(k);
  }

  std::vector<float> probs;
  std::vector<float> carried;  // [active, hidden]: the previous round's output hidden states
  // Round 0 feeds each sequence's entries num_exact..n-2 (real tokens, the target's hidden
  // states); round j > 0 feeds draft j at position n - 2 + j with round j - 1's hidden state.
  for (int32_t round = 0; !active.empty(); ++round) {
    input_.token_ids.clear();
    input_.positions.clear();
    input_.slot_mapping.clear();
    input_.sequences.clear();
    input_.logits_indices.clear();
    prev_hidden_.clear();
    for (size_t a = 0; a < active.size(); ++a) {
      SeqState& s = *states[a];
      const DraftInput& in = inputs[active[a]];
      const int32_t n = static_cast<int32_t>(in.token_ids.size());
      const int32_t begin = round == 0 ? s.num_exact : n - 2 + round;
      const int32_t end = round == 0 ? n - 1 : begin + 1;
      SequenceSlice slice;
      slice.query_start = static_cast<int32_t>(input_.token_ids.size());
      slice.num_context_tokens = begin;
      slice.num_query_tokens = end - begin;
      slice.block_table = absl::MakeConstSpan(s.blocks.table);
      for (int32_t pos = begin; pos < end; ++pos) {
        input_.positions.push_back(pos);
        input_.slot_mapping.push_back(kv_.Slot(s.blocks, pos));
        const size_t row = prev_hidden_.size();
        prev_hidden_.resize(row + h, 0.0f);
        if (round > 0) {
          input_.token_ids.push_back((*outputs)[active[a]].tokens.back());
          std::memcpy(prev_hidden_.data() + row, carried.data() + a * h, h * sizeof(float));
          continue;
        }
        input_.token_ids.push_back(in.token_ids[pos + 1]);
        const int64_t at = static_cast<int64_t>(pos) - s.hidden_begin;
        if (at >= 0 && at < static_cast<int64_t>(s.have.size()) && s.have[at]) {
          std::memcpy(prev_hidden_.data() + row, s.hidden.data() + at * h, h * sizeof(float));
        } else {  // never computed by the target here: a zero hidden state (row stays 0)
          ++num_inexact_positions_;
          s.first_inexact_block = std::min(s.first_inexact_block, pos / bs);
        }
      }
      input_.logits_indices.push_back(slice.query_start + slice.num_query_tokens - 1);
      input_.sequences.push_back(slice);
    }
    logits_.resize(active.size() * vocab);
    hidden_out_.resize(active.size() * h);
    const double start = CostClockSeconds(options_.cost_clock);
    const absl::Status st = target_->ForwardMtp(input_, prev_hidden_, kv_.kv_cache(),
                                                absl::MakeSpan(logits_),
                                                absl::MakeSpan(hidden_out_));
    round_cost_.Observe(static_cast<double>(input_.token_ids.size()),
                        CostClockSeconds(options_.cost_clock) - start);
    if (!st.ok()) {
      for (size_t a = 0; a < active.size(); ++a) Release(inputs[active[a]].request_id);
      for (DraftOutput& out : *outputs) out.Clear();
      return st;
    }
    carried.swap(hidden_out_);
    std::vector<size_t> next_active;
    std::vector<SeqState*> next_states;
    std::vector<int32_t> next_depth;
    std::vector<float> next_carried;
    for (size_t a = 0; a < active.size(); ++a) {
      const DraftInput& in = inputs[active[a]];
      SeqState& s = *states[a];
      DraftOutput& out = (*outputs)[active[a]];
      if (round == 0) {
        const int32_t n = static_cast<int32_t>(in.token_ids.size());
        s.num_exact = n - 1;
        Commit(s);
        // Keep the hidden state of n - 2 only (recomputed if no target step follows).
        const int32_t drop = std::clamp(n - 2 - s.hidden_begin, 0,
                                        static_cast<int32_t>(s.have.size()));
        s.have.erase(s.have.begin(), s.have.begin() + drop);
        s.hidden.erase(s.hidden.begin(), s.hidden.begin() + static_cast<int64_t>(drop) * h);
        s.hidden_begin += drop;
      }
      const absl::Span<const float> row(logits_.data() + a * vocab, vocab);
      SampleDrawKey key = in.first_draft_key;
      key.position += static_cast<int64_t>(out.tokens.size());
      const DraftPick pick = PickDraft(row, in.sampling->temperature, key, &probs);
      const int32_t token = pick.column;
      const float confidence = pick.confidence;
      if (in.sampling->temperature >= kDraftGreedyTemperature) out.probs.push_back(probs);
      out.tokens.push_back(token);
      out.confidence.push_back(confidence);
      const int32_t j = static_cast<int32_t>(out.tokens.size()) - 1;
      if (j + 1 >= depth[a] || (keep_going && !keep_going(active[a], j, confidence))) continue;
      next_active.push_back(active[a]);
      next_states.push_back(&s);
      next_depth.push_back(depth[a]);
      next_carried.insert(next_carried.end(), carried.begin() + a * h,
                          carried.begin() + (a + 1) * h);
    }
    active.swap(next_active);
    states.swap(next_states);
    depth.swap(next_depth);
    carried.swap(next_carried);
  }
  return absl::OkStatus();
}

}  // namespace sluice
