// DeepSeek-V3 (MLA attention + DeepSeekMoE) on the CPU backend.
//
// Architecture: "DeepSeek-V3 Technical Report" (arXiv:2412.19437) and "DeepSeek-V2"
// (arXiv:2405.04434, §2.1 Multi-head Latent Attention), tensor names as in transformers'
// `modeling_deepseek_v3.py`.
#ifndef SLUICE_ENGINE_MODEL_DEEPSEEK_V3_H_
#define SLUICE_ENGINE_MODEL_DEEPSEEK_V3_H_

#include <memory>

#include "absl/status/statusor.h"
#include "engine/model/model.h"
#include "engine/model/model_config.h"
#include "engine/model/safetensors.h"

namespace sluice {

// LoadDeepseekV3 builds a DeepSeek-V3 model from `config` (architecture kDeepseekV3) and the
// tensors of `checkpoint`, converting weights to float32. The KV cache spec is one latent entry
// per token and layer: k_floats_per_token = kv_lora_rank + qk_rope_head_dim, v = 0.
// Errors: NotFound naming a missing tensor, InvalidArgument naming a tensor with the wrong
// shape/dtype or an unsupported config value.
absl::StatusOr<std::unique_ptr<Model>> LoadDeepseekV3(const ModelConfig& config,
                                                      const Checkpoint& checkpoint);

}  // namespace sluice

#endif  // SLUICE_ENGINE_MODEL_DEEPSEEK_V3_H_
