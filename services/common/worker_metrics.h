// WorkerMetrics: the Prometheus metrics (text exposition format 0.0.4) of a prefill or decode
// worker, served on its HTTP port (`--http-port`, GET /metrics; see worker_http.h).
//
// Names carry the `sluice_` prefix and base units (seconds, bytes); counters end in `_total`;
// latencies are histograms. Engine load comes from AsyncEngineStats and transfer byte counts from
// the UCX agent's KvTransferStats at scrape time; request-level latencies are observed by the
// services. Besides our own names, the families Kubernetes inference gateways and dashboards read
// are exported under vLLM's names (services/common/vllm_metrics.h). Thread-safe.
#ifndef SLUICE_SERVICES_COMMON_WORKER_METRICS_H_
#define SLUICE_SERVICES_COMMON_WORKER_METRICS_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "engine/sched/async_engine.h"
#include "services/common/metrics.h"
#include "services/common/vllm_metrics.h"
#include "transfer/kv_transfer.h"
#include "transfer/staged_transfer.h"

namespace sluice {

class WorkerMetrics {
 public:
  // `role`: "prefill" or "decode" (a label value); `model_name`: the served model name (the
  // `model_name` label of the vLLM-compatible gauges).
  WorkerMetrics(std::string role, std::string model_name);

  // Prefill: Prefill call arrival -> first token sampled (queue + compute).
  void ObserveTimeToFirstToken(double seconds);
  // Decode: time between consecutive streamed outputs of one request.
  void ObserveInterTokenLatency(double seconds);
  // ObserveTransfer: one KV transfer this worker ran (decode: a pull; prefill: a push); the
  // bytes moved are the agent's counters (KvTransferStats).
  void ObserveTransfer(double seconds, bool ok);
  // Decode: prefill finished (PrefillResponse.prefill_finished_unix_us) -> the request's first
  // decode step produced its output (the second token).
  void ObserveHandover(double seconds);
  // Decode: CountRecompute counts a prompt recomputed instead of using its transferred KV, by
  // reason (a RecomputeReasonName of services/decode/decode_service.h; a bounded set).
  void CountRecompute(const std::string& reason);
  // CountOutcome counts one finished request by its status (see StatusLabel).
  void CountOutcome(const absl::Status& status);
  // ObserveFinished: a request's end on this worker, for the vllm: families (tokens, finish
  // reason, phases; see VllmMetrics). Prefill: its e2e is the TTFT and a request handed to a
  // decode worker counts as finished by "length" (vLLM's prefill instances run max_tokens=1).
  void ObserveFinished(const FinishedRequest& request) { vllm_.ObserveFinished(request); }

  void set_healthy(bool healthy) { healthy_.store(healthy); }
  bool healthy() const { return healthy_.load(); }

  // ServiceGauges: what the service adds at scrape time.
  struct ServiceGauges {
    int64_t num_queued_prefill_tokens = 0;  // prefill: prompt tokens admitted, not answered
    int64_t num_sessions = 0;               // decode: requests known to the service
    // --kv-staging: the staging's counters (absent: the KV moves directly to or from the KV
    // cache).
    std::optional<transfer::StagedTransferStats> staging;
  };
  // Render returns the whole exposition.
  std::string Render(const AsyncEngineStats& stats, const transfer::KvTransferStats& transfer,
                     const ServiceGauges& service) const;

  // StatusLabel: the `status` label of sluice_worker_requests_total: "ok", or the absl status
  // code name in lower case ("cancelled", "deadline_exceeded", "unavailable", ...).
  static std::string StatusLabel(const absl::Status& status);

 private:
  const std::string role_;
  const std::string model_name_;
  std::atomic<bool> healthy_{true};
  mutable std::mutex mu_;
  Histogram ttft_;                           // guarded by mu_
  Histogram itl_;                            // guarded by mu_
  Histogram transfer_;                       // guarded by mu_
  Histogram handover_;                       // guarded by mu_
  int64_t num_transfers_ok_ = 0;             // guarded by mu_
  int64_t num_transfers_failed_ = 0;         // guarded by mu_
  std::map<std::string, int64_t> outcomes_;  // status label -> count; guarded by mu_
  std::map<std::string, int64_t> recomputes_;  // reason -> count; guarded by mu_
  VllmMetrics vllm_;
};

}  // namespace sluice

#endif  // SLUICE_SERVICES_COMMON_WORKER_METRICS_H_
