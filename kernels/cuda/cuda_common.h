// Shared helpers of the CUDA backend: CUDA/cuBLAS errors as absl::Status, device detection,
// RAII device buffers and streams, and host-side bfloat16 conversion.
//
// Every CUDA launcher in kernels/<op>/<op>_cuda.h takes raw device pointers, sizes and a
// cudaStream_t, enqueues its work on that stream without synchronizing, and returns
// absl::Status: InvalidArgument for bad sizes, Internal for a CUDA launch error. Launchers of
// the kernels a model step chains take a last argument `bool pdl` (default false): launch as a
// programmatic dependent of the kernel before it on the stream (kernels/cuda/pdl.cuh). Pass true
// only where PdlSupported() and where nothing the kernel reads before its wait (documented per
// launcher) is written by a kernel that may still run; CUDA model runners set it per kernel
// family from CudaRunnerOptions::decode_pdl_level.
#ifndef SLUICE_KERNELS_CUDA_CUDA_COMMON_H_
#define SLUICE_KERNELS_CUDA_CUDA_COMMON_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace sluice::kernels {

using bf16 = __nv_bfloat16;

// CudaStatus maps a CUDA runtime result to OK or Internal("<what>: <cudaGetErrorName>: <text>").
absl::Status CudaStatus(cudaError_t err, const char* what);

// SLUICE_CUDA_RETURN_IF_ERROR(expr, what): returns CudaStatus(expr, what) from the enclosing
// function when the CUDA call fails.
#define SLUICE_CUDA_RETURN_IF_ERROR(expr, what)                       \
  do {                                                                \
    const cudaError_t sluice_cuda_err_ = (expr);                      \
    if (sluice_cuda_err_ != cudaSuccess) {                            \
      return ::sluice::kernels::CudaStatus(sluice_cuda_err_, (what)); \
    }                                                                 \
  } while (false)

// CudaLaunchStatus reports the error of the last kernel launch on this thread (bad launch
// configuration, missing kernel image for this GPU), as CudaStatus(cudaGetLastError(), what).
absl::Status CudaLaunchStatus(const char* what);

// CudaAvailable is true when the CUDA runtime loads and sees at least one device. False on
// machines without a GPU or driver (e.g. CI); never fails.
bool CudaAvailable();

// CudaDeviceName returns the name of the current device ("NVIDIA H200"), or an error.
absl::StatusOr<std::string> CudaDeviceName();

// PdlSupported: whether the current device runs griddepcontrol (sm_90+). Below that the kernels'
// waits compile to nothing, so a programmatic dependent launch would race: a launcher's `pdl`
// argument (kernels/cuda/pdl.cuh) may be true only where this is. Does not synchronize (fine
// during graph capture).
bool PdlSupported();

// DeviceBuffer owns `count` elements of T in device memory (cudaMalloc; freed on
// destruction). Move-only. Contents are uninitialized.
template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  // Create allocates count elements; count 0 gives an empty buffer (data() == nullptr).
  // Errors: Internal (e.g. out of device memory).
  static absl::StatusOr<DeviceBuffer> Create(size_t count) {
    DeviceBuffer buffer;
    if (count > 0) {
      void* ptr = nullptr;
      SLUICE_CUDA_RETURN_IF_ERROR(cudaMalloc(&ptr, count * sizeof(T)), "cudaMalloc");
      buffer.data_ = static_cast<T*>(ptr);
      buffer.count_ = count;
    }
    return buffer;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), count_(std::exchange(other.count_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    if (this != &other) {
      Reset();
      data_ = std::exchange(other.data_, nullptr);
      count_ = std::exchange(other.count_, 0);
    }
    return *this;
  }
  ~DeviceBuffer() { Reset(); }

  T* data() const { return data_; }
  size_t size() const { return count_; }
  size_t bytes() const { return count_ * sizeof(T); }

  // CopyFromHost copies size() elements from host memory `src` (synchronous).
  absl::Status CopyFromHost(const T* src) {
    SLUICE_CUDA_RETURN_IF_ERROR(cudaMemcpy(data_, src, bytes(), cudaMemcpyHostToDevice),
                                "cudaMemcpy H2D");
    return absl::OkStatus();
  }
  // CopyToHost copies size() elements to host memory `dst` (synchronous).
  absl::Status CopyToHost(T* dst) const {
    SLUICE_CUDA_RETURN_IF_ERROR(cudaMemcpy(dst, data_, bytes(), cudaMemcpyDeviceToHost),
                                "cudaMemcpy D2H");
    return absl::OkStatus();
  }

 private:
  void Reset() {
    if (data_ != nullptr) cudaFree(data_);
    data_ = nullptr;
    count_ = 0;
  }
  T* data_ = nullptr;
  size_t count_ = 0;
};

// CudaStream owns a non-blocking CUDA stream (destroyed on destruction). Move-only.
class CudaStream {
 public:
  CudaStream() = default;
  // Create makes a stream with cudaStreamNonBlocking. Errors: Internal.
  static absl::StatusOr<CudaStream> Create();
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;
  CudaStream(CudaStream&& other) noexcept : stream_(std::exchange(other.stream_, nullptr)) {}
  CudaStream& operator=(CudaStream&& other) noexcept;
  ~CudaStream();

  cudaStream_t get() const { return stream_; }
  // Synchronize waits for all work on the stream; returns the first asynchronous error.
  absl::Status Synchronize() const;

 private:
  cudaStream_t stream_ = nullptr;
};

// FloatToBf16 rounds to the nearest bfloat16, ties to even (NaN stays a quiet NaN).
// Host-side, bit-exact with __float2bfloat16_rn.
inline bf16 FloatToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  uint16_t out;
  if ((bits & 0x7fffffffu) > 0x7f800000u) {
    out = static_cast<uint16_t>((bits >> 16) | 0x0040u);
  } else {
    bits += 0x7fffu + ((bits >> 16) & 1u);
    out = static_cast<uint16_t>(bits >> 16);
  }
  __nv_bfloat16_raw raw;
  raw.x = out;
  return bf16(raw);
}

// Bf16ToFloat widens exactly (host-side).
inline float Bf16ToFloat(bf16 b) {
  const __nv_bfloat16_raw raw(b);
  const uint32_t bits = static_cast<uint32_t>(raw.x) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

}  // namespace sluice::kernels

#endif  // SLUICE_KERNELS_CUDA_CUDA_COMMON_H_
