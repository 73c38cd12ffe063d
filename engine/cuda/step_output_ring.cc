#include "engine/cuda/step_output_ring.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace sluice::cuda_runner {

StepOutputRing::~StepOutputRing() {
  for (Slot& s : slots_) {
    if (s.done != nullptr) cudaEventDestroy(s.done);
    if (s.host != nullptr) cudaFreeHost(s.host);
  }
}

absl::Status StepOutputRing::Init(int64_t max_rows) {
  max_rows_ = max_rows;
  const size_t n = static_cast<size_t>(std::max<int64_t>(max_rows, 1));
  const size_t bytes = n * (sizeof(kernels::SamplingRow) + sizeof(int32_t) + sizeof(float));
  for (Slot& s : slots_) {
    SLUICE_CUDA_RETURN_IF_ERROR(cudaMallocHost(&s.host, bytes), "cudaMallocHost");
    // SamplingRow holds a double: it goes first, at the allocation's alignment.
    s.params = static_cast<kernels::SamplingRow*>(s.host);
    s.ids = reinterpret_cast<int32_t*>(s.params + n);
    s.logprobs = reinterpret_cast<float*>(s.ids + n);
    SLUICE_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming),
                                "cudaEventCreate");
  }
  return absl::OkStatus();
}

absl::StatusOr<int> StepOutputRing::Acquire(int64_t rows) {
  if (rows < 0 || rows > max_rows_) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampled step of ", rows, " rows; at most ", max_rows_));
  }
  if (num_unread() >= Model::kMaxUnreadSteps) {
    return absl::FailedPreconditionError(absl::StrCat(
        Model::kMaxUnreadSteps, " sampled steps are unread: read one before enqueuing another"));
  }
  // With fewer than kSlots - 1 unread, the slot after the newest unread one is free.
  const int slot = unread_.empty() ? next_ : (unread_.back() + 1) % kSlots;
  slots_[slot].rows = rows;
  return slot;
}

absl::Status StepOutputRing::Commit(int slot, cudaStream_t stream) {
  SLUICE_CUDA_RETURN_IF_ERROR(cudaEventRecord(slots_[slot].done, stream), "cudaEventRecord");
  unread_.push_back(slot);
  next_ = (slot + 1) % kSlots;
  return absl::OkStatus();
}

absl::Status StepOutputRing::ReadOldest(absl::Span<GreedyToken> out) {
  if (unread_.empty()) return absl::FailedPreconditionError("no sampled step is unread");
  const Slot& s = slots_[unread_.front()];
  if (static_cast<int64_t>(out.size()) != s.rows) {
    return absl::InvalidArgumentError(absl::StrCat("ReadSampledStep: ", out.size(),
                                                   " outputs for a step of ", s.rows, " rows"));
  }
  last_read_ = unread_.front();
  unread_.pop_front();
  SLUICE_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(s.done), "sampled step");
  for (int64_t r = 0; r < s.rows; ++r) out[r] = GreedyToken{s.ids[r], s.logprobs[r]};
  return absl::OkStatus();
}

}  // namespace sluice::cuda_runner
