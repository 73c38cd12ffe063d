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
#include "engine/kv/block_hash.h"
#include "engine/kv/prefix_cache.h"
#include "engine/model/model.h"
#include "engine/spec/drafter.h"

namespace sluice {

struct DraftModelOptions {
  int64_t block_size = 16;
  int64_t num_kv_blocks = 0;  // > 0
  bool enable_prefix_caching = true;
  std::string model_id;       // names the draft weights in its block hashes
  CostClock cost_clock = CostClock::kWall;  // the clock round_cost() is fitted on
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
  int64_t num_free_blocks() const { return cache_.allocator().num_free_blocks(); }
  int64_t num_total_blocks() const { return cache_.allocator().num_total_blocks(); }
  const PrefixCacheStats& prefix_cache_stats() const { return cache_.stats(); }
  int64_t num_sequences() const { return static_cast<int64_t>(states_.size()); }

 private:
  struct SeqState {
    BlockHash root;
    std::vector<int32_t> tokens;       // what the KV below num_computed was computed from
    std::vector<int32_t> block_table;
    std::vector<BlockHash> block_hashes;
    int32_t num_computed = 0;
    int32_t num_committed_blocks = 0;
  };

  DraftModelDrafter(std::unique_ptr<Model> model, const DraftModelOptions& options);
  // Prepare rolls `s` back to its common prefix with `tokens`, reuses cached prefix blocks for a
  // fresh state, commits verified full blocks and grows the block table for `num_kv_tokens`.
  // False when blocks ran out.
  bool Prepare(SeqState& s, absl::Span<const int32_t> tokens, int64_t num_kv_tokens);
  void Commit(SeqState& s);
  int64_t Slot(const SeqState& s, int64_t pos) const;

  std::unique_ptr<Model> model_;
  DraftModelOptions options_;
  KvCache kv_cache_;
  BlockHasher hasher_;
  PrefixCache cache_;
  // Node-based: Propose keeps pointers to states across insertions.
  std::unordered_map<std::string, SeqState> states_;
  ForwardInput input_;        // scratch
  std::vector<float> logits_;  // scratch
  StepCostModel round_cost_;
};

}  // namespace sluice

#endif  // SLUICE_ENGINE_SPEC_DRAFT_MODEL_DRAFTER_H_
