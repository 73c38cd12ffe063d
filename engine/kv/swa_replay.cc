#include "engine/kv/swa_replay.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace sluice {
namespace {

bool IsSliding(const ModelConfig& config, int64_t layer) {
  return config.sliding_window > 0 &&
         layer < static_cast<int64_t>(config.layer_is_sliding.size()) &&
         config.layer_is_sliding[static_cast<size_t>(layer)];
}

}  // namespace

std::vector<int32_t> SlidingLayers(const ModelConfig& config) {
  std::vector<int32_t> out;
  for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
    if (IsSliding(config, l)) out.push_back(static_cast<int32_t>(l));
  }
  return out;
}

std::vector<int32_t> FullAttentionLayers(const ModelConfig& config) {
  std::vector<int32_t> out;
  for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
    if (!IsSliding(config, l)) out.push_back(static_cast<int32_t>(l));
  }
  return out;
}

int64_t EffectiveSwaReplayTokens(const Model& model, int64_t requested) {
  if (requested <= 0 || !model.SupportsSwaReplay()) return 0;
  return SlidingLayers(model.config()).empty() ? 0 : requested;
}

int64_t ExactReplayTokens(const ModelConfig& config) {
  const int64_t sliding = static_cast<int64_t>(SlidingLayers(config).size());
  if (sliding == 0) return 0;
  return sliding * (config.sliding_window - 1) + 1;
}

ForwardInput SequenceChunkInput(absl::Span<const int32_t> token_ids, int32_t start, int32_t len,
                                absl::Span<const int32_t> block_table, int64_t block_size,
                                absl::Span<const int32_t> logits_rows) {
  ForwardInput in;
  in.token_ids.assign(token_ids.begin() + start, token_ids.begin() + start + len);
  for (int32_t i = 0; i < len; ++i) {
    const int64_t pos = int64_t{start} + i;
    in.positions.push_back(static_cast<int32_t>(pos));
    in.slot_mapping.push_back(int64_t{block_table[static_cast<size_t>(pos / block_size)]} *
                                  block_size +
                              pos % block_size);
  }
  in.sequences.push_back({0, len, start, block_table});
  in.logits_indices.assign(logits_rows.begin(), logits_rows.end());
  return in;
}

absl::StatusOr<SwaReplayResult> ReplaySlidingWindowKv(Model& model, KvCache& cache,
                                                      absl::Span<const int32_t> token_ids,
                                                      absl::Span<const int32_t> block_table,
                                                      const SwaReplayOptions& options,
                                                      absl::Span<float> last_logits) {
  if (!model.SupportsSwaReplay()) {
    return absl::FailedPreconditionError(
        absl::StrCat("SWA replay: model ", model.config().architecture_name,
                     " does not support kv_frozen_layers / sliding_kv_start"));
  }
  const int64_t n = static_cast<int64_t>(token_ids.size());
  if (n == 0) return absl::InvalidArgumentError("SWA replay: empty sequence");
  if (options.replay_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("SWA replay: replay_tokens must be >= 1, got ", options.replay_tokens));
  }
  const int64_t vocab = model.config().vocab_size;
  if (!last_logits.empty() && static_cast<int64_t>(last_logits.size()) != vocab) {
    return absl::InvalidArgumentError(absl::StrCat(
        "SWA replay: last_logits has ", last_logits.size(), " floats, expected ", vocab));
  }
  if (static_cast<int64_t>(block_table.size()) * cache.block_size() < n) {
    return absl::InvalidArgumentError(absl::StrCat("SWA replay: block table of ",
                                                   block_table.size(), " blocks does not cover ",
                                                   n, " tokens"));
  }
  SwaReplayResult result;
  result.replay_start = static_cast<int32_t>(std::max<int64_t>(0, n - options.replay_tokens));
  result.num_replayed = static_cast<int32_t>(n - result.replay_start);
  result.sliding_kv_start = result.replay_start;

  std::vector<int32_t> rows;
  if (!last_logits.empty()) rows.push_back(result.num_replayed - 1);
  ForwardInput in = SequenceChunkInput(token_ids, result.replay_start, result.num_replayed,
                                       block_table, cache.block_size(), rows);
  in.sliding_kv_start = {result.replay_start};
  if (options.full_kv == SwaReplayFullKv::kExact) {
    // Full-attention layers keep (and attend) the exact transferred K/V of [s0, n).
    in.kv_frozen_layers.assign(static_cast<size_t>(model.config().num_hidden_layers), 0);
    for (int32_t layer : FullAttentionLayers(model.config())) {
      in.kv_frozen_layers[static_cast<size_t>(layer)] = 1;
    }
  }
  if (absl::Status s = model.Forward(in, cache, last_logits); !s.ok()) return s;
  return result;
}

absl::StatusOr<KvTransferLayout> MakeKvTransferLayout(const ModelConfig& config,
                                                      const KvCacheSpec& spec,
                                                      KvLayerSelection selection) {
  if (spec.num_layers != config.num_hidden_layers) {
    return absl::InvalidArgumentError(absl::StrCat("KV spec has ", spec.num_layers,
                                                   " layers, model config ",
                                                   config.num_hidden_layers));
  }
  KvTransferLayout layout;
  layout.selection = selection;
  layout.num_model_layers = spec.num_layers;
  if (selection == KvLayerSelection::kFullAttentionOnly) {
    layout.layers = FullAttentionLayers(config);
  } else {
    for (int64_t l = 0; l < spec.num_layers; ++l) layout.layers.push_back(static_cast<int32_t>(l));
  }
  const int64_t per_layer = (spec.k_floats_per_token + spec.v_floats_per_token) * 4;
  layout.bytes_per_token = per_layer * static_cast<int64_t>(layout.layers.size());
  layout.all_layers_bytes_per_token = spec.BytesPerToken();
  const int32_t regions_per_layer = spec.v_floats_per_token > 0 ? 2 : 1;
  for (int32_t l : layout.layers) {
    for (int32_t r = 0; r < regions_per_layer; ++r) {
      layout.region_indices.push_back(l * regions_per_layer + r);
    }
  }
  return layout;
}

absl::Status CopyKvLayers(const KvCache& src, absl::Span<const int32_t> src_table, KvCache& dst,
                          absl::Span<const int32_t> dst_table, int64_t num_tokens,
                          const KvTransferLayout& layout) {
  const KvCacheSpec& spec = src.spec();
  if (dst.spec().num_layers != spec.num_layers ||
      dst.spec().k_floats_per_token != spec.k_floats_per_token ||
      dst.spec().v_floats_per_token != spec.v_floats_per_token ||
      dst.block_size() != src.block_size()) {
    return absl::InvalidArgumentError("CopyKvLayers: caches of different layouts");
  }
  if (layout.num_model_layers != spec.num_layers) {
    return absl::InvalidArgumentError("CopyKvLayers: layout of another model");
  }
  const int64_t bs = src.block_size();
  const int64_t blocks = (num_tokens + bs - 1) / bs;
  if (num_tokens < 0 || static_cast<int64_t>(src_table.size()) < blocks ||
      static_cast<int64_t>(dst_table.size()) < blocks) {
    return absl::InvalidArgumentError(
        absl::StrCat("CopyKvLayers: block tables do not cover ", num_tokens, " tokens"));
  }
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t sb = src_table[static_cast<size_t>(b)], db = dst_table[static_cast<size_t>(b)];
    if (sb < 0 || sb >= src.num_blocks() || db < 0 || db >= dst.num_blocks()) {
      return absl::InvalidArgumentError(absl::StrCat("CopyKvLayers: block id out of range"));
    }
  }
  // Whole blocks: the tail of the last block is copied too (unwritten entries, never read).
  for (int32_t layer : layout.layers) {
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t sb = src_table[static_cast<size_t>(b)], db = dst_table[static_cast<size_t>(b)];
      const int64_t kf = bs * spec.k_floats_per_token, vf = bs * spec.v_floats_per_token;
      std::copy_n(src.k(layer) + sb * kf, kf, dst.k(layer) + db * kf);
      std::copy_n(src.v(layer) + sb * vf, vf, dst.v(layer) + db * vf);
    }
  }
  return absl::OkStatus();
}

absl::Status RebuildSlidingKvAfterTransfer(Model& model, KvCache& cache,
                                           absl::Span<const int32_t> prompt_ids,
                                           absl::Span<const int32_t> block_table,
                                           const KvTransferLayout& layout,
                                           int64_t replay_tokens) {
  const ModelConfig& config = model.config();
  if (layout.num_model_layers != config.num_hidden_layers) {
    return absl::InvalidArgumentError(absl::StrCat("KV layout describes ",
                                                   layout.num_model_layers,
                                                   " layers, the model has ",
                                                   config.num_hidden_layers));
  }
  const std::vector<int32_t> full = FullAttentionLayers(config);
  if (layout.selection == KvLayerSelection::kAllLayers ||
      layout.layers.size() == static_cast<size_t>(config.num_hidden_layers)) {
    return absl::OkStatus();  // every layer's K/V arrived: nothing to rebuild
  }
  if (layout.layers != full) {
    return absl::InvalidArgumentError(
        "KV layout carries layers other than the model's full-attention layers");
  }
  const int64_t n = static_cast<int64_t>(prompt_ids.size());
  if (replay_tokens < std::min<int64_t>(config.sliding_window, n)) {
    // Later decode steps are ordinary Forward calls without sliding_kv_start, so every window
    // that can still be queried must lie inside the replayed range.
    return absl::InvalidArgumentError(absl::StrCat(
        "replay_tokens ", replay_tokens, " is below the sliding window ", config.sliding_window));
  }
  SwaReplayOptions options;
  options.replay_tokens = replay_tokens;
  options.full_kv = SwaReplayFullKv::kExact;
  absl::StatusOr<SwaReplayResult> r =
      ReplaySlidingWindowKv(model, cache, prompt_ids, block_table, options);
  return r.status();
}

}  // namespace sluice
