// VllmMetrics: vLLM's family names, label sets and bucket bounds; counts and sums of known
// observations; label escaping.
#include "services/common/vllm_metrics.h"

#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace sluice {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(VllmMetricsTest, BucketsAreVllms) {
  // vllm/v1/metrics/loggers.py: 22 TTFT bounds, 19 per-token, 21 request-latency bounds.
  EXPECT_EQ(VllmMetrics::TtftBuckets().size(), 22u);
  EXPECT_EQ(VllmMetrics::TtftBuckets().back(), 2560.0);
  EXPECT_EQ(VllmMetrics::TpotBuckets().size(), 19u);
  EXPECT_EQ(VllmMetrics::TpotBuckets().front(), 0.01);
  EXPECT_EQ(VllmMetrics::RequestLatencyBuckets().size(), 21u);
  EXPECT_EQ(VllmMetrics::RequestLatencyBuckets().back(), 7680.0);
}

TEST(VllmMetricsTest, RendersObservations) {
  VllmMetrics metrics("m");
  metrics.ObserveTimeToFirstToken(0.03125);
  metrics.ObserveTimeToFirstToken(3.0);
  metrics.ObserveInterTokenLatency(0.02);
  FinishedRequest a;
  a.finish_reason = FinishReason::kStop;
  a.num_prompt_tokens = 10;
  a.num_generation_tokens = 4;
  a.e2e_seconds = 1.25;
  a.queue_seconds = 0.25;
  a.prefill_seconds = 0.5;
  a.decode_seconds = 0.5;
  metrics.ObserveFinished(a);
  FinishedRequest b;  // a prefill worker's view: no decode phase
  b.finish_reason = FinishReason::kLength;
  b.num_prompt_tokens = 7;
  b.num_generation_tokens = 1;
  b.e2e_seconds = 0.5;
  b.queue_seconds = 0.125;
  b.prefill_seconds = 0.25;
  metrics.ObserveFinished(b);
  FinishedRequest c;  // an error: tokens counted, not a success
  c.finish_reason = FinishReason::kError;
  c.num_prompt_tokens = 5;
  metrics.ObserveFinished(c);
  FinishedRequest d;
  d.finish_reason = FinishReason::kAbort;
  metrics.ObserveFinished(d);

  VllmGauges gauges;
  gauges.num_requests_waiting = 2;
  gauges.num_requests_running = 3;
  gauges.kv_cache_usage = 0.5;
  gauges.block_size = 16;
  gauges.num_gpu_blocks = 64;
  gauges.prefix_cache_queries = 32;
  gauges.prefix_cache_hits = 16;
  std::string out;
  metrics.Render(gauges, out);

  EXPECT_THAT(out, HasSubstr("# TYPE vllm:num_requests_waiting gauge\n"
                             "vllm:num_requests_waiting{model_name=\"m\"} 2\n"));
  EXPECT_THAT(out, HasSubstr("vllm:num_requests_running{model_name=\"m\"} 3\n"));
  EXPECT_THAT(out, HasSubstr("vllm:kv_cache_usage_perc{model_name=\"m\"} 0.5\n"));
  EXPECT_THAT(out, HasSubstr("vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"64\"} 1\n"));
  EXPECT_THAT(out, HasSubstr("vllm:prefix_cache_queries_total{model_name=\"m\"} 32\n"));
  EXPECT_THAT(out, HasSubstr("vllm:prefix_cache_hits_total{model_name=\"m\"} 16\n"));
  EXPECT_THAT(out, HasSubstr("# TYPE vllm:prompt_tokens_total counter\n"
                             "vllm:prompt_tokens_total{model_name=\"m\"} 22\n"));
  EXPECT_THAT(out, HasSubstr("vllm:generation_tokens_total{model_name=\"m\"} 5\n"));
  EXPECT_THAT(out, HasSubstr("vllm:request_success_total{model_name=\"m\",finished_reason=\"stop\"} 1\n"
                             "vllm:request_success_total{model_name=\"m\",finished_reason=\"length\"} 1\n"
                             "vllm:request_success_total{model_name=\"m\",finished_reason=\"abort\"} 1\n"));
  // TTFT 0.03125 s and 3 s: cumulative buckets.
  EXPECT_THAT(out, HasSubstr("vllm:time_to_first_token_seconds_bucket{model_name=\"m\",le=\"0.02\"} 0\n"
                             "vllm:time_to_first_token_seconds_bucket{model_name=\"m\",le=\"0.04\"} 1\n"));
  EXPECT_THAT(out, HasSubstr("vllm:time_to_first_token_seconds_bucket{model_name=\"m\",le=\"2.5\"} 1\n"
                             "vllm:time_to_first_token_seconds_bucket{model_name=\"m\",le=\"5\"} 2\n"));
  EXPECT_THAT(out, HasSubstr("vllm:time_to_first_token_seconds_bucket{model_name=\"m\",le=\"+Inf\"} 2\n"
                             "vllm:time_to_first_token_seconds_sum{model_name=\"m\"} 3.03125\n"
                             "vllm:time_to_first_token_seconds_count{model_name=\"m\"} 2\n"));
  // The deprecated name carries the same observations.
  EXPECT_THAT(out, HasSubstr("vllm:inter_token_latency_seconds_bucket{model_name=\"m\",le=\"0.025\"} 1\n"));
  EXPECT_THAT(out, HasSubstr("vllm:time_per_output_token_seconds_count{model_name=\"m\"} 1\n"));
  // Phases: only what was observed (b has no decode phase; c and d none).
  EXPECT_THAT(out, HasSubstr("vllm:e2e_request_latency_seconds_sum{model_name=\"m\"} 1.75\n"
                             "vllm:e2e_request_latency_seconds_count{model_name=\"m\"} 2\n"));
  EXPECT_THAT(out, HasSubstr("vllm:request_queue_time_seconds_sum{model_name=\"m\"} 0.375\n"));
  EXPECT_THAT(out, HasSubstr("vllm:request_prefill_time_seconds_sum{model_name=\"m\"} 0.75\n"
                             "vllm:request_prefill_time_seconds_count{model_name=\"m\"} 2\n"));
  EXPECT_THAT(out, HasSubstr("vllm:request_decode_time_seconds_count{model_name=\"m\"} 1\n"));
  EXPECT_THAT(out, HasSubstr("vllm:request_inference_time_seconds_sum{model_name=\"m\"} 1.25\n"
                             "vllm:request_inference_time_seconds_count{model_name=\"m\"} 2\n"));
  EXPECT_THAT(out, HasSubstr("vllm:request_decode_time_seconds_bucket{model_name=\"m\",le=\"0.5\"} 1\n"));
}

TEST(VllmMetricsTest, ModelNameIsEscaped) {
  VllmMetrics metrics;
  metrics.set_model_name("org/a\"b\\c\nd");
  std::string out;
  metrics.Render(VllmGauges{}, out);
  EXPECT_THAT(out, HasSubstr("vllm:num_requests_running{model_name=\"org/a\\\"b\\\\c\\nd\"} 0\n"));
  // Without a block size the cache config family is left out.
  EXPECT_THAT(out, Not(HasSubstr("vllm:cache_config_info")));
}

}  // namespace
}  // namespace sluice
