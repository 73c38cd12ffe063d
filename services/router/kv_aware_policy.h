// KvAwarePolicy: choose a worker for a prompt by cached-prefix overlap against live load
// (docs/design.md, "Route on overlap and live load together").
//
// Cost of sending a prompt of P tokens to worker w (lower is better; unit: prompt tokens, a proxy
// for prefill time since prefill time grows about linearly in new tokens at these lengths):
//
//   cost_w = (P - C_w)                                  tokens w must compute for this prompt
//          + queue_weight   * Q_w                       prefill tokens already queued on w
//          + running_weight * R_w                       requests w is running (decode steps
//                                                       interleave with our prefill)
//          + kv_weight      * P * U_w                   KV pressure: U_w = 1 - free/total blocks
//
// C_w: cached prefix tokens on w (KvIndex match * block_size, capped at P - 1 because the engine
// always computes at least the last prompt token). Q_w: max(the worker's reported
// num_queued_prefill_tokens, the new tokens of requests this router sent it and has not
// released) — the router's own count covers heartbeat lag the way provisional KvIndex entries
// cover event lag. R_w: max(reported running + waiting, router-assigned requests).
//
// Where it comes from (facts only): NVIDIA Dynamo's KV router scores a worker by
// `overlap_score_weight * potential_prefill_blocks + potential_decode_blocks`, where potential
// prefill blocks are the request's uncached tokens plus prefill already pending on the worker
// (docs.nvidia.com/dynamo, "Router Design" / "KV Router", cost function). llm-d's inference
// scheduler sums weighted, normalized scorers for prefix-cache hits, queue depth and KV-cache
// utilization. Ours keeps Dynamo's additive "new prefill + pending prefill" core in tokens (so the
// overlap benefit and the queue are in the same unit and need no normalization) and adds the
// running-request and KV-usage terms from llm-d's scorer set as explicit weights.
//
// Why a hot prefix does not pile up: the worker holding the prefix saves C tokens, but every
// request sent to it adds (P - C) to its Q; once Q_hot exceeds Q_other + C the prefix's cost
// advantage is gone and the next request goes to another worker, whose routing decision is
// recorded in the KvIndex, so that worker becomes a second holder of the prefix.
//
// Hard rule (DESIGN: "never send cache misses to a worker because its cache is small"): a worker
// whose free KV (free blocks * block_size) cannot hold the prompt's new tokens ranks after every
// worker that can; the cost never rewards a small cache.
#ifndef SLUICE_SERVICES_ROUTER_KV_AWARE_POLICY_H_
#define SLUICE_SERVICES_ROUTER_KV_AWARE_POLICY_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace sluice {

struct KvAwarePolicyOptions {
  double queue_weight = 1.0;     // per queued prefill token (FCFS: each delays ours by one)
  double running_weight = 16.0;  // prompt-token equivalents per running request
  double kv_weight = 1.0;        // at 100% KV usage, as costly as computing the prompt again
};

// KvCandidate: one live worker as the policy sees it.
struct KvCandidate {
  std::string worker_id;
  int64_t cached_blocks = 0;          // leading prompt blocks it holds (KvIndex::MatchPrefix)
  int64_t queued_prefill_tokens = 0;  // reported by the worker
  int64_t running_requests = 0;       // reported: running + waiting
  int64_t free_blocks = 0;
  int64_t total_blocks = 0;
  int64_t block_size = 0;             // tokens per block (> 0)
  int64_t assigned_requests = 0;      // sent by this router, not released
  int64_t assigned_new_tokens = 0;    // their uncached prompt tokens
  int64_t picked_total = 0;           // tie-break: fewer picks first
};

// KvChoice: the chosen worker with its cost terms (for logs, metrics and tests).
struct KvChoice {
  std::string worker_id;
  int64_t cached_tokens = 0;  // C_w
  int64_t new_tokens = 0;     // P - C_w
  double cost = 0;
};

// KvCost: cost_w above for one candidate; `fits` is false when free KV cannot hold the new tokens.
struct KvCost {
  int64_t cached_tokens = 0;
  int64_t new_tokens = 0;
  double cost = 0;
  bool fits = true;
};
KvCost ComputeKvCost(const KvAwarePolicyOptions& options, const KvCandidate& candidate,
                     int64_t prompt_tokens);

// ChooseKvWorker: the candidate with the lowest cost (fitting ones first; ties: fewer picks,
// then smallest id). nullopt when `candidates` is empty. `prompt_tokens` >= 1.
std::optional<KvChoice> ChooseKvWorker(const KvAwarePolicyOptions& options,
                                       const std::vector<KvCandidate>& candidates,
                                       int64_t prompt_tokens);

}  // namespace sluice

#endif  // SLUICE_SERVICES_ROUTER_KV_AWARE_POLICY_H_
