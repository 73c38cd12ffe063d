// SWA bounded replay (docs/design.md, "SWA bounded replay"): for models with sliding-window
// attention layers, only the full-attention layers' KV of a prompt is stored and moved; the
// receiving side rebuilds the sliding-window layers' KV by replaying the last R prompt tokens
// over the exact full-attention KV.
//
// Semantics (the "full_kv = exact" variant of shared/models/sluice-mini-swa/
// swa_replay_reference.json, computed there with transformers): for a prompt of n tokens whose
// full-attention layers' K/V for positions [0, n) are in the cache and whose sliding layers' K/V
// are absent, let s0 = max(0, n - R). The model runs once over tokens [s0, n) at positions
// s0..n-1 with
//   - full-attention layers attending the cached exact K/V (keys 0..s for the query at s; the
//     replay's own full-layer K/V are computed but discarded, never written), and
//   - sliding layers attending only replayed keys max(s0, s - window + 1)..s and writing their
//     K/V for [s0, n) into the cache.
// Afterwards the sequence decodes on exact full-layer K/V [0, n) and replayed sliding K/V
// [s0, n); while a query's window still reaches below s0 (only when R < window) it must see
// keys from s0 on only (ForwardInput::sliding_kv_start = s0).
//
// Exactness: a sliding layer moves the first position whose hidden state is exact (window - 1)
// tokens later; full-attention layers on exact K/V do not. So the rebuilt K/V, and the logits at
// n - 1, equal exact prefill (bit for bit on this backend, whose kernels are batch- and
// chunk-invariant) once R >= num_sliding_layers * (window - 1) + 1 (ExactReplayTokens). Below
// that, the difference is small because the state of the earliest replayed positions barely
// reaches the suffix: on sluice-mini-swa (6 sliding layers, window 64) R = 128 changes the
// suffix loss by < 1e-5 (bench/results/swa_replay.json).
//
// The "recomputed" variant (SwaReplayFullKv::kRecomputed) also overwrites the full layers'
// K/V of [s0, n) with the replay's own: a chunked prefill of [s0, n) over a cache that holds
// full-layer K/V for [0, s0) only. It is exact only for R >= n and exists for the evaluation.
//
// Wiring into disaggregated serving (services/prefill, services/decode): both sides build the
// same KvTransferLayout (kFullAttentionOnly) and the prefill worker announces it with the KV
// descriptor; the decode worker pulls only layout.region_indices of its region list (and of the
// RemoteKvDescriptor), then, on the engine thread and before the sequence's first decode step,
// calls RebuildSlidingKvAfterTransfer as a Forward of its own. The first token still comes from
// the prefill worker's exact logits. Blocks whose sliding-layer K/V is absent (positions below
// s0) must not be offered to prefix caching as complete blocks.
#ifndef SLUICE_ENGINE_KV_SWA_REPLAY_H_
#define SLUICE_ENGINE_KV_SWA_REPLAY_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/model/model.h"
#include "engine/model/model_config.h"

namespace sluice {

// Default R (docs/design.md); on sluice-mini-swa it is within 1e-5 of exact suffix loss.
inline constexpr int64_t kDefaultSwaReplayTokens = 128;

enum class SwaReplayFullKv {
  kExact,       // full-attention K/V of the replayed tokens are the transferred exact ones
  kRecomputed,  // the replay writes its own full-attention K/V for the replayed tokens
};

struct SwaReplayOptions {
  int64_t replay_tokens = kDefaultSwaReplayTokens;  // R >= 1; R >= n replays the whole prompt
  SwaReplayFullKv full_kv = SwaReplayFullKv::kExact;
};

struct SwaReplayResult {
  int32_t replay_start = 0;  // s0 = max(0, n - R): first replayed position
  int32_t num_replayed = 0;  // n - s0 tokens run through the model
  // Pass as ForwardInput::sliding_kv_start for this sequence on later steps while the first
  // query position p has p - window + 1 < sliding_kv_start (never when R >= window).
  int32_t sliding_kv_start = 0;
};

// SlidingLayers / FullAttentionLayers: layer ids (increasing) of each kind, from
// ModelConfig::layer_is_sliding (layers past its end, and all layers when sliding_window is 0,
// count as full attention).
std::vector<int32_t> SlidingLayers(const ModelConfig& config);
std::vector<int32_t> FullAttentionLayers(const ModelConfig& config);

// EffectiveSwaReplayTokens: the replay length R an engine serving `model` uses when asked for
// `requested` (--swa-replay-tokens): `requested` when it is > 0, the model has sliding layers and
// its Forward supports replay (Model::SupportsSwaReplay); otherwise 0 (every layer's K/V is
// moved and stored).
int64_t EffectiveSwaReplayTokens(const Model& model, int64_t requested);

// ExactReplayTokens: the smallest R for which replay reproduces exact prefill:
// num_sliding_layers * (sliding_window - 1) + 1 (swa_replay_reference.json
// "exactness_bound_A"; 379 for sluice-mini-swa, 31 for the qwen3-hybrid-tiny fixture); 0 when
// the model has no sliding layers.
int64_t ExactReplayTokens(const ModelConfig& config);

// ReplaySlidingWindowKv rebuilds the sliding layers' K/V of positions [s0, n) of one sequence
// (semantics above). Inputs:
//   token_ids   [n] the sequence's tokens 0..n-1 (n >= 1); only [s0, n) are read
//   block_table the sequence's KV blocks in order, covering n tokens; the full-attention layers'
//               entries of [0, n) must hold the sequence's K/V (for kRecomputed: of [0, s0))
//   last_logits empty, or [vocab_size] float32 receiving the logits at position n - 1 (the
//               replay pass's last row; equal to exact prefill's only when R >=
//               ExactReplayTokens)
// Writes the cache entries of [s0, n) of every sliding layer (kExact) or of every layer
// (kRecomputed); nothing else. Errors: FailedPrecondition when the model does not support
// replay (Model::SupportsSwaReplay); InvalidArgument for n == 0, R < 1, a wrong last_logits
// size, and those of Model::Forward (token ids, block table).
absl::StatusOr<SwaReplayResult> ReplaySlidingWindowKv(Model& model, KvCache& cache,
                                                      absl::Span<const int32_t> token_ids,
                                                      absl::Span<const int32_t> block_table,
                                                      const SwaReplayOptions& options,
                                                      absl::Span<float> last_logits = {});

// ---------------------------------------------------------------------------------------------
// KV transfer / storage layout.

enum class KvLayerSelection {
  kAllLayers,          // every layer's K/V (the default transfer)
  kFullAttentionOnly,  // only full-attention layers' K/V; the receiver replays (above)
};

// KvTransferLayout: which layers' K/V a transfer or the kvstore carries for a block.
struct KvTransferLayout {
  KvLayerSelection selection = KvLayerSelection::kAllLayers;
  std::vector<int32_t> layers;  // carried layer ids, increasing
  int64_t num_model_layers = 0;
  // Bytes per token carried (float32 K and V of the carried layers) and over all layers.
  int64_t bytes_per_token = 0;
  int64_t all_layers_bytes_per_token = 0;
  // Region indices of the carried layers in the per-layer region list k(0), v(0), k(1), v(1),
  // ... (v omitted when v_floats_per_token is 0), the order of KvRegionsOf in
  // services/common/worker_wire.h: select these from both sides' region lists (and from
  // the RemoteKvDescriptor) to move only the carried layers.
  std::vector<int32_t> region_indices;
};

// MakeKvTransferLayout describes `selection` for a model. kFullAttentionOnly on a model without
// sliding layers carries every layer (nothing to replay). Errors: InvalidArgument when `spec`
// has a different layer count than `config`.
absl::StatusOr<KvTransferLayout> MakeKvTransferLayout(const ModelConfig& config,
                                                      const KvCacheSpec& spec,
                                                      KvLayerSelection selection);

// CopyKvLayers copies the K/V of the first `num_tokens` positions of one sequence, for the
// layers `layout` carries only, from `src` (blocks src_table) to `dst` (blocks dst_table): the
// in-process equivalent of a KV transfer under `layout` (the UCX path moves the same bytes with
// layout.region_indices). Errors: InvalidArgument when the caches' specs or block sizes differ,
// the layout's layer count differs from theirs, or a table does not cover num_tokens tokens.
absl::Status CopyKvLayers(const KvCache& src, absl::Span<const int32_t> src_table, KvCache& dst,
                          absl::Span<const int32_t> dst_table, int64_t num_tokens,
                          const KvTransferLayout& layout);

// RebuildSlidingKvAfterTransfer is the decode-side entry point: call it after the prompt's K/V
// under `layout` has landed in `block_table` (prompt_ids [n], all prompt tokens) and before the
// sequence's first decode step. With a kAllLayers layout (or a model without sliding layers) it
// does nothing; otherwise it runs ReplaySlidingWindowKv with full_kv = kExact and R =
// replay_tokens. R must be at least the sliding window (or cover the prompt), so the later
// ordinary decode steps need no ForwardInput::sliding_kv_start. The first generated token comes
// from the prefill side's exact logits; the replay's own last-row logits are not needed.
// Errors: InvalidArgument for R < min(window, n) or a layout of another model; those of
// ReplaySlidingWindowKv.
absl::Status RebuildSlidingKvAfterTransfer(Model& model, KvCache& cache,
                                           absl::Span<const int32_t> prompt_ids,
                                           absl::Span<const int32_t> block_table,
                                           const KvTransferLayout& layout,
                                           int64_t replay_tokens = kDefaultSwaReplayTokens);

// SequenceChunkInput: the ForwardInput of one sequence's positions [start, start + len)
// (context = start tokens already cached; token ids token_ids[start..start+len)), with logits
// wanted for chunk rows `logits_rows` (0-based within the chunk). The returned input refers to
// `block_table`, which must outlive it. No validation beyond what Forward does.
ForwardInput SequenceChunkInput(absl::Span<const int32_t> token_ids, int32_t start, int32_t len,
                                absl::Span<const int32_t> block_table, int64_t block_size,
                                absl::Span<const int32_t> logits_rows);

}  // namespace sluice

#endif  // SLUICE_ENGINE_KV_SWA_REPLAY_H_
