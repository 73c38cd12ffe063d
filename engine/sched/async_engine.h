// AsyncEngine: runs an LLMEngine on its own thread and implements the backend interface the
// HTTP handlers use. Submit/Abort are thread-safe and never block on a model step.
#ifndef SLUICE_ENGINE_SCHED_ASYNC_ENGINE_H_
#define SLUICE_ENGINE_SCHED_ASYNC_ENGINE_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/sched/llm_engine.h"
#include "engine/sched/request.h"

namespace sluice {

struct AsyncEngineStats {
  int64_t num_waiting_requests = 0;
  int64_t num_running_requests = 0;
  int64_t num_total_blocks = 0;
  int64_t num_free_blocks = 0;
  int64_t block_size = 0;
  int64_t num_held_blocks = 0;  // prefill: blocks pinned for decode workers
  int64_t num_reserved = 0;     // decode: requests waiting for their KV transfer
  int64_t num_cached_blocks = 0;  // blocks registered in the prefix cache
  EngineCounters counters;
};

class AsyncEngine {
 public:
  // Starts the engine thread. `engine` is owned.
  explicit AsyncEngine(std::unique_ptr<LLMEngine> engine);
  ~AsyncEngine();  // aborts everything in flight, joins the thread
  // Shutdown: what the destructor does, earlier: every request in flight gets its final
  // (aborted) output, then the engine thread ends. Owners of output callbacks call it before
  // they go. Idempotent; later Submit calls get Unavailable.
  void Shutdown();

  // Submit validates and queues `request`; outputs go to `on_output` from the engine thread.
  // Errors as LLMEngine::AddRequest; on error no callback is made.
  absl::Status Submit(EngineRequest request, OutputCallback on_output);
  // Abort stops a request at any stage: queued, running, reserved for a transfer (its callback
  // gets kAbort), or finished with held KV blocks (the blocks are freed). Unknown ids are ignored.
  void Abort(const std::string& request_id);

  // --- Disaggregated serving (see LLMEngine's hooks) ---
  // ReleaseHeldBlocks frees a prefill request's pinned blocks. `done` (may be empty) gets
  // OK or NotFound, from the engine thread.
  void ReleaseHeldBlocks(const std::string& request_id,
                         std::function<void(absl::Status)> done = nullptr);
  // ReserveForTransfer reserves decode blocks for `request` (prompt + 1 tokens). `on_reserved`
  // gets the block ids (sequence order) or an error, from the engine thread; when blocks are
  // short the reservation is retried after each step until `deadline`, then DeadlineExceeded.
  // The ids come once no asynchronous step in flight at the reservation can still write them
  // (LLMEngine::num_steps_read), so the caller may hand them to any writer at once.
  // After a successful reservation `on_output` receives the request's outputs (from the second
  // token on) once CompleteTransfer(OK) ran, or one final kError/kAbort output. Errors from
  // on_reserved: as LLMEngine::ReserveForTransfer, Unavailable on shutdown; no on_output call.
  void ReserveForTransfer(EngineRequest request, std::optional<SampledToken> first_token,
                          absl::Time deadline,
                          std::function<void(absl::StatusOr<std::vector<int32_t>>)> on_reserved,
                          OutputCallback on_output);
  // CompleteTransfer ends a reservation (see LLMEngine::CompleteTransfer); errors (NotFound,
  // InvalidArgument) go to `done` (may be empty) from the engine thread.
  void CompleteTransfer(const std::string& request_id, absl::Status status,
                        std::optional<SampledToken> first_token,
                        std::function<void(absl::Status)> done = nullptr);
  // kv_cache: the engine's KV storage, for registering its buffers with a transfer agent.
  // Addresses are stable; only the engine thread writes the contents.
  KvCache& kv_cache();
  int64_t block_size() const;

  // --- KV events (prefix cache changes), for KV-aware routing. Thread-safe, never block on a
  // step. ReadKvEvents returns the events after `after_seq` (at most `max_events`); with
  // fell_behind set the caller must resync from KvCacheSnapshot() and continue from its seq.
  KvEventBatch ReadKvEvents(uint64_t after_seq, size_t max_events = 1024) const;
  KvSnapshot KvCacheSnapshot() const;
  // The block-hash identity (seed string) of this engine's cache; see KvLayoutIdentity.
  const std::string& kv_identity() const;

  AsyncEngineStats Stats() const;
  int32_t max_model_len() const;
  const Model& model() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sluice

#endif  // SLUICE_ENGINE_SCHED_ASYNC_ENGINE_H_
