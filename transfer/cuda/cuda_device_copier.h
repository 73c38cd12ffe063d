// CudaDeviceCopier: the CUDA DeviceCopier (transfer/device_copier.h): one non-blocking stream
// per lane on one device, cudaMemcpyAsync between device memory and pinned host staging
// (cudaHostAlloc, portable), so the staged KV transfer's device copies overlap its network
// operations and the engine's compute stream.
#ifndef SLUICE_TRANSFER_CUDA_CUDA_DEVICE_COPIER_H_
#define SLUICE_TRANSFER_CUDA_CUDA_DEVICE_COPIER_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "transfer/device_copier.h"

namespace sluice::transfer {

class CudaDeviceCopier final : public DeviceCopier {
 public:
  // Create: `num_lanes` streams on CUDA device `device` (-1: the calling thread's current one).
  // Errors: InvalidArgument for num_lanes < 1; FailedPrecondition when no device is usable;
  // Internal for other CUDA errors.
  static absl::StatusOr<std::unique_ptr<CudaDeviceCopier>> Create(int device, int num_lanes);
  ~CudaDeviceCopier() override;  // waits for every lane, destroys the streams

  int num_lanes() const override { return static_cast<int>(streams_.size()); }
  absl::StatusOr<void*> AllocateStaging(int64_t bytes) override;
  void FreeStaging(void* staging) override;
  absl::Status CopyAsync(int lane, void* dst, const void* src, int64_t bytes,
                         CopyDirection direction) override;
  absl::Status Wait(int lane) override;
  // WaitFence: cudaStreamWaitEvent of the lane's stream on `fence` (a cudaEvent_t).
  absl::Status WaitFence(int lane, const void* fence) override;
  // WaitUntil polls the lane's stream (cudaStreamQuery) until it is idle or `deadline`.
  absl::Status WaitUntil(int lane, absl::Time deadline) override;
  // RecordFence records the lane's own event on its stream.
  absl::StatusOr<const void*> RecordFence(int lane) override;

 private:
  CudaDeviceCopier() = default;
  absl::Status SetDevice() const;

  int device_ = 0;
  std::vector<void*> streams_;  // cudaStream_t, kept opaque so the header needs no CUDA
  std::vector<void*> fences_;   // cudaEvent_t per lane (RecordFence), created at first use
};

}  // namespace sluice::transfer

#endif  // SLUICE_TRANSFER_CUDA_CUDA_DEVICE_COPIER_H_
