#include "services/router/router_metrics.h"

#include "absl/strings/str_cat.h"

namespace sluice {
namespace {

void Header(std::string& out, const char* name, const char* type, const char* help) {
  absl::StrAppend(&out, "# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n");
}

std::string WorkerLabels(const WorkerSnapshot& worker) {
  return absl::StrCat("worker=\"", worker.worker_id, "\",role=\"", WorkerRoleName(worker.role),
                      "\"");
}

// PerWorker renders one gauge with a sample per worker.
template <typename Value>
void PerWorker(std::string& out, const char* name, const char* help,
               const std::vector<WorkerSnapshot>& workers, Value value) {
  Header(out, name, "gauge", help);
  for (const WorkerSnapshot& worker : workers) {
    absl::StrAppend(&out, name, "{", WorkerLabels(worker), "} ", value(worker), "\n");
  }
}

}  // namespace

std::string RenderRouterMetrics(const std::vector<WorkerSnapshot>& workers,
                                const RemoteBackendCounters& counters) {
  std::string out;
  Header(out, "sluice_router_workers", "gauge", "Live (registered, not draining) workers.");
  for (WorkerRole role : {WorkerRole::kPrefill, WorkerRole::kDecode, WorkerRole::kEncoder}) {
    int64_t live = 0;
    for (const WorkerSnapshot& worker : workers) {
      if (worker.role == role && !worker.draining) ++live;
    }
    absl::StrAppend(&out, "sluice_router_workers{role=\"", WorkerRoleName(role), "\"} ", live,
                    "\n");
  }
  Header(out, "sluice_router_worker_up", "gauge",
         "1 for a registered worker taking new work, 0 while it drains.");
  for (const WorkerSnapshot& worker : workers) {
    absl::StrAppend(&out, "sluice_router_worker_up{", WorkerLabels(worker), ",address=\"",
                    worker.address, "\"} ", worker.draining ? 0 : 1, "\n");
  }
  PerWorker(out, "sluice_router_worker_waiting_requests",
            "Requests waiting in the worker's engine (last heartbeat).", workers,
            [](const WorkerSnapshot& w) { return w.load.num_waiting_requests; });
  PerWorker(out, "sluice_router_worker_running_requests",
            "Requests running in the worker's engine (last heartbeat).", workers,
            [](const WorkerSnapshot& w) { return w.load.num_running_requests; });
  PerWorker(out, "sluice_router_worker_kv_total_blocks",
            "KV cache blocks of the worker (last heartbeat).", workers,
            [](const WorkerSnapshot& w) { return w.load.num_total_blocks; });
  PerWorker(out, "sluice_router_worker_kv_free_blocks",
            "Free KV cache blocks of the worker (last heartbeat).", workers,
            [](const WorkerSnapshot& w) { return w.load.num_free_blocks; });
  PerWorker(out, "sluice_router_worker_assigned_requests",
            "Requests the router sent to the worker and has not seen finish.", workers,
            [](const WorkerSnapshot& w) { return w.num_assigned; });
  PerWorker(out, "sluice_router_worker_lease_seconds",
            "The worker's lease, tuned from the jitter of its heartbeats (silent this long: "
            "suspect).",
            workers, [](const WorkerSnapshot& w) { return absl::ToDoubleSeconds(w.lease); });
  Header(out, "sluice_router_prefills_total", "counter",
         "Requests by where their prompt was prefilled.");
  absl::StrAppend(&out, "sluice_router_prefills_total{where=\"remote\"} ",
                  counters.num_remote_prefills, "\n");
  absl::StrAppend(&out, "sluice_router_prefills_total{where=\"local\"} ",
                  counters.num_local_prefills, "\n");
  Header(out, "sluice_router_retries_total", "counter",
         "Requests retried on another worker after one failed.");
  absl::StrAppend(&out, "sluice_router_retries_total{stage=\"prefill\"} ",
                  counters.num_prefill_retries, "\n");
  absl::StrAppend(&out, "sluice_router_retries_total{stage=\"decode\"} ",
                  counters.num_decode_retries, "\n");
  absl::StrAppend(&out, "sluice_router_retries_total{stage=\"encode\"} ",
                  counters.num_encode_retries, "\n");
  Header(out, "sluice_router_encoded_images_total", "counter",
         "Images the router had encoder workers encode.");
  absl::StrAppend(&out, "sluice_router_encoded_images_total ", counters.num_encoded_images,
                  "\n");
  Header(out, "sluice_router_self_encoded_images_total", "counter",
         "Images sent as bytes to prefill/decode workers that encode them themselves (no "
         "encoder worker could).");
  absl::StrAppend(&out, "sluice_router_self_encoded_images_total ",
                  counters.num_self_encoded_images, "\n");
  Header(out, "sluice_router_decode_retries_pinned_kv_total", "counter",
         "Decode retries after the first token was sent, on another decode worker pulling the "
         "same pinned prefill KV.");
  absl::StrAppend(&out, "sluice_router_decode_retries_pinned_kv_total ",
                  counters.num_decode_retries_pinned_kv, "\n");
  Header(out, "sluice_router_decode_rereserves_total", "counter",
         "Decode reservations made again because prefill answered after they (nearly) expired "
         "(--decode-reserve-timeout-s).");
  absl::StrAppend(&out, "sluice_router_decode_rereserves_total ", counters.num_decode_rereserves,
                  "\n");
  Header(out, "sluice_router_migrations_total", "counter",
         "Requests continued on another decode worker after theirs failed mid-stream.");
  absl::StrAppend(&out, "sluice_router_migrations_total ", counters.num_migrations, "\n");
  Header(out, "sluice_router_migration_prefills_total", "counter",
         "Migrations whose prompt and streamed tokens a prefill worker re-prefilled (the rest "
         "re-prefilled on their new decode worker).");
  absl::StrAppend(&out, "sluice_router_migration_prefills_total ",
                  counters.num_migration_prefills, "\n");
  Header(out, "sluice_router_decode_reserve_full_total", "counter",
         "Reserve calls a decode worker answered without free KV blocks (the router tried "
         "another or waited).");
  absl::StrAppend(&out, "sluice_router_decode_reserve_full_total ", counters.num_reserve_full,
                  "\n");
  Header(out, "sluice_router_decode_queue_timeouts_total", "counter",
         "Requests failed (503) because no decode worker had free KV blocks within the wait.");
  absl::StrAppend(&out, "sluice_router_decode_queue_timeouts_total ",
                  counters.num_decode_queue_timeouts, "\n");
  Header(out, "sluice_router_worker_failures_total", "counter",
         "Requests ended with an error because a worker failed (died, or gave up on the "
         "request) and no other worker could continue them; requests retried or migrated to "
         "another worker are not counted (sluice_router_retries_total, "
         "sluice_router_migrations_total), nor decode queue timeouts. Failed workers: "
         "sluice_router_workers_dropped_total.");
  absl::StrAppend(&out, "sluice_router_worker_failures_total ", counters.num_worker_failures, "\n");
  Header(out, "sluice_router_workers_dropped_total", "counter",
         "Workers removed before their lease ended because a connection probe failed (a "
         "killed or unreachable worker).");
  absl::StrAppend(&out, "sluice_router_workers_dropped_total ", counters.num_workers_dropped,
                  "\n");
  return out;
}

std::string RenderKvRouterMetrics(const KvRouterCounters& counters) {
  std::string out;
  Header(out, "sluice_router_kv_picks_total", "counter",
         "Workers picked by the router, by whether the chosen one held a prompt block.");
  absl::StrAppend(&out, "sluice_router_kv_picks_total{overlap=\"true\"} ",
                  counters.num_picks_with_overlap, "\n");
  absl::StrAppend(&out, "sluice_router_kv_picks_total{overlap=\"false\"} ",
                  counters.num_picks - counters.num_picks_with_overlap, "\n");
  Header(out, "sluice_router_kv_predicted_cached_tokens_total", "counter",
         "Prompt tokens the router's KV index predicted cached on the chosen workers.");
  absl::StrAppend(&out, "sluice_router_kv_predicted_cached_tokens_total ",
                  counters.predicted_cached_tokens, "\n");
  Header(out, "sluice_router_kv_resyncs_total", "counter",
         "KV index snapshots fetched from workers after a gap, a fall-behind or a restart.");
  absl::StrAppend(&out, "sluice_router_kv_resyncs_total ", counters.num_resyncs, "\n");
  Header(out, "sluice_router_kv_poll_errors_total", "counter",
         "KV event polls of workers that failed (worker down, deadline).");
  absl::StrAppend(&out, "sluice_router_kv_poll_errors_total ", counters.num_poll_errors, "\n");
  return out;
}

nlohmann::json WorkersJson(const std::vector<WorkerSnapshot>& workers) {
  nlohmann::json data = nlohmann::json::array();
  for (const WorkerSnapshot& worker : workers) {
    data.push_back({{"id", worker.worker_id},
                    {"role", WorkerRoleName(worker.role)},
                    {"address", worker.address},
                    {"draining", worker.draining},
                    {"suspect", worker.suspect},
                    {"lease_s", absl::ToDoubleSeconds(worker.lease)},
                    {"assigned", worker.num_assigned},
                    {"picked", worker.num_picked_total},
                    {"waiting", worker.load.num_waiting_requests},
                    {"running", worker.load.num_running_requests},
                    {"free_blocks", worker.load.num_free_blocks},
                    {"total_blocks", worker.load.num_total_blocks}});
    // The KV settings the pool must share (absent: a worker that did not report them).
    if (worker.kv_peer.has_value()) {
      data.back()["kv_transfer_mode"] = worker.kv_peer->transfer_mode;
      data.back()["swa_replay_tokens"] = worker.kv_peer->swa_replay_tokens;
    }
  }
  return {{"object", "list"}, {"data", data}};
}

}  // namespace sluice
