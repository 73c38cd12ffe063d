// MtpDrafter: multi-token prediction drafting (`--speculative-method mtp`) with the target's own
// MTP module (DeepSeek-V3 report, arXiv:2412.19437 §2.2; Model::ForwardMtp).
//
// The module's entry at position i combines the target's final hidden state h_i with the
// embedding of token t_{i+1}; its logits predict t_{i+2}. With a sequence of n tokens whose
// target KV covers positions 0..n-2, the first draft (t_n) comes from position n-2; draft j+1
// feeds draft j at the next position with the module's own output hidden state in place of the
// target's (one module applied recursively, as vLLM's deepseek_mtp does for k > 1).
//
// The module's KV is paged and prefix-cached like a draft model's (own blocks and PrefixCache).
// An entry at position i depends on t_0..t_{i+1}, so a block is addressed by the chained hashes
// of the tokens shifted by one under a root that covers t_0 and the request's cache_salt. The
// engine hands over the target's hidden states of the positions it computed
// (ObserveHiddenStates); entries whose position the target never computed here (a target prefix
// cache hit the module's cache did not also hold, or KV transferred from a prefill worker) are
// computed from a zero hidden state: only acceptance suffers, verification keeps the output
// exact. Such blocks are not registered in the module's prefix cache. Entries at draft positions
// are recomputed on the next Propose from the real tokens and hidden states (no notification of
// which drafts were accepted is needed).
#ifndef SLUICE_ENGINE_SPEC_MTP_DRAFTER_H_
#define SLUICE_ENGINE_SPEC_MTP_DRAFTER_H_

#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/kv/prefix_cache.h"
#include "engine/model/model.h"
#include "engine/spec/drafter.h"
#include "engine/spec/paged_draft_kv.h"

namespace sluice {

struct MtpOptions {
  int64_t block_size = 16;
  int64_t num_kv_blocks = 0;  // > 0
  bool enable_prefix_caching = true;
  std::string model_id;       // names the weights in the module's block hashes
  CostClock cost_clock = CostClock::kWall;  // the clock round_cost() is fitted on
  // Observed hidden states kept per sequence until a Propose consumes them (steps where the
  // confidence scheduler drafts nothing still hand them over). Beyond this many positions the
  // oldest are dropped (down to three quarters), and their entries later use the zero hidden
  // state: memory stays bounded by max_pending_positions · hidden_size floats per sequence.
  int32_t max_pending_positions = 8192;
};

class MtpDrafter final : public Drafter {
 public:
  // `target` (not owned) must outlive the drafter; its Forward and ForwardMtp run on the same
  // thread, one at a time (the engine's step). Errors: InvalidArgument for a null target or
  // num_kv_blocks / block_size <= 0; target->MtpStatus() when it cannot draft (NotFound naming
  // the missing MTP weights, Unimplemented for other architectures).
  static absl::StatusOr<std::unique_ptr<MtpDrafter>> Create(Model* target,
                                                            const MtpOptions& options);

  std::string_view method() const override { return "mtp"; }
  bool HasModel() const override { return true; }
  const StepCostModel* round_cost() const override { return &round_cost_; }
  bool WantsHiddenStates() const override { return true; }
  void ObserveHiddenStates(std::string_view request_id, int32_t first_position,
                           absl::Span<const float> hidden) override;
  absl::Status Propose(absl::Span<const DraftInput> inputs, const DraftContinue& keep_going,
                       std::vector<DraftOutput>* outputs) override;
  void Release(std::string_view request_id) override;

  int64_t num_free_blocks() const { return kv_.num_free_blocks(); }
  int64_t num_total_blocks() const { return kv_.num_total_blocks(); }
  const PrefixCacheStats& prefix_cache_stats() const { return kv_.prefix_cache_stats(); }
  int64_t num_sequences() const { return static_cast<int64_t>(states_.size()); }
  // Entries computed from a zero hidden state (the target's was not observed), in total.
  int64_t num_inexact_positions() const { return num_inexact_positions_; }

 private:
  struct SeqState {
    bool rooted = false;
    // Root covers cache_salt and t_0; entry i addressed by tokens[1..i+1].
    PagedDraftKv::Blocks blocks;
    std::vector<int32_t> tokens;       // the real tokens the exact entries were computed from
    int32_t num_exact = 0;             // entries at positions < num_exact are final
    int32_t first_inexact_block = std::numeric_limits<int32_t>::max();
    // Observed target hidden states of positions [hidden_begin, hidden_begin + have.size()).
    int32_t hidden_begin = 0;
    std::vector<float> hidden;
    std::vector<uint8_t> have;
  };

  MtpDrafter(Model* target, const MtpOptions& options);
  // Prepare rolls `s` back to what `tokens` still agrees with, reuses cached prefix blocks for a
  // fresh state, commits final full blocks and grows the block table for `num_kv_tokens`
  // positions. False when blocks ran out.
  bool Prepare(SeqState& s, absl::Span<const int32_t> tokens, int64_t num_kv_tokens);
  // Commit registers the full blocks of final, exact entries in the prefix cache.
  void Commit(SeqState& s);

  Model* target_;
  MtpOptions options_;
  int64_t hidden_size_;
  PagedDraftKv kv_;
  std::unordered_map<std::string, SeqState> states_;  // node-based: pointers stay valid
  ForwardInput input_;              // scratch
  std::vector<float> prev_hidden_;  // scratch [tokens, hidden]
  std::vector<float> logits_;       // scratch [rows, vocab]
  std::vector<float> hidden_out_;   // scratch [rows, hidden]
  StepCostModel round_cost_;
  int64_t num_inexact_positions_ = 0;
};

}  // namespace sluice

#endif  // SLUICE_ENGINE_SPEC_MTP_DRAFTER_H_
