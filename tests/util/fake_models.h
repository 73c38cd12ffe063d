// Small fake models for engine tests (no weights, deterministic, exact references).
#ifndef SLUICE_TESTS_UTIL_FAKE_MODELS_H_
#define SLUICE_TESTS_UTIL_FAKE_MODELS_H_

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "engine/model/model.h"
#include "engine/sched/request.h"

namespace sluice::testing {

// ChecksumModel: next token = (Σ of the context's token ids read back from the KV cache · 31 +
// position) mod kVocab, never EOS. Its output depends on every token stored in the paged KV
// cache (k(0), one float per token: the token id), so wrong block tables, slot mappings, chunk
// boundaries or wrongly moved KV blocks change the generated tokens.
class ChecksumModel final : public Model {
 public:
  static constexpr int64_t kVocab = 64;
  static constexpr int32_t kEos = 1;

  ChecksumModel() {
    config_.vocab_size = kVocab;
    config_.max_position_embeddings = 256;
    config_.eos_token_ids = {kEos};
  }
  const ModelConfig& config() const override { return config_; }
  KvCacheSpec kv_cache_spec() const override { return {1, 1, 0}; }
  int64_t WeightBytesPerToken() const override { return 0; }
  absl::Status Forward(const ForwardInput& in, KvCache& kv, absl::Span<float> logits) override {
    const int64_t bs = kv.block_size();
    for (size_t t = 0; t < in.token_ids.size(); ++t) {
      if (in.token_ids[t] < 0 || in.token_ids[t] >= kVocab) {
        return absl::InvalidArgumentError("token out of range");
      }
      kv.k(0)[in.slot_mapping[t]] = static_cast<float>(in.token_ids[t]);
    }
    std::fill(logits.begin(), logits.end(), 0.0f);
    size_t row = 0;
    for (int32_t index : in.logits_indices) {
      const SequenceSlice* seq = nullptr;
      for (const SequenceSlice& s : in.sequences) {
        if (index >= s.query_start && index < s.query_start + s.num_query_tokens) seq = &s;
      }
      if (seq == nullptr) return absl::InternalError("logits index outside every sequence");
      const int32_t pos = in.positions[index];
      int64_t sum = 0;
      for (int32_t p = 0; p <= pos; ++p) {
        sum += static_cast<int64_t>(kv.k(0)[seq->block_table[p / bs] * bs + p % bs]);
      }
      logits[row * kVocab + Next(sum, pos)] = 10.0f;
      ++row;
    }
    return absl::OkStatus();
  }
  static int32_t Next(int64_t sum, int32_t pos) {
    int32_t t = static_cast<int32_t>((sum * 31 + pos) % kVocab);
    return t == kEos ? 2 : t;
  }
  // Reference: the next `n` tokens after `tokens`, computed without any cache.
  static std::vector<int32_t> Reference(std::vector<int32_t> tokens, int n) {
    std::vector<int32_t> out;
    for (int i = 0; i < n; ++i) {
      int64_t sum = 0;
      for (int32_t t : tokens) sum += t;
      const int32_t next = Next(sum, static_cast<int32_t>(tokens.size()) - 1);
      out.push_back(next);
      tokens.push_back(next);
    }
    return out;
  }

 private:
  ModelConfig config_;
};

// ChecksumPrompt: `len` deterministic prompt tokens in [3, kVocab), varied by `salt`.
inline std::vector<int32_t> ChecksumPrompt(int len, int salt) {
  std::vector<int32_t> p;
  for (int i = 0; i < len; ++i) p.push_back(3 + (i * 7 + salt * 13) % (ChecksumModel::kVocab - 3));
  return p;
}

// GreedyRequest: a greedy request for `max_tokens` tokens.
inline EngineRequest GreedyRequest(const std::string& id, std::vector<int32_t> prompt,
                                   int max_tokens) {
  EngineRequest r;
  r.request_id = id;
  r.prompt_token_ids = std::move(prompt);
  r.sampling.temperature = 0.0f;
  r.sampling.max_tokens = max_tokens;
  return r;
}

}  // namespace sluice::testing

#endif  // SLUICE_TESTS_UTIL_FAKE_MODELS_H_
