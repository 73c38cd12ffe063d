// AsyncEngine: runs an LLMEngine on its own thread and implements the backend interface the
// HTTP handlers use. Submit/Abort are thread-safe and never block on a model step.
#ifndef SLUICE_ENGINE_SCHED_ASYNC_ENGINE_H_
#define SLUICE_ENGINE_SCHED_ASYNC_ENGINE_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "engine/sched/llm_engine.h"
#include "engine/sched/request.h"

namespace sluice {

struct AsyncEngineStats {
  int64_t num_waiting_requests = 0;
  int64_t num_running_requests = 0;
  int64_t num_total_blocks = 0;
  int64_t num_free_blocks = 0;
  int64_t block_size = 0;
  EngineCounters counters;
};

class AsyncEngine {
 public:
  // Starts the engine thread. `engine` is owned.
  explicit AsyncEngine(std::unique_ptr<LLMEngine> engine);
  ~AsyncEngine();  // aborts everything in flight, joins the thread

  // Submit validates and queues `request`; outputs go to `on_output` from the engine thread.
  // Errors as LLMEngine::AddRequest; on error no callback is made.
  absl::Status Submit(EngineRequest request, OutputCallback on_output);
  void Abort(const std::string& request_id);
  AsyncEngineStats Stats() const;
  int32_t max_model_len() const;
  const Model& model() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sluice

#endif  // SLUICE_ENGINE_SCHED_ASYNC_ENGINE_H_
