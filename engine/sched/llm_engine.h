// LLMEngine: continuous batching over a paged KV cache on one model.
//
// Each Step() schedules running decodes first, then prefill chunks of waiting requests within
// a per-step token budget (chunked prefill); when KV blocks run out the most recently admitted
// running request is preempted (its blocks freed, recomputed later). Not thread-safe: driven by
// one thread (see AsyncEngine).
#ifndef SLUICE_ENGINE_SCHED_LLM_ENGINE_H_
#define SLUICE_ENGINE_SCHED_LLM_ENGINE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/model/model.h"
#include "engine/sched/request.h"

namespace sluice {

struct EngineOptions {
  int64_t block_size = 16;             // tokens per KV block
  int64_t num_kv_blocks = 0;           // 0: derive from kv_cache_bytes
  int64_t kv_cache_bytes = 1LL << 30;  // KV memory budget when num_kv_blocks == 0
  int32_t max_num_seqs = 256;          // running sequences per step
  int32_t max_num_batched_tokens = 512;  // token budget per step (prefill chunk + decodes)
  int32_t max_model_len = 0;           // 0: the model's max_position_embeddings
  int32_t max_waiting_requests = 4096;  // beyond this Submit returns ResourceExhausted
};

// EngineCounters: cumulative figures for metrics and tests.
struct EngineCounters {
  int64_t num_steps = 0;
  int64_t num_prompt_tokens_computed = 0;  // prefill tokens run through the model (incl. recompute)
  int64_t num_generation_tokens = 0;
  int64_t num_preemptions = 0;
};

class LLMEngine {
 public:
  // `model` is owned. Errors: InvalidArgument for options that cannot hold one sequence.
  static absl::StatusOr<std::unique_ptr<LLMEngine>> Create(std::unique_ptr<Model> model,
                                                           const EngineOptions& options);
  virtual ~LLMEngine() = default;

  // AddRequest queues a request. Errors: InvalidArgument (empty prompt, prompt + max_tokens over
  // max_model_len — message gives both numbers —, token id outside the vocabulary, bad sampling
  // params), AlreadyExists (duplicate id), ResourceExhausted (waiting queue full).
  virtual absl::Status AddRequest(EngineRequest request) = 0;
  // ValidateRequest runs AddRequest's checks that depend only on the request and the model
  // (not on engine state). Thread-safe: reads immutable configuration only.
  virtual absl::Status ValidateRequest(const EngineRequest& request) const = 0;
  // AbortRequest finishes the request with kAbort in the next Step's outputs and frees its
  // blocks. Unknown ids are ignored.
  virtual void AbortRequest(const std::string& request_id) = 0;
  // Step runs one scheduling step and returns the outputs it produced.
  virtual std::vector<RequestOutput> Step() = 0;
  virtual bool HasUnfinishedRequests() const = 0;

  virtual const Model& model() const = 0;
  virtual int32_t max_model_len() const = 0;
  virtual int64_t num_waiting() const = 0;
  virtual int64_t num_running() const = 0;
  virtual int64_t num_total_blocks() const = 0;
  virtual int64_t num_free_blocks() const = 0;
  virtual int64_t block_size() const = 0;
  virtual EngineCounters counters() const = 0;
};

}  // namespace sluice

#endif  // SLUICE_ENGINE_SCHED_LLM_ENGINE_H_
