#include "engine/vision/vision_encoder.h"

#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/model/safetensors.h"
#include "engine/model/weight_loader.h"
#include "kernels/activation/activation.h"
#include "kernels/linear/linear.h"

namespace sluice::vision {

absl::StatusOr<std::unique_ptr<VisionEncoder>> VisionEncoder::Load(const std::string& dir) {
  std::unique_ptr<VisionEncoder> enc(new VisionEncoder());
  SLUICE_ASSIGN_OR_RETURN(enc->config_, LlavaConfig::Load(dir));
  auto processor = ImageProcessorConfig::Load(dir);
  if (!processor.ok()) {
    return absl::Status(processor.status().code(),
                        absl::StrCat(dir, ": ", processor.status().message()));
  }
  enc->processor_ = *processor;
  SLUICE_ASSIGN_OR_RETURN(auto ckpt, Checkpoint::Open(dir));
  const std::string root = ckpt->Contains("model.vision_tower.embeddings.class_embedding")
                               ? "model."
                               : "";
  const LlavaConfig& c = enc->config_;
  SLUICE_ASSIGN_OR_RETURN(ClipVisionTower tower,
                          ClipVisionTower::Load(*ckpt, root + "vision_tower.", c.vision,
                                                c.FeatureLayerIndex()));
  enc->tower_ = std::make_unique<ClipVisionTower>(std::move(tower));
  const int64_t dv = c.vision.hidden_size, dt = c.text_hidden_size;
  const std::string p = root + "multi_modal_projector.";
  SLUICE_RETURN_IF_ERROR(LoadWeightInto(*ckpt, p + "linear_1.weight", {dt, dv}, &enc->w1_));
  SLUICE_RETURN_IF_ERROR(LoadWeightInto(*ckpt, p + "linear_2.weight", {dt, dt}, &enc->w2_));
  if (c.multimodal_projector_bias) {
    SLUICE_RETURN_IF_ERROR(LoadWeightInto(*ckpt, p + "linear_1.bias", {dt}, &enc->b1_));
    SLUICE_RETURN_IF_ERROR(LoadWeightInto(*ckpt, p + "linear_2.bias", {dt}, &enc->b2_));
  }
  return enc;
}

absl::StatusOr<std::vector<float>> VisionEncoder::SelectedHiddenState(
    absl::Span<const float> pixel_values, int64_t num_images) const {
  return tower_->HiddenState(pixel_values, num_images, config_.FeatureLayerIndex());
}

absl::StatusOr<std::vector<float>> VisionEncoder::Encode(absl::Span<const float> pixel_values,
                                                         int64_t num_images) const {
  SLUICE_ASSIGN_OR_RETURN(std::vector<float> hidden,
                          SelectedHiddenState(pixel_values, num_images));
  const int64_t positions = config_.vision.num_positions(), dv = config_.vision.hidden_size;
  const int64_t dt = config_.text_hidden_size, T = config_.image_seq_length;
  const int64_t skip = positions - T;  // 1 with "default" (CLS dropped), 0 with "full"
  std::vector<float> selected(static_cast<size_t>(num_images * T * dv));
  for (int64_t n = 0; n < num_images; ++n) {
    std::memcpy(selected.data() + n * T * dv, hidden.data() + (n * positions + skip) * dv,
                T * dv * sizeof(float));
  }
  const int64_t rows = num_images * T;
  std::vector<float> mid(static_cast<size_t>(rows * dt)), out(static_cast<size_t>(rows * dt));
  kernels::LinearCpu(selected.data(), w1_.data(), b1_.empty() ? nullptr : b1_.data(), mid.data(),
                     rows, dt, dv);
  if (config_.projector_hidden_act == "gelu") {
    kernels::GeluCpu(mid.data(), mid.data(), rows * dt);
  } else {
    kernels::QuickGeluCpu(mid.data(), mid.data(), rows * dt);
  }
  kernels::LinearCpu(mid.data(), w2_.data(), b2_.empty() ? nullptr : b2_.data(), out.data(), rows,
                     dt, dt);
  return out;
}

absl::StatusOr<std::vector<float>> VisionEncoder::EncodeImage(const RgbImage& image) const {
  const auto size = processor_.OutputSize(image.height, image.width);
  const int64_t s = config_.vision.image_size;
  if (size[0] != s || size[1] != s) {
    return absl::InvalidArgumentError(absl::StrCat(
        "preprocessing makes a ", size[1], "x", size[0], " image, the vision tower takes ", s,
        "x", s));
  }
  const std::vector<float> pixels = Preprocess(image, processor_);
  return Encode(pixels, 1);
}

}  // namespace sluice::vision
