// LogitsProcessingCpu: list resolution (placeholders, ids outside the vocab), penalty order and
// arithmetic, and that it equals the span functions SampleToken uses.
#include "kernels/sampling/logits_processing.h"

#include <cmath>
#include <limits>
#include <vector>

#include "gtest/gtest.h"

namespace sluice::kernels {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

TEST(LogitsProcessingCpuTest, PenaltiesPlaceholdersAndSuppression) {
  const int64_t vocab = 6;
  const std::vector<float> logits = {2.0f, -1.0f, 0.5f, 3.0f, 0.0f, 1.0f};
  // prompt {0, 0, 9}, output {1, 1, -1 (→ prev 3), -5 (beyond prev: ignored), 7}, suppress {5}
  const std::vector<int32_t> ids = {0, 0, 9, 1, 1, -1, -5, 7, 5};
  LogitsProcessingRow p;
  p.repetition_penalty = 2.0f;
  p.frequency_penalty = 0.5f;
  p.presence_penalty = 0.25f;
  p.prompt_begin = 0;
  p.prompt_end = 3;
  p.output_begin = 3;
  p.output_end = 8;
  p.suppress_begin = 8;
  p.suppress_end = 9;
  const std::vector<int32_t> prev = {3, 4};
  std::vector<float> out(vocab);
  LogitsProcessingCpu(logits.data(), 1, vocab, &p, ids.data(), nullptr, prev.data(), 2,
                      out.data());
  EXPECT_EQ(out[0], 1.0f);                          // prompt only: 2 / 2
  EXPECT_EQ(out[1], -2.0f - 0.5f * 2.0f - 0.25f);  // -1 * 2, count 2
  EXPECT_EQ(out[2], 0.5f);                          // untouched
  EXPECT_EQ(out[3], 1.5f - 0.5f - 0.25f);           // placeholder → 3: 3 / 2, count 1
  EXPECT_EQ(out[4], 0.0f);                          // prev[1] unused
  EXPECT_EQ(out[5], -kInf);                         // suppressed

  // The same through the span functions (SampleToken's calls).
  std::vector<float> again = logits;
  const std::vector<int32_t> prompt = {0, 0, 9}, output = {1, 1, 3, -1, 7}, stop = {5};
  SuppressTokensCpu(absl::MakeSpan(again), stop);
  ApplyPenaltiesCpu(absl::MakeSpan(again), {2.0f, 0.5f, 0.25f}, prompt, output);
  for (int64_t i = 0; i < vocab; ++i) EXPECT_EQ(again[i], out[i]) << i;

  // In place (out aliases logits), no placeholders source: placeholders are ignored.
  std::vector<float> in_place = logits;
  LogitsProcessingCpu(in_place.data(), 1, vocab, &p, ids.data(), nullptr, nullptr, 0,
                      in_place.data());
  EXPECT_EQ(in_place[3], 3.0f);
  EXPECT_EQ(in_place[1], out[1]);
}

// A grammar mask: cleared tokens get -inf, whatever the penalties would give them (the host
// path's ApplyTokenBitmask, then the penalties).
TEST(LogitsProcessingCpuTest, GrammarMaskClearsTokensBeforePenalties) {
  const int64_t vocab = 40;  // two mask words, the second partly used
  std::vector<float> logits(vocab);
  for (int64_t i = 0; i < vocab; ++i) logits[i] = 0.25f * static_cast<float>(i) - 3.0f;
  const std::vector<int32_t> ids = {1, 2, 33};  // output {1, 2, 33}
  const std::vector<uint32_t> masks = {0xdeadbeefu, 0x00000000u,   // row 0: no mask (unused)
                                       0x0000000fu, 0x00000002u};  // row 1: tokens 0-3, 33
  LogitsProcessingRow rows[2];
  for (LogitsProcessingRow& p : rows) {
    p.frequency_penalty = 1.0f;
    p.output_begin = 0;
    p.output_end = 3;
  }
  rows[1].mask_begin = 2;
  std::vector<float> batch = logits;
  batch.insert(batch.end(), logits.begin(), logits.end());
  std::vector<float> out(2 * vocab);
  LogitsProcessingCpu(batch.data(), 2, vocab, rows, ids.data(), masks.data(), nullptr, 0,
                      out.data());
  for (int64_t i = 0; i < vocab; ++i) {
    const bool listed = i == 1 || i == 2 || i == 33;
    const float penalized = listed ? logits[i] - 1.0f : logits[i];
    EXPECT_EQ(out[i], penalized) << i;  // row 0 is unmasked
    const bool allowed = i < 4 || i == 33;
    EXPECT_EQ(out[vocab + i], allowed ? penalized : -kInf) << i;
  }
}

TEST(LogitsProcessingCpuTest, TopLogprobsOrderTiesAndNaN) {
  const std::vector<float> raw = {1.0f, 3.0f, std::nanf(""), 3.0f, -kInf, 2.0f};
  const double lse = LogSumExpCpu(raw);
  EXPECT_NEAR(lse, std::log(std::exp(1.0) + 2 * std::exp(3.0) + std::exp(2.0)), 1e-12);
  const std::vector<TopLogprob> top = TopLogprobsCpu(raw, lse, 20);
  ASSERT_EQ(top.size(), 5u);  // NaN skipped
  const int32_t want[] = {1, 3, 5, 0, 4};
  for (int i = 0; i < 5; ++i) EXPECT_EQ(top[i].token_id, want[i]) << i;
  EXPECT_EQ(top[4].logprob, -kInf);
  EXPECT_EQ(TopLogprobsCpu(raw, lse, 0).size(), 0u);
  const std::vector<float> none = {-kInf, -kInf};
  EXPECT_EQ(LogSumExpCpu(none), -kInf);
}

}  // namespace
}  // namespace sluice::kernels
