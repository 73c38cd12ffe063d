// DeviceCopier: asynchronous copies between device memory and host staging memory, the one
// device-specific piece of the staged KV transfer (staged_transfer.h). The CUDA implementation
// (transfer/cuda/cuda_device_copier.h) runs cudaMemcpyAsync on one stream per lane into pinned
// host memory; HostMemcpyCopier stands in for it on machines without a GPU (tests: "device"
// memory is ordinary host memory).
#ifndef SLUICE_TRANSFER_DEVICE_COPIER_H_
#define SLUICE_TRANSFER_DEVICE_COPIER_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace sluice::transfer {

enum class CopyDirection { kDeviceToHost, kHostToDevice };

// Contract: copies enqueued on one lane run in order; copies on different lanes may run at the
// same time (and overlap the caller's network operations). A copy may run at any moment between
// CopyAsync and the Wait of its lane, so neither side's bytes may be touched in between.
// One caller at a time.
class DeviceCopier {
 public:
  virtual ~DeviceCopier() = default;
  // Lanes 0 .. num_lanes() - 1.
  virtual int num_lanes() const = 0;
  // AllocateStaging: `bytes` of host memory the copies run at full speed from and to (pinned
  // for CUDA). Errors: InvalidArgument for bytes <= 0; ResourceExhausted / Internal.
  virtual absl::StatusOr<void*> AllocateStaging(int64_t bytes) = 0;
  // FreeStaging: frees AllocateStaging's memory (no copy may be pending on it).
  virtual void FreeStaging(void* staging) = 0;
  // CopyAsync enqueues a copy of `bytes` from `src` to `dst` (device -> staging or staging ->
  // device, per `direction`) on `lane`. Errors: InvalidArgument for a bad lane or bytes < 0;
  // Internal for a failure to enqueue.
  virtual absl::Status CopyAsync(int lane, void* dst, const void* src, int64_t bytes,
                                 CopyDirection direction) = 0;
  // Wait blocks until every copy enqueued on `lane` has finished; returns the first error of
  // those copies (Internal), or InvalidArgument for a bad lane.
  virtual absl::Status Wait(int lane) = 0;
  // WaitFence orders `lane` after device work: copies enqueued on it from now on start only once
  // the work `fence` marks is done (an event its producer recorded, a cudaEvent_t for CUDA;
  // opaque here), without blocking the host. Null: nothing to wait for. The default suits
  // copiers whose "device" work is done on the host before any fence is handed out
  // (HostMemcpyCopier). Errors: InvalidArgument for a bad lane; Internal.
  virtual absl::Status WaitFence(int lane, const void* fence) {
    if (lane < 0 || lane >= num_lanes()) return absl::InvalidArgumentError("bad copy lane");
    return absl::OkStatus();
  }
  // WaitUntil is Wait with a deadline: DeadlineExceeded when the lane's copies have not all
  // finished by then; they stay pending (their buffers stay busy) until a later Wait.
  // The default waits without one (copies that run on the host finish promptly).
  virtual absl::Status WaitUntil(int lane, absl::Time deadline) { return Wait(lane); }
  // RecordFence returns a fence (see WaitFence) that completes once the copies enqueued on
  // `lane` so far have, for device work that must follow them; valid until the next call for
  // that lane. Null by default (copies run on the host: nothing on a device to order).
  // Errors: InvalidArgument for a bad lane; Internal.
  virtual absl::StatusOr<const void*> RecordFence(int lane) {
    if (lane < 0 || lane >= num_lanes()) return absl::InvalidArgumentError("bad copy lane");
    return static_cast<const void*>(nullptr);
  }
};

// HostMemcpyCopier: "device" memory is host memory; a lane's copies run (memcpy) at its Wait,
// the latest moment the contract allows, so a caller that reads or reuses a buffer before
// waiting for it sees the stale bytes in tests instead of getting lucky.
class HostMemcpyCopier final : public DeviceCopier {
 public:
  explicit HostMemcpyCopier(int num_lanes);
  int num_lanes() const override { return static_cast<int>(pending_.size()); }
  absl::StatusOr<void*> AllocateStaging(int64_t bytes) override;
  void FreeStaging(void* staging) override;
  absl::Status CopyAsync(int lane, void* dst, const void* src, int64_t bytes,
                         CopyDirection direction) override;
  absl::Status Wait(int lane) override;
  // Copies run so far (for tests).
  int64_t num_copies() const { return num_copies_; }

 private:
  struct Copy {
    void* dst;
    const void* src;
    int64_t bytes;
  };
  std::vector<std::vector<Copy>> pending_;
  int64_t num_copies_ = 0;
};

}  // namespace sluice::transfer

#endif  // SLUICE_TRANSFER_DEVICE_COPIER_H_
