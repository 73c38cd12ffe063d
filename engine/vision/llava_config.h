// LlavaConfig: the vision side of a `LlavaForConditionalGeneration` config.json (the text side,
// `text_config`, is the ModelConfig the language model loads with).
//
// Reference: transformers' `LlavaConfig`, `CLIPVisionConfig` and `modeling_llava.py`
// ("Visual Instruction Tuning", Liu et al. 2023).
#ifndef SLUICE_ENGINE_VISION_LLAVA_CONFIG_H_
#define SLUICE_ENGINE_VISION_LLAVA_CONFIG_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace sluice::vision {

// ClipVisionConfig: `vision_config` (model_type clip_vision_model).
struct ClipVisionConfig {
  int64_t hidden_size = 768;
  int64_t intermediate_size = 3072;
  int64_t num_hidden_layers = 12;
  int64_t num_attention_heads = 12;
  int64_t num_channels = 3;
  int64_t image_size = 224;
  int64_t patch_size = 32;
  double layer_norm_eps = 1e-5;
  std::string hidden_act = "quick_gelu";  // "quick_gelu" | "gelu"
  int64_t num_patches() const { return (image_size / patch_size) * (image_size / patch_size); }
  int64_t num_positions() const { return num_patches() + 1; }  // + CLS
};

struct LlavaConfig {
  ClipVisionConfig vision;
  int64_t text_hidden_size = 0;  // text_config.hidden_size: the projector's output width
  int32_t image_token_index = 32000;
  // Placeholder tokens per image: num_patches (strategy "default", CLS dropped) or
  // num_patches + 1 ("full"). config.json's image_seq_length must agree when present.
  int64_t image_seq_length = 0;
  // Index into the vision tower's hidden states (embeddings after pre_layrnorm, then each
  // encoder layer's output): negative counts from the end (-1 = last layer, -2 = the one before).
  int64_t vision_feature_layer = -2;
  std::string vision_feature_select_strategy = "default";  // "default" drops CLS | "full"
  std::string projector_hidden_act = "gelu";               // "gelu" | "quick_gelu"
  bool multimodal_projector_bias = true;

  // The hidden-state index vision_feature_layer selects, in [0, num_hidden_layers].
  int64_t FeatureLayerIndex() const {
    return vision_feature_layer < 0 ? vision.num_hidden_layers + 1 + vision_feature_layer
                                    : vision_feature_layer;
  }

  // FromJsonText parses a whole llava config.json. Errors: InvalidArgument for another
  // architecture, a missing vision_config/text_config, a field of the wrong type, a list-valued
  // vision_feature_layer, an unsupported activation or strategy, or an image_seq_length that
  // does not match the strategy.
  static absl::StatusOr<LlavaConfig> FromJsonText(const std::string& text);
  static absl::StatusOr<LlavaConfig> Load(const std::string& dir);  // <dir>/config.json
};

}  // namespace sluice::vision

#endif  // SLUICE_ENGINE_VISION_LLAVA_CONFIG_H_
