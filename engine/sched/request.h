// Request and output types exchanged between the engine and its front ends.
#ifndef SLUICE_ENGINE_SCHED_REQUEST_H_
#define SLUICE_ENGINE_SCHED_REQUEST_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/sample/sampler.h"
#include "engine/sample/sampling_params.h"

namespace sluice {

// EngineRequest: a tokenized prompt and its sampling parameters.
struct EngineRequest {
  std::string request_id;                // unique among in-flight requests
  std::vector<int32_t> prompt_token_ids;
  SamplingParams sampling;
};

enum class FinishReason { kNone, kStop, kLength, kAbort, kError };
const char* FinishReasonName(FinishReason reason);  // "stop" | "length" | "abort" | "error"

// RequestOutput: what one engine step produced for one request.
struct RequestOutput {
  std::string request_id;
  std::vector<SampledToken> new_tokens;  // usually one per step
  FinishReason finish_reason = FinishReason::kNone;
  absl::Status status;                   // non-OK with kError
  int32_t num_prompt_tokens = 0;
  int32_t num_cached_tokens = 0;         // prompt tokens served from the prefix cache
  int32_t num_output_tokens = 0;         // total so far
  bool finished() const { return finish_reason != FinishReason::kNone; }
};

// OutputCallback receives a request's outputs in order; the last one has finished() true.
// Called from the engine thread: it must not block.
using OutputCallback = std::function<void(const RequestOutput&)>;

}  // namespace sluice

#endif  // SLUICE_ENGINE_SCHED_REQUEST_H_
