// DraftModelDrafter: a small causal LM of the target's vocabulary proposes k tokens
// autoregressively (`--speculative-model DIR`; Leviathan et al. 2023, Chen et al. 2023).
//
// Its KV cache is paged and prefix-cached like the target's (own blocks, own PrefixCache, block
// hashes under the draft model's identity and the request's cache_salt). Per sequence it keeps the
// tokens its KV was computed from; on each Propose the common prefix with the sequence's real
// tokens is kept (accepted drafts included) and the rest recomputed in one catch-up chunk, so a
// rejection needs no notification. A sequence whose draft blocks run out gets no drafts that
// step (its draft state is dropped and rebuilt later, prefix cache first).
#ifndef SLUICE_ENGINE_SPEC_DRAFT_MODEL_DRAFTER_H_
#define SLUICE_ENGINE_SPEC_DRAFT_MODEL_DRAFTER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <unordered_map>
#include "absl/status/statusor.h"
#include "engine/kv/prefix_cache.h"
#include "engine/model/model.h"
#include "engine/spec/drafter.h"
#include "engine/spec/paged_draft_kv.h"

namespace sluice {

struct DraftModelOptions {
  int64_t block_size = 16;
  int64_t num_kv_blocks = 0;  // > 0
  bool enable_prefix_caching = true;
  std::string model_id;       // names the draft weights in its block hashes
  CostClock cost_clock = CostClock::kWall;  // the clock round_cost() is fitted on
  // Keep the draft's weight matrices as bfloat16 (Model::StoreWeightsBf16: half the bytes a
  // draft round streams; the same logits for a bfloat16 checkpoint). Models without it keep
  // float32.
  bool bf16_weights = true;
  // FR-Spec (Zhao et al. 2025, arXiv:2502.14856): > 0 drafts only over this many most
  // frequent tokens (Model::RestrictLogits), cutting the LM head, the largest part of a small
  // draft model, by vocab / draft_vocab. Frequencies are counted over the tokens of the
  // sequences drafted for (prompts and outputs); the subset is re-ranked after 256 counted
  // tokens and each time the count doubles (ties and unseen tokens by id, lowest first, which
  // is a BPE tokenizer's merge order). Only what is drafted changes: verification keeps the
  // target's output exact and, for sampled requests, its distribution (q is 0 off the subset).
  // 0 or >= the vocabulary: every token.
  int32_t draft_vocab = 0;
  // Tokens one Forward of the draft model may hold (a CUDA runner's max_num_tokens; 0: no
  // limit). A round's catch-up chunks (new prompts, rejected drafts) beyond it are computed
  // first, in forwards of at most this many tokens without logits. Must be at least the
  // sequences drafted for in one call.
  int64_t max_tokens_per_forward = 0;
  // False when the draft model keeps its own KV cache (a CUDA runner, where the KvCache passed
  // to Forward only gives the geometry): the host cache then allocates no storage.
  bool host_kv_storage = true;
};

class DraftModelDrafter final : public Drafter {
 public:
  // Errors: InvalidArgument for a null model or num_kv_blocks / block_size <= 0.
  static absl::StatusOr<std::unique_ptr<DraftModelDrafter>> Create(
      std::unique_ptr<Model> model, const DraftModelOptions& options);

  std::string_view method() const override { return "draft_model"; }
  bool HasModel() const override { return true; }
  const StepCostModel* round_cost() const override { return &round_cost_; }
  absl::Status Propose(absl::Span<const DraftInput> inputs, const DraftContinue& keep_going,
                       std::vector<DraftOutput>* outputs) override;
  void Release(std::string_view request_id) override;

  const Model& model() const { return *model_; }
  // The token ids drafted over (ascending); empty: the full vocabulary.
  const std::vector<int32_t>& draft_vocab_ids() const { return vocab_ids_; }
  int64_t num_free_blocks() const { return kv_.num_free_blocks(); }
  int64_t num_total_blocks() const { return kv_.num_total_blocks(); }
  const PrefixCacheStats& prefix_cache_stats() const { return kv_.prefix_cache_stats(); }
  int64_t num_sequences() const { return static_cast<int64_t>(states_.size()); }

 private:
  struct SeqState {
    PagedDraftKv::Blocks blocks;       // entry i addressed by tokens[0..i]
    std::vector<int32_t> tokens;       // what the KV below num_computed was computed from
    int32_t num_computed = 0;
    int32_t num_counted = 0;           // tokens counted into token_counts_
  };

  DraftModelDrafter(std::unique_ptr<Model> model, const DraftModelOptions& options);
  // Prepare rolls `s` back to its common prefix with `tokens`, reuses cached prefix blocks for a
  // fresh state, commits verified full blocks and grows the block table for `num_kv_tokens`.
  // False when blocks ran out.
  bool Prepare(SeqState& s, absl::Span<const int32_t> tokens, int64_t num_kv_tokens);
  // Commit registers the full blocks below num_computed in the prefix cache.
  void Commit(SeqState& s);
  // CatchUp computes the sequences' pending tokens but the last in forwards of at most
  // max_tokens_per_forward tokens, until one round-0 forward holds what is left.
  absl::Status CatchUp(absl::Span<SeqState* const> states);
  // CountTokens adds the real tokens of `s` not counted yet; Rerank re-selects the FR-Spec
  // subset from the counts.
  void CountTokens(SeqState& s, absl::Span<const int32_t> tokens);
  absl::Status Rerank();

  std::unique_ptr<Model> model_;
  DraftModelOptions options_;
  PagedDraftKv kv_;
  // Node-based: Propose keeps pointers to states across insertions.
  std::unordered_map<std::string, SeqState> states_;
  ForwardInput input_;        // scratch
  std::vector<float> logits_;  // scratch
  StepCostModel round_cost_;
  // FR-Spec (options_.draft_vocab > 0).
  std::vector<int32_t> vocab_ids_;
  std::vector<int64_t> token_counts_;
  int64_t num_counted_ = 0;
  int64_t next_rerank_ = 0;
};

}  // namespace sluice

#endif  // SLUICE_ENGINE_SPEC_DRAFT_MODEL_DRAFTER_H_
