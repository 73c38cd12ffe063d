#include "services/api/local_backend.h"

#include <utility>

namespace sluice {

LocalBackend::LocalBackend(std::unique_ptr<AsyncEngine> engine) : engine_(std::move(engine)) {}

absl::Status LocalBackend::Submit(EngineRequest request, OutputCallback on_output) {
  return engine_->Submit(std::move(request), std::move(on_output));
}

void LocalBackend::Abort(const std::string& request_id) { engine_->Abort(request_id); }

BackendStats LocalBackend::Stats() const {
  const AsyncEngineStats s = engine_->Stats();
  BackendStats out;
  out.num_waiting_requests = s.num_waiting_requests;
  out.num_running_requests = s.num_running_requests;
  out.num_total_blocks = s.num_total_blocks;
  out.num_free_blocks = s.num_free_blocks;
  out.block_size = s.block_size;
  out.num_preemptions_total = s.counters.num_preemptions;
  out.num_preemptions_waiting_head_total = s.counters.num_preemptions_waiting_head;
  out.num_swa_replay_recomputes_total = s.counters.num_swa_replay_recomputes;
  out.num_kvstore_swa_replay_recomputes_total = s.counters.num_kvstore_swa_replay_recomputes;
  out.num_prompt_tokens_total = s.counters.num_prompt_tokens_computed;
  out.num_generation_tokens_total = s.counters.num_generation_tokens;
  out.num_jump_forward_tokens_total = s.counters.num_jump_forward_tokens;
  out.num_prefix_cache_query_tokens_total =
      s.counters.num_prefix_cache_queried_blocks * s.block_size;
  out.num_prefix_cache_hit_tokens_total = s.counters.num_prefix_cache_hit_blocks * s.block_size;
  out.num_prompt_tokens_cached_total = s.counters.num_prompt_tokens_cached;
  out.num_cached_blocks = s.num_cached_blocks;
  out.spec_decode = SpecDecodeFromCounters(s.counters);
  return out;
}

int32_t LocalBackend::max_model_len() const { return engine_->max_model_len(); }

}  // namespace sluice
