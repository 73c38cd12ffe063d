// VisionEncoder: images to the embeddings a vision-language model splices into its prompt —
// decode (image.h), preprocess (image_processor.h), the vision tower (clip_vision.h), feature
// selection and the multimodal projector. LLaVA's `get_image_features`:
//   features = hidden_states[vision_feature_layer]            [n, P + 1, Dv]
//   features = features[:, 1:] (strategy "default") or all ("full")
//   embeddings = linear_2(act(linear_1(features)))             [n, image_seq_length, Dt]
// The math runs in a VisionBackend (vision_backend.h): float32 on the CPU by default.
// This is the encoder side of encoder / prefill / decode disaggregation: it needs the vision
// weights only; the language model runs elsewhere (engine/model, LoadModel on the same folder).
#ifndef SLUICE_ENGINE_VISION_VISION_ENCODER_H_
#define SLUICE_ENGINE_VISION_VISION_ENCODER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/vision/image.h"
#include "engine/vision/image_processor.h"
#include "engine/vision/llava_config.h"
#include "engine/vision/vision_backend.h"

namespace sluice::vision {

class VisionEncoder {
 public:
  // Load reads config.json (LlavaForConditionalGeneration), preprocessor_config.json and the
  // vision tower + projector weights from `dir`. Both checkpoint layouts are accepted:
  // `vision_tower.*` / `multi_modal_projector.*` (transformers 4.x and 5 save format) and
  // `model.vision_tower.*` / `model.multi_modal_projector.*`. Errors: those of the config
  // parsers and of LoadWeight (each naming the file or tensor).
  static absl::StatusOr<std::unique_ptr<VisionEncoder>> Load(const std::string& dir);
  // Load with another backend: `factory` makes the compute side (e.g. the CUDA tower,
  // engine/cuda/cuda_vision.h) from the parsed config. Errors: those of the config parsers and
  // of the factory.
  static absl::StatusOr<std::unique_ptr<VisionEncoder>> Load(const std::string& dir,
                                                             const VisionBackendFactory& factory);

  const LlavaConfig& config() const { return config_; }
  const ImageProcessorConfig& processor() const { return processor_; }
  int64_t tokens_per_image() const { return config_.image_seq_length; }
  int64_t embedding_dim() const { return config_.text_hidden_size; }
  int32_t image_token_id() const { return config_.image_token_index; }
  // "cpu" or "cuda": where the tower and projector run.
  std::string device() const { return backend_->device(); }

  // SelectedHiddenState: the vision tower's hidden state at vision_feature_layer, before
  // feature selection: [num_images, num_positions, vision hidden]. Thread-safe. Errors: as
  // Encode.
  absl::StatusOr<std::vector<float>> SelectedHiddenState(absl::Span<const float> pixel_values,
                                                         int64_t num_images) const;
  // Encode: pixel_values [num_images, 3, S, S] → [num_images, tokens_per_image, embedding_dim]
  // float32. Thread-safe. Errors: InvalidArgument for a pixel_values size that is not
  // num_images preprocessed images.
  absl::StatusOr<std::vector<float>> Encode(absl::Span<const float> pixel_values,
                                            int64_t num_images) const;
  // EncodeImage: one decoded image through preprocessing and Encode → [tokens_per_image,
  // embedding_dim]. Errors: InvalidArgument when preprocessing does not produce the tower's
  // image_size (a preprocessor_config without center crop on a non-square image), or that of
  // CheckResizedSize (image_processor.h: an aspect ratio over about 64:1).
  absl::StatusOr<std::vector<float>> EncodeImage(const RgbImage& image) const;

 private:
  VisionEncoder() = default;
  absl::Status CheckPixels(absl::Span<const float> pixel_values, int64_t num_images) const;
  LlavaConfig config_;
  ImageProcessorConfig processor_;
  std::unique_ptr<VisionBackend> backend_;
};

}  // namespace sluice::vision

#endif  // SLUICE_ENGINE_VISION_VISION_ENCODER_H_
