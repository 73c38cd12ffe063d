// InferenceBackend: what the OpenAI HTTP handlers need from whatever runs the model — the
// in-process engine for `sluice serve`, or the router's remote prefill/decode workers.
#ifndef SLUICE_SERVICES_API_INFERENCE_BACKEND_H_
#define SLUICE_SERVICES_API_INFERENCE_BACKEND_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "engine/sched/request.h"
#include "services/api/spec_decode_metrics.h"

namespace sluice {

// BackendStats: live load figures for /metrics and routing.
struct BackendStats {
  int64_t num_waiting_requests = 0;
  int64_t num_running_requests = 0;
  int64_t num_total_blocks = 0;
  int64_t num_free_blocks = 0;
  int64_t block_size = 0;
  int64_t num_preemptions_total = 0;
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

class InferenceBackend {
 public:
  virtual ~InferenceBackend() = default;
  // Submit starts a request; `on_output` is called (from a backend thread, must not block)
  // with each step's output until one with finished() is delivered — exactly once, also for
  // errors and aborts. Errors returned here (nothing was started, no callback will come):
  // InvalidArgument (bad parameters, prompt over the context length), ResourceExhausted
  // (queue full), AlreadyExists (duplicate request id).
  virtual absl::Status Submit(EngineRequest request, OutputCallback on_output) = 0;
  // Abort stops a request; its callback receives a final output with FinishReason::kAbort
  // (unless it already finished). Unknown ids are ignored.
  virtual void Abort(const std::string& request_id) = 0;
  virtual BackendStats Stats() const = 0;
  // Maximum prompt + output tokens per sequence.
  virtual int32_t max_model_len() const = 0;
};

}  // namespace sluice

#endif  // SLUICE_SERVICES_API_INFERENCE_BACKEND_H_
