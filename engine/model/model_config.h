// ModelConfig: the fields of a Hugging Face `config.json` that the engine uses.
#ifndef SLUICE_ENGINE_MODEL_MODEL_CONFIG_H_
#define SLUICE_ENGINE_MODEL_MODEL_CONFIG_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace sluice {

// Architecture is the model family selected from `architectures[0]` / `model_type`.
enum class Architecture { kLlama, kQwen3, kDeepseekV3 };

// RopeScaling holds `rope_parameters` (transformers 5) or `rope_scaling` + `rope_theta` (4.x).
// YaRN fields follow "YaRN: Efficient Context Window Extension of LLMs" (Peng et al., 2023)
// as implemented in transformers' `_compute_yarn_parameters`.
struct RopeScaling {
  std::string rope_type = "default";  // "default" | "yarn" | "linear" | "llama3"
  double rope_theta = 10000.0;
  double factor = 1.0;
  int64_t original_max_position_embeddings = 0;  // 0: use max_position_embeddings
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double mscale = 1.0;
  double mscale_all_dim = 0.0;
  double low_freq_factor = 1.0;   // llama3
  double high_freq_factor = 4.0;  // llama3
};

struct ModelConfig {
  Architecture architecture = Architecture::kLlama;
  std::string model_type;         // "llama" | "qwen3" | "deepseek_v3"
  std::string architecture_name;  // e.g. "DeepseekV3ForCausalLM"
  // DeepseekV2ForCausalLM / model_type deepseek_v2, run as kDeepseekV3 (the same MLA + MoE
  // layout): softmax router scores without mlp.gate.e_score_correction_bias (routed as with a
  // zero bias), greedy or group-limited top-k (topk_method), interleaved RoPE pairs.
  // "DeepSeek-V2" (arXiv:2405.04434).
  bool deepseek_v2 = false;
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;  // default hidden_size / num_attention_heads
  double rms_norm_eps = 1e-6;
  int64_t max_position_embeddings = 2048;
  bool tie_word_embeddings = false;
  bool attention_bias = false;
  bool mlp_bias = false;
  std::string hidden_act = "silu";
  RopeScaling rope;
  bool rope_interleave = false;  // DeepSeek: channels in (x0,x1) pairs, reordered before rotating
  int32_t bos_token_id = -1;
  std::vector<int32_t> eos_token_ids;

  // Vision-language wrappers (LlavaForConditionalGeneration): the fields above describe the
  // language model (`text_config`); the vision side is engine/vision/llava_config.h. Empty /
  // -1 for text-only models.
  std::string multimodal_architecture;
  int32_t image_token_index = -1;

  // Sliding window (Qwen3 `layer_types`): per-layer flag, window in tokens. In a sliding layer
  // query i attends to keys j with i - sliding_window < j <= i (transformers semantics).
  std::vector<bool> layer_is_sliding;  // [num_hidden_layers]
  int64_t sliding_window = 0;          // 0: no sliding layers

  // DeepSeek-V3 MLA + MoE ("DeepSeek-V3 Technical Report", arXiv:2412.19437).
  int64_t q_lora_rank = 0;  // 0: no q compression (q_proj directly)
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  int64_t n_routed_experts = 0;
  int64_t n_shared_experts = 0;
  int64_t num_experts_per_tok = 0;
  int64_t moe_intermediate_size = 0;
  int64_t n_group = 1;
  int64_t topk_group = 1;
  double routed_scaling_factor = 1.0;
  bool norm_topk_prob = true;
  int64_t first_k_dense_replace = 0;
  std::string scoring_func = "sigmoid";
  // Groups ranked by their best expert (DeepSeek-V2's group_limited_greedy) instead of the sum
  // of their two best (MoeRoutingParams::group_score_max).
  bool moe_group_score_max = false;
  // Checkpoints hold mlp.gate.e_score_correction_bias (DeepSeek-V3); false for DeepSeek-V2,
  // whose routing then adds nothing to the scores.
  bool has_score_correction_bias = true;
  // Multi-token prediction modules (DeepSeek-V3 report §2.2), stored after the decoder layers as
  // model.layers.<num_hidden_layers + k>; 0: none declared.
  int64_t num_nextn_predict_layers = 0;

  // LoadModelConfig parses `<dir>/config.json` (and `generation_config.json` for extra EOS ids).
  // Errors: NotFound (no file), InvalidArgument (bad JSON, missing required field,
  // "unsupported architecture X").
  static absl::StatusOr<ModelConfig> Load(const std::string& dir);
  static absl::StatusOr<ModelConfig> FromJsonText(const std::string& json_text);
};

}  // namespace sluice

#endif  // SLUICE_ENGINE_MODEL_MODEL_CONFIG_H_
