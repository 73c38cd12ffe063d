// VisionBackend: the compute of a VisionEncoder — vision tower, feature selection and
// projector — on one device. VisionEncoder (vision_encoder.h) owns the configs and
// preprocessing and checks its inputs; a backend only runs the math:
//   cpu:  engine/vision (ClipVisionTower + the projector, float32), VisionEncoder::Load's default;
//   cuda: engine/cuda/cuda_vision.h (bf16 weights and GEMMs, fp32 residual stream).
#ifndef SLUICE_ENGINE_VISION_VISION_BACKEND_H_
#define SLUICE_ENGINE_VISION_VISION_BACKEND_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/vision/llava_config.h"

namespace sluice::vision {

class VisionBackend {
 public:
  virtual ~VisionBackend() = default;
  // "cpu" or "cuda".
  virtual std::string device() const = 0;
  // SelectedHiddenState: pixel_values [num_images, 3, S, S] (already checked by the caller) →
  // the tower's hidden state at vision_feature_layer, [num_images, num_positions, vision
  // hidden] float32, CLS first. Thread-safe.
  virtual absl::StatusOr<std::vector<float>> SelectedHiddenState(
      absl::Span<const float> pixel_values, int64_t num_images) const = 0;
  // Encode: the same pixels → projected embeddings [num_images, image_seq_length, text hidden]
  // float32. Thread-safe.
  virtual absl::StatusOr<std::vector<float>> Encode(absl::Span<const float> pixel_values,
                                                    int64_t num_images) const = 0;
};

// VisionBackendFactory loads a backend for the LLaVA folder `dir` whose vision config is
// `config` (VisionEncoder::Load parses it once for both).
using VisionBackendFactory = std::function<absl::StatusOr<std::unique_ptr<VisionBackend>>(
    const std::string& dir, const LlavaConfig& config)>;

// LoadCpuVisionBackend: the float32 CPU backend, weights from `dir`'s safetensors (both
// checkpoint layouts, see VisionEncoder::Load). Errors: those of LoadWeight, naming the tensor.
absl::StatusOr<std::unique_ptr<VisionBackend>> LoadCpuVisionBackend(const std::string& dir,
                                                                    const LlavaConfig& config);

// VisionWeightRoot: "model." when `has_nested` (the checkpoint holds
// model.vision_tower.embeddings.class_embedding: transformers 5's layout), else "".
inline std::string VisionWeightRoot(bool has_nested) { return has_nested ? "model." : ""; }

}  // namespace sluice::vision

#endif  // SLUICE_ENGINE_VISION_VISION_BACKEND_H_
