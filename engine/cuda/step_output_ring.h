// StepOutputRing: where a CUDA runner's asynchronous sampled steps leave their results. Each
// enqueued step takes one pinned host slot — its rows' sampling parameters staged for the
// upload, and the sampled token ids and logprobs copied back — and an event recorded after its
// last copy. Steps are read back oldest first; a slot is reused only after it was read, so the
// pinned parameters it staged are never rewritten while their upload may still be pending.
// Internal to engine/cuda. Not thread-safe.
#ifndef SLUICE_ENGINE_CUDA_STEP_OUTPUT_RING_H_
#define SLUICE_ENGINE_CUDA_STEP_OUTPUT_RING_H_

#include <cstdint>
#include <deque>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/model/model.h"
#include "kernels/cuda/cuda_common.h"
#include "kernels/sampling/sampling.h"

namespace sluice::cuda_runner {

class StepOutputRing {
 public:
  // Unread steps at most (Model::kMaxUnreadSteps) plus the one being enqueued.
  static constexpr int kSlots = Model::kMaxUnreadSteps + 1;

  StepOutputRing() = default;
  StepOutputRing(const StepOutputRing&) = delete;
  StepOutputRing& operator=(const StepOutputRing&) = delete;
  ~StepOutputRing();

  // Init allocates kSlots slots of max_rows rows. Errors: Internal for CUDA failures.
  absl::Status Init(int64_t max_rows);

  // Acquire returns a free slot for a step of `rows` rows (not yet counted as unread).
  // Errors: FailedPrecondition when kMaxUnreadSteps steps are unread; InvalidArgument for rows
  // outside [0, max_rows].
  absl::StatusOr<int> Acquire(int64_t rows);
  kernels::SamplingRow* params(int slot) { return slots_[slot].params; }
  int32_t* ids(int slot) { return slots_[slot].ids; }
  float* logprobs(int slot) { return slots_[slot].logprobs; }
  // Commit records the slot's event on `stream` (after the step's device→host copies were
  // enqueued) and queues it for ReadOldest.
  absl::Status Commit(int slot, cudaStream_t stream);
  // ReadOldest waits for the oldest committed step and copies its results into `out`.
  // Errors: FailedPrecondition when nothing is unread; InvalidArgument when out.size() differs
  // from its rows (it stays unread); Internal for an asynchronous CUDA error.
  absl::Status ReadOldest(absl::Span<GreedyToken> out);
  int num_unread() const { return static_cast<int>(unread_.size()); }
  // The slot ReadOldest reads next; -1 when nothing is unread.
  int oldest_slot() const { return unread_.empty() ? -1 : unread_.front(); }
  // The event of the step ReadOldest read last (null before the first read): complete once that
  // step and everything enqueued before it are. Recorded again by a later step's Commit, it then
  // marks that later step — a fence that is late, never early.
  cudaEvent_t last_read_event() const {
    return last_read_ < 0 ? nullptr : slots_[last_read_].done;
  }
  // Clear forgets unread steps (after the stream was synchronized, e.g. a new KV cache).
  void Clear() { unread_.clear(); }

 private:
  struct Slot {
    void* host = nullptr;  // pinned: params, then ids, then logprobs
    kernels::SamplingRow* params = nullptr;
    int32_t* ids = nullptr;
    float* logprobs = nullptr;
    int64_t rows = 0;
    cudaEvent_t done = nullptr;
  };
  Slot slots_[kSlots];
  std::deque<int> unread_;  // committed slots, oldest first
  int last_read_ = -1;
  int next_ = 0;
  int64_t max_rows_ = 0;
};

}  // namespace sluice::cuda_runner

#endif  // SLUICE_ENGINE_CUDA_STEP_OUTPUT_RING_H_
