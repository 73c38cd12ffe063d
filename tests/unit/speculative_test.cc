// engine/spec pieces without a model: n-gram lookup, the step-cost fit, the confidence
// calibration and the confidence scheduler's verification lengths, TargetProbs against
// SampleToken's processing, the rejection rule's residual, and the sizes a device target
// plans with (logits rows per sequence, the draft model's host KV blocks).
#include <cmath>
#include <vector>

#include <gtest/gtest.h>

#include "engine/sched/step_cost_model.h"
#include "engine/spec/ngram_drafter.h"
#include "engine/spec/rejection_sampler.h"
#include "engine/spec/spec_sizing.h"
#include "engine/spec/speculative.h"

namespace sluice {
namespace {

TEST(NgramLookupTest, ProposesWhatFollowedTheLatestLongestMatch) {
  // Suffix [7, 8] occurred at 1 (followed by 9, 10) and at 5 (followed by 11, 12).
  const std::vector<int32_t> t = {1, 7, 8, 9, 10, 7, 8, 11, 12, 3, 7, 8};
  EXPECT_EQ(NgramLookup(t, 3, {2, 4}), (std::vector<int32_t>{11, 12, 3}));
  EXPECT_EQ(NgramLookup(t, 1, {2, 4}), (std::vector<int32_t>{11}));
  // The longest suffix wins: [3, 7, 8] never occurred before, [7, 8] did.
  EXPECT_EQ(NgramLookup({5, 6, 1, 2, 9, 6, 1, 2}, 2, {1, 3}), (std::vector<int32_t>{9, 6}));
  // Continuation runs into the end of the sequence.
  EXPECT_EQ(NgramLookup({4, 4, 4}, 5, {1, 2}), (std::vector<int32_t>{4}));
  EXPECT_TRUE(NgramLookup({1, 2, 3, 4}, 3, {2, 4}).empty());
  EXPECT_TRUE(NgramLookup({1, 2, 1, 2}, 0, {1, 4}).empty());
}

// Confidence is the request's agreement rate: each compared token moves it a quarter of the way
// to 1 (agreed) or 0 (the first mismatch), starting from the pooled rate (0.5 before any
// comparison); Release forgets it.
TEST(NgramDrafterTest, ConfidenceTracksHowOftenTheRequestsLookupsAgreed) {
  NgramDrafter drafter({2, 4});
  SamplingParams greedy;
  std::vector<DraftOutput> out;
  auto propose = [&](const std::string& id, const std::vector<int32_t>& tokens) {
    DraftInput in;
    in.request_id = id;
    in.token_ids = tokens;
    in.sampling = &greedy;
    in.max_draft_tokens = 3;
    EXPECT_TRUE(drafter.Propose({in}, nullptr, &out).ok());
    return out[0];
  };
  std::vector<int32_t> a = {1, 2, 3, 4, 1, 2};
  DraftOutput d = propose("a", a);
  EXPECT_EQ(d.tokens, (std::vector<int32_t>{3, 4, 1}));
  EXPECT_EQ(d.confidence, (std::vector<float>{0.5f, 0.5f, 0.5f}));
  // The target went on with 3, 4 (agreed) then 9 (mismatch): 0.5 -> 0.625 -> 0.71875 -> 0.5390625.
  a.insert(a.end(), {3, 4, 9, 1, 2});
  d = propose("a", a);
  EXPECT_EQ(d.tokens, (std::vector<int32_t>{3, 4, 9}));
  EXPECT_FLOAT_EQ(d.confidence[0], 0.5390625f);
  // Another request has its own rate, starting from the pooled one (the same comparisons at
  // weight 0.05: 0.5 -> 0.525 -> 0.54875 -> 0.5213125); after Release "a" starts over from it.
  EXPECT_FLOAT_EQ(propose("b", {5, 6, 7, 5, 6}).confidence[0], 0.5213125f);
  drafter.Release("a");
  EXPECT_FLOAT_EQ(propose("a", a).confidence[0], 0.5213125f);
}

TEST(StepCostModelTest, FitsFixedAndPerTokenCost) {
  StepCostModel m(1.0);
  EXPECT_EQ(m.Predict(10), 0.0);
  for (int rep = 0; rep < 3; ++rep) {
    for (int x = 1; x <= 10; ++x) m.Observe(x, 0.010 + 0.002 * x);
  }
  EXPECT_NEAR(m.fixed_seconds(), 0.010, 1e-9);
  EXPECT_NEAR(m.per_token_seconds(), 0.002, 1e-9);
  StepCostModel flat;
  flat.Observe(1, 0.5);
  flat.Observe(1, 0.7);
  // No spread: the split is unknown, all of the cost is taken as per-token (pessimistic).
  EXPECT_FALSE(flat.Identified());
  EXPECT_NEAR(flat.per_token_seconds(), 0.6, 0.01);
  EXPECT_EQ(flat.fixed_seconds(), 0.0);
  EXPECT_TRUE(m.Identified());
}

TEST(ConfidenceCalibrationTest, StartsAtTheBinCentreAndLearnsTheMeasuredRate) {
  ConfidenceCalibration c;
  EXPECT_NEAR(c.Map(0.93f), 0.95, 1e-12);
  EXPECT_NEAR(c.Map(0.02f), 0.05, 1e-12);
  for (int i = 0; i < 1000; ++i) c.Observe(0.97f, i % 10 < 3);  // 30% accepted
  EXPECT_NEAR(c.Map(0.91f), 0.30, 0.01);
  EXPECT_NEAR(c.Map(0.55f), 0.55, 1e-12);  // other bins untouched
  EXPECT_NEAR(c.MaxAcceptance(), 0.85, 1e-12);
}

StepCostModel Linear(double fixed, double per_token) {
  StepCostModel m(1.0);
  for (int x = 1; x <= 8; ++x) m.Observe(x, fixed + per_token * x);
  return m;
}

TEST(ConfidenceSchedulerTest, PlansTheLengthThatMaximizesTokensPerCost) {
  ConfidenceScheduler s(VerifyMode::kAuto, 5);
  // Batch 1, a step costs 10 ms + 1 ms per token, a draft round 2 ms; no drafts seen yet, so
  // every depth's mean calibrated confidence is the prior 0.7. Per sequence a plain step costs
  // 11 ms and each draft 3 ms more: E(L) = 1, 1.7, 2.19, 2.533, 2.773, 2.941 tokens for
  // C(L) = 11, 14, 17, 20, 23, 26 ms, best at L = 2 with 2.19 / 17 ms.
  const StepCostModel target = Linear(0.010, 0.001);
  const StepCostModel draft = Linear(0.002, 0.0);
  bool probe = true;
  EXPECT_EQ(s.BeginStep(1, target, &draft, &probe), 5);
  EXPECT_FALSE(probe);
  EXPECT_EQ(s.planned_length(), 2);
  const double rate = 2.19 / 0.017;
  EXPECT_NEAR(s.planned_rate(), rate, 1e-6 * rate);
  EXPECT_NEAR(s.draft_threshold(), rate * 0.003, 1e-6);
  EXPECT_NEAR(s.verify_threshold(), rate * 0.001, 1e-6);  // 0.1288
  // Drafting goes on while P_j · 0.7 >= 0.3865: after 0.95 (0.665) yes, after 0.95 · 0.55
  // (0.366) no.
  double product = 1.0;
  EXPECT_TRUE(s.KeepGoing(0, 0.97f, &product));
  EXPECT_NEAR(product, 0.95, 1e-9);
  EXPECT_FALSE(s.KeepGoing(1, 0.51f, &product));
  // Verification prices only the row, the draft rounds being spent: the longest prefix with
  // P_j >= 0.1288. Calibrated = bin centres: 0.95, 0.8075, 0.4441, 0.1110.
  EXPECT_EQ(s.VerifyLength({0.97f, 0.88f, 0.51f, 0.22f, 0.99f}), 3);
  // A draft the drafting rule would not have asked for is still verified once drafted
  // (0.15, then 0.1425); the old rule, pricing the spent draft round too, verified none.
  EXPECT_EQ(s.VerifyLength({0.15f, 0.99f}), 2);
  EXPECT_EQ(s.VerifyLength({0.05f, 0.99f}), 0);
  EXPECT_EQ(s.VerifyLength({0.99f, 0.99f, 0.99f, 0.99f, 0.99f, 0.99f}), 5);
}

TEST(ConfidenceSchedulerTest, PlansFromTheMeasuredConfidencePerDepth) {
  ConfidenceScheduler s(VerifyMode::kAuto, 5);
  for (int i = 0; i < 2000; ++i) s.ObserveDrafts({0.95f, 0.45f});
  // Exponentially weighted (~200 recent drafts) with the prior's 4 pseudo-drafts of 0.7.
  const double a1 = s.DepthAcceptance(1), a2 = s.DepthAcceptance(2);
  EXPECT_NEAR(a1, 0.95, 0.01);
  EXPECT_NEAR(a2, 0.45, 0.01);
  EXPECT_NEAR(s.DepthAcceptance(3), ConfidenceScheduler::kDepthPriorMean, 1e-12);
  // Batch 1, the CPU costs of sluice-mini-moe + sluice-mini-draft (ms): target 2.6 + 0.85 per
  // token, draft round 0.7 + 0.1. Plain 3.45, each draft +1.65: E(1) / C(1) = 1.95 / 5.10
  // = 0.382 beats E(2) / C(2) = 2.38 / 6.75 = 0.352 and L = 0 (0.290).
  const StepCostModel target = Linear(0.0026, 0.00085);
  const StepCostModel draft = Linear(0.0007, 0.0001);
  bool probe = false;
  EXPECT_EQ(s.BeginStep(1, target, &draft, &probe), 5);
  EXPECT_EQ(s.planned_length(), 1);
  EXPECT_NEAR(s.planned_rate(), (1.0 + a1) / 0.0051, 1e-3);
  EXPECT_NEAR(s.draft_threshold(), (1.0 + a1) / 0.0051 * 0.00165, 1e-6);  // ~0.63
  // After an ordinary first draft (0.95) the second is not worth its round (0.95 · 0.45), but
  // the measured depths are only means: a first draft that leaves P_1 = 0.95 before a depth
  // whose mean is 0.7 would be (0.665).
  double product = 1.0;
  EXPECT_FALSE(s.KeepGoing(0, 0.97f, &product));
  product = 1.0;
  EXPECT_TRUE(s.KeepGoing(1, 0.97f, &product));
}

TEST(ConfidenceSchedulerTest, ShrinksToZeroWhenVerificationDoesNotPay) {
  ConfidenceScheduler s(VerifyMode::kAuto, 5);
  // Per-token cost dominates (large batch): one more row costs as much as a whole plain
  // token, so no acceptance below 1 pays for a draft.
  const StepCostModel target = Linear(0.010, 0.010);
  for (int i = 0; i < 200; ++i) s.ObserveVerification({0.99f}, 1, i % 2);  // 50% accepted
  // Probes only, spaced twice as far each time drafting still does not pay (16 steps, then
  // 32, 64, ... up to kMaxProbeInterval = 512). A probe drafts and verifies in full.
  std::vector<int> probe_steps;
  for (int step = 1; step <= 2048; ++step) {
    bool probe = false;
    const int32_t depth = s.BeginStep(64, target, nullptr, &probe);
    if (depth > 0) {
      probe_steps.push_back(step);
      EXPECT_TRUE(probe);
      EXPECT_EQ(depth, 5);
      double product = 1.0;
      EXPECT_TRUE(s.KeepGoing(0, 0.01f, &product));
      EXPECT_EQ(s.VerifyLength({0.01f, 0.01f, 0.01f, 0.01f, 0.01f}), 5);
    } else {
      EXPECT_EQ(s.planned_length(), 0);
    }
  }
  EXPECT_EQ(probe_steps, (std::vector<int>{16, 32, 64, 128, 256, 512, 1024, 1536, 2048}));
  // Batch 1 with the same costs: a plain token costs 20 ms, a draft 10 ms more, and a draft of
  // the prior's 0.7 pays (1.7 / 30 > 1 / 20).
  bool probe = false;
  EXPECT_EQ(s.BeginStep(1, target, nullptr, &probe), 5);
  EXPECT_FALSE(probe);
  EXPECT_EQ(s.planned_length(), 1);
  // Drafting paid again, so back at batch 64 the next probe is kProbeInterval steps away.
  int first_probe = 0;
  for (int step = 1; step <= 64 && first_probe == 0; ++step) {
    if (s.BeginStep(64, target, nullptr, &probe) > 0) first_probe = step;
  }
  EXPECT_EQ(first_probe, ConfidenceScheduler::kProbeInterval);
}

// Beside SpeculationRegime: a speculating step plans at least one draft (no drafts at all is the
// regime's pipelined step), the per-sequence threshold still cutting drafts that do not pay;
// speculation's first measurement drafts and verifies everything.
TEST(ConfidenceSchedulerTest, BesidePipelinedStepsPlansAtLeastOneDraftOrMeasuresInFull) {
  ConfidenceScheduler s(VerifyMode::kAuto, 5);
  const StepCostModel target = Linear(0.010, 0.010);
  for (int i = 0; i < 200; ++i) s.ObserveVerification({0.99f}, 1, i % 2);  // 50% accepted
  bool probe = true;
  EXPECT_EQ(s.BeginStep(64, target, nullptr, &probe), 0);  // against a synchronous plain step
  EXPECT_FALSE(probe);
  // Per sequence a plain share costs 0.01/64 + 0.01, each draft 0.01 more; at the prior's 0.7
  // per depth L = 1 is best: r* = 1.7 / 0.0201563 = 84.34, a row verified while P >= 0.8434.
  EXPECT_EQ(s.BeginStep(64, target, nullptr, &probe, ConfidenceScheduler::Baseline::kPipelined),
            5);
  EXPECT_FALSE(probe);
  EXPECT_EQ(s.planned_length(), 1);
  EXPECT_NEAR(s.planned_rate(), 1.7 / (0.01 / 64 + 0.02), 1e-9);
  EXPECT_NEAR(s.verify_threshold(), 0.01 * 1.7 / (0.01 / 64 + 0.02), 1e-12);
  EXPECT_EQ(s.VerifyLength({0.99f}), 0);  // calibrated 103.8 / 204 = 0.509 < 0.843
  EXPECT_EQ(s.BeginStep(64, target, nullptr, &probe, ConfidenceScheduler::Baseline::kMeasuring),
            5);
  EXPECT_FALSE(probe);  // every sequence, not kProbeSequences
  double product = 1.0;
  EXPECT_TRUE(s.KeepGoing(3, 0.01f, &product));
  EXPECT_EQ(s.VerifyLength({0.01f, 0.01f, 0.01f, 0.01f, 0.01f}), 5);
}

// Before the step cost is measured, or while every step had the same size (so its split into
// fixed and per-token cost is unknown), each step is a probe: a few sequences draft and verify
// in full, giving the fit steps of another size.
TEST(ConfidenceSchedulerTest, ProbesUntilTheStepCostIsSplit) {
  ConfidenceScheduler s(VerifyMode::kAuto, 4);
  StepCostModel target;
  bool probe = false;
  EXPECT_EQ(s.BeginStep(8, target, nullptr, &probe), 4);
  EXPECT_TRUE(probe);
  EXPECT_EQ(s.VerifyLength({0.01f, 0.01f, 0.01f, 0.01f}), 4);
  target.Observe(8, 0.010);
  target.Observe(8, 0.011);
  ASSERT_FALSE(target.Identified());
  probe = false;
  EXPECT_EQ(s.BeginStep(8, target, nullptr, &probe), 4);
  EXPECT_TRUE(probe);
  for (int i = 0; i < 4; ++i) target.Observe(16, 0.020);
  ASSERT_TRUE(target.Identified());
  probe = true;
  s.BeginStep(8, target, nullptr, &probe);
  EXPECT_FALSE(probe);
}

TEST(ConfidenceSchedulerTest, FixedVerifiesEverything) {
  ConfidenceScheduler s(VerifyMode::kFixed, 4);
  bool probe = true;
  EXPECT_EQ(s.BeginStep(256, Linear(0.001, 1.0), nullptr, &probe), 4);
  EXPECT_FALSE(probe);
  EXPECT_EQ(s.VerifyLength({0.01f, 0.01f, 0.01f}), 3);
  EXPECT_EQ(s.VerifyLength({0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f}), 4);
}

TEST(ParseVerifyModeTest, AutoOrAFixedCount) {
  VerifyMode mode = VerifyMode::kFixed;
  int32_t k = 5;
  ASSERT_TRUE(ParseVerifyMode("auto", &mode, &k).ok());
  EXPECT_EQ(mode, VerifyMode::kAuto);
  ASSERT_TRUE(ParseVerifyMode("3", &mode, &k).ok());
  EXPECT_EQ(mode, VerifyMode::kFixed);
  EXPECT_EQ(k, 3);
  for (const char* bad : {"0", "17", "x", "3x", ""}) {
    absl::Status s = ParseVerifyMode(bad, &mode, &k);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.message().find("--speculative-verify"), std::string::npos);
  }
  SpeculativeOptions options;
  options.num_speculative_tokens = 0;
  EXPECT_EQ(options.Validate().message(), "--num-speculative-tokens must be in [1, 16], got 0");
}

// The logits rows a device target sizes per decode sequence: k, or the fixed count, and the
// largest k for values the flags' own checks refuse.
TEST(MaxVerifiedDraftsTest, KOrTheFixedCount) {
  EXPECT_EQ(MaxVerifiedDrafts(5, "auto"), 5);
  EXPECT_EQ(MaxVerifiedDrafts(7, "auto"), 7);
  EXPECT_EQ(MaxVerifiedDrafts(5, "3"), 3);
  EXPECT_EQ(MaxVerifiedDrafts(2, "9"), 9);
  EXPECT_EQ(MaxVerifiedDrafts(0, "auto"), kMaxSpeculativeTokens);
  EXPECT_EQ(MaxVerifiedDrafts(5, "17"), kMaxSpeculativeTokens);
  EXPECT_EQ(MaxVerifiedDrafts(5, "x"), kMaxSpeculativeTokens);
}

// A draft model beside a host-KV target shares its block count; beside a device-KV target
// (CUDA: block counts from GPU memory) its host KV is capped by the host budget, never 0.
TEST(DraftKvBlocksTest, CappedByTheHostBudgetBesideADeviceTarget) {
  const int64_t draft_block = 32 << 10;  // sluice-mini-draft: 2 KiB per token, 16-token blocks
  EXPECT_EQ(DraftKvBlocks(4096, false, 1LL << 30, draft_block), 4096);
  EXPECT_EQ(DraftKvBlocks(1 << 20, false, 1LL << 30, draft_block), 1 << 20);
  EXPECT_EQ(DraftKvBlocks(65536, true, 1LL << 30, draft_block), 32768);
  EXPECT_EQ(DraftKvBlocks(1000, true, 1LL << 30, draft_block), 1000);
  EXPECT_EQ(DraftKvBlocks(1000, true, 1000, draft_block), 1);
}

TEST(TargetProbsTest, MatchesWhatSampleTokenDraws) {
  // Logits over 6 tokens; top_k 3 then top_p 0.8 over the renormalized top 3, temperature 0.5,
  // a presence penalty on token 0 (an output token).
  std::vector<float> logits = {2.0f, 1.5f, 1.0f, 0.9f, -1.0f, 0.0f};
  SamplingParams p;
  p.temperature = 0.5f;
  p.top_k = 3;
  p.top_p = 0.8f;
  p.presence_penalty = 0.5f;
  const std::vector<int32_t> prompt = {5}, output = {0};
  const SequenceContext ctx{prompt, output, {}};
  std::vector<double> probs;
  std::vector<float> scratch = logits;
  TargetProbs(absl::MakeSpan(scratch), p, ctx, &probs);
  // Penalized: {1.5, 1.5, 1.0, 0.9, -1, 0} / 0.5 = {3, 3, 2, 1.8, -2, 0}; top 3: ids 0, 1, 2 with
  // weights 1, 1, e^-1; top_p 0.8 of 2.368 = 1.894 needs ids 0 and 1 (mass 2): p = 0.5, 0.5.
  EXPECT_NEAR(probs[0], 0.5, 1e-12);
  EXPECT_NEAR(probs[1], 0.5, 1e-12);
  for (int i = 2; i < 6; ++i) EXPECT_EQ(probs[i], 0.0);
  // SampleToken's draws land only on those two, about equally often.
  int counts[6] = {};
  for (int i = 0; i < 4000; ++i) {
    std::vector<float> l = logits;
    ++counts[SampleToken(absl::MakeSpan(l), p, ctx, SampleDrawKey{7, 0, i}).token_id];
  }
  EXPECT_EQ(counts[0] + counts[1], 4000);
  EXPECT_NEAR(counts[0] / 4000.0, 0.5, 0.03);
}

TEST(RejectionRuleTest, AcceptsWithMinOneOfPOverQAndResamplesTheResidual) {
  RejectionRule rule;
  EXPECT_TRUE(rule.Accept(0.3, 0.6, 0.49));
  EXPECT_FALSE(rule.Accept(0.3, 0.6, 0.51));
  EXPECT_TRUE(rule.Accept(0.6, 0.3, 0.999));
  std::vector<double> out;
  const std::vector<float> q = {0.5f, 0.25f, 0.25f};
  rule.Residual({0.2, 0.5, 0.3}, q, 0, &out);
  EXPECT_NEAR(out[0], 0.0, 1e-7);
  EXPECT_NEAR(out[1], 0.25, 1e-7);
  EXPECT_NEAR(out[2], 0.05, 1e-7);
  rule.Residual({0.2, 0.5, 0.3}, {}, 1, &out);  // one-hot q at the draft
  EXPECT_EQ(out, (std::vector<double>{0.2, 0.0, 0.3}));
}

}  // namespace
}  // namespace sluice
