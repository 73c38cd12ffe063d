#include "services/serve/vision_device.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

#if defined(SLUICE_HAVE_CUDA)
#include <cuda_runtime_api.h>

#include "engine/cuda/cuda_vision.h"
#endif

namespace sluice {

absl::Status CheckVisionPlacement(const VisionPlacement& placement) {
  if (placement.device != "cpu" && placement.device != "cuda") {
    return absl::InvalidArgumentError(
        absl::StrCat("vision device ", placement.device, ": must be cpu or cuda"));
  }
  if (placement.max_batch_images < 1) {
    return absl::InvalidArgumentError(absl::StrCat("vision tower batch ",
                                                   placement.max_batch_images, ": must be >= 1"));
  }
  if (placement.device == "cpu") {
    if (placement.dummy_weights) {
      return absl::InvalidArgumentError(
          "--load-format dummy: the CPU vision tower loads the folder's weights only (dummy "
          "vision weights need the CUDA tower)");
    }
    return absl::OkStatus();
  }
#if !defined(SLUICE_HAVE_CUDA)
  return absl::InvalidArgumentError(
      "vision device cuda: this build has no CUDA backend (rebuild with -DSLUICE_CUDA=ON)");
#else
  return absl::OkStatus();
#endif
}

absl::StatusOr<std::unique_ptr<vision::VisionEncoder>> LoadVisionEncoderOn(
    const std::string& model_dir, const VisionPlacement& placement) {
  if (absl::Status s = CheckVisionPlacement(placement); !s.ok()) return s;
  if (placement.device == "cpu") return vision::VisionEncoder::Load(model_dir);
#if defined(SLUICE_HAVE_CUDA)
  int num_devices = 0;
  if (cudaError_t e = cudaGetDeviceCount(&num_devices); e != cudaSuccess || num_devices == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "vision device cuda: no CUDA GPU is visible (",
        e != cudaSuccess ? cudaGetErrorString(e) : "cudaGetDeviceCount found 0 devices", ")"));
  }
  cuda_runner::CudaVisionOptions options;
  options.dummy_weights = placement.dummy_weights;
  options.max_batch_images = placement.max_batch_images;
  return vision::VisionEncoder::Load(model_dir, cuda_runner::CudaVisionBackendFactory(options));
#else
  return absl::InternalError("unreachable: CheckVisionPlacement refuses cuda without CUDA");
#endif
}

}  // namespace sluice
