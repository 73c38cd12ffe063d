#include "engine/kv/swa_replay_eval.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"

namespace sluice {
namespace {

// Cross-entropy -log softmax(row)[target] in double (log-sum-exp with the max subtracted).
double CrossEntropy(const float* row, int64_t vocab, int32_t target) {
  const float mx = *std::max_element(row, row + vocab);
  double sum = 0;
  for (int64_t j = 0; j < vocab; ++j) sum += std::exp(static_cast<double>(row[j]) - mx);
  return std::log(sum) + mx - static_cast<double>(row[target]);
}

int64_t ArgMaxRow(const float* row, int64_t vocab) {
  return std::max_element(row, row + vocab) - row;  // first maximum: lowest index on ties
}

// Fills the cache entries of positions [begin, end) of `layer` with NaN.
void Poison(KvCache& cache, int64_t layer, absl::Span<const int32_t> table, int64_t begin,
            int64_t end) {
  const KvCacheSpec& spec = cache.spec();
  const int64_t bs = cache.block_size();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int64_t p = begin; p < end; ++p) {
    const int64_t slot = int64_t{table[static_cast<size_t>(p / bs)]} * bs + p % bs;
    std::fill_n(cache.k(layer) + slot * spec.k_floats_per_token, spec.k_floats_per_token, nan);
    std::fill_n(cache.v(layer) + slot * spec.v_floats_per_token, spec.v_floats_per_token, nan);
  }
}

}  // namespace

absl::StatusOr<SwaEvalSequenceResult> EvaluateSwaReplay(Model& model,
                                                        absl::Span<const int32_t> token_ids,
                                                        int32_t split,
                                                        absl::Span<const SwaEvalVariant> variants,
                                                        int64_t block_size) {
  const int64_t L = static_cast<int64_t>(token_ids.size());
  const int32_t P = split;
  if (P < 1 || P >= L) {
    return absl::InvalidArgumentError(
        absl::StrCat("split ", P, " outside [1, ", L, ") for a sequence of ", L, " tokens"));
  }
  if (block_size < 1) return absl::InvalidArgumentError("block_size must be >= 1");
  const int64_t vocab = model.config().vocab_size;
  const int64_t num_blocks = (L + block_size - 1) / block_size;
  std::vector<int32_t> table(static_cast<size_t>(num_blocks));
  for (int64_t b = 0; b < num_blocks; ++b) table[b] = static_cast<int32_t>(num_blocks - 1 - b);
  KvCache cache(model.kv_cache_spec(), num_blocks, block_size);
  const int32_t targets = static_cast<int32_t>(L - P);
  std::vector<int32_t> suffix_rows(static_cast<size_t>(targets - 1));
  for (int32_t i = 0; i + 1 < targets; ++i) suffix_rows[i] = i;

  // Scored logits [targets, vocab]: row 0 at position P - 1, row i at P - 1 + i.
  std::vector<float> exact(static_cast<size_t>(targets * vocab));
  std::vector<float> logits(exact.size());
  const std::vector<int32_t> last_row = {P - 1};
  ForwardInput prefill = SequenceChunkInput(token_ids, 0, P, table, block_size, last_row);
  if (absl::Status s = model.Forward(prefill, cache, absl::MakeSpan(exact.data(), vocab));
      !s.ok()) {
    return s;
  }
  const KvCache snapshot = cache;  // exact K/V of [0, P) in every layer

  // Runs tokens P..L-2 over the current cache into rows 1.. of `out`.
  auto run_suffix = [&](std::vector<float>* out, int32_t sliding_kv_start) -> absl::Status {
    if (targets < 2) return absl::OkStatus();
    ForwardInput in = SequenceChunkInput(token_ids, P, targets - 1, table, block_size, suffix_rows);
    if (sliding_kv_start > 0) in.sliding_kv_start = {sliding_kv_start};
    return model.Forward(in, cache, absl::MakeSpan(out->data() + vocab, (targets - 1) * vocab));
  };
  auto mean_loss = [&](const std::vector<float>& rows) {
    double sum = 0;
    for (int32_t i = 0; i < targets; ++i) {
      sum += CrossEntropy(rows.data() + i * vocab, vocab, token_ids[static_cast<size_t>(P + i)]);
    }
    return sum / targets;
  };

  SwaEvalSequenceResult result;
  result.num_targets = targets;
  if (absl::Status s = run_suffix(&exact, 0); !s.ok()) return s;
  result.exact_loss = mean_loss(exact);

  const std::vector<int32_t> sliding = SlidingLayers(model.config());
  const std::vector<int32_t> full = FullAttentionLayers(model.config());
  for (const SwaEvalVariant& v : variants) {
    cache = snapshot;
    const int64_t s0 = std::max<int64_t>(0, P - v.replay_tokens);
    for (int32_t layer : sliding) Poison(cache, layer, table, 0, L);
    if (v.full_kv == SwaReplayFullKv::kRecomputed) {
      for (int32_t layer : full) Poison(cache, layer, table, s0, L);
    }
    SwaReplayOptions options;
    options.replay_tokens = v.replay_tokens;
    options.full_kv = v.full_kv;
    absl::StatusOr<SwaReplayResult> replay =
        ReplaySlidingWindowKv(model, cache, token_ids.subspan(0, P), table, options,
                              absl::MakeSpan(logits.data(), vocab));
    if (!replay.ok()) return replay.status();
    if (absl::Status s = run_suffix(&logits, replay->sliding_kv_start); !s.ok()) return s;
    result.loss.push_back(mean_loss(logits));
    double max_diff = 0;
    int64_t agree = 0;
    for (int32_t i = 0; i < targets; ++i) {
      const float* a = exact.data() + i * vocab;
      const float* b = logits.data() + i * vocab;
      for (int64_t j = 0; j < vocab; ++j) {
        // NaN compares false: a poisoned row must still show up as a difference.
        const double d = std::fabs(static_cast<double>(a[j]) - b[j]);
        max_diff = std::isnan(d) ? std::numeric_limits<double>::infinity() : std::max(max_diff, d);
      }
      agree += ArgMaxRow(a, vocab) == ArgMaxRow(b, vocab) ? 1 : 0;
    }
    result.max_abs_logit_diff.push_back(max_diff);
    result.top1_agreement.push_back(agree);
  }
  return result;
}

}  // namespace sluice
