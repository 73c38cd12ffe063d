#include "services/router/kv_aware_policy.h"

#include <algorithm>
#include <tuple>

namespace sluice {

KvCost ComputeKvCost(const KvAwarePolicyOptions& options, const KvCandidate& candidate,
                     int64_t prompt_tokens) {
  KvCost cost;
  const int64_t block_size = std::max<int64_t>(candidate.block_size, 1);
  // The engine computes at least the last prompt token (it needs its logits), so a fully cached
  // prompt still costs one token.
  cost.cached_tokens = std::clamp<int64_t>(candidate.cached_blocks * block_size, 0,
                                           std::max<int64_t>(prompt_tokens - 1, 0));
  cost.new_tokens = prompt_tokens - cost.cached_tokens;
  const int64_t queued = std::max(candidate.queued_prefill_tokens, candidate.assigned_new_tokens);
  const int64_t running = std::max(candidate.running_requests, candidate.assigned_requests);
  const double usage =
      candidate.total_blocks > 0
          ? 1.0 - static_cast<double>(std::clamp<int64_t>(candidate.free_blocks, 0,
                                                          candidate.total_blocks)) /
                      static_cast<double>(candidate.total_blocks)
          : 1.0;
  cost.cost = static_cast<double>(cost.new_tokens) + options.queue_weight * queued +
              options.running_weight * running + options.kv_weight * prompt_tokens * usage;
  // Blocks the new tokens need beyond the cached ones (ceil).
  const int64_t blocks_needed = (cost.new_tokens + block_size - 1) / block_size;
  cost.fits = candidate.free_blocks >= blocks_needed;
  return cost;
}

std::optional<KvChoice> ChooseKvWorker(const KvAwarePolicyOptions& options,
                                       const std::vector<KvCandidate>& candidates,
                                       int64_t prompt_tokens) {
  const KvCandidate* best = nullptr;
  KvCost best_cost;
  auto key = [](const KvCandidate& c, const KvCost& k) {
    return std::make_tuple(!k.fits, k.cost, c.picked_total, c.worker_id);
  };
  for (const KvCandidate& candidate : candidates) {
    const KvCost cost = ComputeKvCost(options, candidate, prompt_tokens);
    if (best == nullptr || key(candidate, cost) < key(*best, best_cost)) {
      best = &candidate;
      best_cost = cost;
    }
  }
  if (best == nullptr) return std::nullopt;
  return KvChoice{best->worker_id, best_cost.cached_tokens, best_cost.new_tokens, best_cost.cost};
}

}  // namespace sluice
