#include "engine/vision/llava_config.h"

#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace sluice::vision {
namespace {

using json = nlohmann::json;

absl::Status TypeError(const std::string& key, const char* want) {
  return absl::InvalidArgumentError(absl::StrCat("config field ", key, " must be ", want));
}

absl::Status GetInt(const json& j, const char* key, int64_t* out, bool positive = true) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_number_integer()) return TypeError(key, "an integer");
  *out = it->get<int64_t>();
  if (positive && *out <= 0) return TypeError(key, "positive");
  return absl::OkStatus();
}

absl::Status GetString(const json& j, const char* key, std::string* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_string()) return TypeError(key, "a string");
  *out = it->get<std::string>();
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<LlavaConfig> LlavaConfig::FromJsonText(const std::string& text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError("config.json: not a valid JSON object");
  }
  std::string arch, model_type;
  if (auto it = j.find("architectures"); it != j.end() && it->is_array() && !it->empty() &&
                                         (*it)[0].is_string()) {
    arch = (*it)[0].get<std::string>();
  }
  SLUICE_RETURN_IF_ERROR(GetString(j, "model_type", &model_type));
  if (arch != "LlavaForConditionalGeneration" && !(arch.empty() && model_type == "llava")) {
    return absl::InvalidArgumentError(absl::StrCat(
        "not a LlavaForConditionalGeneration config (architecture ", arch.empty() ? "(none)" : arch,
        ")"));
  }
  auto vc = j.find("vision_config");
  auto tc = j.find("text_config");
  if (vc == j.end() || !vc->is_object() || tc == j.end() || !tc->is_object()) {
    return absl::InvalidArgumentError("llava config.json needs vision_config and text_config");
  }
  LlavaConfig c;
  std::string vision_type = "clip_vision_model";
  SLUICE_RETURN_IF_ERROR(GetString(*vc, "model_type", &vision_type));
  if (vision_type != "clip_vision_model") {
    return absl::InvalidArgumentError(
        absl::StrCat("unsupported vision tower ", vision_type, " (clip_vision_model only)"));
  }
  ClipVisionConfig& v = c.vision;
  SLUICE_RETURN_IF_ERROR(GetInt(*vc, "hidden_size", &v.hidden_size));
  SLUICE_RETURN_IF_ERROR(GetInt(*vc, "intermediate_size", &v.intermediate_size));
  SLUICE_RETURN_IF_ERROR(GetInt(*vc, "num_hidden_layers", &v.num_hidden_layers));
  SLUICE_RETURN_IF_ERROR(GetInt(*vc, "num_attention_heads", &v.num_attention_heads));
  SLUICE_RETURN_IF_ERROR(GetInt(*vc, "num_channels", &v.num_channels));
  SLUICE_RETURN_IF_ERROR(GetInt(*vc, "image_size", &v.image_size));
  SLUICE_RETURN_IF_ERROR(GetInt(*vc, "patch_size", &v.patch_size));
  SLUICE_RETURN_IF_ERROR(GetString(*vc, "hidden_act", &v.hidden_act));
  if (auto it = vc->find("layer_norm_eps"); it != vc->end() && it->is_number()) {
    v.layer_norm_eps = it->get<double>();
  }
  if (v.num_channels != 3) return absl::InvalidArgumentError("vision_config.num_channels must be 3");
  if (v.image_size % v.patch_size != 0 || v.hidden_size % v.num_attention_heads != 0) {
    return absl::InvalidArgumentError(
        "vision_config: image_size must be a multiple of patch_size and hidden_size of "
        "num_attention_heads");
  }
  if (v.hidden_act != "quick_gelu" && v.hidden_act != "gelu") {
    return absl::InvalidArgumentError(
        absl::StrCat("unsupported vision_config.hidden_act ", v.hidden_act));
  }
  SLUICE_RETURN_IF_ERROR(GetInt(*tc, "hidden_size", &c.text_hidden_size));
  if (c.text_hidden_size <= 0) return absl::InvalidArgumentError("text_config.hidden_size missing");
  int64_t image_token = c.image_token_index;
  SLUICE_RETURN_IF_ERROR(GetInt(j, "image_token_index", &image_token, /*positive=*/false));
  if (auto it = j.find("image_token_id"); it != j.end() && it->is_number_integer()) {
    image_token = it->get<int64_t>();  // the transformers 4.5x spelling
  }
  c.image_token_index = static_cast<int32_t>(image_token);
  if (auto it = j.find("vision_feature_layer"); it != j.end() && !it->is_null()) {
    if (!it->is_number_integer()) {
      return absl::InvalidArgumentError(
          "vision_feature_layer must be one integer (lists of layers are not supported)");
    }
    c.vision_feature_layer = it->get<int64_t>();
  }
  if (c.FeatureLayerIndex() < 0 || c.FeatureLayerIndex() > v.num_hidden_layers) {
    return absl::InvalidArgumentError(absl::StrCat("vision_feature_layer ", c.vision_feature_layer,
                                                   " outside the ", v.num_hidden_layers,
                                                   "-layer vision tower"));
  }
  SLUICE_RETURN_IF_ERROR(
      GetString(j, "vision_feature_select_strategy", &c.vision_feature_select_strategy));
  if (c.vision_feature_select_strategy != "default" && c.vision_feature_select_strategy != "full") {
    return absl::InvalidArgumentError(absl::StrCat("unsupported vision_feature_select_strategy ",
                                                   c.vision_feature_select_strategy));
  }
  SLUICE_RETURN_IF_ERROR(GetString(j, "projector_hidden_act", &c.projector_hidden_act));
  if (c.projector_hidden_act != "gelu" && c.projector_hidden_act != "quick_gelu") {
    return absl::InvalidArgumentError(
        absl::StrCat("unsupported projector_hidden_act ", c.projector_hidden_act));
  }
  if (auto it = j.find("multimodal_projector_bias"); it != j.end() && it->is_boolean()) {
    c.multimodal_projector_bias = it->get<bool>();
  }
  c.image_seq_length = v.num_patches() + (c.vision_feature_select_strategy == "full" ? 1 : 0);
  int64_t declared = c.image_seq_length;
  SLUICE_RETURN_IF_ERROR(GetInt(j, "image_seq_length", &declared));
  if (declared != c.image_seq_length) {
    return absl::InvalidArgumentError(absl::StrCat(
        "image_seq_length ", declared, " does not match the vision tower's ", c.image_seq_length,
        " features per image"));
  }
  return c;
}

absl::StatusOr<LlavaConfig> LlavaConfig::Load(const std::string& dir) {
  const std::string path = dir + "/config.json";
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  auto c = FromJsonText(ss.str());
  if (!c.ok()) return absl::Status(c.status().code(), absl::StrCat(path, ": ", c.status().message()));
  return c;
}

}  // namespace sluice::vision
