// Where a process's vision tower runs: `sluice encoder --device`, `sluice serve/generate
// --vision-device` (default: the engine's --device). The CPU backend is engine/vision's float32
// tower; the CUDA backend (engine/cuda/cuda_vision.h) exists only in builds with the CUDA
// backend.
#ifndef SLUICE_SERVICES_SERVE_VISION_DEVICE_H_
#define SLUICE_SERVICES_SERVE_VISION_DEVICE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/vision/vision_encoder.h"

namespace sluice {

struct VisionPlacement {
  std::string device = "cpu";  // cpu | cuda (GPU 0)
  bool dummy_weights = false;  // --load-format dummy: random weights from config.json (CUDA)
  int64_t max_batch_images = 8;  // CUDA: images per tower pass (activation memory)
};

// CheckVisionPlacement: the start-up checks of LoadVisionEncoderOn without loading anything.
// Errors: InvalidArgument for a device other than cpu/cuda, dummy weights on the CPU (its
// tower loads the folder's safetensors only), max_batch_images < 1, or cuda in a build without
// the CUDA backend (naming the flag and the rebuild).
absl::Status CheckVisionPlacement(const VisionPlacement& placement);

// LoadVisionEncoderOn: the VisionEncoder of the LLaVA folder `model_dir` with its tower and
// projector on placement.device. Errors: those of CheckVisionPlacement; FailedPrecondition when
// no CUDA GPU is visible; those of VisionEncoder::Load and the backend's load.
absl::StatusOr<std::unique_ptr<vision::VisionEncoder>> LoadVisionEncoderOn(
    const std::string& model_dir, const VisionPlacement& placement);

}  // namespace sluice

#endif  // SLUICE_SERVICES_SERVE_VISION_DEVICE_H_
