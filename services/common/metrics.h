// ApiMetrics: the OpenAI front end's Prometheus metrics (text exposition format 0.0.4).
//
// Names carry the `sluice_` prefix and base units (seconds, tokens); counters end in `_total`;
// latencies are histograms with cumulative `le` buckets, `_sum` and `_count`. Engine load
// (waiting/running requests, KV blocks) comes from InferenceBackend::Stats() at scrape time.
// Thread-safe.
#ifndef SLUICE_SERVICES_COMMON_METRICS_H_
#define SLUICE_SERVICES_COMMON_METRICS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "services/common/backend_stats.h"

namespace sluice {
struct FinishedRequest;
class VllmMetrics;
}  // namespace sluice

namespace sluice {

// Histogram accumulates observations into fixed upper bounds (seconds). Not thread-safe.
class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void Observe(double value);
  // Render appends the `_bucket`, `_sum` and `_count` lines of metric `name`; `labels` (e.g.
  // `model_name="m"`, already escaped) go on every sample, before `le`.
  void Render(const std::string& name, std::string& out) const { Render(name, "", out); }
  void Render(const std::string& name, const std::string& labels, std::string& out) const;

 private:
  std::vector<double> upper_bounds_;
  std::vector<uint64_t> counts_;  // per bucket, not cumulative; last = +Inf
  double sum_ = 0.0;
  uint64_t count_ = 0;
};

// Exposition helpers, shared with the prefill/decode workers' /metrics
// (services/common/worker_metrics.h).
namespace prometheus {
// FormatDouble: the shortest text that reads back as exactly `v` ("+Inf" for infinity).
std::string FormatDouble(double v);
// Header appends the `# HELP` and `# TYPE` lines of metric `name` (type: "gauge", ...).
void Header(std::string& out, const std::string& name, const char* type, const char* help);
// Gauge / Counter append a whole unlabelled metric: header and one sample.
void Gauge(std::string& out, const std::string& name, const char* help, double value);
void Counter(std::string& out, const std::string& name, const char* help, double value);
// Histogram bounds (seconds) for time to first token and inter-token latency (vLLM's choices).
std::vector<double> TtftBuckets();
std::vector<double> ItlBuckets();
}  // namespace prometheus

// AppendPreemptions appends sluice_preemptions_total{cause}: `total` preemptions, of which
// `waiting_head` for a blocked waiting head (cause "waiting_head_blocked"; the rest
// "out_of_kv_blocks": RecomputeCauseName). Shared by serve and the workers.
void AppendPreemptions(std::string& out, int64_t total, int64_t waiting_head);

// RecomputeCounts: recomputes by the `cause` of their `recompute` log line
// (services/common/recompute_log.h).
struct RecomputeCounts {
  int64_t num_preemptions = 0;               // every preemption cause
  int64_t num_preemptions_waiting_head = 0;  // of those, waiting_head_blocked
  int64_t num_swa_replay_failed = 0;         // a transfer's sliding-window replay failed
  int64_t num_kvstore_swa_replay_failed = 0;  // a kvstore load's sliding-window replay failed
  // A decode worker's transfer reasons (pin_gone, ...: RecomputeReasonName) and their counts;
  // empty elsewhere.
  std::vector<std::pair<std::string, int64_t>> transfer_reasons;
};
// AppendRecomputes appends sluice_recomputes_total{cause}: every recompute, one sample per cause
// (zeros included), so the samples sum to the `recompute` log lines. Shared by serve and the
// workers.
void AppendRecomputes(std::string& out, const RecomputeCounts& counts);

// Besides the sluice_ families, ApiMetrics renders the vllm: ones (services/common/vllm_metrics.h)
// from the same observations, labelled with the served model name.
class ApiMetrics {
 public:
  ApiMetrics();
  ~ApiMetrics();
  // set_model_name: the vllm: families' `model_name` label; call before serving.
  void set_model_name(const std::string& model_name);

  // ObserveRequest counts one finished HTTP request by endpoint path and status code.
  void ObserveRequest(const std::string& endpoint, int status);
  void ObserveTimeToFirstToken(double seconds);
  void ObserveInterTokenLatency(double seconds);
  void ObserveE2eLatency(double seconds);
  void AddTokens(int64_t num_prompt_tokens, int64_t num_generation_tokens);
  // ObserveFinished: a choice ended (its e2e latency, tokens, finish reason and phases);
  // replaces ObserveE2eLatency + AddTokens.
  void ObserveFinished(const FinishedRequest& request);
  // set_finished_observer: also hand every FinishedRequest to `observer` (the router's planner);
  // call before serving. `observer` must be thread-safe.
  void set_finished_observer(std::function<void(const FinishedRequest&)> observer) {
    finished_observer_ = std::move(observer);
  }
  void SetInFlight(int64_t num_requests);

  // Render returns the whole exposition, with `stats` as the engine gauges.
  std::string Render(const BackendStats& stats) const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;  // (endpoint, status) → count
  Histogram ttft_;
  Histogram itl_;
  Histogram e2e_;
  int64_t prompt_tokens_ = 0;
  int64_t generation_tokens_ = 0;
  int64_t in_flight_ = 0;
  std::unique_ptr<VllmMetrics> vllm_;
  std::function<void(const FinishedRequest&)> finished_observer_;
};

}  // namespace sluice

#endif  // SLUICE_SERVICES_COMMON_METRICS_H_
