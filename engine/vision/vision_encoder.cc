#include "engine/vision/vision_encoder.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/model/safetensors.h"
#include "engine/model/weight_loader.h"
#include "engine/vision/clip_vision.h"
#include "kernels/activation/activation.h"
#include "kernels/linear/linear.h"
#include "kernels/vit/vit.h"

namespace sluice::vision {
namespace {

// The float32 CPU backend: ClipVisionTower, then LLaVA's feature selection and projector.
class CpuVisionBackend : public VisionBackend {
 public:
  static absl::StatusOr<std::unique_ptr<VisionBackend>> Load(const std::string& dir,
                                                             const LlavaConfig& c) {
    std::unique_ptr<CpuVisionBackend> b(new CpuVisionBackend());
    b->config_ = c;
    SLUICE_ASSIGN_OR_RETURN(auto ckpt, Checkpoint::Open(dir));
    const std::string root =
        VisionWeightRoot(ckpt->Contains("model.vision_tower.embeddings.class_embedding"));
    SLUICE_ASSIGN_OR_RETURN(ClipVisionTower tower,
                            ClipVisionTower::Load(*ckpt, root + "vision_tower.", c.vision,
                                                  c.FeatureLayerIndex()));
    b->tower_ = std::make_unique<ClipVisionTower>(std::move(tower));
    const int64_t dv = c.vision.hidden_size, dt = c.text_hidden_size;
    const std::string p = root + "multi_modal_projector.";
    SLUICE_RETURN_IF_ERROR(LoadWeightInto(*ckpt, p + "linear_1.weight", {dt, dv}, &b->w1_));
    SLUICE_RETURN_IF_ERROR(LoadWeightInto(*ckpt, p + "linear_2.weight", {dt, dt}, &b->w2_));
    if (c.multimodal_projector_bias) {
      SLUICE_RETURN_IF_ERROR(LoadWeightInto(*ckpt, p + "linear_1.bias", {dt}, &b->b1_));
      SLUICE_RETURN_IF_ERROR(LoadWeightInto(*ckpt, p + "linear_2.bias", {dt}, &b->b2_));
    }
    return std::unique_ptr<VisionBackend>(std::move(b));
  }

  std::string device() const override { return "cpu"; }

  absl::StatusOr<std::vector<float>> SelectedHiddenState(absl::Span<const float> pixel_values,
                                                         int64_t num_images) const override {
    return tower_->HiddenState(pixel_values, num_images, config_.FeatureLayerIndex());
  }

  absl::StatusOr<std::vector<float>> Encode(absl::Span<const float> pixel_values,
                                            int64_t num_images) const override {
    SLUICE_ASSIGN_OR_RETURN(std::vector<float> hidden,
                            SelectedHiddenState(pixel_values, num_images));
    const int64_t positions = config_.vision.num_positions(), dv = config_.vision.hidden_size;
    const int64_t dt = config_.text_hidden_size, T = config_.image_seq_length;
    std::vector<float> selected(static_cast<size_t>(num_images * T * dv));
    // skip 1 with "default" (CLS dropped), 0 with "full"
    kernels::SelectFeatureRowsCpu(hidden.data(), num_images, positions, positions - T, T, dv,
                                  selected.data());
    const int64_t rows = num_images * T;
    std::vector<float> mid(static_cast<size_t>(rows * dt)), out(static_cast<size_t>(rows * dt));
    kernels::LinearCpu(selected.data(), w1_.data(), b1_.empty() ? nullptr : b1_.data(),
                       mid.data(), rows, dt, dv);
    if (config_.projector_hidden_act == "gelu") {
      kernels::GeluCpu(mid.data(), mid.data(), rows * dt);
    } else {
      kernels::QuickGeluCpu(mid.data(), mid.data(), rows * dt);
    }
    kernels::LinearCpu(mid.data(), w2_.data(), b2_.empty() ? nullptr : b2_.data(), out.data(),
                       rows, dt, dt);
    return out;
  }

 private:
  CpuVisionBackend() = default;
  LlavaConfig config_;
  std::unique_ptr<ClipVisionTower> tower_;
  std::vector<float> w1_, b1_;  // [Dt, Dv], [Dt] (b empty without multimodal_projector_bias)
  std::vector<float> w2_, b2_;  // [Dt, Dt], [Dt]
};

}  // namespace

absl::StatusOr<std::unique_ptr<VisionBackend>> LoadCpuVisionBackend(const std::string& dir,
                                                                    const LlavaConfig& config) {
  return CpuVisionBackend::Load(dir, config);
}

absl::StatusOr<std::unique_ptr<VisionEncoder>> VisionEncoder::Load(const std::string& dir) {
  return Load(dir, LoadCpuVisionBackend);
}

absl::StatusOr<std::unique_ptr<VisionEncoder>> VisionEncoder::Load(
    const std::string& dir, const VisionBackendFactory& factory) {
  std::unique_ptr<VisionEncoder> enc(new VisionEncoder());
  SLUICE_ASSIGN_OR_RETURN(enc->config_, LlavaConfig::Load(dir));
  auto processor = ImageProcessorConfig::Load(dir);
  if (!processor.ok()) {
    return absl::Status(processor.status().code(),
                        absl::StrCat(dir, ": ", processor.status().message()));
  }
  enc->processor_ = *processor;
  SLUICE_ASSIGN_OR_RETURN(enc->backend_, factory(dir, enc->config_));
  return enc;
}

absl::Status VisionEncoder::CheckPixels(absl::Span<const float> pixel_values,
                                        int64_t num_images) const {
  const int64_t S = config_.vision.image_size, C = config_.vision.num_channels;
  if (num_images <= 0 ||
      static_cast<int64_t>(pixel_values.size()) != num_images * C * S * S) {
    return absl::InvalidArgumentError(absl::StrCat("pixel_values has ", pixel_values.size(),
                                                   " floats, expected ", num_images, " x ", C,
                                                   " x ", S, " x ", S));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> VisionEncoder::SelectedHiddenState(
    absl::Span<const float> pixel_values, int64_t num_images) const {
  SLUICE_RETURN_IF_ERROR(CheckPixels(pixel_values, num_images));
  return backend_->SelectedHiddenState(pixel_values, num_images);
}

absl::StatusOr<std::vector<float>> VisionEncoder::Encode(absl::Span<const float> pixel_values,
                                                         int64_t num_images) const {
  SLUICE_RETURN_IF_ERROR(CheckPixels(pixel_values, num_images));
  return backend_->Encode(pixel_values, num_images);
}

absl::StatusOr<std::vector<float>> VisionEncoder::EncodeImage(const RgbImage& image) const {
  const auto size = processor_.OutputSize(image.height, image.width);
  const int64_t s = config_.vision.image_size;
  SLUICE_RETURN_IF_ERROR(CheckResizedSize(processor_, s, image.height, image.width));
  if (size[0] != s || size[1] != s) {
    return absl::InvalidArgumentError(absl::StrCat(
        "preprocessing makes a ", size[1], "x", size[0], " image, the vision tower takes ", s,
        "x", s));
  }
  const std::vector<float> pixels = Preprocess(image, processor_);
  return Encode(pixels, 1);
}

}  // namespace sluice::vision
