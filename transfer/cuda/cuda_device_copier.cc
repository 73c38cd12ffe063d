#include "transfer/cuda/cuda_device_copier.h"

#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace sluice::transfer {
namespace {

absl::Status CudaError(const char* what, cudaError_t err) {
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(err)));
}

cudaStream_t Stream(void* s) { return static_cast<cudaStream_t>(s); }

}  // namespace

absl::StatusOr<std::unique_ptr<CudaDeviceCopier>> CudaDeviceCopier::Create(int device,
                                                                           int num_lanes) {
  if (num_lanes < 1) return absl::InvalidArgumentError("CudaDeviceCopier needs num_lanes >= 1");
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();  // clear the sticky "no device" error
    return absl::FailedPreconditionError("CudaDeviceCopier: no CUDA device is visible");
  }
  std::unique_ptr<CudaDeviceCopier> copier(new CudaDeviceCopier());
  if (device < 0) {
    if (cudaError_t err = cudaGetDevice(&device); err != cudaSuccess) {
      return CudaError("cudaGetDevice", err);
    }
  }
  if (device >= count) {
    return absl::InvalidArgumentError(absl::StrCat("CUDA device ", device, " of ", count));
  }
  copier->device_ = device;
  if (absl::Status s = copier->SetDevice(); !s.ok()) return s;
  for (int i = 0; i < num_lanes; ++i) {
    cudaStream_t stream = nullptr;
    if (cudaError_t err = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
        err != cudaSuccess) {
      return CudaError("cudaStreamCreateWithFlags", err);
    }
    copier->streams_.push_back(stream);
  }
  copier->fences_.assign(static_cast<size_t>(num_lanes), nullptr);
  return copier;
}

CudaDeviceCopier::~CudaDeviceCopier() {
  if (!SetDevice().ok()) return;
  for (void* s : streams_) {
    cudaStreamSynchronize(Stream(s));
    cudaStreamDestroy(Stream(s));
  }
  for (void* e : fences_) {
    if (e != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(e));
  }
}

absl::Status CudaDeviceCopier::SetDevice() const {
  if (cudaError_t err = cudaSetDevice(device_); err != cudaSuccess) {
    return CudaError("cudaSetDevice", err);
  }
  return absl::OkStatus();
}

absl::StatusOr<void*> CudaDeviceCopier::AllocateStaging(int64_t bytes) {
  if (bytes <= 0) return absl::InvalidArgumentError("AllocateStaging needs bytes > 0");
  if (absl::Status s = SetDevice(); !s.ok()) return s;
  void* p = nullptr;
  // Portable: pinned for every context, so any thread (the transfer pool) may copy from it.
  if (cudaError_t err = cudaHostAlloc(&p, static_cast<size_t>(bytes), cudaHostAllocPortable);
      err != cudaSuccess) {
    return err == cudaErrorMemoryAllocation
               ? absl::ResourceExhaustedError(absl::StrCat("cudaHostAlloc of ", bytes, " bytes"))
               : CudaError("cudaHostAlloc", err);
  }
  return p;
}

void CudaDeviceCopier::FreeStaging(void* staging) {
  if (staging != nullptr) cudaFreeHost(staging);
}

absl::Status CudaDeviceCopier::CopyAsync(int lane, void* dst, const void* src, int64_t bytes,
                                         CopyDirection direction) {
  if (lane < 0 || lane >= num_lanes()) {
    return absl::InvalidArgumentError(absl::StrCat("copy lane ", lane, " of ", num_lanes()));
  }
  if (bytes < 0) return absl::InvalidArgumentError("copy of a negative size");
  if (bytes == 0) return absl::OkStatus();
  if (absl::Status s = SetDevice(); !s.ok()) return s;
  const cudaMemcpyKind kind = direction == CopyDirection::kHostToDevice ? cudaMemcpyHostToDevice
                                                                        : cudaMemcpyDeviceToHost;
  if (cudaError_t err =
          cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), kind, Stream(streams_[lane]));
      err != cudaSuccess) {
    return CudaError("cudaMemcpyAsync", err);
  }
  return absl::OkStatus();
}

absl::Status CudaDeviceCopier::Wait(int lane) {
  if (lane < 0 || lane >= num_lanes()) {
    return absl::InvalidArgumentError(absl::StrCat("copy lane ", lane, " of ", num_lanes()));
  }
  if (cudaError_t err = cudaStreamSynchronize(Stream(streams_[lane])); err != cudaSuccess) {
    return CudaError("cudaStreamSynchronize", err);
  }
  return absl::OkStatus();
}

absl::Status CudaDeviceCopier::WaitFence(int lane, const void* fence) {
  if (lane < 0 || lane >= num_lanes()) {
    return absl::InvalidArgumentError(absl::StrCat("copy lane ", lane, " of ", num_lanes()));
  }
  if (fence == nullptr) return absl::OkStatus();
  if (absl::Status s = SetDevice(); !s.ok()) return s;
  // The event may belong to another stream of the device (the runner's compute stream).
  cudaEvent_t event = static_cast<cudaEvent_t>(const_cast<void*>(fence));
  if (cudaError_t err = cudaStreamWaitEvent(Stream(streams_[lane]), event, 0);
      err != cudaSuccess) {
    return CudaError("cudaStreamWaitEvent", err);
  }
  return absl::OkStatus();
}

absl::Status CudaDeviceCopier::WaitUntil(int lane, absl::Time deadline) {
  if (lane < 0 || lane >= num_lanes()) {
    return absl::InvalidArgumentError(absl::StrCat("copy lane ", lane, " of ", num_lanes()));
  }
  if (absl::Status s = SetDevice(); !s.ok()) return s;
  for (;;) {
    const cudaError_t err = cudaStreamQuery(Stream(streams_[lane]));
    if (err == cudaSuccess) return absl::OkStatus();
    if (err != cudaErrorNotReady) return CudaError("cudaStreamQuery", err);
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("device copies on lane ", lane, " still running at the deadline"));
    }
    // Copies of a few MiB take tens of microseconds to milliseconds: poll finely.
    absl::SleepFor(absl::Microseconds(20));
  }
}

absl::StatusOr<const void*> CudaDeviceCopier::RecordFence(int lane) {
  if (lane < 0 || lane >= num_lanes()) {
    return absl::InvalidArgumentError(absl::StrCat("copy lane ", lane, " of ", num_lanes()));
  }
  if (absl::Status s = SetDevice(); !s.ok()) return s;
  cudaEvent_t event = static_cast<cudaEvent_t>(fences_[lane]);
  if (event == nullptr) {
    if (cudaError_t err = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
        err != cudaSuccess) {
      return CudaError("cudaEventCreateWithFlags", err);
    }
    fences_[lane] = event;
  }
  if (cudaError_t err = cudaEventRecord(event, Stream(streams_[lane])); err != cudaSuccess) {
    return CudaError("cudaEventRecord", err);
  }
  return static_cast<const void*>(event);
}

}  // namespace sluice::transfer
