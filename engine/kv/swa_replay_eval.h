// Suffix-loss evaluation of SWA bounded replay (engine/kv/swa_replay.h), the protocol of
// shared/models/sluice-mini-swa/swa_replay_reference.json: a sequence of L tokens is split at P;
// "exact" is the model over all L tokens; a replay variant keeps the full-attention layers'
// K/V of [0, P) (exact, or recomputed for the replayed range), rebuilds the sliding layers' K/V
// by replaying [P - R, P), takes the logits at P - 1 from the replay pass's last row, then runs
// tokens P..L-2 on that cache. Scored: cross-entropy (natural log) of targets P..L-1 given the
// logits at P-1..L-2, averaged over the L - P targets of the sequence.
//
// Used by bench/swa_replay_eval.cc (all 64 reference sequences) and
// tests/golden/swa_replay_test.cc (a subset, in CI).
#ifndef SLUICE_ENGINE_KV_SWA_REPLAY_EVAL_H_
#define SLUICE_ENGINE_KV_SWA_REPLAY_EVAL_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/kv/swa_replay.h"
#include "engine/model/model.h"

namespace sluice {

struct SwaEvalVariant {
  SwaReplayFullKv full_kv = SwaReplayFullKv::kExact;
  int64_t replay_tokens = kDefaultSwaReplayTokens;  // R
};

// Per-sequence results; vectors are indexed like the `variants` argument.
struct SwaEvalSequenceResult {
  int64_t num_targets = 0;  // L - P
  double exact_loss = 0;    // mean cross-entropy of exact decoding (nats)
  std::vector<double> loss;  // mean cross-entropy with replay
  // Against exact: largest |Δlogit| over the scored rows and vocabulary, and how many scored
  // rows have the same argmax (lowest index on ties).
  std::vector<double> max_abs_logit_diff;
  std::vector<int64_t> top1_agreement;
};

// EvaluateSwaReplay runs the protocol above for one sequence `token_ids` [L] split at
// `split` (1 <= P < L), on a fresh KV cache of `block_size`-token blocks handed out in reverse
// order (so block ids and positions disagree). Before each variant the sliding layers' cache
// entries (and, for kRecomputed, the full layers' entries of the replayed range) are filled
// with NaN, so any read of state the protocol says is absent poisons the loss.
// Errors: InvalidArgument for a bad split or block_size; those of ReplaySlidingWindowKv and
// Model::Forward.
absl::StatusOr<SwaEvalSequenceResult> EvaluateSwaReplay(Model& model,
                                                        absl::Span<const int32_t> token_ids,
                                                        int32_t split,
                                                        absl::Span<const SwaEvalVariant> variants,
                                                        int64_t block_size = 16);

}  // namespace sluice

#endif  // SLUICE_ENGINE_KV_SWA_REPLAY_EVAL_H_
