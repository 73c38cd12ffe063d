// RankedModel: a deterministic fake Model for the engine's device-sampling paths (issue 5).
#ifndef SLUICE_TESTS_UNIT_RANKED_MODEL_H_
#define SLUICE_TESTS_UNIT_RANKED_MODEL_H_

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <deque>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "engine/model/model.h"
#include "kernels/sampling/sampling.h"

namespace sluice {

// RankedModel: logits over kVocab ids that depend on the context's token ids read back from
// the paged KV cache (k(0): one float per token, the id) and the position: many ties (values
// (h·7 + v·13) mod 11 · 0.5, so ties resolve to the lowest id), and EOS on top at every fourth
// hash so min_tokens suppression changes the host's choice. ForwardGreedy is an independent
// argmax + double log-sum-exp over those logits; the calls of each path are counted.
class RankedModel final : public Model {
 public:
  static constexpr int64_t kVocab = 64;
  static constexpr int32_t kEos = 1;

  // device_greedy: ForwardGreedy works; async: EnqueueSampledStep / ReadSampledStep work (rows
  // sampled by kernels::SampleRowsCpu, the device sampler's reference), each step computed at
  // enqueue — program order stands for stream order.
  explicit RankedModel(bool device_greedy, bool async = false)
      : device_greedy_(device_greedy), async_(async) {
    config_.vocab_size = kVocab;
    config_.max_position_embeddings = 256;
    config_.eos_token_ids = {kEos};
  }
  const ModelConfig& config() const override { return config_; }
  KvCacheSpec kv_cache_spec() const override { return {1, 1, 0}; }
  int64_t WeightBytesPerToken() const override { return 0; }

  absl::Status Forward(const ForwardInput& in, KvCache& kv, absl::Span<float> logits) override {
    if (!in.logits_indices.empty()) ++full_steps_;
    return Compute(in, kv, logits);
  }
  bool SupportsDeviceGreedy() const override { return device_greedy_; }
  absl::Status ForwardGreedy(const ForwardInput& in, KvCache& kv,
                             absl::Span<GreedyToken> out) override {
    if (!device_greedy_) return absl::UnimplementedError("off");
    if (out.size() != in.logits_indices.size()) return absl::InvalidArgumentError("out size");
    ++greedy_steps_;
    return Greedy(in, kv, out);
  }

  bool SupportsAsyncSteps() const override { return async_; }
  absl::Status EnqueueSampledStep(const ForwardInput& in, KvCache& kv,
                                  absl::Span<const kernels::SamplingRow> rows) override {
    if (!async_) return absl::UnimplementedError("off");
    if (static_cast<int>(unread_.size()) >= kMaxUnreadSteps) {
      return absl::FailedPreconditionError("too many unread steps");
    }
    if (rows.size() != in.logits_indices.size()) return absl::InvalidArgumentError("rows size");
    ForwardInput resolved = in;
    for (int32_t& id : resolved.token_ids) {
      if (id >= 0) continue;
      const size_t r = static_cast<size_t>(-(id + 1));
      if (r >= last_sampled_.size()) return absl::InvalidArgumentError("bad row reference");
      id = last_sampled_[r].token_id;
      ++fed_back_tokens_;
    }
    // Every row through the device sampler's CPU reference (greedy rows: argmax, as Greedy).
    std::vector<float> logits(rows.size() * kVocab);
    if (absl::Status s = Compute(resolved, kv, absl::MakeSpan(logits)); !s.ok()) return s;
    std::vector<int32_t> ids(rows.size());
    std::vector<float> logprobs(rows.size());
    kernels::SampleRowsCpu(logits.data(), static_cast<int64_t>(rows.size()), kVocab, rows.data(),
                           ids.data(), logprobs.data());
    std::vector<GreedyToken> out(rows.size());
    for (size_t r = 0; r < rows.size(); ++r) {
      out[r] = GreedyToken{ids[r], logprobs[r]};
      sampled_rows_ += rows[r].temperature >= kernels::kGreedyTemperature ? 1 : 0;
    }
    ++async_steps_;
    last_sampled_ = out;
    unread_.push_back(std::move(out));
    std::vector<int64_t> blocks;
    for (int64_t slot : in.slot_mapping) blocks.push_back(slot / kv.block_size());
    unread_blocks_.push_back(std::move(blocks));
    max_unread_ = std::max(max_unread_, static_cast<int>(unread_.size()));
    return absl::OkStatus();
  }
  absl::Status ReadSampledStep(absl::Span<GreedyToken> out) override {
    if (unread_.empty()) return absl::FailedPreconditionError("nothing unread");
    if (out.size() != unread_.front().size()) return absl::InvalidArgumentError("out size");
    std::copy(unread_.front().begin(), unread_.front().end(), out.begin());
    unread_.pop_front();
    unread_blocks_.pop_front();
    return absl::OkStatus();
  }
  int NumUnreadSteps() const override { return static_cast<int>(unread_.size()); }
  // UnreadStepsWrite: a step enqueued and not yet read writes K/V into one of `blocks` (on a
  // device it might still be running).
  bool UnreadStepsWrite(const std::vector<int32_t>& blocks) const {
    for (const std::vector<int64_t>& step : unread_blocks_) {
      for (int64_t b : step) {
        if (std::find(blocks.begin(), blocks.end(), b) != blocks.end()) return true;
      }
    }
    return false;
  }

  int full_steps() const { return full_steps_; }
  int greedy_steps() const { return greedy_steps_; }
  int async_steps() const { return async_steps_; }
  int max_unread() const { return max_unread_; }
  int fed_back_tokens() const { return fed_back_tokens_; }
  int sampled_rows() const { return sampled_rows_; }  // async rows with a temperature

 private:
  // Greedy: argmax (lowest id on ties) and a double log-sum-exp logprob per logits row.
  absl::Status Greedy(const ForwardInput& in, KvCache& kv, absl::Span<GreedyToken> out) {
    std::vector<float> logits(in.logits_indices.size() * kVocab);
    if (absl::Status s = Compute(in, kv, absl::MakeSpan(logits)); !s.ok()) return s;
    for (size_t r = 0; r < out.size(); ++r) {
      const float* row = logits.data() + r * kVocab;
      int32_t best = 0;
      for (int32_t v = 1; v < kVocab; ++v) {
        if (row[v] > row[best]) best = v;
      }
      double sum = 0.0;
      for (int32_t v = 0; v < kVocab; ++v) sum += std::exp(static_cast<double>(row[v] - row[best]));
      out[r] = GreedyToken{best, static_cast<float>(-std::log(sum))};
    }
    return absl::OkStatus();
  }
  absl::Status Compute(const ForwardInput& in, KvCache& kv, absl::Span<float> logits) {
    const int64_t bs = kv.block_size();
    for (size_t t = 0; t < in.token_ids.size(); ++t) {
      if (in.token_ids[t] < 0 || in.token_ids[t] >= kVocab) {
        return absl::InvalidArgumentError("token out of range");
      }
      kv.k(0)[in.slot_mapping[t]] = static_cast<float>(in.token_ids[t]);
    }
    for (size_t r = 0; r < in.logits_indices.size(); ++r) {
      const int32_t index = in.logits_indices[r];
      const SequenceSlice* seq = nullptr;
      for (const SequenceSlice& s : in.sequences) {
        if (index >= s.query_start && index < s.query_start + s.num_query_tokens) seq = &s;
      }
      if (seq == nullptr) return absl::InternalError("logits index outside every sequence");
      const int32_t pos = in.positions[index];
      int64_t h = pos;
      for (int32_t p = 0; p <= pos; ++p) {
        h += 31 * static_cast<int64_t>(kv.k(0)[seq->block_table[p / bs] * bs + p % bs]);
      }
      float* row = logits.data() + r * kVocab;
      for (int64_t v = 0; v < kVocab; ++v) row[v] = static_cast<float>((h * 7 + v * 13) % 11) * 0.5f;
      if (h % 4 == 0) row[kEos] = 6.0f;
    }
    return absl::OkStatus();
  }

  ModelConfig config_;
  bool device_greedy_;
  bool async_;
  int full_steps_ = 0;
  int greedy_steps_ = 0;
  int async_steps_ = 0;
  int max_unread_ = 0;
  int fed_back_tokens_ = 0;
  int sampled_rows_ = 0;
  std::vector<GreedyToken> last_sampled_;
  std::deque<std::vector<GreedyToken>> unread_;
  std::deque<std::vector<int64_t>> unread_blocks_;  // blocks each unread step writes
};

}  // namespace sluice

#endif  // SLUICE_TESTS_UNIT_RANKED_MODEL_H_
