// VllmMetrics: the metric families Kubernetes inference gateways, autoscalers and dashboards
// read from a vLLM server, exported under vLLM's names beside our `sluice_` ones, by every pod
// that serves (`sluice serve`, the router, prefill and decode workers).
//
// Names, types, labels and histogram buckets follow vLLM's v1 Prometheus logger
// (vllm/v1/metrics/loggers.py): every family carries `model_name` (the served model name);
// vllm:request_success_total adds `finished_reason` ("stop", "length", "abort"). No label holds
// request data. vllm:kv_cache_usage_perc is a 0-1 fraction despite its name (as in vLLM). The
// Gateway API Inference Extension's model server protocol (kubernetes-sigs/gateway-api-inference-
// extension, docs/proposals/003-model-server-protocol) routes on vllm:num_requests_waiting,
// vllm:num_requests_running, vllm:kv_cache_usage_perc and vllm:cache_config_info's block_size /
// num_gpu_blocks labels.
// vllm:time_per_output_token_seconds is vLLM's deprecated name of the inter-token latency
// histogram, still read by older dashboards; it carries the same observations.
//
// Request phases (as vLLM defines them): queue = arrival at the engine -> first scheduled;
// prefill = first scheduled -> first token; decode = first token -> last token;
// inference = prefill + decode; e2e = arrival at this pod -> last output. A pod observes the
// phases it runs: a prefill worker has no decode phase, a decode worker's queue includes the wait
// for the KV transfer (its request is not schedulable before).
//
// `promtool check metrics` reports the ':' in these names (a recording-rule convention); vLLM's
// own exposition has the same finding. Thread-safe.
#ifndef SLUICE_SERVICES_COMMON_VLLM_METRICS_H_
#define SLUICE_SERVICES_COMMON_VLLM_METRICS_H_

#include <cstdint>
#include <mutex>
#include <string>

#include "engine/sched/request.h"
#include "services/common/metrics.h"

namespace sluice {

// FinishedRequest: one request's end, as one pod saw it. Seconds; a negative phase was not
// observed here and is not recorded.
struct FinishedRequest {
  FinishReason finish_reason = FinishReason::kStop;  // kError is not counted as a success
  int64_t num_prompt_tokens = 0;
  int64_t num_generation_tokens = 0;
  int64_t num_cached_tokens = 0;  // prompt tokens served from a prefix cache (not a vllm: family)
  double e2e_seconds = -1;
  double queue_seconds = -1;
  double prefill_seconds = -1;
  double decode_seconds = -1;
};

// VllmGauges: scrape-time load of the pod.
struct VllmGauges {
  double num_requests_waiting = 0;
  double num_requests_running = 0;
  double kv_cache_usage = 0;  // 0 to 1
  int64_t block_size = 0;     // vllm:cache_config_info labels; 0: the family is left out
  int64_t num_gpu_blocks = 0;
  int64_t prefix_cache_queries = 0;  // tokens looked up in the prefix cache (counter)
  int64_t prefix_cache_hits = 0;     // tokens found there (counter)
};

class VllmMetrics {
 public:
  explicit VllmMetrics(std::string model_name = "");
  // set_model_name: the `model_name` label value; call before the first scrape.
  void set_model_name(const std::string& model_name);

  void ObserveTimeToFirstToken(double seconds);
  void ObserveInterTokenLatency(double seconds);
  // ObserveFinished counts tokens and the finish reason, and records the phases given.
  void ObserveFinished(const FinishedRequest& request);

  // Render appends every vllm: family.
  void Render(const VllmGauges& gauges, std::string& out) const;

  // Bucket bounds (seconds), vLLM's.
  static std::vector<double> TtftBuckets();
  static std::vector<double> TpotBuckets();  // inter-token latency and its deprecated name
  static std::vector<double> RequestLatencyBuckets();  // e2e, queue, prefill, decode, inference

 private:
  mutable std::mutex mu_;
  std::string labels_;  // `model_name="..."`, escaped
  Histogram ttft_;
  Histogram itl_;
  Histogram e2e_;
  Histogram queue_;
  Histogram prefill_;
  Histogram decode_;
  Histogram inference_;
  int64_t prompt_tokens_ = 0;
  int64_t generation_tokens_ = 0;
  int64_t num_stop_ = 0;
  int64_t num_length_ = 0;
  int64_t num_abort_ = 0;
};

// FinishedReasonLabel: the `finished_reason` label value of a finish reason ("stop", "length",
// "abort"); nullptr for kNone and kError (not a success).
const char* FinishedReasonLabel(FinishReason reason);

// EscapeLabelValue escapes a label value per the text format (backslash, double quote, newline).
std::string EscapeLabelValue(const std::string& value);

}  // namespace sluice

#endif  // SLUICE_SERVICES_COMMON_VLLM_METRICS_H_
