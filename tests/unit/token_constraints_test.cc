// Token constraints (allowed_token_ids, bad_words, logit_bias) on the host sampler, and that
// rows with them are never handed to a device sampler.
#include <cmath>
#include <limits>
#include <vector>

#include <gtest/gtest.h>

#include "engine/sample/sampler.h"
#include "engine/sample/token_constraints.h"

namespace sluice {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

TEST(TokenConstraintsTest, AllowedTokenIdsMaskEverythingElse) {
  std::vector<float> logits = {1, 5, 2, 3};
  SamplingParams p;
  p.allowed_token_ids = {0, 2};
  ApplyTokenConstraints(absl::MakeSpan(logits), p, {});
  EXPECT_EQ(logits, (std::vector<float>{1, kNegInf, 2, kNegInf}));
}

TEST(TokenConstraintsTest, BadWordsBanTheLastTokenAfterTheirPrefix) {
  SamplingParams p;
  p.bad_words_token_ids = {{2}, {0, 3}};
  std::vector<float> logits = {1, 1, 1, 1};
  ApplyTokenConstraints(absl::MakeSpan(logits), p, std::vector<int32_t>{1});
  EXPECT_EQ(logits, (std::vector<float>{1, 1, kNegInf, 1}));  // 3 allowed: output ends in 1
  logits = {1, 1, 1, 1};
  ApplyTokenConstraints(absl::MakeSpan(logits), p, std::vector<int32_t>{1, 0});
  EXPECT_EQ(logits, (std::vector<float>{1, 1, kNegInf, kNegInf}));
}

TEST(TokenConstraintsTest, LogitBiasAddsAndSamplingFollows) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.logit_bias = {{1, -100.0f}, {3, 2.5f}};
  std::vector<float> logits = {0, 10, 0, 0};
  ApplyTokenConstraints(absl::MakeSpan(logits), p, {});
  EXPECT_EQ(logits, (std::vector<float>{0, -90, 0, 2.5}));
  // SampleToken applies them; the reported logprob stays that of the raw logits.
  std::vector<float> raw = {0, 10, 0, 0};
  SampledToken t = SampleToken(absl::MakeSpan(raw), p, SequenceContext{}, SampleDrawKey{1, 0, 0});
  EXPECT_EQ(t.token_id, 3);
  EXPECT_NEAR(t.logprob, 0.0 - std::log(std::exp(10.0) + 3.0), 1e-5);
  // Forcing: +100 wins over any ordinary logit, also when sampling.
  p.temperature = 1.0f;
  p.logit_bias = {{2, 100.0f}};
  for (int i = 0; i < 20; ++i) {
    std::vector<float> row = {0, 10, 0, 0};
    EXPECT_EQ(SampleToken(absl::MakeSpan(row), p, SequenceContext{}, SampleDrawKey{1, 0, i}).token_id,
              2);
  }
}

TEST(TokenConstraintsTest, ConstrainedRowsAreNotDeviceSamplable) {
  SamplingParams p;
  p.temperature = 0.0f;
  EXPECT_TRUE(IsPlainGreedy(p, SequenceContext{}));
  p.allowed_token_ids = {1};
  EXPECT_FALSE(IsDeviceSamplable(p, SequenceContext{}));
  EXPECT_FALSE(IsPlainGreedy(p, SequenceContext{}));
  SamplingParams q;
  q.bad_words_token_ids = {{1}};
  EXPECT_FALSE(IsDeviceSamplable(q, SequenceContext{}));
  SamplingParams b;
  b.logit_bias = {{1, 1.0f}};
  EXPECT_FALSE(IsDeviceSamplable(b, SequenceContext{}));
}

TEST(TokenConstraintsTest, ValidateChecksRanges) {
  SamplingParams p;
  p.logit_bias = {{1, 101.0f}};
  EXPECT_FALSE(p.Validate(8).ok());
  p.logit_bias = {{8, 1.0f}};
  EXPECT_FALSE(p.Validate(8).ok());
  p.logit_bias.clear();
  p.allowed_token_ids = {-1};
  EXPECT_FALSE(p.Validate(8).ok());
  p.allowed_token_ids.clear();
  p.bad_words_token_ids = {{}};
  EXPECT_FALSE(p.Validate(8).ok());
  p.bad_words_token_ids = {{7}};
  p.prompt_logprobs = 21;
  EXPECT_FALSE(p.Validate(8).ok());
  p.prompt_logprobs = 20;
  EXPECT_TRUE(p.Validate(8).ok());
}

}  // namespace
}  // namespace sluice
