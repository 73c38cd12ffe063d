// Llama and Qwen3 decoder-only transformers on the CPU backend (one file: Qwen3 is Llama plus
// per-head q/k RMSNorm before RoPE, per-layer sliding-window attention and, optionally, tied
// embeddings).
//
// Reference implementations: transformers' `modeling_llama.py` and `modeling_qwen3.py`
// (pre-norm decoder layers, GQA attention with rotate-half RoPE, SwiGLU MLP, final RMSNorm,
// `lm_head`). Tensor names are the Hugging Face ones (`model.layers.L.self_attn.q_proj.weight`,
// ...).
#ifndef SLUICE_ENGINE_MODEL_LLAMA_H_
#define SLUICE_ENGINE_MODEL_LLAMA_H_

#include <memory>

#include "absl/status/statusor.h"
#include "engine/model/model.h"
#include "engine/model/model_config.h"
#include "engine/model/safetensors.h"

namespace sluice {

// LoadLlama builds a Llama (Architecture::kLlama) or Qwen3 (Architecture::kQwen3) model from
// `config` and the tensors of `checkpoint`, converting every weight to float32 (the checkpoint
// is not referenced afterwards). The KV cache stores, per token and layer,
// K [num_key_value_heads, head_dim] and V [num_key_value_heads, head_dim].
// Errors: NotFound "missing tensor <name>", InvalidArgument for a tensor with the wrong
// shape/dtype, an unsupported hidden_act or rope setting, or a config of another architecture.
absl::StatusOr<std::unique_ptr<Model>> LoadLlama(const ModelConfig& config,
                                                 const Checkpoint& checkpoint);

}  // namespace sluice

#endif  // SLUICE_ENGINE_MODEL_LLAMA_H_
