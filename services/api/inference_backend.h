// InferenceBackend: what the OpenAI HTTP handlers need from whatever runs the model — the
// in-process engine for `sluice serve`, or the router's remote prefill/decode workers.
#ifndef SLUICE_SERVICES_API_INFERENCE_BACKEND_H_
#define SLUICE_SERVICES_API_INFERENCE_BACKEND_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "engine/sched/request.h"
#include "services/common/backend_stats.h"

namespace sluice {

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
