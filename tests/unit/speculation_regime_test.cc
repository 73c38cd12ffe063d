// SpeculationRegime: measured rates pick speculative or pipelined plain steps; the loser is
// measured again after an interval that doubles while it keeps losing.
#include "engine/spec/speculation_regime.h"

#include <gtest/gtest.h>

namespace sluice {
namespace {

// Runs `steps` steps of the current regime, each emitting `tokens` per sequence in 10 ms for
// 4 sequences (a rate of tokens / 0.01 per sequence-second). Returns the regime after them.
bool RunSteps(SpeculationRegime& regime, int64_t steps, double spec_tokens, double plain_tokens) {
  for (int64_t i = 0; i < steps; ++i) {
    const double tokens = regime.Pipelined() ? plain_tokens : spec_tokens;
    regime.Observe(0.01, static_cast<int64_t>(4 * tokens), 4);
  }
  return regime.Pipelined();
}

TEST(SpeculationRegimeTest, MeasuresBothThenRunsTheFasterAndRetriesTheOtherLessOften) {
  SpeculationRegime regime;
  EXPECT_FALSE(regime.Pipelined());  // speculation first: it calibrates the drafter too
  // Speculative steps emit 1 token per sequence, pipelined ones 1.5 (the host's work overlaps).
  EXPECT_FALSE(RunSteps(regime, SpeculationRegime::kMeasureSteps - 1, 1, 1.5));
  EXPECT_TRUE(RunSteps(regime, 1, 1, 1.5));  // measured: now the pipelined steps' turn
  EXPECT_NEAR(regime.speculative_rate(), 100.0, 1e-9);
  EXPECT_TRUE(RunSteps(regime, SpeculationRegime::kMeasureSteps, 1, 1.5));
  EXPECT_NEAR(regime.pipelined_rate(), 150.0, 1e-9);
  // Pipelined runs; speculation is retried after kRetryInterval steps, for kMeasureSteps.
  EXPECT_TRUE(RunSteps(regime, SpeculationRegime::kRetryInterval - 1, 1, 1.5));
  EXPECT_FALSE(RunSteps(regime, 1, 1, 1.5));
  EXPECT_FALSE(RunSteps(regime, SpeculationRegime::kMeasureSteps - 1, 1, 1.5));
  EXPECT_TRUE(RunSteps(regime, 1, 1, 1.5));
  // It lost again, by 1.5x: the next retry comes twice as late (at least 2x).
  EXPECT_TRUE(RunSteps(regime, 2 * SpeculationRegime::kRetryInterval - 1, 1, 1.5));
  EXPECT_FALSE(RunSteps(regime, 1, 1, 1.5));
  EXPECT_EQ(regime.num_switches(), 4);
  // Now speculation pays (3 tokens per step): the retry finds it and it stays.
  EXPECT_FALSE(RunSteps(regime, SpeculationRegime::kMeasureSteps, 3, 1.5));
  EXPECT_FALSE(RunSteps(regime, SpeculationRegime::kRetryInterval - 1, 3, 1.5));
  EXPECT_NEAR(regime.speculative_rate(), 300.0, 1e-9);
  // ... and its retry of pipelined steps comes after kRetryInterval again.
  EXPECT_TRUE(RunSteps(regime, 1, 3, 1.5));
}

TEST(SpeculationRegimeTest, SpeculationThatPaysFromTheStartKeepsRunning) {
  SpeculationRegime regime;
  EXPECT_TRUE(RunSteps(regime, SpeculationRegime::kMeasureSteps, 3, 1));
  EXPECT_FALSE(RunSteps(regime, SpeculationRegime::kMeasureSteps, 3, 1));
  EXPECT_FALSE(RunSteps(regime, SpeculationRegime::kRetryInterval - 1, 3, 1));
  EXPECT_EQ(regime.num_switches(), 2);
}

// On a GPU a CPU draft model's speculative step of 8 sequences cost ~10 plain pipelined steps:
// a retry that far behind stops after kMinRetrySteps counted steps, and the next comes later by
// the factor it lost by.
TEST(SpeculationRegimeTest, RetryFarBehindEndsEarlyAndBacksOffByItsLoss) {
  SpeculationRegime regime;
  EXPECT_TRUE(RunSteps(regime, SpeculationRegime::kMeasureSteps, 0.25, 2));  // 25 vs 200
  EXPECT_TRUE(RunSteps(regime, SpeculationRegime::kMeasureSteps, 0.25, 2));
  EXPECT_TRUE(RunSteps(regime, SpeculationRegime::kRetryInterval - 1, 0.25, 2));
  EXPECT_FALSE(RunSteps(regime, 1, 0.25, 2));  // the retry begins
  // Its first step is not counted; after kMinRetrySteps counted steps at 25 < 0.5 x 200 it ends.
  EXPECT_FALSE(RunSteps(regime, SpeculationRegime::kMinRetrySteps, 0.25, 2));
  EXPECT_TRUE(RunSteps(regime, 1, 0.25, 2));
  // 8x behind: the next retry after 32 x 8 steps.
  EXPECT_TRUE(RunSteps(regime, 8 * SpeculationRegime::kRetryInterval - 1, 0.25, 2));
  EXPECT_FALSE(RunSteps(regime, 1, 0.25, 2));
}

TEST(SpeculationRegimeTest, FirstStepOfAMeasurementAndIdleStepsAreNotCounted) {
  SpeculationRegime regime;
  // The first speculative step drains the pipeline or catches a drafter up: slow, not counted.
  regime.Observe(1.0, 4, 4);
  for (int i = 0; i < 10; ++i) regime.Observe(0.01, 4, 0);  // no decode sequences: ignored
  regime.Observe(0.0, 4, 4);                                // no time: ignored
  EXPECT_FALSE(regime.Pipelined());
  for (int64_t i = 1; i < SpeculationRegime::kMeasureSteps; ++i) regime.Observe(0.01, 4, 4);
  EXPECT_NEAR(regime.speculative_rate(), 100.0, 1e-9);
  EXPECT_TRUE(regime.Pipelined());
}

// A kernel shape's first use (module loading) makes one step of a measurement 20x slower: the
// measurement leaves out steps slower than kOutlierFactor x its median.
TEST(SpeculationRegimeTest, MeasurementLeavesOutOutlierSteps) {
  SpeculationRegime regime;
  regime.Observe(0.01, 12, 4);  // the first step: not counted
  regime.Observe(0.2, 12, 4);   // 20x the others
  for (int64_t i = 2; i < SpeculationRegime::kMeasureSteps; ++i) regime.Observe(0.01, 12, 4);
  EXPECT_NEAR(regime.speculative_rate(), 300.0, 1e-9);
  // Pipelined steps at 200: speculation (300) wins although its eight steps took 0.27 s.
  EXPECT_TRUE(regime.Pipelined());
  EXPECT_FALSE(RunSteps(regime, SpeculationRegime::kMeasureSteps, 3, 2));
  EXPECT_NEAR(regime.pipelined_rate(), 200.0, 1e-9);
}

// A new request at batch 1 (or half a batch of new sequences) while pipelined steps run: what
// drafting gains for its text is unknown, so speculation is retried at once, its spacing reset.
TEST(SpeculationRegimeTest, NewSequencesRetrySpeculationAtOnce) {
  SpeculationRegime regime;
  EXPECT_TRUE(RunSteps(regime, SpeculationRegime::kMeasureSteps, 1, 2.25));  // 100 vs 225
  EXPECT_TRUE(RunSteps(regime, SpeculationRegime::kMeasureSteps, 1, 2.25));
  EXPECT_TRUE(RunSteps(regime, SpeculationRegime::kRetryInterval - 1, 1, 2.25));
  EXPECT_FALSE(RunSteps(regime, 1 + SpeculationRegime::kMinRetrySteps, 1, 2.25));  // a retry
  EXPECT_TRUE(RunSteps(regime, 1, 1, 2.25));  // abandoned: over 2x behind, the next after 64+
  EXPECT_TRUE(RunSteps(regime, SpeculationRegime::kRetryInterval, 1, 2.25));
  // One new sequence of 4: not enough. A second: half the batch is new, speculation runs next.
  regime.NoteNewSequences(1, 4);
  EXPECT_TRUE(regime.Pipelined());
  regime.NoteNewSequences(1, 4);
  EXPECT_FALSE(regime.Pipelined());
  EXPECT_TRUE(regime.Retrying());
  EXPECT_TRUE(regime.DraftsInFull());  // a new text: acceptance not calibrated yet
  // The new text drafts well (3 tokens a step): the retry wins and speculation stays.
  EXPECT_FALSE(RunSteps(regime, SpeculationRegime::kMeasureSteps, 3, 2));
  EXPECT_FALSE(RunSteps(regime, SpeculationRegime::kRetryInterval - 1, 3, 2));
  // Sequences that start while speculation runs are measured by it: no retry is asked for.
  regime.NoteNewSequences(4, 4);
  EXPECT_FALSE(regime.Retrying());
}

// Speculation far behind (a CPU draft model's verify steps beside a GPU target), or a batch over
// kTurnoverMaxSequences: new sequences do not bring a retry; the spaced retries still come.
TEST(SpeculationRegimeTest, NewSequencesDoNotRetrySpeculationFarBehind) {
  SpeculationRegime regime;
  EXPECT_TRUE(RunSteps(regime, SpeculationRegime::kMeasureSteps, 0.1, 2));  // 10 vs 200
  EXPECT_TRUE(RunSteps(regime, SpeculationRegime::kMeasureSteps, 0.1, 2));
  regime.NoteNewSequences(4, 4);
  EXPECT_TRUE(regime.Pipelined());
  EXPECT_TRUE(RunSteps(regime, SpeculationRegime::kRetryInterval - 1, 0.1, 2));
  EXPECT_FALSE(RunSteps(regime, 1, 0.1, 2));
  EXPECT_FALSE(regime.DraftsInFull());  // a spaced retry runs the scheduler's own plan
  SpeculationRegime wide;
  EXPECT_TRUE(RunSteps(wide, SpeculationRegime::kMeasureSteps, 1, 2.25));
  EXPECT_TRUE(RunSteps(wide, SpeculationRegime::kMeasureSteps, 1, 2.25));
  wide.NoteNewSequences(8, 8);
  EXPECT_TRUE(wide.Pipelined());
}

}  // namespace
}  // namespace sluice
