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

  PlannerWorker prefill{"p0", PlannerPool::kPrefill, false, 2000, kBlockSize, {}, {}};
  PlannerWorker decode{"d0", PlannerPool::kDecode, false, kBlocks, kBlockSize, {}, {}};
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
  ASSERT_EQ(plans.size(), 2u);  // a text model without encoder workers: no encoder pool
  EXPECT_EQ(plans[0].explanation["ttft_budget_seconds"].get<double>(), 1.0);
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

// The encoder pool's offline answer: one Encode call per image request of `images` images, a
// share `hit` of them from the cache, within encode_share of the TTFT SLO (M/D/1).
int64_t OfflineEncoder(double rate, double images, double hit, TrueCost c, double budget) {
  const double s = c.fixed + c.per_token * images * (1 - hit);
  const double rho = 2 * (budget - s) / (2 * (budget - s) + s);
  return std::max<int64_t>(1, static_cast<int64_t>(std::ceil(rate * s / rho)));
}

TEST(PlannerTest, VisionReplayReachesOfflineReplicasForEveryPool) {
  // A vision-language deployment: every request carries 4 images; the encoders answer a quarter
  // of them from their embedding cache. Load steps from 2 to 8 requests/s at t = 120 s.
  const TrueCost prefill_cost{0.02, 0.0005};
  const TrueCost decode_cost{0.01, 0.0005};
  const TrueCost encode_cost{0.02, 0.1};  // per Encode call, per image encoded
  PlannerOptions options;
  options.slo.ttft_seconds = 1.0;
  options.slo.itl_seconds = 0.05;
  options.slo.encode_share = 0.4;
  options.window = absl::Seconds(60);
  options.encoder_pool = true;
  Planner planner(options);
  constexpr int64_t kPrompt = 1000, kCached = 200, kOutput = 400, kBlocks = 1000, kBlockSize = 16;
  constexpr int64_t kImages = 4;

  PlannerWorker prefill{"p0", PlannerPool::kPrefill, false, 2000, kBlockSize, {}, {}};
  PlannerWorker decode{"d0", PlannerPool::kDecode, false, kBlocks, kBlockSize, {}, {}};
  PlannerWorker encoder{"e0", PlannerPool::kEncoder, false, 0, 0, {}, {}};
  PlannerWorker encoder2{"e1", PlannerPool::kEncoder, false, 0, 0, {}, {}};
  const absl::Time t0 = absl::FromUnixSeconds(1700000000);
  std::vector<std::pair<double, std::vector<int64_t>>> seen;  // (t, desired per pool)
  int64_t heartbeat = 0;
  for (int64_t ms = 0; ms < 240000; ms += 125) {
    const double t = ms / 1000.0;
    const int64_t every_ms = t < 120 ? 500 : 125;
    const absl::Time now = t0 + absl::Milliseconds(ms);
    if (ms % every_ms == 0) {
      planner.ObserveImageRequest(now, kImages);
      planner.ObserveRequest(now + absl::Milliseconds(100), kPrompt, kCached, kOutput);
    }
    if (ms % 10000 == 0) {
      const bool odd = (heartbeat++ % 2) == 1;
      Accumulate(prefill.prefill_steps, Steps(prefill_cost, odd ? 5 : 10, odd ? 300 : 800));
      Accumulate(decode.decode_steps, Steps(decode_cost, odd ? 40 : 100, odd ? 3 : 11));
      // Two encoders: 10 calls of 4 images each per report, all encoded by one, half by the
      // other (its cache answers the rest): a 25 % hit rate, and calls that vary in images
      // encoded so the fit splits the per-call and per-image cost.
      Accumulate(encoder.encode_steps, Steps(encode_cost, 10, 4));
      Accumulate(encoder2.encode_steps, Steps(encode_cost, 10, 2));
      encoder.num_images_answered += 10 * kImages;
      encoder2.num_images_answered += 10 * kImages;
      const std::vector<PoolPlan> plans = planner.Plan({prefill, decode, encoder, encoder2}, now);
      seen.push_back({t, {plans[0].desired_replicas, plans[1].desired_replicas,
                          plans[2].desired_replicas}});
    }
  }
  // The offline answer at the windowed rate (the same calculation as the replay above).
  auto offline = [&](double rate) {
    return std::vector<int64_t>{
        OfflinePrefill(rate, kPrompt, kCached, prefill_cost, 0.6 /* (1 - 0.4) x 1 s */),
        OfflineDecode(rate, kPrompt, kOutput, decode_cost, 0.05, kBlocks, kBlockSize),
        OfflineEncoder(rate, kImages, 0.25, encode_cost, 0.4 /* 0.4 x 1 s */)};
  };
  // SLUICE_PLANNER_VISION_TRACE_CSV=path: the replay as CSV (bench/planner_replay_plot.py).
  if (const char* path = std::getenv("SLUICE_PLANNER_VISION_TRACE_CSV")) {
    std::ofstream csv(path);
    csv << "t_seconds,arrival_rate,desired_prefill,desired_decode,desired_encoder,"
           "offline_prefill,offline_decode,offline_encoder\n";
    for (const auto& [when, desired] : seen) {
      const double lo = std::max(0.0, when - 60.0);
      const double slow = std::max(0.0, std::min(when, 120.0) - lo);
      const double fast = std::max(0.0, when - std::max(lo, 120.0));
      const double span = std::min(60.0, when);
      const double rate = span > 0 ? (2 * slow + 8 * fast) / span : 0.0;
      const std::vector<int64_t> want = rate > 0 ? offline(rate) : std::vector<int64_t>{0, 0, 0};
      csv << when << "," << rate << "," << desired[0] << "," << desired[1] << "," << desired[2]
          << "," << want[0] << "," << want[1] << "," << want[2] << "\n";
    }
  }
  auto at = [&](double t) {
    for (const auto& [when, desired] : seen) {
      if (when == t) return desired;
    }
    ADD_FAILURE() << "no plan at " << t;
    return std::vector<int64_t>{0, 0, 0};
  };
  // Encoder: S = 0.02 + 0.1 x 4 x 0.75 = 0.32 s within 0.4 s: rho_max = 1/3, so 2 requests/s
  // need ceil(0.64 x 3) = 2 encoders and 8 requests/s ceil(2.56 x 3) = 8. Prefill within 0.6 s:
  // S = 0.42 s, rho_max = 0.4615: 2 and 8 (7.28) replicas, where the whole 1 s gave 2 and 5.
  EXPECT_EQ(offline(2), (std::vector<int64_t>{2, 2, 2}));
  EXPECT_EQ(offline(8), (std::vector<int64_t>{8, 5, 8}));
  EXPECT_EQ(at(110), offline(2));
  EXPECT_EQ(at(230), offline(8));
  const std::vector<int64_t> mid = at(150);
  EXPECT_GT(mid[2], 2);
  EXPECT_LE(mid[2], 8);

  // The last image request arrived at 239.875 s: the window then holds 60 s at 8/s.
  const std::vector<PoolPlan> plans =
      planner.Plan({prefill, decode, encoder, encoder2}, t0 + absl::Milliseconds(239875));
  ASSERT_EQ(plans.size(), 3u);
  const PoolPlan& e = plans[2];
  EXPECT_EQ(e.pool, "encoder");
  EXPECT_EQ(e.current_replicas, 2);
  EXPECT_EQ(e.desired_replicas, 8);
  EXPECT_NEAR(e.explanation["cost_model"]["fixed_seconds"].get<double>(), 0.02, 1e-9);
  EXPECT_NEAR(e.explanation["cost_model"]["per_token_seconds"].get<double>(), 0.1, 1e-9);
  EXPECT_NEAR(e.explanation["cache_hit_rate"].get<double>(), 0.25, 1e-12);
  EXPECT_NEAR(e.explanation["workload"]["image_request_rate_rps"].get<double>(), 8, 1e-9);
  EXPECT_EQ(e.explanation["workload"]["mean_images_per_image_request"].get<double>(), 4.0);
  EXPECT_NEAR(e.explanation["encode_seconds_per_request"].get<double>(), 0.32, 1e-9);
  EXPECT_NEAR(e.explanation["ttft_budget_seconds"].get<double>(), 0.4, 1e-12);
  EXPECT_NEAR(plans[0].explanation["ttft_budget_seconds"].get<double>(), 0.6, 1e-12);
  const std::string metrics = Planner::RenderMetrics(plans);
  EXPECT_NE(metrics.find("sluice_planner_desired_replicas{pool=\"encoder\"} 8\n"),
            std::string::npos)
      << metrics;
  EXPECT_NE(metrics.find("sluice_planner_current_replicas{pool=\"encoder\"} 2\n"),
            std::string::npos);
  const nlohmann::json page = planner.Json(plans, t0 + absl::Milliseconds(239875));
  EXPECT_EQ(page["slo"]["encode_share"].get<double>(), 0.4);
  EXPECT_EQ(page["pools"][2]["pool"], "encoder");
}

TEST(PlannerTest, EncoderPoolWithoutImagesOrEncoders) {
  PlannerOptions options;
  options.encoder_pool = true;
  const absl::Time t0 = absl::FromUnixSeconds(1700000000);
  {
    // A vision model with no encoder worker yet: no cost model, keep the current count (none),
    // raised to the minimum.
    Planner planner(options);
    planner.ObserveImageRequest(t0, 2);
    const std::vector<PoolPlan> plans = planner.Plan({}, t0 + absl::Seconds(1));
    ASSERT_EQ(plans.size(), 3u);
    EXPECT_EQ(plans[2].pool, "encoder");
    EXPECT_EQ(plans[2].current_replicas, 0);
    EXPECT_EQ(plans[2].desired_replicas, 1);
    EXPECT_NE(plans[2].explanation["note"].get<std::string>().find("no cost model"),
              std::string::npos);
  }
  {
    // Encoders reporting calls but no image request in the window: the minimum.
    Planner planner(options);
    PlannerWorker encoder{"e0", PlannerPool::kEncoder, false, 0, 0, {}, {}};
    encoder.encode_steps = StepTotals{10, 20, 1.0};
    encoder.num_images_answered = 20;
    PlannerWorker encoder2 = encoder;
    encoder2.worker_id = "e1";
    planner.ObserveRequest(t0, 100, 0, 10);
    const std::vector<PoolPlan> plans = planner.Plan({encoder, encoder2}, t0 + absl::Seconds(5));
    EXPECT_EQ(plans[2].current_replicas, 2);
    EXPECT_EQ(plans[2].desired_replicas, 1);
    EXPECT_EQ(plans[2].explanation["workload"]["image_requests_in_window"].get<int64_t>(), 0);
  }
  {
    // Encoder workers registered for a model the router did not flag: planned all the same.
    Planner planner(PlannerOptions{});
    PlannerWorker encoder{"e0", PlannerPool::kEncoder, false, 0, 0, {}, {}};
    ASSERT_EQ(planner.Plan({encoder}, t0).size(), 3u);
    EXPECT_EQ(planner.Plan({}, t0).size(), 2u);
  }
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
