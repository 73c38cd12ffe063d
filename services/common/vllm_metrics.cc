#include "services/common/vllm_metrics.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace sluice {
namespace {

using prometheus::FormatDouble;
using prometheus::Header;

}  // namespace

const char* FinishedReasonLabel(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kAbort:
      return "abort";
    default:
      return nullptr;
  }
}

std::string EscapeLabelValue(const std::string& value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    if (c == '\\' || c == '"') out += '\\';
    out += c;
  }
  return out;
}

std::vector<double> VllmMetrics::TtftBuckets() {
  return {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25,  0.5,   0.75,
          1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
}

std::vector<double> VllmMetrics::TpotBuckets() {
  return {0.01, 0.025, 0.05, 0.075, 0.1,  0.15, 0.2,  0.3,  0.4, 0.5,
          0.75, 1.0,   2.5,  5.0,   7.5,  10.0, 20.0, 40.0, 80.0};
}

std::vector<double> VllmMetrics::RequestLatencyBuckets() {
  return {0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,   5.0,   10.0,   15.0,  20.0,
          30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
}

VllmMetrics::VllmMetrics(std::string model_name)
    : labels_(absl::StrCat("model_name=\"", EscapeLabelValue(model_name), "\"")),
      ttft_(TtftBuckets()),
      itl_(TpotBuckets()),
      e2e_(RequestLatencyBuckets()),
      queue_(RequestLatencyBuckets()),
      prefill_(RequestLatencyBuckets()),
      decode_(RequestLatencyBuckets()),
      inference_(RequestLatencyBuckets()) {}

void VllmMetrics::set_model_name(const std::string& model_name) {
  std::lock_guard<std::mutex> lock(mu_);
  labels_ = absl::StrCat("model_name=\"", EscapeLabelValue(model_name), "\"");
}

void VllmMetrics::ObserveTimeToFirstToken(double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  ttft_.Observe(seconds);
}

void VllmMetrics::ObserveInterTokenLatency(double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  itl_.Observe(seconds);
}

void VllmMetrics::ObserveFinished(const FinishedRequest& request) {
  std::lock_guard<std::mutex> lock(mu_);
  prompt_tokens_ += request.num_prompt_tokens;
  generation_tokens_ += request.num_generation_tokens;
  switch (request.finish_reason) {
    case FinishReason::kStop:
      ++num_stop_;
      break;
    case FinishReason::kLength:
      ++num_length_;
      break;
    case FinishReason::kAbort:
      ++num_abort_;
      break;
    default:
      break;
  }
  if (request.e2e_seconds >= 0) e2e_.Observe(request.e2e_seconds);
  if (request.queue_seconds >= 0) queue_.Observe(request.queue_seconds);
  if (request.prefill_seconds >= 0) prefill_.Observe(request.prefill_seconds);
  if (request.decode_seconds >= 0) decode_.Observe(request.decode_seconds);
  if (request.prefill_seconds >= 0 || request.decode_seconds >= 0) {
    inference_.Observe(std::max(0.0, request.prefill_seconds) +
                       std::max(0.0, request.decode_seconds));
  }
}

void VllmMetrics::Render(const VllmGauges& gauges, std::string& out) const {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string sample = absl::StrCat("{", labels_, "} ");
  auto one = [&](const char* name, const char* type, const char* help, double value) {
    Header(out, name, type, help);
    absl::StrAppend(&out, name, sample, FormatDouble(value), "\n");
  };
  one("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.",
      gauges.num_requests_running);
  one("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.",
      gauges.num_requests_waiting);
  one("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.",
      gauges.kv_cache_usage);
  if (gauges.block_size > 0) {
    Header(out, "vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig");
    absl::StrAppend(&out, "vllm:cache_config_info{block_size=\"", gauges.block_size,
                    "\",num_gpu_blocks=\"", gauges.num_gpu_blocks, "\"} 1\n");
  }
  one("vllm:prefix_cache_queries_total", "counter",
      "Prefix cache queries, in terms of number of queried tokens.",
      static_cast<double>(gauges.prefix_cache_queries));
  one("vllm:prefix_cache_hits_total", "counter",
      "Prefix cache hits, in terms of number of cached tokens.",
      static_cast<double>(gauges.prefix_cache_hits));
  one("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.",
      static_cast<double>(prompt_tokens_));
  one("vllm:generation_tokens_total", "counter", "Number of generation tokens processed.",
      static_cast<double>(generation_tokens_));
  Header(out, "vllm:request_success_total", "counter",
         "Count of successfully processed requests.");
  for (auto [reason, count] : {std::pair<const char*, int64_t>{"stop", num_stop_},
                               {"length", num_length_},
                               {"abort", num_abort_}}) {
    absl::StrAppend(&out, "vllm:request_success_total{", labels_, ",finished_reason=\"", reason,
                    "\"} ", count, "\n");
  }
  auto histogram = [&](const char* name, const char* help, const Histogram& h) {
    Header(out, name, "histogram", help);
    h.Render(name, labels_, out);
  };
  histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
            ttft_);
  histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
            itl_);
  histogram("vllm:time_per_output_token_seconds",
            "Histogram of time per output token in seconds. DEPRECATED: Use "
            "vllm:inter_token_latency_seconds instead.",
            itl_);
  histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
            e2e_);
  histogram("vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.", queue_);
  histogram("vllm:request_inference_time_seconds",
            "Histogram of time spent in RUNNING phase for request.", inference_);
  histogram("vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.", prefill_);
  histogram("vllm:request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request.", decode_);
}

}  // namespace sluice
