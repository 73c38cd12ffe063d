#include "services/common/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/sched/recompute_event.h"
#include "services/common/spec_decode_metrics.h"
#include "services/common/vllm_metrics.h"

namespace sluice {
namespace prometheus {

// FormatDouble prints a value with the fewest significant digits (15 to 17) that read back
// exactly, so bucket bounds print as "0.005", not "0.0050000000000000001".
std::string FormatDouble(double v) {
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  std::string out;
  for (int precision = 15; precision <= 17; ++precision) {
    out = absl::StrFormat("%.*g", precision, v);
    if (std::strtod(out.c_str(), nullptr) == v) break;
  }
  return out;
}

void Header(std::string& out, const std::string& name, const char* type, const char* help) {
  absl::StrAppend(&out, "# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n");
}

void Gauge(std::string& out, const std::string& name, const char* help, double value) {
  Header(out, name, "gauge", help);
  absl::StrAppend(&out, name, " ", FormatDouble(value), "\n");
}

void Counter(std::string& out, const std::string& name, const char* help, double value) {
  Header(out, name, "counter", help);
  absl::StrAppend(&out, name, " ", FormatDouble(value), "\n");
}

// Buckets follow vLLM's choices for the same latencies, in seconds.
std::vector<double> TtftBuckets() {
  return {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,
          0.75,  1.0,   2.5,  5.0,  7.5,  10.0, 20.0, 40.0, 80.0};
}
std::vector<double> ItlBuckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05,
          0.075, 0.1,    0.15,  0.2,  0.3,   0.4,  0.5,   0.75, 1.0,  2.5};
}

}  // namespace prometheus

void AppendPreemptions(std::string& out, int64_t total, int64_t waiting_head) {
  prometheus::Header(out, "sluice_preemptions_total", "counter",
                     "Requests preempted (KV blocks freed, tokens recomputed later), by cause: "
                     "out_of_kv_blocks (a running request's next tokens needed them), "
                     "waiting_head_blocked (queued requests held blocks the waiting head needed).");
  absl::StrAppend(&out, "sluice_preemptions_total{cause=\"",
                  RecomputeCauseName(RecomputeCause::kOutOfKvBlocks), "\"} ", total - waiting_head,
                  "\n", "sluice_preemptions_total{cause=\"",
                  RecomputeCauseName(RecomputeCause::kWaitingHeadBlocked), "\"} ", waiting_head,
                  "\n");
}

void AppendRecomputes(std::string& out, const RecomputeCounts& counts) {
  prometheus::Header(
      out, "sluice_recomputes_total", "counter",
      "Recomputes: a request's KV dropped or unusable and its tokens computed again, by cause, "
      "one 'recompute' log line each: out_of_kv_blocks and waiting_head_blocked (preemptions: the "
      "request gives its blocks back and recomputes when readmitted), swa_replay_failed (a "
      "transfer's sliding-window layers could not be rebuilt), kvstore_swa_replay_failed (the "
      "same for blocks loaded from the kvstore); decode workers also count the transfer reasons "
      "(pin_gone, ack_failed, transfer_timeout, reservation_expired, transfer_failed, "
      "staging_copy_failed).");
  const std::pair<RecomputeCause, int64_t> engine_causes[] = {
      {RecomputeCause::kOutOfKvBlocks,
       counts.num_preemptions - counts.num_preemptions_waiting_head},
      {RecomputeCause::kWaitingHeadBlocked, counts.num_preemptions_waiting_head},
      {RecomputeCause::kSwaReplayFailed, counts.num_swa_replay_failed},
      {RecomputeCause::kKvstoreSwaReplayFailed, counts.num_kvstore_swa_replay_failed}};
  for (const auto& [cause, n] : engine_causes) {
    absl::StrAppend(&out, "sluice_recomputes_total{cause=\"", RecomputeCauseName(cause), "\"} ",
                    n, "\n");
  }
  for (const auto& [reason, n] : counts.transfer_reasons) {
    absl::StrAppend(&out, "sluice_recomputes_total{cause=\"", reason, "\"} ", n, "\n");
  }
}

namespace {

using prometheus::Counter;
using prometheus::FormatDouble;
using prometheus::Gauge;
using prometheus::Header;
using prometheus::ItlBuckets;
using prometheus::TtftBuckets;

std::vector<double> E2eBuckets() {
  return {0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
          120.0, 240.0, 480.0, 960.0};
}

}  // namespace

Histogram::Histogram(std::vector<double> upper_bounds)
    : upper_bounds_(std::move(upper_bounds)), counts_(upper_bounds_.size() + 1, 0) {}

void Histogram::Observe(double value) {
  const size_t bucket =
      std::lower_bound(upper_bounds_.begin(), upper_bounds_.end(), value) - upper_bounds_.begin();
  ++counts_[bucket];
  sum_ += value;
  ++count_;
}

void Histogram::Render(const std::string& name, const std::string& labels,
                       std::string& out) const {
  const std::string bucket = labels.empty() ? "_bucket{le=\"" : absl::StrCat("_bucket{", labels,
                                                                            ",le=\"");
  const std::string plain = labels.empty() ? " " : absl::StrCat("{", labels, "} ");
  uint64_t cumulative = 0;
  for (size_t i = 0; i < upper_bounds_.size(); ++i) {
    cumulative += counts_[i];
    absl::StrAppend(&out, name, bucket, FormatDouble(upper_bounds_[i]), "\"} ", cumulative, "\n");
  }
  absl::StrAppend(&out, name, bucket, "+Inf\"} ", count_, "\n");
  absl::StrAppend(&out, name, "_sum", plain, FormatDouble(sum_), "\n");
  absl::StrAppend(&out, name, "_count", plain, count_, "\n");
}

ApiMetrics::ApiMetrics()
    : ttft_(TtftBuckets()),
      itl_(ItlBuckets()),
      e2e_(E2eBuckets()),
      vllm_(std::make_unique<VllmMetrics>()) {}

ApiMetrics::~ApiMetrics() = default;

void ApiMetrics::set_model_name(const std::string& model_name) {
  vllm_->set_model_name(model_name);
}

void ApiMetrics::ObserveFinished(const FinishedRequest& request) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (request.e2e_seconds >= 0) e2e_.Observe(request.e2e_seconds);
    prompt_tokens_ += request.num_prompt_tokens;
    generation_tokens_ += request.num_generation_tokens;
  }
  vllm_->ObserveFinished(request);
  if (finished_observer_) finished_observer_(request);
}

void ApiMetrics::ObserveRequest(const std::string& endpoint, int status) {
  std::lock_guard<std::mutex> lock(mu_);
  ++requests_[{endpoint, status}];
}

void ApiMetrics::ObserveTimeToFirstToken(double seconds) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ttft_.Observe(seconds);
  }
  vllm_->ObserveTimeToFirstToken(seconds);
}

void ApiMetrics::ObserveInterTokenLatency(double seconds) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    itl_.Observe(seconds);
  }
  vllm_->ObserveInterTokenLatency(seconds);
}

void ApiMetrics::ObserveE2eLatency(double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  e2e_.Observe(seconds);
}

void ApiMetrics::AddTokens(int64_t num_prompt_tokens, int64_t num_generation_tokens) {
  std::lock_guard<std::mutex> lock(mu_);
  prompt_tokens_ += num_prompt_tokens;
  generation_tokens_ += num_generation_tokens;
}

void ApiMetrics::SetInFlight(int64_t num_requests) {
  std::lock_guard<std::mutex> lock(mu_);
  in_flight_ = num_requests;
}

std::string ApiMetrics::Render(const BackendStats& stats) const {
  std::string out;
  std::lock_guard<std::mutex> lock(mu_);
  Header(out, "sluice_http_requests_total", "counter",
         "HTTP requests answered, by endpoint and status code.");
  for (const auto& [key, count] : requests_) {
    absl::StrAppend(&out, "sluice_http_requests_total{endpoint=\"", key.first, "\",status=\"",
                    key.second, "\"} ", count, "\n");
  }
  Header(out, "sluice_time_to_first_token_seconds", "histogram",
         "Time from request arrival to its first generated token.");
  ttft_.Render("sluice_time_to_first_token_seconds", out);
  Header(out, "sluice_inter_token_latency_seconds", "histogram",
         "Time between consecutive generated tokens of a request.");
  itl_.Render("sluice_inter_token_latency_seconds", out);
  Header(out, "sluice_e2e_request_latency_seconds", "histogram",
         "Time from request arrival to its last token.");
  e2e_.Render("sluice_e2e_request_latency_seconds", out);
  Counter(out, "sluice_prompt_tokens_total", "Prompt tokens of finished requests.",
          static_cast<double>(prompt_tokens_));
  Counter(out, "sluice_generation_tokens_total", "Generated tokens of finished requests.",
          static_cast<double>(generation_tokens_));
  Gauge(out, "sluice_http_requests_in_flight", "Generation requests being served.",
        static_cast<double>(in_flight_));
  Gauge(out, "sluice_num_requests_waiting", "Requests waiting to be scheduled.",
        static_cast<double>(stats.num_waiting_requests));
  Gauge(out, "sluice_num_requests_running", "Requests being decoded or prefilled.",
        static_cast<double>(stats.num_running_requests));
  Gauge(out, "sluice_kv_cache_blocks", "KV cache blocks in total.",
        static_cast<double>(stats.num_total_blocks));
  Gauge(out, "sluice_kv_cache_free_blocks", "KV cache blocks free.",
        static_cast<double>(stats.num_free_blocks));
  const double usage = stats.num_total_blocks > 0
                           ? 1.0 - static_cast<double>(stats.num_free_blocks) /
                                       static_cast<double>(stats.num_total_blocks)
                           : 0.0;
  Gauge(out, "sluice_kv_cache_usage_ratio", "Fraction of KV cache blocks in use (0 to 1).",
        usage);
  Gauge(out, "sluice_kv_cache_block_size_tokens", "Tokens per KV cache block.",
        static_cast<double>(stats.block_size));
  AppendPreemptions(out, stats.num_preemptions_total, stats.num_preemptions_waiting_head_total);
  RecomputeCounts recomputes;
  recomputes.num_preemptions = stats.num_preemptions_total;
  recomputes.num_preemptions_waiting_head = stats.num_preemptions_waiting_head_total;
  recomputes.num_swa_replay_failed = stats.num_swa_replay_recomputes_total;
  recomputes.num_kvstore_swa_replay_failed = stats.num_kvstore_swa_replay_recomputes_total;
  AppendRecomputes(out, recomputes);
  Counter(out, "sluice_grammar_jump_forward_tokens_total",
          "Structured-output tokens the grammar forced, appended without a model step "
          "(jump-forward): decode steps saved.",
          static_cast<double>(stats.num_jump_forward_tokens_total));
  // Prefix cache; hit rate = hits / queries (vLLM's prefix_cache_queries/hits, in tokens).
  Counter(out, "sluice_prefix_cache_queries_total",
          "Tokens of full prompt blocks looked up in the prefix cache.",
          static_cast<double>(stats.num_prefix_cache_query_tokens_total));
  Counter(out, "sluice_prefix_cache_hits_total",
          "Tokens of full prompt blocks found in the prefix cache.",
          static_cast<double>(stats.num_prefix_cache_hit_tokens_total));
  Counter(out, "sluice_prompt_tokens_cached_total",
          "Prompt tokens served from the prefix cache instead of being computed.",
          static_cast<double>(stats.num_prompt_tokens_cached_total));
  Gauge(out, "sluice_kv_cache_cached_blocks",
        "KV blocks registered in the prefix cache (in use or evictable).",
        static_cast<double>(stats.num_cached_blocks));
  AppendSpecDecodeMetrics(stats.spec_decode, out);
  VllmGauges gauges;
  gauges.num_requests_waiting = static_cast<double>(stats.num_waiting_requests);
  gauges.num_requests_running = static_cast<double>(stats.num_running_requests);
  gauges.kv_cache_usage = usage;
  gauges.block_size = stats.block_size;
  gauges.num_gpu_blocks = stats.num_total_blocks;
  gauges.prefix_cache_queries = stats.num_prefix_cache_query_tokens_total;
  gauges.prefix_cache_hits = stats.num_prefix_cache_hit_tokens_total;
  vllm_->Render(gauges, out);
  return out;
}

}  // namespace sluice
