// BackendStats: live load figures of whatever runs a server's model (InferenceBackend::Stats,
// a worker's engine), for /metrics and routing.
#ifndef SLUICE_SERVICES_COMMON_BACKEND_STATS_H_
#define SLUICE_SERVICES_COMMON_BACKEND_STATS_H_

#include <cstdint>

#include "services/common/spec_decode_metrics.h"

namespace sluice {

struct BackendStats {
  int64_t num_waiting_requests = 0;
  int64_t num_running_requests = 0;
  int64_t num_total_blocks = 0;
  int64_t num_free_blocks = 0;
  int64_t block_size = 0;
  int64_t num_preemptions_total = 0;
  int64_t num_preemptions_waiting_head_total = 0;  // of those, RecomputeCause::kWaitingHeadBlocked
  // Sliding-window replays that failed: after a transfer, after a kvstore load (recomputed).
  int64_t num_swa_replay_recomputes_total = 0;
  int64_t num_kvstore_swa_replay_recomputes_total = 0;
  int64_t num_prompt_tokens_total = 0;
  int64_t num_generation_tokens_total = 0;
  // Of those, tokens a grammar forced, appended without a model step (jump-forward).
  int64_t num_jump_forward_tokens_total = 0;
  // Prefix cache (0 where the backend has none): tokens looked up / found at admissions,
  // prompt tokens served from the cache, blocks registered now.
  int64_t num_prefix_cache_query_tokens_total = 0;
  int64_t num_prefix_cache_hit_tokens_total = 0;
  int64_t num_prompt_tokens_cached_total = 0;
  int64_t num_cached_blocks = 0;
  SpecDecodeStats spec_decode;  // zeros without speculative decoding
};

}  // namespace sluice

#endif  // SLUICE_SERVICES_COMMON_BACKEND_STATS_H_
