// Planner: the step cost fit recovers the workers' cost model; a replayed step change of load
// moves the desired replicas to what an offline calculation with the same cost model gives.
#include "services/router/planner.h"

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <vector>

#include <gtest/gtest.h>

namespace sluice {
namespace {

struct TrueCost {
  double fixed, per_token;
};

// Increment of `steps` steps of `tokens_per_step` tokens each under `cost`.
StepTotals Steps(const TrueCost& cost, int64_t steps, int64_t tokens_per_step) {
  return StepTotals{steps, steps * tokens_per_step,
                    static_cast<double>(steps) * (cost.fixed + cost.per_token * tokens_per_step)};
}

void Accumulate(StepTotals& total, const StepTotals& d) {
  total.num_steps += d.num_steps;
  total.num_tokens += d.num_tokens;
  total.seconds += d.seconds;
}

TEST(StepCostFitTest, RecoversFixedAndPerTokenCost) {
  const TrueCost cost{0.02, 0.0005};
  StepCostFit fit;
  fit.Add(Steps(cost, 10, 800));
  fit.Add(Steps(cost, 5, 300));
  fit.Add(Steps(cost, 7, 1024));
  const StepCost c = fit.Fit();
  EXPECT_EQ(c.num_steps, 22);
  EXPECT_NEAR(c.fixed_seconds, 0.02, 1e-9);
  EXPECT_NEAR(c.per_token_seconds, 0.0005, 1e-12);
}

TEST(StepCostFitTest, UnidentifiedSplitChargesEverythingPerToken) {
  StepCostFit fit;
  fit.Add(Steps({0.01, 0.001}, 4, 100));  // one tokens-per-step ratio: no split
  const StepCost c = fit.Fit();
  EXPECT_EQ(c.fixed_seconds, 0.0);
  EXPECT_NEAR(c.per_token_seconds, 0.11 / 100, 1e-12);
  EXPECT_EQ(StepCostFit().Fit().num_steps, 0);
}

// The offline calculation, written out for the numbers below.
int64_t OfflinePrefill(double rate, double prompt, double cached, TrueCost c, double slo_ttft) {
  const double s = c.fixed + c.per_token * (prompt - cached);
  const double rho = 2 * (slo_ttft - s) / (2 * (slo_ttft - s) + s);
  return std::max<int64_t>(1, static_cast<int64_t>(std::ceil(rate * s / rho)));
}
int64_t OfflineDecode(double rate, double prompt, double output, TrueCost c, double slo_itl,
                      int64_t blocks, int64_t block_size) {
  const double b_slo = std::floor((slo_itl - c.fixed) / c.per_token);
  const double b_kv = std::floor(blocks / std::ceil((prompt + output) / block_size));
  const double b = std::min(b_slo, b_kv);
  return std::max<int64_t>(
      1, static_cast<int64_t>(std::ceil(rate * output * (c.fixed + c.per_token * b) / b)));
}

TEST(PlannerTest, ReplayedStepChangeReachesOfflineReplicas) {
  const TrueCost prefill_cost{0.02, 0.0005};
  const TrueCost decode_cost{0.01, 0.0005};
  PlannerOptions options;
  options.slo.ttft_seconds = 1.0;
  options.slo.itl_seconds = 0.05;
  options.window = absl::Seconds(60);
  Planner planner(options);
  constexpr int64_t kPrompt = 1000, kCached = 200, kOutput = 400, kBlocks = 1000, kBlockSize = 16;

  PlannerWorker prefill{"p0", true, false, 2000, kBlockSize, {}, {}};
  PlannerWorker decode{"d0", false, false, kBlocks, kBlockSize, {}, {}};
  const absl::Time t0 = absl::FromUnixSeconds(1700000000);
  // Replay: 2 requests/s for 120 s, then 8 requests/s for 120 s. Workers report their step
  // totals every 10 s; their steps vary in size so the fit can split fixed and per-token cost.
  std::vector<std::pair<double, std::vector<int64_t>>> seen;  // (t, desired prefill/decode)
  int64_t heartbeat = 0;
  for (int64_t ms = 0; ms < 240000; ms += 125) {
    const double t = ms / 1000.0;
    const int64_t every_ms = t < 120 ? 500 : 125;
    const absl::Time now = t0 + absl::Milliseconds(ms);
    if (ms % every_ms == 0) planner.ObserveRequest(now, kPrompt, kCached, kOutput);
    if (ms % 10000 == 0) {
      const bool odd = (heartbeat++ % 2) == 1;
      Accumulate(prefill.prefill_steps, Steps(prefill_cost, odd ? 5 : 10, odd ? 300 : 800));
      Accumulate(decode.decode_steps, Steps(decode_cost, odd ? 40 : 100, odd ? 3 : 11));
      const std::vector<PoolPlan> plans = planner.Plan({prefill, decode}, now);
      seen.push_back({t, {plans[0].desired_replicas, plans[1].desired_replicas}});
    }
  }
  // SLUICE_PLANNER_TRACE_CSV=path: the replay as CSV (bench/planner_replay_plot.py plots it).
  if (const char* path = std::getenv("SLUICE_PLANNER_TRACE_CSV")) {
    std::ofstream csv(path);
    csv << "t_seconds,arrival_rate,desired_prefill,desired_decode,offline_prefill,offline_decode\n";
    for (const auto& [when, desired] : seen) {
      // The offline answer for the rate the window holds at `when`.
      const double lo = std::max(0.0, when - 60.0);
      const double slow = std::max(0.0, std::min(when, 120.0) - lo);
      const double fast = std::max(0.0, when - std::max(lo, 120.0));
      const double span = std::min(60.0, when);
      const double rate = span > 0 ? (2 * slow + 8 * fast) / span : 0.0;
      csv << when << "," << rate << "," << desired[0] << "," << desired[1] << ","
          << (rate > 0 ? OfflinePrefill(rate, kPrompt, kCached, prefill_cost, 1.0) : 0) << ","
          << (rate > 0 ? OfflineDecode(rate, kPrompt, kOutput, decode_cost, 0.05, kBlocks,
                                       kBlockSize)
                       : 0)
          << "\n";
    }
  }
  auto at = [&](double t) {
    for (const auto& [when, desired] : seen) {
      if (when == t) return desired;
    }
    ADD_FAILURE() << "no plan at " << t;
    return std::vector<int64_t>{0, 0};
  };
  const int64_t low_prefill = OfflinePrefill(2, kPrompt, kCached, prefill_cost, 1.0);
  const int64_t high_prefill = OfflinePrefill(8, kPrompt, kCached, prefill_cost, 1.0);
  const int64_t low_decode =
      OfflineDecode(2, kPrompt, kOutput, decode_cost, 0.05, kBlocks, kBlockSize);
  const int64_t high_decode =
      OfflineDecode(8, kPrompt, kOutput, decode_cost, 0.05, kBlocks, kBlockSize);
  // The numbers the formulas give here (S = 0.42 s, rho_max = 0.734; B = min(80, 11)).
  EXPECT_EQ(low_prefill, 2);
  EXPECT_EQ(high_prefill, 5);
  EXPECT_EQ(low_decode, 2);
  EXPECT_EQ(high_decode, 5);
  // Steady state before the step (window fully at 2/s) and after it (fully at 8/s).
  EXPECT_EQ(at(110), (std::vector<int64_t>{low_prefill, low_decode}));
  EXPECT_EQ(at(230), (std::vector<int64_t>{high_prefill, high_decode}));
  // Halfway through the window after the step: in between.
  const std::vector<int64_t> mid = at(150);
  EXPECT_GT(mid[0], low_prefill);
  EXPECT_LE(mid[0], high_prefill);
  // The plan explains itself with the fitted cost model.
  const std::vector<PoolPlan> plans = planner.Plan({prefill, decode}, t0 + absl::Seconds(235));
  EXPECT_NEAR(plans[0].explanation["cost_model"]["fixed_seconds"].get<double>(), 0.02, 1e-9);
  EXPECT_NEAR(plans[1].explanation["cost_model"]["per_token_seconds"].get<double>(), 0.0005,
              1e-12);
  EXPECT_NEAR(plans[0].explanation["workload"]["prefix_hit_rate"].get<double>(), 0.2, 1e-12);
  EXPECT_EQ(plans[1].explanation["batch_per_replica"].get<double>(), 11.0);
  EXPECT_EQ(plans[0].current_replicas, 1);
  const std::string metrics = Planner::RenderMetrics(plans);
  EXPECT_NE(metrics.find("sluice_planner_desired_replicas{pool=\"prefill\"} 5\n"),
            std::string::npos)
      << metrics;
  EXPECT_NE(metrics.find("sluice_planner_desired_replicas{pool=\"decode\"} 5\n"),
            std::string::npos);
}

TEST(PlannerTest, InfeasibleSloAndUnknownCost) {
  Workload load;
  load.arrival_rate = 4;
  load.mean_prompt_tokens = 2000;
  load.mean_output_tokens = 100;
  PlannerSlo slo{0.5, 0.02};
  // One prefill takes 1.02 s > 0.5 s: replicas only keep up, ceil(4 * 1.02) = 5.
  const PoolPlan p = PlanPrefill(load, StepCost{0.02, 0.0005, 10}, slo, 2, 1);
  EXPECT_EQ(p.desired_replicas, 5);
  EXPECT_FALSE(p.explanation["slo_feasible"].get<bool>());
  // Decode step floor (fixed) over the ITL SLO: batch 1.
  const PoolPlan d = PlanDecode(load, StepCost{0.03, 0.001, 10}, slo, 0, 16, 1, 1);
  EXPECT_FALSE(d.explanation["slo_feasible"].get<bool>());
  EXPECT_EQ(d.desired_replicas, static_cast<int64_t>(std::ceil(4 * 100 * 0.031)));
  // No steps reported yet: keep the current count.
  EXPECT_EQ(PlanPrefill(load, StepCost{}, slo, 3, 1).desired_replicas, 3);
}

}  // namespace
}  // namespace sluice
