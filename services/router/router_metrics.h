// Router-only Prometheus metrics: worker health and load per registered worker,
// and the outcomes of the router's dispatch (remote/local prefills, retries,
// worker failures). Appended to the OpenAI front end's /metrics
// (services/common/metrics.h) by `sluice router`.
#ifndef SLUICE_SERVICES_ROUTER_ROUTER_METRICS_H_
#define SLUICE_SERVICES_ROUTER_ROUTER_METRICS_H_

#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "services/router/kv_router.h"
#include "services/router/remote_backend.h"
#include "services/router/worker_registry.h"

namespace sluice {

// RenderRouterMetrics returns exposition-format text (0.0.4) for:
//   sluice_router_workers{role}                  gauge, live (non-draining)
//   workers sluice_router_worker_up{worker,role,address} gauge, 1 live, 0
//   draining sluice_router_worker_{waiting,running}_requests{worker,role}
//   gauges, last heartbeat
//   sluice_router_worker_kv_{total,free}_blocks{worker,role}       gauges, last
//   heartbeat sluice_router_worker_assigned_requests{worker,role} gauge,
//   router's own count sluice_router_prefills_total{where="remote"|"local"}
//   counter sluice_router_retries_total{stage="prefill"|"decode"} counter
//   sluice_router_worker_failures_total                           counter
//   sluice_router_decode_retries_pinned_kv_total                  counter
//   sluice_router_decode_reserve_full_total                       counter
//   sluice_router_decode_queue_timeouts_total                     counter
std::string RenderRouterMetrics(const std::vector<WorkerSnapshot>& workers,
                                const RemoteBackendCounters& counters);

// RenderKvRouterMetrics returns the KV-aware routing counters (all `counter`):
//   sluice_router_kv_picks_total{overlap="true"|"false"}  picks by whether the chosen worker
//                                                          held at least one prompt block
//   sluice_router_kv_predicted_cached_tokens_total        prompt tokens the index predicted cached
//   sluice_router_kv_resyncs_total                        worker snapshots fetched (gap/restart)
//   sluice_router_kv_poll_errors_total                    failed KV event polls
std::string RenderKvRouterMetrics(const KvRouterCounters& counters);

// WorkersJson lists the workers for GET /v1/workers:
//   {"object":"list","data":[{"id","role","address","draining","assigned","picked",
//    "waiting","running","free_blocks","total_blocks"[,"kv_transfer_mode",
//    "swa_replay_tokens"]}...]} (the last two for workers that reported their KV settings)
nlohmann::json WorkersJson(const std::vector<WorkerSnapshot>& workers);

}  // namespace sluice

#endif  // SLUICE_SERVICES_ROUTER_ROUTER_METRICS_H_
