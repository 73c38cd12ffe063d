#include "services/common/worker_metrics.h"

#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "engine/sched/recompute_event.h"
#include "services/common/spec_decode_metrics.h"

namespace sluice {
namespace {

using prometheus::Counter;
using prometheus::FormatDouble;
using prometheus::Gauge;
using prometheus::Header;

// KV transfers of one request: tens of microseconds (shared memory, a few blocks) to seconds
// (large prompts over TCP).
std::vector<double> TransferBuckets() {
  return {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
          0.05,   0.1,     0.25,   0.5,   1.0,    2.5,   5.0,  10.0};
}

// A decode worker's transfer recompute reasons (services/decode: RecomputeReasonName).
constexpr const char* kTransferRecomputeReasons[] = {
    "pin_gone",        "ack_failed",          "transfer_timeout", "reservation_expired",
    "transfer_failed", "staging_copy_failed"};

// Handover: includes the router's Decode call and the transfer; up to the reservation timeout.
std::vector<double> HandoverBuckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0};
}

}  // namespace

WorkerMetrics::WorkerMetrics(std::string role, std::string model_name)
    : role_(std::move(role)),
      model_name_(std::move(model_name)),
      ttft_(prometheus::TtftBuckets()),
      itl_(prometheus::ItlBuckets()),
      transfer_(TransferBuckets()),
      handover_(HandoverBuckets()),
      vllm_(model_name_) {}

void WorkerMetrics::ObserveTimeToFirstToken(double seconds) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ttft_.Observe(seconds);
  }
  vllm_.ObserveTimeToFirstToken(seconds);
}

void WorkerMetrics::ObserveInterTokenLatency(double seconds) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    itl_.Observe(seconds);
  }
  vllm_.ObserveInterTokenLatency(seconds);
}

void WorkerMetrics::ObserveTransfer(double seconds, bool ok) {
  std::lock_guard<std::mutex> lock(mu_);
  transfer_.Observe(seconds);
  ++(ok ? num_transfers_ok_ : num_transfers_failed_);
}

void WorkerMetrics::ObserveHandover(double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  handover_.Observe(seconds < 0 ? 0 : seconds);  // clocks of two hosts may disagree
}

void WorkerMetrics::CountRecompute(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  ++recomputes_[reason];
}

void WorkerMetrics::CountOutcome(const absl::Status& status) {
  const std::string label = StatusLabel(status);
  std::lock_guard<std::mutex> lock(mu_);
  ++outcomes_[label];
}

std::string WorkerMetrics::StatusLabel(const absl::Status& status) {
  if (status.ok()) return "ok";
  return absl::AsciiStrToLower(absl::StatusCodeToString(status.code()));
}

std::string WorkerMetrics::Render(const AsyncEngineStats& stats,
                                  const transfer::KvTransferStats& transfer,
                                  const ServiceGauges& service) const {
  std::string out;
  const double total = static_cast<double>(stats.num_total_blocks);
  const double free = static_cast<double>(stats.num_free_blocks);
  const double usage = total > 0 ? (total - free) / total : 0.0;
  // Requests waiting for a KV transfer count as waiting: they hold blocks but do not run yet.
  const double waiting = static_cast<double>(stats.num_waiting_requests + stats.num_reserved);
  const double running = static_cast<double>(stats.num_running_requests);

  Header(out, "sluice_worker_healthy", "gauge",
         "1 while the worker takes new work, 0 while it drains.");
  absl::StrAppend(&out, "sluice_worker_healthy{role=\"", role_, "\"} ", healthy() ? 1 : 0, "\n");
  Gauge(out, "sluice_num_requests_waiting",
        "Requests queued in the engine or waiting for their KV transfer.", waiting);
  Gauge(out, "sluice_num_requests_running", "Requests being prefilled or decoded.", running);
  Gauge(out, "sluice_kv_cache_blocks", "KV cache blocks in total.", total);
  Gauge(out, "sluice_kv_cache_free_blocks", "KV cache blocks free.", free);
  Gauge(out, "sluice_kv_cache_used_blocks",
        "KV cache blocks in use (running, pinned for a decode worker, or reserved).", total - free);
  Gauge(out, "sluice_kv_cache_usage_ratio", "Fraction of KV cache blocks in use (0 to 1).", usage);
  Gauge(out, "sluice_kv_cache_block_size_tokens", "Tokens per KV cache block.",
        static_cast<double>(stats.block_size));
  AppendPreemptions(out, stats.counters.num_preemptions,
                    stats.counters.num_preemptions_waiting_head);
  {
    RecomputeCounts recomputes;
    recomputes.num_preemptions = stats.counters.num_preemptions;
    recomputes.num_preemptions_waiting_head = stats.counters.num_preemptions_waiting_head;
    recomputes.num_swa_replay_failed = stats.counters.num_swa_replay_recomputes;
    recomputes.num_kvstore_swa_replay_failed = stats.counters.num_kvstore_swa_replay_recomputes;
    if (role_ == "decode") {
      std::lock_guard<std::mutex> lock(mu_);
      for (const char* reason : kTransferRecomputeReasons) {
        auto it = recomputes_.find(reason);
        recomputes.transfer_reasons.emplace_back(reason,
                                                 it == recomputes_.end() ? 0 : it->second);
      }
    }
    AppendRecomputes(out, recomputes);
  }
  Counter(out, "sluice_grammar_jump_forward_tokens_total",
          "Structured-output tokens the grammar forced, appended without a model step "
          "(jump-forward): decode steps saved.",
          static_cast<double>(stats.counters.num_jump_forward_tokens));
  {
    // Fair prefill: the fitted step cost(q, c) that sizes prefill chunks (0 until fitted).
    const EngineCounters& c = stats.counters;
    Header(out, "sluice_step_cost_seconds", "gauge",
           "Fitted engine step cost: seconds per step (fixed), per new token (token) and per "
           "query-key pair of attention (pair); 0 until fitted.");
    absl::StrAppend(&out, "sluice_step_cost_seconds{term=\"fixed\"} ", c.step_cost_fixed_seconds,
                    "\n", "sluice_step_cost_seconds{term=\"token\"} ",
                    c.step_cost_token_seconds, "\n", "sluice_step_cost_seconds{term=\"pair\"} ",
                    c.step_cost_pair_seconds, "\n");
  }
  {
    // Prompt KV: computed here vs served from a cache, by where it came from.
    const EngineCounters& c = stats.counters;
    Counter(out, "sluice_prompt_tokens_computed_total",
            "Prompt tokens run through the model (recomputes included).",
            static_cast<double>(c.num_prompt_tokens_computed));
    Header(out, "sluice_prompt_tokens_cached_total", "counter",
           "Prompt tokens served from a KV cache at admission, by source (local: this worker's "
           "prefix cache; kvstore: loaded from the kvstore).");
    absl::StrAppend(&out, "sluice_prompt_tokens_cached_total{source=\"local\"} ",
                    c.num_prompt_tokens_cached - c.num_prompt_tokens_cached_external, "\n",
                    "sluice_prompt_tokens_cached_total{source=\"kvstore\"} ",
                    c.num_prompt_tokens_cached_external, "\n");
    const KvConnectorStats& k = c.kv_connector;
    Header(out, "sluice_kvstore_blocks_total", "counter",
           "KV blocks through the kvstore connector, by op: loaded (verified, into the cache), "
           "saved (written through), present (already stored), failed (not stored), dropped "
           "(save queue full).");
    absl::StrAppend(&out, "sluice_kvstore_blocks_total{op=\"loaded\"} ", k.num_loaded_blocks,
                    "\n", "sluice_kvstore_blocks_total{op=\"saved\"} ", k.num_saved_blocks, "\n",
                    "sluice_kvstore_blocks_total{op=\"present\"} ", k.num_save_present_blocks,
                    "\n", "sluice_kvstore_blocks_total{op=\"failed\"} ",
                    k.num_save_failed_blocks, "\n", "sluice_kvstore_blocks_total{op=\"dropped\"} ",
                    k.num_save_dropped_blocks, "\n");
    Header(out, "sluice_kvstore_bytes_total", "counter",
           "KV block bytes moved to and from the kvstore, by path: rma (UCX one-sided, from and "
           "into registered host buffers) or inline (in gRPC messages: the fallback).");
    absl::StrAppend(&out, "sluice_kvstore_bytes_total{path=\"rma\"} ", k.num_rma_bytes, "\n",
                    "sluice_kvstore_bytes_total{path=\"inline\"} ", k.num_inline_bytes, "\n");
    Counter(out, "sluice_kvstore_load_errors_total",
            "Kvstore loads cut short by a store error or deadline (the rest is computed).",
            static_cast<double>(k.num_load_errors));
    Counter(out, "sluice_kvstore_copy_errors_total",
            "Kvstore block copies between the KV cache (GPU memory) and host memory that failed "
            "(those saves are dropped, those loads computed).",
            static_cast<double>(c.num_kv_connector_copy_errors));
  }
  AppendSpecDecodeMetrics(SpecDecodeFromCounters(stats.counters), out);
  if (role_ == "prefill") {
    Gauge(out, "sluice_prefill_held_blocks",
          "KV blocks pinned for decode workers to pull (or to be pushed).",
          static_cast<double>(stats.num_held_blocks));
    Gauge(out, "sluice_prefill_queued_tokens", "Prompt tokens admitted and not yet answered.",
          static_cast<double>(service.num_queued_prefill_tokens));
    Header(out, "sluice_prefill_held_released_total", "counter",
           "Pinned block sets freed, by why: released (ack or abort) or expired (pin timeout).");
    absl::StrAppend(&out, "sluice_prefill_held_released_total{reason=\"released\"} ",
                    stats.counters.num_held_released, "\n",
                    "sluice_prefill_held_released_total{reason=\"expired\"} ",
                    stats.counters.num_held_expired, "\n");
  } else {
    Gauge(out, "sluice_decode_reserved_transfers",
          "Requests holding reserved KV blocks while their KV transfer is pending.",
          static_cast<double>(stats.num_reserved));
    Gauge(out, "sluice_decode_sessions", "Requests known to the decode service.",
          static_cast<double>(service.num_sessions));
    Counter(out, "sluice_decode_transfers_recomputed_total",
            "Requests whose KV transfer failed (source gone or too slow) after the first token "
            "was sent, and whose prompt was recomputed here instead of failing.",
            static_cast<double>(stats.counters.num_transfers_recomputed));
    Counter(out, "sluice_decode_swa_replayed_tokens_total",
            "Prompt tokens replayed to rebuild sliding-window layers' KV after a transfer that "
            "moved only full-attention layers (--swa-replay-tokens).",
            static_cast<double>(stats.counters.num_swa_replayed_tokens));
  }
  if (service.staging.has_value()) {
    Counter(out, "sluice_kv_staging_chunks_total",
            "Pinned host staging slot fills of KV moved through staging (--kv-staging): one RMA "
            "batch and its device copies each (prefill: pushes; decode: pulls).",
            static_cast<double>(service.staging->num_chunks));
    Counter(out, "sluice_kv_staging_bytes_total",
            "KV bytes moved through pinned host staging (--kv-staging): pushed to peers "
            "(prefill) or pulled from them (decode).",
            static_cast<double>(service.staging->bytes_pushed + service.staging->bytes_pulled));
  }
  Header(out, "sluice_kv_transfer_bytes_total", "counter",
         "KV payload bytes moved by successful transfers, by direction (pull: read from a peer, "
         "push: written to a peer).");
  absl::StrAppend(
      &out, "sluice_kv_transfer_bytes_total{direction=\"pull\"} ", transfer.bytes_pulled, "\n",
      "sluice_kv_transfer_bytes_total{direction=\"push\"} ", transfer.bytes_pushed, "\n");
  {
    std::lock_guard<std::mutex> lock(mu_);
    Header(out, "sluice_kv_transfers_total", "counter",
           "KV transfers run by this worker, by result.");
    absl::StrAppend(&out, "sluice_kv_transfers_total{result=\"ok\"} ", num_transfers_ok_, "\n",
                    "sluice_kv_transfers_total{result=\"failed\"} ", num_transfers_failed_, "\n");
    Header(out, "sluice_kv_transfer_seconds", "histogram",
           "Time of one request's KV transfer (decode: pull; prefill: push).");
    transfer_.Render("sluice_kv_transfer_seconds", out);
    if (role_ == "prefill") {
      Header(out, "sluice_time_to_first_token_seconds", "histogram",
             "Prefill call arrival to its first token sampled (queue and compute).");
      ttft_.Render("sluice_time_to_first_token_seconds", out);
    } else {
      Header(out, "sluice_kv_handover_seconds", "histogram",
             "Prefill finished (first token sampled) to the request's first decode step here.");
      handover_.Render("sluice_kv_handover_seconds", out);
      Header(out, "sluice_inter_token_latency_seconds", "histogram",
             "Time between consecutive streamed outputs of a request.");
      itl_.Render("sluice_inter_token_latency_seconds", out);
      Header(out, "sluice_decode_recomputes_total", "counter",
             "Prompts recomputed here instead of using their transferred KV, by reason (pin_gone, "
             "ack_failed, transfer_timeout, reservation_expired, transfer_failed, "
             "staging_copy_failed; "
             "swa_replay_failed: transferred, but the sliding-window layers could not be "
             "rebuilt).");
      for (const char* reason : kTransferRecomputeReasons) {
        auto it = recomputes_.find(reason);
        absl::StrAppend(&out, "sluice_decode_recomputes_total{reason=\"", reason, "\"} ",
                        it == recomputes_.end() ? 0 : it->second, "\n");
      }
      absl::StrAppend(&out, "sluice_decode_recomputes_total{reason=\"",
                      RecomputeCauseName(RecomputeCause::kSwaReplayFailed), "\"} ",
                      stats.counters.num_swa_replay_recomputes, "\n");
    }
    Header(out, "sluice_worker_requests_total", "counter",
           "Requests this worker finished, by status (ok or a gRPC status code name).");
    for (const auto& [label, count] : outcomes_) {
      absl::StrAppend(&out, "sluice_worker_requests_total{status=\"", label, "\"} ", count, "\n");
    }
  }

  // The vllm: families (gateways route on waiting / running / KV usage and read block_size and
  // num_gpu_blocks from vllm:cache_config_info's labels).
  VllmGauges gauges;
  gauges.num_requests_waiting = waiting;
  gauges.num_requests_running = running;
  gauges.kv_cache_usage = usage;
  gauges.block_size = stats.block_size;
  gauges.num_gpu_blocks = stats.num_total_blocks;
  gauges.prefix_cache_queries = stats.counters.num_prefix_cache_queried_blocks * stats.block_size;
  gauges.prefix_cache_hits = stats.counters.num_prefix_cache_hit_blocks * stats.block_size;
  vllm_.Render(gauges, out);
  return out;
}

}  // namespace sluice
