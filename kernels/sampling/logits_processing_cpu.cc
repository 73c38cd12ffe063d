// CPU logits processing and top logprobs (logits_processing.h): the reference semantics that
// engine/sample/sampler.cc's SampleToken calls and the CUDA kernels are tested against.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/sampling/logits_processing.h"

namespace sluice::kernels {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

bool InVocab(int32_t id, size_t vocab_size) {
  return id >= 0 && static_cast<size_t>(id) < vocab_size;
}

// Ranks token a before token b: higher value first, then lower id.
struct RankDescending {
  const float* values;
  bool operator()(int32_t a, int32_t b) const {
    return values[a] > values[b] || (values[a] == values[b] && a < b);
  }
};

}  // namespace

void SuppressTokensCpu(absl::Span<float> logits, absl::Span<const int32_t> ids) {
  for (int32_t id : ids) {
    if (InVocab(id, logits.size())) logits[id] = kNegInf;
  }
}

void ApplyPenaltiesCpu(absl::Span<float> logits, const LogitPenalties& penalties,
                       absl::Span<const int32_t> prompt_ids,
                       absl::Span<const int32_t> output_ids) {
  thread_local std::vector<int32_t> ids;
  if (penalties.repetition_penalty != 1.0f) {
    ids.clear();
    for (int32_t id : prompt_ids) {
      if (InVocab(id, logits.size())) ids.push_back(id);
    }
    for (int32_t id : output_ids) {
      if (InVocab(id, logits.size())) ids.push_back(id);
    }
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    const float penalty = penalties.repetition_penalty;
    for (int32_t id : ids) {
      float& logit = logits[id];
      logit = logit > 0.0f ? logit / penalty : logit * penalty;
    }
  }
  if (penalties.frequency_penalty != 0.0f || penalties.presence_penalty != 0.0f) {
    ids.clear();
    for (int32_t id : output_ids) {
      if (InVocab(id, logits.size())) ids.push_back(id);
    }
    std::sort(ids.begin(), ids.end());
    for (size_t begin = 0; begin < ids.size();) {
      size_t end = begin;
      while (end < ids.size() && ids[end] == ids[begin]) ++end;
      float& logit = logits[ids[begin]];
      // Two separately rounded steps, as the device kernel computes them (this file is built
      // with -ffp-contract=off: kernels/CMakeLists.txt).
      const float frequency_term = penalties.frequency_penalty * static_cast<float>(end - begin);
      logit -= frequency_term;
      logit -= penalties.presence_penalty;
      begin = end;
    }
  }
}

double LogSumExpCpu(absl::Span<const float> raw) {
  float max_logit = kNegInf;
  for (float logit : raw) max_logit = std::max(max_logit, logit);
  if (!(max_logit > kNegInf)) return max_logit;
  double sum = 0.0;
  for (float logit : raw) {
    if (logit > kNegInf) sum += std::exp(static_cast<double>(logit) - max_logit);
  }
  return max_logit + std::log(sum);
}

std::vector<TopLogprob> TopLogprobsCpu(absl::Span<const float> raw, double log_sum_exp,
                                       size_t count) {
  count = std::min(count, raw.size());
  std::vector<int32_t> best;  // sorted by RankDescending, at most `count` entries
  best.reserve(count + 1);
  const RankDescending rank{raw.data()};
  for (size_t i = 0; i < raw.size() && count > 0; ++i) {
    const int32_t id = static_cast<int32_t>(i);
    if (std::isnan(raw[i])) continue;
    if (best.size() == count && !rank(id, best.back())) continue;
    best.insert(std::upper_bound(best.begin(), best.end(), id, rank), id);
    if (best.size() > count) best.pop_back();
  }
  std::vector<TopLogprob> out;
  out.reserve(best.size());
  for (int32_t id : best) {
    out.push_back({id, static_cast<float>(static_cast<double>(raw[id]) - log_sum_exp)});
  }
  return out;
}

void LogitsProcessingCpu(const float* logits, int64_t rows, int64_t vocab,
                         const LogitsProcessingRow* params, const int32_t* ids,
                         const uint32_t* masks, const int32_t* prev_sampled, int64_t num_prev,
                         float* out) {
  std::vector<int32_t> prompt, output, suppress;
  // Resolves placeholders; unresolvable ones become -1 (ignored like any id outside the vocab).
  auto resolve = [&](int32_t begin, int32_t end, std::vector<int32_t>& list) {
    list.clear();
    for (int32_t i = begin; i < end; ++i) {
      int32_t id = ids[i];
      if (id < 0) {
        const int64_t r = -static_cast<int64_t>(id) - 1;
        id = prev_sampled != nullptr && r < num_prev ? prev_sampled[r] : -1;
      }
      list.push_back(id);
    }
  };
  for (int64_t r = 0; r < rows; ++r) {
    const LogitsProcessingRow& p = params[r];
    const float* in_row = logits + r * vocab;
    float* out_row = out + r * vocab;
    if (out_row != in_row) std::copy(in_row, in_row + vocab, out_row);
    const absl::Span<float> row(out_row, static_cast<size_t>(vocab));
    if (p.mask_begin >= 0) {
      const uint32_t* mask = masks + p.mask_begin;
      for (int64_t t = 0; t < vocab; ++t) {
        if (!((mask[t / 32] >> (t % 32)) & 1u)) row[t] = -std::numeric_limits<float>::infinity();
      }
    }
    resolve(p.prompt_begin, p.prompt_end, prompt);
    resolve(p.output_begin, p.output_end, output);
    resolve(p.suppress_begin, p.suppress_end, suppress);
    ApplyPenaltiesCpu(row, {p.repetition_penalty, p.frequency_penalty, p.presence_penalty},
                      prompt, output);
    SuppressTokensCpu(row, suppress);
  }
}

}  // namespace sluice::kernels
