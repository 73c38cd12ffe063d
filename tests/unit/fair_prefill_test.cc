// Fair prefill: the cost(q, c) fit (QcCostModel), the scheduling policies' order (fcfs,
// priority, shortest-prefill-first with aging), decodes before prefills, and prefill chunks cut
// to a per-step time budget. Scheduler scenarios run on a fake clock and a cost model fitted
// from exact synthetic steps; engine scenarios check that the order changes and the outputs
// do not.
#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "engine/sched/llm_engine.h"
#include "engine/sched/qc_cost_model.h"
#include "engine/sched/scheduler.h"
#include "tests/util/fake_models.h"

namespace sluice {
namespace {

// --- QcCostModel ---

// Steps of one prefill chunk (q, c) each, timed by the exact cost(q, c) given.
QcCostModel FitExact(double fixed, double per_token, double per_pair) {
  QcCostModel m(1.0);
  const int qs[] = {1, 16, 100, 512, 3, 250};
  const int cs[] = {0, 700, 40, 0, 1500, 1000};
  for (int i = 0; i < 6; ++i) {
    const double pairs = QcCostModel::Pairs(qs[i], cs[i]);
    m.Observe(qs[i], pairs, fixed + per_token * qs[i] + per_pair * pairs);
  }
  // Two more decode-like steps: eight in all, the minimum to count as fitted.
  m.Observe(8, 8 * 300 + 8, fixed + per_token * 8 + per_pair * (8 * 300 + 8));
  m.Observe(2, QcCostModel::Pairs(2, 10), fixed + per_token * 2 + per_pair * QcCostModel::Pairs(2, 10));
  return m;
}

TEST(QcCostModelTest, PairsCountsCausalQueryKeyPairs) {
  EXPECT_EQ(QcCostModel::Pairs(1, 0), 1);     // the token attends to itself
  EXPECT_EQ(QcCostModel::Pairs(1, 9), 10);    // a decode after 9 tokens
  EXPECT_EQ(QcCostModel::Pairs(4, 0), 10);    // 1 + 2 + 3 + 4
  EXPECT_EQ(QcCostModel::Pairs(4, 10), 50);   // 11 + 12 + 13 + 14
}

TEST(QcCostModelTest, RecoversExactCoefficients) {
  const QcCostModel m = FitExact(0.004, 2e-4, 3e-8);
  ASSERT_TRUE(m.Fitted());
  EXPECT_NEAR(m.fixed_seconds(), 0.004, 1e-9);
  EXPECT_NEAR(m.per_token_seconds(), 2e-4, 1e-11);
  EXPECT_NEAR(m.per_pair_seconds(), 3e-8, 1e-14);
  EXPECT_NEAR(m.Predict(100, QcCostModel::Pairs(100, 50)),
              0.004 + 0.02 + 3e-8 * QcCostModel::Pairs(100, 50), 1e-9);
  EXPECT_NEAR(m.RowSeconds(10, 0), 10 * 2e-4 + 55 * 3e-8, 1e-12);
}

TEST(QcCostModelTest, TermsWithoutAttentionCostFitToZero) {
  // Time linear in tokens only: the pair term must come out 0, not negative.
  const QcCostModel m = FitExact(0.01, 1e-3, 0.0);
  EXPECT_NEAR(m.fixed_seconds(), 0.01, 1e-9);
  EXPECT_NEAR(m.per_token_seconds(), 1e-3, 1e-10);
  EXPECT_NEAR(m.per_pair_seconds(), 0.0, 1e-14);
}

TEST(QcCostModelTest, NeverNegativeCoefficients) {
  // Bigger steps measured faster (noise, caches warming): an unconstrained fit has a negative
  // slope; the constrained one keeps every coefficient >= 0 and fits the mean.
  QcCostModel m(1.0);
  for (int i = 0; i < 10; ++i) m.Observe(10 + 50 * i, QcCostModel::Pairs(10 + 50 * i, 0), 0.5 - 0.01 * i);
  ASSERT_TRUE(m.Fitted());
  EXPECT_GE(m.per_token_seconds(), 0);
  EXPECT_GE(m.per_pair_seconds(), 0);
  EXPECT_NEAR(m.fixed_seconds(), 0.455, 1e-9);  // mean of 0.5 .. 0.41
}

// OverrunSteps: m (fitted exact: 10 ms + 1 ms per token) then measures `n` 100-token steps
// (predicted 110 ms) at `ratio` x 110 ms.
void OverrunSteps(QcCostModel& m, int n, double ratio) {
  for (int i = 0; i < n; ++i) m.Observe(100, QcCostModel::Pairs(100, 0), 0.110 * ratio);
}

TEST(QcCostModelTest, OverrunRatioIsTheHighQuantileOfRecentSlowSteps) {
  QcCostModel m = FitExact(0.010, 0.001, 0.0);
  m.TrackOverrun(0.05);
  EXPECT_EQ(m.OverrunRatio(), 1.0);  // nothing tracked yet
  OverrunSteps(m, 20, 1.0);          // as predicted (the fit stays exact)
  EXPECT_DOUBLE_EQ(m.OverrunRatio(), 1.0);
  // Steps predicted under 50 ms are not tracked, however slow: 10 tokens (20 ms) taking 40 ms.
  QcCostModel small = FitExact(0.010, 0.001, 0.0);
  small.TrackOverrun(0.05);
  for (int i = 0; i < 20; ++i) small.Observe(10, QcCostModel::Pairs(10, 0), 0.04);
  EXPECT_EQ(small.OverrunRatio(), 1.0);
  // 64 steps at 1.5x: the window holds only them. Each is measured against the fit before it,
  // which moves towards them, so the ratios fall from 1.5; the 90th percentile stays near it.
  OverrunSteps(m, 64, 1.5);
  EXPECT_LE(m.OverrunRatio(), 1.5 + 1e-9);
  EXPECT_GE(m.OverrunRatio(), 1.3);
  // Faster steps than predicted never shrink it below 1.
  QcCostModel fast = FitExact(0.010, 0.001, 0.0);
  fast.TrackOverrun(0.05);
  OverrunSteps(fast, 20, 0.5);
  EXPECT_EQ(fast.OverrunRatio(), 1.0);
}

TEST(QcCostModelTest, NotFittedUntilEnoughDifferentSteps) {
  QcCostModel m;
  for (int i = 0; i < 20; ++i) m.Observe(4, 40, 0.01);  // one token count only
  EXPECT_FALSE(m.Fitted());
  QcCostModel few;
  for (int i = 0; i < QcCostModel::kMinObservations - 1; ++i) few.Observe(1 + i, 1 + i, 0.01 * (i + 1));
  EXPECT_FALSE(few.Fitted());
  few.Observe(100, 100, 1.0);
  EXPECT_TRUE(few.Fitted());
}

// --- Scheduler ---

struct FakeClock {
  double now = 100.0;
};

class SchedulerPolicyTest : public ::testing::Test {
 protected:
  Scheduler Make(SchedulingPolicy policy, int32_t token_budget = 512, int64_t blocks = 1024) {
    SchedulerConfig c;
    c.block_size = 16;
    c.max_num_batched_tokens = token_budget;
    c.policy = policy;
    c.prefill_aging = aging_;
    c.clock = [this] { return clock_.now; };
    c.step_cost = cost_.get();
    c.step_time_budget_seconds = time_budget_;
    c.enable_prefix_caching = prefix_caching_;
    return Scheduler(c, blocks);
  }
  // Prompts of one `salt` share their leading tokens.
  void Add(Scheduler& s, const std::string& id, int prompt_len, int32_t priority = 0,
           int salt = 0) {
    auto seq = std::make_unique<Sequence>();
    seq->request.request_id = id;
    seq->request.priority = priority;
    seq->request.sampling.max_tokens = 100;
    for (int i = 0; i < prompt_len; ++i) {
      seq->request.prompt_token_ids.push_back(3 + (i + salt * 7) % 50 + salt * 50);
    }
    seq->token_ids = seq->request.prompt_token_ids;
    s.Add(std::move(seq));
  }
  // Step plans one step, "runs" it (advances computed tokens, samples token 7 where the chunk
  // reaches the end) and returns "id:n" per scheduled sequence, in plan order.
  std::vector<std::string> Step(Scheduler& s) {
    const SchedulerOutput out = s.Schedule();
    std::vector<std::string> plan;
    for (const ScheduledSequence& row : out.scheduled) {
      plan.push_back(row.seq->request.request_id + ":" + std::to_string(row.num_new_tokens));
      const bool samples = row.samples();
      row.seq->num_computed_tokens += row.num_new_tokens;
      if (samples) row.seq->AppendToken(7);
    }
    return plan;
  }
  using Plan = std::vector<std::string>;

  FakeClock clock_;
  std::unique_ptr<QcCostModel> cost_;
  double time_budget_ = 0.0;
  double aging_ = 0.1;
  bool prefix_caching_ = false;
};

TEST_F(SchedulerPolicyTest, FcfsKeepsShortPromptBehindLongOnes) {
  Scheduler s = Make(SchedulingPolicy::kFcfs);
  Add(s, "long", 1500);
  EXPECT_EQ(Step(s), (Plan{"long:512"}));
  Add(s, "short", 5);
  EXPECT_EQ(Step(s), (Plan{"long:512"}));
  EXPECT_EQ(Step(s), (Plan{"long:476", "short:5"}));
}

TEST_F(SchedulerPolicyTest, ShortestPrefillFirstOvertakesARunningLongPrefill) {
  Scheduler s = Make(SchedulingPolicy::kShortestPrefillFirst);
  Add(s, "long", 1500);
  EXPECT_EQ(Step(s), (Plan{"long:512"}));
  clock_.now += 0.5;
  Add(s, "short", 5);
  // The short prompt is prefilled in the very next step, alone: a chunk of the long one would
  // delay its first token.
  EXPECT_EQ(Step(s), (Plan{"short:5"}));
  // Then the short one decodes first every step, and the long one goes on.
  EXPECT_EQ(Step(s), (Plan{"short:1", "long:511"}));
  EXPECT_EQ(Step(s), (Plan{"short:1", "long:477"}));
  // Both decode: in admission order.
  EXPECT_EQ(Step(s), (Plan{"long:1", "short:1"}));
}

TEST_F(SchedulerPolicyTest, ShortestPrefillFirstOrdersWaitingByRemainingTokens) {
  Scheduler s = Make(SchedulingPolicy::kShortestPrefillFirst, 600);
  Add(s, "a1500", 1500);
  Add(s, "b40", 40);
  Add(s, "c5", 5);
  Add(s, "d300", 300);
  // Each ends its prompt in this step; a1500's chunk would not, and waits for the next one.
  EXPECT_EQ(Step(s), (Plan{"c5:5", "b40:40", "d300:300"}));
  EXPECT_EQ(Step(s), (Plan{"c5:1", "b40:1", "d300:1", "a1500:597"}));
}

TEST_F(SchedulerPolicyTest, AgingLetsALongPromptOvertakeFreshShortOnes) {
  // 10 ms per prefill token (100 tokens/s) and aging 1: 100 tokens of credit per second waited.
  cost_ = std::make_unique<QcCostModel>(FitExact(0.0, 0.01, 0.0));
  aging_ = 1.0;
  Scheduler s = Make(SchedulingPolicy::kShortestPrefillFirst, 64);
  Add(s, "long", 1000);
  clock_.now += 9.0;  // long's score: 1000 - 100 * 9 = 100 > 60
  Add(s, "short", 60);
  EXPECT_EQ(Step(s), (Plan{"short:60"}));
  clock_.now += 0.5;
  Add(s, "fresh", 60);
  // short decodes first; then long (1000 left, waited 9.5 s: 1000 - 950 = 50) before fresh (60).
  EXPECT_EQ(Step(s), (Plan{"short:1", "long:63"}));
  // Each step takes what long's chunk costs, 0.63 s: long's service, not its wait. long stays
  // ahead: 937 - 950 = -13 against fresh's 60 - 63 = -3; then 874 - 950 against 60 - 126.
  clock_.now += 0.63;
  EXPECT_EQ(Step(s), (Plan{"short:1", "long:63"}));
  clock_.now += 0.63;
  EXPECT_EQ(Step(s), (Plan{"short:1", "long:63"}));
}

// Aging counts waiting, not service: a long prompt that has been prefilled for seconds is old,
// but has not waited, so near its end it does not outrank a short prompt that just came (by time
// in the system it would: the short one would wait for another long chunk after the one running
// when it arrived, twice the step budget).
TEST_F(SchedulerPolicyTest, ALongPromptBeingPrefilledDoesNotAgePastAFreshShortOne) {
  // cost = 10 ms + 1 ms per token, a 250.5 ms budget: 240 tokens (0.25 s) a step; aging 0.1.
  cost_ = std::make_unique<QcCostModel>(FitExact(0.010, 0.001, 0.0));
  time_budget_ = 0.2505;
  Scheduler s = Make(SchedulingPolicy::kShortestPrefillFirst, 512, 1024);
  Add(s, "long", 6000);
  int steps = 0;
  while (s.Find("long")->num_computed_tokens < 6000 - 480) {
    ASSERT_EQ(Step(s), (Plan{"long:240"}));
    clock_.now += 0.25;  // the step took what the cost model says
    ++steps;
  }
  ASSERT_EQ(steps, 23);
  // long: 2 chunks left, 0.5 s, after 5.75 s in the system (credit 0.575 s by that measure);
  // short: 0.015 s. long has waited 0 s: short goes first, alone.
  Add(s, "short", 5, 0, 1);
  EXPECT_EQ(Step(s), (Plan{"short:5"}));
  clock_.now += 0.015;
  EXPECT_EQ(Step(s), (Plan{"short:1", "long:239"}));  // the decode takes 1 ms of the budget
}

TEST_F(SchedulerPolicyTest, AgingCreditFollowsTheFittedPrefillRate) {
  // Unfitted: no credit, however long the long prompt waited.
  {
    Scheduler s = Make(SchedulingPolicy::kShortestPrefillFirst, 64);
    Add(s, "long", 1000);
    clock_.now += 1000.0;
    Add(s, "short", 60);
    EXPECT_EQ(Step(s), (Plan{"short:60"}));
  }
  // 1 ms per token (1000 tokens/s) with the default aging 0.1: 100 tokens per second waited.
  cost_ = std::make_unique<QcCostModel>(FitExact(0.0, 0.001, 0.0));
  Scheduler s = Make(SchedulingPolicy::kShortestPrefillFirst, 64);
  Add(s, "long", 1000);
  clock_.now += 9.5;  // 1000 - 950 = 50 < 60
  Add(s, "short", 60);
  EXPECT_EQ(Step(s), (Plan{"long:64"}));
}

TEST_F(SchedulerPolicyTest, AgingCreditCountsTheFixedAndAttentionCost) {
  // cost(q, c) = 50 ms per step + 1 ms per token + 1 us per query-key pair; 64 tokens a step.
  // long (1000 tokens): 16 steps x 0.05 + 1.0 + 1e-6 x 500500 = 2.3005 s of prefill;
  // short (60): 0.05 + 0.06 + 1e-6 x 1830 = 0.11183 s. With aging 1 long overtakes a fresh
  // short one after waiting 2.18867 s (a credit counting only the per-token term, 1000 tokens
  // per second waited, let it overtake after 0.94 s).
  cost_ = std::make_unique<QcCostModel>(FitExact(0.05, 0.001, 1e-6));
  aging_ = 1.0;
  {
    Scheduler s = Make(SchedulingPolicy::kShortestPrefillFirst, 64);
    Add(s, "long", 1000);
    clock_.now += 2.0;  // 2.3005 - 2.0 = 0.3005 > 0.11183
    Add(s, "short", 60, 0, 1);
    EXPECT_EQ(Step(s), (Plan{"short:60"}));
  }
  Scheduler s = Make(SchedulingPolicy::kShortestPrefillFirst, 64);
  Add(s, "long", 1000);
  clock_.now += 2.25;  // 2.3005 - 2.25 = 0.0505 < 0.11183
  Add(s, "short", 60, 0, 1);
  EXPECT_EQ(Step(s), (Plan{"long:64"}));
}

// Starvation under overload: a fresh short prompt arrives every step, as on a prefill worker
// that is never idle (each finishes with its first token). Pure shortest-first serves the short
// ones forever: every step ends a short prompt, and a chunk of the long one would delay that
// first token, so the long one never gets a chunk. With the shipped aging (0.02) its credit
// overtakes the fresh prompts after (its prefill seconds - theirs) / 0.02 seconds of waiting:
// it then finishes in 16 steps while the short ones keep coming, and every short prompt still
// gets its first token.
TEST_F(SchedulerPolicyTest, LongPromptFinishesWhileShortOnesKeepComing) {
  // 10 ms per step + 1 ms per token: the long prompt's prefill is 16 x 0.01 + 1.0 = 1.16 s,
  // a 20-token one's 0.03 s: the long one overtakes after waiting (1.16 - 0.03) / 0.02 = 56.5 s,
  // about 1900 steps of 0.03 s.
  cost_ = std::make_unique<QcCostModel>(FitExact(0.01, 0.001, 0.0));
  const int kMaxSteps = 5000;
  struct Run {
    int long_done_step = -1;  // the step the long prompt sampled its first token; -1: never
    int shorts_added = 0;
    int shorts_done = 0;
    int longest_short_wait_steps = 0;
  };
  auto run = [&](double aging) {
    aging_ = aging;
    clock_.now = 100.0;
    Scheduler s = Make(SchedulingPolicy::kShortestPrefillFirst, 64);
    Add(s, "long", 1000);
    Run r;
    std::map<std::string, int> added_at;
    // Until kMaxSteps, or 40 steps after the long prompt's first token (the short ones that
    // queued behind its last chunks get theirs).
    for (int step = 0; step < kMaxSteps && (r.long_done_step < 0 || step <= r.long_done_step + 40);
         ++step) {
      const std::string id = "short" + std::to_string(r.shorts_added++);
      Add(s, id, 20, 0, 1 + r.shorts_added % 5);
      added_at[id] = step;
      const SchedulerOutput out = s.Schedule();
      int tokens = 0;
      std::vector<std::string> finished;
      for (const ScheduledSequence& row : out.scheduled) {
        tokens += row.num_new_tokens;
        const bool samples = row.samples();
        row.seq->num_computed_tokens += row.num_new_tokens;
        if (samples) finished.push_back(row.seq->request.request_id);
      }
      // A prefill worker's request ends with its first token.
      for (const std::string& done : finished) {
        EXPECT_NE(s.Remove(done), nullptr);
        if (done == "long") {
          r.long_done_step = step;
        } else {
          ++r.shorts_done;
          r.longest_short_wait_steps =
              std::max(r.longest_short_wait_steps, step - added_at[done]);
        }
      }
      clock_.now += 0.01 + 0.001 * tokens;  // the step took what the cost model says
    }
    return r;
  };
  const Run fair = run(0.02);
  ASSERT_GE(fair.long_done_step, 0) << "the long prompt starved";
  EXPECT_LT(fair.long_done_step, kMaxSteps / 2);
  // Short prompts kept coming and being served until it overtook them, and none waited long
  // behind it (its 16 chunks of 64 tokens, then the backlog at 3 per step).
  EXPECT_GT(fair.shorts_done, 1800);
  EXPECT_LE(fair.longest_short_wait_steps, 30);
  // Without aging the same load starves it: never a chunk in kMaxSteps steps.
  const Run pure = run(0.0);
  EXPECT_EQ(pure.long_done_step, -1);
  EXPECT_GE(pure.shorts_done, kMaxSteps - 1);
  EXPECT_LE(pure.longest_short_wait_steps, 1);
}

TEST_F(SchedulerPolicyTest, WaitingPromptIsRankedByWhatItsPrefixCacheHitLeaves) {
  prefix_caching_ = true;
  Scheduler s = Make(SchedulingPolicy::kShortestPrefillFirst, 64);
  // A 400-token prompt runs and finishes: its 25 full blocks stay in the prefix cache.
  Add(s, "first", 400);
  for (int i = 0; i < 7; ++i) {
    Step(s);
    s.CommitBlocks(*s.Find("first"));
  }
  ASSERT_EQ(s.Find("first")->num_computed_tokens, 400);
  ASSERT_NE(s.Remove("first"), nullptr);
  // "mid" (100 new tokens) arrives before "cached" (410 tokens, 400 of them cached: 10 left).
  Add(s, "mid", 100, 0, 1);
  Add(s, "cached", 410);
  // "cached" goes first and ends its prompt; mid's 64-token chunk would not, so it waits.
  // Ranked by its whole length (410 > 100), "cached" came after a chunk of "mid".
  EXPECT_EQ(Step(s), (Plan{"cached:10"}));
  EXPECT_EQ(Step(s), (Plan{"cached:1", "mid:63"}));
}

TEST_F(SchedulerPolicyTest, PriorityClassesComeFirstThenArrival) {
  Scheduler s = Make(SchedulingPolicy::kPriority, 100);
  Add(s, "p1-first", 30, 1);
  clock_.now += 1;
  Add(s, "p0-long", 80, 0);
  clock_.now += 1;
  Add(s, "p-1", 50, -1);
  clock_.now += 1;
  Add(s, "p0-short", 10, 0);
  // -1, then the p0 ones by arrival (the long one first: kPriority ignores length), then 1.
  // p-1 ends its prompt in step 1: p0-long's 50-token chunk would not, so it waits a step.
  EXPECT_EQ(Step(s), (Plan{"p-1:50"}));
  EXPECT_EQ(Step(s), (Plan{"p-1:1", "p0-long:80", "p0-short:10"}));
  EXPECT_EQ(Step(s), (Plan{"p-1:1", "p0-long:1", "p0-short:1", "p1-first:30"}));
}

TEST_F(SchedulerPolicyTest, ShortestPrefillFirstHonoursPriorityClasses) {
  Scheduler s = Make(SchedulingPolicy::kShortestPrefillFirst, 100);
  Add(s, "short-low", 5, 2);
  Add(s, "long-high", 300, 0);
  EXPECT_EQ(Step(s), (Plan{"long-high:100"}));
}

TEST_F(SchedulerPolicyTest, DecodesGoBeforeEveryPrefill) {
  Scheduler s = Make(SchedulingPolicy::kShortestPrefillFirst, 64);
  Add(s, "a", 20);
  Add(s, "b", 30);
  EXPECT_EQ(Step(s), (Plan{"a:20", "b:30"}));
  Add(s, "c", 3);
  // a and b decode (admission order), then the new 3-token prompt.
  EXPECT_EQ(Step(s), (Plan{"a:1", "b:1", "c:3"}));
}

TEST_F(SchedulerPolicyTest, PreemptsAPrefillRatherThanADecode) {
  // 12 blocks of 16 tokens. "big" is admitted first and prefills in chunks; "dec", admitted
  // later, decodes. When big's next chunk needs more blocks than are free, big (served after
  // the decodes) is the victim, not the more recently admitted dec (kFcfs's choice).
  Scheduler s = Make(SchedulingPolicy::kShortestPrefillFirst, 64, 12);
  Add(s, "big", 180);
  EXPECT_EQ(Step(s), (Plan{"big:64"}));             // 4 blocks
  Add(s, "dec", 20);
  EXPECT_EQ(Step(s), (Plan{"dec:20"}));             // 2 blocks; dec samples its first token
  EXPECT_EQ(Step(s), (Plan{"dec:1", "big:63"}));    // big: 8 blocks
  EXPECT_EQ(Step(s), (Plan{"dec:1"}));              // big's last 53 need 12 blocks: preempted
  EXPECT_EQ(s.num_preemptions(), 1);
  ASSERT_NE(s.Find("big"), nullptr);
  EXPECT_EQ(s.Find("big")->num_computed_tokens, 0);
  EXPECT_EQ(s.Find("dec")->num_computed_tokens, 22);
  EXPECT_EQ(s.num_running(), 1);
  EXPECT_EQ(s.num_waiting(), 1);
}

TEST_F(SchedulerPolicyTest, TimeBudgetCutsPrefillChunks) {
  // cost = 10 ms + 1 ms per token (no attention term): a 100.5 ms budget fits 90 tokens.
  cost_ = std::make_unique<QcCostModel>(FitExact(0.010, 0.001, 0.0));
  time_budget_ = 0.1005;
  Scheduler s = Make(SchedulingPolicy::kShortestPrefillFirst, 512);
  Add(s, "long", 1000);
  EXPECT_EQ(Step(s), (Plan{"long:90"}));
  Add(s, "short", 5);
  EXPECT_EQ(Step(s), (Plan{"short:5"}));
  EXPECT_EQ(Step(s), (Plan{"short:1", "long:89"}));
  EXPECT_EQ(Step(s), (Plan{"short:1", "long:89"}));
}

// A long prompt's final chunk ends its prompt too, but it must not ride along in the step that
// gives a short prompt its first token: that step would take up to a whole budget, and the short
// prompt's TTFT two of them. The rows after the first prompt to end cost at most what its step
// alone would; short prompts arriving together still share the step.
TEST_F(SchedulerPolicyTest, FirstTokenStepTakesNoLongFinalChunk) {
  // cost = 10 ms + 1 ms per token, a 250.5 ms budget: 240 tokens a step.
  cost_ = std::make_unique<QcCostModel>(FitExact(0.010, 0.001, 0.0));
  time_budget_ = 0.2505;
  Scheduler s = Make(SchedulingPolicy::kShortestPrefillFirst, 512);
  Add(s, "long", 400);
  EXPECT_EQ(Step(s), (Plan{"long:240"}));
  // long's last 160 tokens would end its prompt within the budget, but cost 160 ms against the
  // short step's 15 ms; the other 5-token prompt (5 ms) fits the 15 ms cap, the 40-token one not.
  Add(s, "short", 5, 0, 1);
  Add(s, "short2", 5, 0, 2);
  Add(s, "mid", 40, 0, 3);
  EXPECT_EQ(Step(s), (Plan{"short:5", "short2:5"}));
  EXPECT_EQ(Step(s), (Plan{"short:1", "short2:1", "mid:40"}));
  EXPECT_EQ(Step(s), (Plan{"short:1", "short2:1", "mid:1", "long:160"}));
}

TEST_F(SchedulerPolicyTest, TimeBudgetShrinksByTheRecentOverrun) {
  // As TimeBudgetCutsPrefillChunks (90 tokens fit 100.5 ms as fitted), but recent long steps
  // ran about 1.5x their prediction: chunks are cut to 100.5 ms / OverrunRatio.
  cost_ = std::make_unique<QcCostModel>(FitExact(0.010, 0.001, 0.0));
  cost_->TrackOverrun(0.05);
  OverrunSteps(*cost_, 20, 1.0);
  OverrunSteps(*cost_, 64, 1.5);
  const double r = cost_->OverrunRatio();
  ASSERT_GT(r, 1.3);
  time_budget_ = 0.1005;
  // The longest chunk whose row cost fits 100.5 ms / r after the fixed cost (at least half of
  // the 100.5 ms budget).
  const double rows = std::max(0.1005 / 2, 0.1005 / r - cost_->fixed_seconds());
  int expected = 0;
  while (cost_->RowSeconds(expected + 1, 0) <= rows) ++expected;
  EXPECT_LT(expected, 70);
  EXPECT_GT(expected, 16);
  Scheduler s = Make(SchedulingPolicy::kShortestPrefillFirst, 512);
  Add(s, "long", 1000);
  EXPECT_EQ(Step(s), (Plan{"long:" + std::to_string(expected)}));
}

TEST_F(SchedulerPolicyTest, FixedCostOverTheBudgetStillBatchesShortPrompts) {
  // cost = 300 ms a step + 1 ms per token against a 250.1 ms budget (an overloaded machine):
  // the rows still get half the budget, 125 tokens, so the waiting short prompts share one step
  // (before, each step took one of them and they queued behind each other).
  cost_ = std::make_unique<QcCostModel>(FitExact(0.300, 0.001, 0.0));
  time_budget_ = 0.2501;
  Scheduler s = Make(SchedulingPolicy::kShortestPrefillFirst, 512);
  Add(s, "long", 1000);
  EXPECT_EQ(Step(s), (Plan{"long:125"}));
  Add(s, "a", 5, 0, 1);
  Add(s, "b", 5, 0, 2);
  Add(s, "c", 5, 0, 3);
  EXPECT_EQ(Step(s), (Plan{"a:5", "b:5", "c:5"}));
  EXPECT_EQ(Step(s), (Plan{"a:1", "b:1", "c:1", "long:122"}));
}

TEST_F(SchedulerPolicyTest, TimeBudgetPricesAttentionByContext) {
  // cost = 1 µs per query-key pair only: a chunk after c tokens costs q·c + q(q+1)/2 µs.
  cost_ = std::make_unique<QcCostModel>(FitExact(0.0, 0.0, 1e-6));
  time_budget_ = 0.050;  // 50000 pairs
  Scheduler s = Make(SchedulingPolicy::kFcfs, 1024);
  Add(s, "long", 2000);
  // From c = 0: q(q+1)/2 <= 50000 -> q = 315.
  EXPECT_EQ(Step(s), (Plan{"long:315"}));
  // From c = 315: 315q + q(q+1)/2 <= 50000 -> q = 131.
  EXPECT_EQ(Step(s), (Plan{"long:131"}));
}

TEST_F(SchedulerPolicyTest, TimeSpentByDecodesStillLeavesOneBlockOfPrefill) {
  // 1 ms per token, 5 ms budget: five decodes spend it all; the prefill still gets 16 tokens.
  cost_ = std::make_unique<QcCostModel>(FitExact(0.0, 0.001, 0.0));
  time_budget_ = 0.005;
  Scheduler s = Make(SchedulingPolicy::kShortestPrefillFirst, 512);
  for (int i = 0; i < 5; ++i) Add(s, "d" + std::to_string(i), 1);
  EXPECT_EQ(Step(s), (Plan{"d0:1", "d1:1", "d2:1", "d3:1", "d4:1"}));
  Add(s, "p", 100);
  Add(s, "q", 50);
  EXPECT_EQ(Step(s), (Plan{"d0:1", "d1:1", "d2:1", "d3:1", "d4:1", "q:16"}));
}

TEST_F(SchedulerPolicyTest, UnfittedCostModelLeavesTheTokenBudget) {
  cost_ = std::make_unique<QcCostModel>();
  cost_->Observe(10, 10, 1.0);  // one observation: not fitted
  time_budget_ = 0.001;
  Scheduler s = Make(SchedulingPolicy::kShortestPrefillFirst, 256);
  Add(s, "long", 1000);
  EXPECT_EQ(Step(s), (Plan{"long:256"}));
}

TEST(SchedulingPolicyNameTest, RoundTrips) {
  for (SchedulingPolicy p : {SchedulingPolicy::kFcfs, SchedulingPolicy::kPriority,
                             SchedulingPolicy::kShortestPrefillFirst}) {
    SchedulingPolicy parsed = SchedulingPolicy::kFcfs;
    ASSERT_TRUE(ParseSchedulingPolicy(SchedulingPolicyName(p), parsed));
    EXPECT_EQ(parsed, p);
  }
  SchedulingPolicy p = SchedulingPolicy::kPriority;
  EXPECT_FALSE(ParseSchedulingPolicy("sjf", p));
  EXPECT_EQ(p, SchedulingPolicy::kPriority);
}

// --- LLMEngine ---

using testing::ChecksumModel;

EngineRequest Greedy(const std::string& id, int len, int salt, int max_tokens) {
  EngineRequest r;
  r.request_id = id;
  for (int i = 0; i < len; ++i) {
    r.prompt_token_ids.push_back(3 + (i * 7 + salt * 13) % (ChecksumModel::kVocab - 3));
  }
  r.sampling.temperature = 0.0f;
  r.sampling.max_tokens = max_tokens;
  return r;
}

// Runs the engine to the end; returns each request's tokens and the order first tokens came.
struct EngineTrace {
  std::map<std::string, std::vector<int32_t>> tokens;
  std::vector<std::string> first_token_order;
};
EngineTrace Drain(LLMEngine& engine) {
  EngineTrace run;
  for (int i = 0; i < 10000 && engine.HasUnfinishedRequests(); ++i) {
    for (const RequestOutput& out : engine.Step()) {
      if (!out.new_tokens.empty() && run.tokens[out.request_id].empty()) {
        run.first_token_order.push_back(out.request_id);
      }
      for (const SampledToken& t : out.new_tokens) run.tokens[out.request_id].push_back(t.token_id);
    }
  }
  EXPECT_FALSE(engine.HasUnfinishedRequests());
  return run;
}

TEST(FairPrefillEngineTest, ShortRequestsGetTheirFirstTokenBeforeLongOnesQueuedEarlier) {
  for (SchedulingPolicy policy : {SchedulingPolicy::kFcfs, SchedulingPolicy::kShortestPrefillFirst}) {
    EngineOptions o;
    o.block_size = 4;
    o.num_kv_blocks = 512;
    o.max_num_batched_tokens = 64;
    o.scheduling_policy = policy;
    // A budget the fake model's steps never reach: the cost fit runs, chunks stay whole.
    o.step_time_budget_seconds = 10.0;
    auto engine = LLMEngine::Create(std::make_unique<ChecksumModel>(), o);
    ASSERT_TRUE(engine.ok()) << engine.status();
    std::vector<EngineRequest> reqs = {Greedy("long1", 200, 1, 4), Greedy("long2", 180, 2, 4),
                                       Greedy("short", 5, 3, 4)};
    for (const EngineRequest& r : reqs) ASSERT_TRUE((*engine)->AddRequest(r).ok());
    const EngineTrace run = Drain(**engine);
    for (const EngineRequest& r : reqs) {
      EXPECT_EQ(run.tokens.at(r.request_id), ChecksumModel::Reference(r.prompt_token_ids, 4))
          << r.request_id << " under " << SchedulingPolicyName(policy);
    }
    if (policy == SchedulingPolicy::kFcfs) {
      EXPECT_EQ(run.first_token_order, (std::vector<std::string>{"long1", "long2", "short"}));
    } else {
      EXPECT_EQ(run.first_token_order, (std::vector<std::string>{"short", "long2", "long1"}));
    }
    EXPECT_GT((*engine)->counters().step_cost_token_seconds +
                  (*engine)->counters().step_cost_fixed_seconds +
                  (*engine)->counters().step_cost_pair_seconds,
              0.0);
  }
}

TEST(FairPrefillEngineTest, PriorityIsRefusedWhereNoPolicyHonoursIt) {
  for (SchedulingPolicy policy : {SchedulingPolicy::kFcfs, SchedulingPolicy::kPriority,
                                  SchedulingPolicy::kShortestPrefillFirst}) {
    EngineOptions o;
    o.block_size = 4;
    o.num_kv_blocks = 512;
    o.scheduling_policy = policy;
    auto engine = LLMEngine::Create(std::make_unique<ChecksumModel>(), o);
    ASSERT_TRUE(engine.ok()) << engine.status();
    EngineRequest r = Greedy("urgent", 5, 1, 2);
    r.priority = -2;
    const absl::Status s = (*engine)->AddRequest(r);
    if (policy == SchedulingPolicy::kFcfs) {
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
      EXPECT_EQ(s.message(),
                "priority -2 was given, but priority scheduling is not enabled "
                "(--scheduling-policy fcfs; use priority or shortest_prefill_first)");
      EXPECT_FALSE((*engine)->HasUnfinishedRequests());
      r.priority = 0;  // the default class is fine under every policy
      EXPECT_TRUE((*engine)->AddRequest(r).ok());
    } else {
      EXPECT_TRUE(s.ok()) << SchedulingPolicyName(policy) << ": " << s;
    }
  }
}

TEST(FairPrefillEngineTest, RejectsNegativeBudgetOrAging) {
  EngineOptions o;
  o.num_kv_blocks = 512;
  o.step_time_budget_seconds = -1;
  EXPECT_EQ(LLMEngine::Create(std::make_unique<ChecksumModel>(), o).status().code(),
            absl::StatusCode::kInvalidArgument);
  o.step_time_budget_seconds = 0;
  o.prefill_aging = -5;
  EXPECT_EQ(LLMEngine::Create(std::make_unique<ChecksumModel>(), o).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// A decode worker's queue: a request whose KV transfer completed waits behind a head that does
// not fit (a preempted or failed-transfer sequence put in front). It runs on the KV it holds
// instead of being preempted for the head and recomputing KV that arrived intact.
TEST_F(SchedulerPolicyTest, TransferredKvRunsBehindAHeadThatDoesNotFit) {
  Scheduler s = Make(SchedulingPolicy::kFcfs, 512, /*blocks=*/10);
  auto make = [](const std::string& id, int prompt_len) {
    auto seq = std::make_unique<Sequence>();
    seq->request.request_id = id;
    seq->request.sampling.max_tokens = 100;
    for (int i = 0; i < prompt_len; ++i) seq->request.prompt_token_ids.push_back(3 + i % 50);
    seq->token_ids = seq->request.prompt_token_ids;
    return seq;
  };
  // "moved": 64 prompt tokens whose KV arrived (4 blocks), its first token from prefill.
  std::unique_ptr<Sequence> moved = make("moved", 64);
  ASSERT_TRUE(s.Reserve(moved, 64));
  s.Find("moved")->num_computed_tokens = 64;
  s.Find("moved")->AppendToken(7);
  ASSERT_TRUE(s.Activate("moved"));
  // "head": 150 tokens (10 blocks) to compute from scratch, queued in front of it.
  std::unique_ptr<Sequence> head = make("head", 150);
  ASSERT_TRUE(s.Reserve(head, 16));
  ASSERT_TRUE(s.ActivateForRecompute("head"));
  // The head cannot fit beside the 4 held blocks; "moved" decodes on its transferred KV.
  EXPECT_EQ(Step(s), (Plan{"moved:1"}));
  EXPECT_EQ(Step(s), (Plan{"moved:1"}));
  EXPECT_EQ(s.num_preemptions(), 0);
  EXPECT_EQ(s.Find("moved")->num_computed_tokens, 66);
  // Once it finishes, the head gets every block.
  s.Remove("moved");
  EXPECT_EQ(Step(s), (Plan{"head:150"}));
  EXPECT_EQ(s.num_preemptions(), 0);
}

// Nothing runs, the head does not fit, and the two requests queued behind it hold every block
// yet cannot take their next tokens: they are preempted for the head, and the plan says so
// (cause, blocks freed, tokens to recompute, whose tokens needed them).
TEST_F(SchedulerPolicyTest, HoldersBehindABlockedHeadArePreemptedWithTheirCause) {
  Scheduler s = Make(SchedulingPolicy::kFcfs, 512, /*blocks=*/8);
  auto make = [](const std::string& id, int prompt_len) {
    auto seq = std::make_unique<Sequence>();
    seq->request.request_id = id;
    seq->request.sampling.max_tokens = 100;
    for (int i = 0; i < prompt_len; ++i) seq->request.prompt_token_ids.push_back(3 + i % 50);
    seq->token_ids = seq->request.prompt_token_ids;
    return seq;
  };
  std::unique_ptr<Sequence> head = make("head", 100);  // 7 blocks to compute from scratch
  ASSERT_TRUE(s.Reserve(head, 0));
  for (const char* id : {"moved1", "moved2"}) {  // 64 transferred tokens each: 4 blocks
    std::unique_ptr<Sequence> moved = make(id, 64);
    ASSERT_TRUE(s.Reserve(moved, 64));
    s.Find(id)->num_computed_tokens = 64;
    s.Find(id)->AppendToken(7);  // the 65th token needs a 5th block
    ASSERT_TRUE(s.Activate(id));
  }
  ASSERT_TRUE(s.ActivateForRecompute("head"));
  ASSERT_EQ(s.allocator().num_free_blocks(), 0);
  const SchedulerOutput out = s.Schedule();
  ASSERT_EQ(out.scheduled.size(), 1u);
  EXPECT_EQ(out.scheduled[0].seq->request.request_id, "head");
  EXPECT_EQ(out.scheduled[0].num_new_tokens, 100);
  ASSERT_EQ(out.preempted.size(), 2u);
  for (size_t k = 0; k < 2; ++k) {
    const RecomputeEvent& e = out.preempted[k];
    EXPECT_EQ(e.request_id, k == 0 ? "moved2" : "moved1");  // queue order behind the head
    EXPECT_EQ(e.cause, RecomputeCause::kWaitingHeadBlocked);
    EXPECT_STREQ(RecomputeCauseName(e.cause), "waiting_head_blocked");
    EXPECT_EQ(e.num_blocks_freed, 4);
    EXPECT_EQ(e.num_tokens_to_recompute, 64);
    EXPECT_EQ(e.needed_by, "head");
  }
  EXPECT_EQ(s.num_preemptions(), 2);
  EXPECT_EQ(s.Find("moved1")->num_computed_tokens, 0);
}

}  // namespace
}  // namespace sluice
