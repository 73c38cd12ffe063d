#include "engine/model/model_config.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace sluice {
namespace {

using json = nlohmann::json;

absl::StatusOr<json> ParseJsonFile(const std::string& path, bool* found) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    *found = false;
    return absl::NotFoundError(absl::StrCat("cannot open ", path));
  }
  *found = true;
  std::stringstream ss;
  ss << in.rdbuf();
  json j = json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a valid JSON object"));
  }
  return j;
}

// Field readers: an absent or null field yields the default; a field of the wrong type is an
// InvalidArgument naming the field.
constexpr int64_t kMaxLayers = 1 << 14;

absl::Status TypeError(const std::string& key, const char* want) {
  return absl::InvalidArgumentError(absl::StrCat("config field ", key, " must be ", want));
}

absl::Status GetInt(const json& j, const std::string& key, int64_t* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (it->is_number_integer()) {
    *out = it->get<int64_t>();
    return absl::OkStatus();
  }
  if (it->is_number_float()) {
    double d = it->get<double>();
    // In range before the cast (casting 1e300 to int64 is undefined; fuzz finding).
    if (d >= -0x1p63 && d < 0x1p63 && d == std::trunc(d)) {
      *out = static_cast<int64_t>(d);
      return absl::OkStatus();
    }
  }
  return TypeError(key, "an integer");
}

absl::Status GetRequiredInt(const json& j, const std::string& key, int64_t* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    return absl::InvalidArgumentError(absl::StrCat("config.json: missing required field ", key));
  }
  if (auto s = GetInt(j, key, out); !s.ok()) return s;
  if (*out <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("config field ", key, " must be positive"));
  }
  return absl::OkStatus();
}

absl::Status GetDouble(const json& j, const std::string& key, double* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_number()) return TypeError(key, "a number");
  *out = it->get<double>();
  return absl::OkStatus();
}

absl::Status GetBool(const json& j, const std::string& key, bool* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_boolean()) return TypeError(key, "a boolean");
  *out = it->get<bool>();
  return absl::OkStatus();
}

absl::Status GetString(const json& j, const std::string& key, std::string* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_string()) return TypeError(key, "a string");
  *out = it->get<std::string>();
  return absl::OkStatus();
}

// Appends eos ids from `eos_token_id` (int or list of ints), skipping duplicates.
absl::Status AppendEosIds(const json& j, std::vector<int32_t>* ids) {
  auto it = j.find("eos_token_id");
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  auto add = [&](const json& v) -> absl::Status {
    if (!v.is_number_integer()) return TypeError("eos_token_id", "an integer or integer list");
    int32_t id = v.get<int32_t>();
    for (int32_t x : *ids) {
      if (x == id) return absl::OkStatus();
    }
    ids->push_back(id);
    return absl::OkStatus();
  };
  if (it->is_array()) {
    for (const json& v : *it) {
      if (auto s = add(v); !s.ok()) return s;
    }
    return absl::OkStatus();
  }
  return add(*it);
}

// Parses transformers 5 `rope_parameters` or 4.x `rope_theta` + `rope_scaling`.
absl::Status ParseRope(const json& j, RopeScaling* rope) {
  SLUICE_RETURN_IF_ERROR(GetDouble(j, "rope_theta", &rope->rope_theta));
  const json* params = nullptr;
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    auto it = j.find(key);
    if (it != j.end() && !it->is_null()) {
      if (!it->is_object()) return TypeError(key, "an object");
      params = &*it;
      break;
    }
  }
  if (params == nullptr) return absl::OkStatus();
  const json& p = *params;
  SLUICE_RETURN_IF_ERROR(GetString(p, "type", &rope->rope_type));  // 4.x spelling
  SLUICE_RETURN_IF_ERROR(GetString(p, "rope_type", &rope->rope_type));
  SLUICE_RETURN_IF_ERROR(GetDouble(p, "rope_theta", &rope->rope_theta));
  SLUICE_RETURN_IF_ERROR(GetDouble(p, "factor", &rope->factor));
  SLUICE_RETURN_IF_ERROR(
      GetInt(p, "original_max_position_embeddings", &rope->original_max_position_embeddings));
  SLUICE_RETURN_IF_ERROR(GetDouble(p, "beta_fast", &rope->beta_fast));
  SLUICE_RETURN_IF_ERROR(GetDouble(p, "beta_slow", &rope->beta_slow));
  SLUICE_RETURN_IF_ERROR(GetDouble(p, "mscale", &rope->mscale));
  SLUICE_RETURN_IF_ERROR(GetDouble(p, "mscale_all_dim", &rope->mscale_all_dim));
  SLUICE_RETURN_IF_ERROR(GetDouble(p, "low_freq_factor", &rope->low_freq_factor));
  SLUICE_RETURN_IF_ERROR(GetDouble(p, "high_freq_factor", &rope->high_freq_factor));
  if (rope->rope_type != "default" && rope->rope_type != "linear" && rope->rope_type != "yarn" &&
      rope->rope_type != "llama3") {
    return absl::InvalidArgumentError(
        absl::StrCat("unsupported rope_type ", rope->rope_type));
  }
  return absl::OkStatus();
}

absl::StatusOr<ModelConfig> ParseConfig(const json& j);

// LLaVA: the language model is `text_config` (a Llama unless it says otherwise).
absl::StatusOr<ModelConfig> ParseLlavaConfig(const json& j, const std::string& arch) {
  auto tc = j.find("text_config");
  if (tc == j.end() || !tc->is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(arch, ": missing text_config"));
  }
  json text = *tc;
  if (!text.contains("model_type") && !text.contains("architectures")) text["model_type"] = "llama";
  auto c = ParseConfig(text);
  if (!c.ok()) {
    return absl::Status(c.status().code(), absl::StrCat("text_config: ", c.status().message()));
  }
  c->multimodal_architecture = arch;
  int64_t image_token = 32000;  // LlavaConfig's default
  SLUICE_RETURN_IF_ERROR(GetInt(j, "image_token_index", &image_token));
  SLUICE_RETURN_IF_ERROR(GetInt(j, "image_token_id", &image_token));
  c->image_token_index = static_cast<int32_t>(image_token);
  return c;
}

absl::StatusOr<ModelConfig> ParseConfig(const json& j) {
  ModelConfig c;
  // Architecture: architectures[0], else model_type.
  if (auto it = j.find("architectures"); it != j.end() && it->is_array() && !it->empty() &&
                                         (*it)[0].is_string()) {
    c.architecture_name = (*it)[0].get<std::string>();
  }
  SLUICE_RETURN_IF_ERROR(GetString(j, "model_type", &c.model_type));
  const std::string& a = c.architecture_name;
  const std::string& t = c.model_type;
  if (a == "LlavaForConditionalGeneration" || (a.empty() && t == "llava")) {
    return ParseLlavaConfig(j, "LlavaForConditionalGeneration");
  }
  if (a == "LlamaForCausalLM" || (a.empty() && t == "llama")) {
    c.architecture = Architecture::kLlama;
  } else if (a == "Qwen3ForCausalLM" || (a.empty() && t == "qwen3")) {
    c.architecture = Architecture::kQwen3;
  } else if (a == "DeepseekV3ForCausalLM" || (a.empty() && t == "deepseek_v3")) {
    c.architecture = Architecture::kDeepseekV3;
  } else if (a == "DeepseekV2ForCausalLM" || (a.empty() && t == "deepseek_v2")) {
    // DeepSeek-V2's defaults where its config.json is silent (its HF config class and the
    // reference modeling code): softmax scores, no correction bias, no top-k renormalization,
    // RoPE over interleaved channel pairs.
    c.architecture = Architecture::kDeepseekV3;
    c.deepseek_v2 = true;
    c.scoring_func = "softmax";
    c.has_score_correction_bias = false;
    c.norm_topk_prob = false;
    c.rope_interleave = true;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unsupported architecture ", a.empty() ? "(none)" : a,
                     " (model_type ", t.empty() ? "(none)" : t, ")"));
  }

  SLUICE_RETURN_IF_ERROR(GetRequiredInt(j, "vocab_size", &c.vocab_size));
  SLUICE_RETURN_IF_ERROR(GetRequiredInt(j, "hidden_size", &c.hidden_size));
  SLUICE_RETURN_IF_ERROR(GetRequiredInt(j, "num_hidden_layers", &c.num_hidden_layers));
  SLUICE_RETURN_IF_ERROR(GetRequiredInt(j, "num_attention_heads", &c.num_attention_heads));
  // Per-layer tables are sized from it before any weight is read (fuzz finding: 1e15 layers
  // allocated 1e15 flags); no real model comes near.
  if (c.num_hidden_layers > kMaxLayers) {
    return absl::InvalidArgumentError(absl::StrCat("config field num_hidden_layers ",
                                                   c.num_hidden_layers, " exceeds ", kMaxLayers));
  }
  SLUICE_RETURN_IF_ERROR(GetInt(j, "intermediate_size", &c.intermediate_size));
  c.num_key_value_heads = c.num_attention_heads;
  SLUICE_RETURN_IF_ERROR(GetInt(j, "num_key_value_heads", &c.num_key_value_heads));
  if (c.num_key_value_heads <= 0 || c.num_attention_heads % c.num_key_value_heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_attention_heads ", c.num_attention_heads,
                     " is not a multiple of num_key_value_heads ", c.num_key_value_heads));
  }
  c.head_dim = c.hidden_size / c.num_attention_heads;
  SLUICE_RETURN_IF_ERROR(GetInt(j, "head_dim", &c.head_dim));
  SLUICE_RETURN_IF_ERROR(GetDouble(j, "rms_norm_eps", &c.rms_norm_eps));
  SLUICE_RETURN_IF_ERROR(GetInt(j, "max_position_embeddings", &c.max_position_embeddings));
  SLUICE_RETURN_IF_ERROR(GetBool(j, "tie_word_embeddings", &c.tie_word_embeddings));
  SLUICE_RETURN_IF_ERROR(GetBool(j, "attention_bias", &c.attention_bias));
  SLUICE_RETURN_IF_ERROR(GetBool(j, "mlp_bias", &c.mlp_bias));
  SLUICE_RETURN_IF_ERROR(GetString(j, "hidden_act", &c.hidden_act));
  SLUICE_RETURN_IF_ERROR(ParseRope(j, &c.rope));
  SLUICE_RETURN_IF_ERROR(GetBool(j, "rope_interleave", &c.rope_interleave));
  int64_t bos = -1;
  SLUICE_RETURN_IF_ERROR(GetInt(j, "bos_token_id", &bos));
  c.bos_token_id = static_cast<int32_t>(bos);
  SLUICE_RETURN_IF_ERROR(AppendEosIds(j, &c.eos_token_ids));

  // Sliding window, following transformers' Qwen3Config: the window exists only when
  // use_sliding_window is true; `layer_types` names the sliding layers, else layers with index
  // >= max_window_layers slide.
  c.layer_is_sliding.assign(static_cast<size_t>(c.num_hidden_layers), false);
  if (c.architecture == Architecture::kQwen3) {
    // Defaults of transformers' Qwen3Config: sliding_window 4096, max_window_layers 28.
    bool use_sliding_window = false;
    int64_t window = 4096;
    int64_t max_window_layers = 28;
    SLUICE_RETURN_IF_ERROR(GetBool(j, "use_sliding_window", &use_sliding_window));
    SLUICE_RETURN_IF_ERROR(GetInt(j, "sliding_window", &window));
    SLUICE_RETURN_IF_ERROR(GetInt(j, "max_window_layers", &max_window_layers));
    if (!use_sliding_window) window = 0;
    if (window < 0) return absl::InvalidArgumentError("config field sliding_window is negative");
    auto lt = j.find("layer_types");
    if (lt != j.end() && !lt->is_null()) {
      if (!lt->is_array() || static_cast<int64_t>(lt->size()) != c.num_hidden_layers) {
        return absl::InvalidArgumentError(absl::StrCat(
            "config field layer_types must list num_hidden_layers (", c.num_hidden_layers,
            ") layer types"));
      }
      for (size_t i = 0; i < lt->size(); ++i) {
        const json& v = (*lt)[i];
        if (!v.is_string()) return TypeError("layer_types", "a list of strings");
        const std::string s = v.get<std::string>();
        if (s != "sliding_attention" && s != "full_attention") {
          return absl::InvalidArgumentError(absl::StrCat("unsupported layer type ", s));
        }
        c.layer_is_sliding[i] = window > 0 && s == "sliding_attention";
      }
    } else if (window > 0) {
      for (int64_t i = max_window_layers; i < c.num_hidden_layers; ++i) {
        c.layer_is_sliding[static_cast<size_t>(i)] = true;
      }
    }
    bool any = false;
    for (bool b : c.layer_is_sliding) any = any || b;
    c.sliding_window = any ? window : 0;
  }

  if (c.architecture == Architecture::kDeepseekV3) {
    SLUICE_RETURN_IF_ERROR(GetInt(j, "q_lora_rank", &c.q_lora_rank));
    SLUICE_RETURN_IF_ERROR(GetRequiredInt(j, "kv_lora_rank", &c.kv_lora_rank));
    SLUICE_RETURN_IF_ERROR(GetRequiredInt(j, "qk_nope_head_dim", &c.qk_nope_head_dim));
    SLUICE_RETURN_IF_ERROR(GetRequiredInt(j, "qk_rope_head_dim", &c.qk_rope_head_dim));
    SLUICE_RETURN_IF_ERROR(GetRequiredInt(j, "v_head_dim", &c.v_head_dim));
    SLUICE_RETURN_IF_ERROR(GetInt(j, "n_routed_experts", &c.n_routed_experts));
    SLUICE_RETURN_IF_ERROR(GetInt(j, "n_shared_experts", &c.n_shared_experts));
    SLUICE_RETURN_IF_ERROR(GetInt(j, "num_experts_per_tok", &c.num_experts_per_tok));
    SLUICE_RETURN_IF_ERROR(GetInt(j, "moe_intermediate_size", &c.moe_intermediate_size));
    SLUICE_RETURN_IF_ERROR(GetInt(j, "n_group", &c.n_group));
    SLUICE_RETURN_IF_ERROR(GetInt(j, "topk_group", &c.topk_group));
    SLUICE_RETURN_IF_ERROR(GetDouble(j, "routed_scaling_factor", &c.routed_scaling_factor));
    SLUICE_RETURN_IF_ERROR(GetBool(j, "norm_topk_prob", &c.norm_topk_prob));
    SLUICE_RETURN_IF_ERROR(GetInt(j, "first_k_dense_replace", &c.first_k_dense_replace));
    SLUICE_RETURN_IF_ERROR(GetString(j, "scoring_func", &c.scoring_func));
    SLUICE_RETURN_IF_ERROR(GetInt(j, "num_nextn_predict_layers", &c.num_nextn_predict_layers));
    if (c.deepseek_v2) {
      // topk_method "greedy": top-k over all experts (n_group / topk_group unused, often null);
      // "group_limited_greedy": top-k within the topk_group groups with the best single expert.
      std::string topk_method = "greedy";
      SLUICE_RETURN_IF_ERROR(GetString(j, "topk_method", &topk_method));
      if (topk_method == "greedy") {
        c.n_group = 1;
        c.topk_group = 1;
      } else if (topk_method == "group_limited_greedy") {
        c.moe_group_score_max = true;
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat("unsupported DeepSeek-V2 topk_method ", topk_method));
      }
      // DeepSeek's V2 configs carry moe_layer_freq (every released model: 1, every layer from
      // first_k_dense_replace on is MoE); other periods would interleave dense layers.
      int64_t moe_layer_freq = 1;
      SLUICE_RETURN_IF_ERROR(GetInt(j, "moe_layer_freq", &moe_layer_freq));
      if (moe_layer_freq != 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            "unsupported DeepSeek-V2 moe_layer_freq ", moe_layer_freq, " (only 1)"));
      }
    }
    if (c.n_group <= 0 || c.topk_group <= 0) {
      return absl::InvalidArgumentError("config fields n_group and topk_group must be positive");
    }
  }
  return c;
}

#undef SLUICE_RETURN_IF_ERROR

}  // namespace

absl::StatusOr<ModelConfig> ModelConfig::FromJsonText(const std::string& json_text) {
  json j = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError("config.json: not a valid JSON object");
  }
  return ParseConfig(j);
}

absl::StatusOr<ModelConfig> ModelConfig::Load(const std::string& dir) {
  bool found = false;
  auto j = ParseJsonFile(dir + "/config.json", &found);
  if (!j.ok()) return j.status();
  auto config = ParseConfig(*j);
  if (!config.ok()) {
    return absl::Status(config.status().code(),
                        absl::StrCat(dir, "/config.json: ", config.status().message()));
  }
  // generation_config.json is optional; its eos ids are added to those of config.json.
  auto gen = ParseJsonFile(dir + "/generation_config.json", &found);
  if (gen.ok()) {
    if (auto s = AppendEosIds(*gen, &config->eos_token_ids); !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(dir, "/generation_config.json: ", s.message()));
    }
  } else if (found) {
    return gen.status();
  }
  return config;
}

}  // namespace sluice
