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
// tensors of `checkpoint`, converting weights to float32 (the checkpoint is not referenced
// afterwards). A weight matrix whose values are all bfloat16 values (a bfloat16 checkpoint) is
// then kept as bfloat16 and computed in float32 (kernels::LinearBf16Cpu): the same logits from
// half the weight bytes. The output head and the attention, dense, shared-expert and routed-expert
// matrices qualify; routed experts stay float32 in an expert-parallel shard.
//
// Supported: q_lora_rank > 0 (q_a_proj → q_a_layernorm → q_b_proj) or 0 (q_proj); default and
// YaRN RoPE (with `rope_interleave`); first_k_dense_replace dense SwiGLU layers, then MoE layers
// with n_routed_experts experts (sigmoid or softmax scores, e_score_correction_bias, n_group /
// topk_group group-limited top-k, norm_topk_prob, routed_scaling_factor) plus n_shared_experts
// (0 = none) fused as one SwiGLU of moe_intermediate_size · n_shared_experts; attention_bias;
// tied or untied embeddings.
//
// MTP (num_nextn_predict_layers >= 1): the first module, model.layers.<num_hidden_layers>.*
// (enorm, hnorm, eh_proj, a decoder layer, shared_head.norm; shared_head.head and embed_tokens
// when the checkpoint has its own, else the target's), runs through Model::ForwardMtp. A config
// declaring MTP layers whose checkpoint lacks them (no eh_proj) loads without them
// (MtpStatus() NotFound names the missing weights); one present in part is a load error.
//
// Softmax scale (transformers' DeepseekV3Attention): (qk_nope_head_dim + qk_rope_head_dim)^-½,
// times mscale² with mscale = 0.1 · mscale_all_dim · ln(factor) + 1 (1 when factor <= 1) when
// rope scaling is configured with a nonzero mscale_all_dim.
//
// KV cache: one latent entry per token and layer (MLA, absorbed form, arXiv:2405.04434 §2.1.3):
// k_floats_per_token = kv_lora_rank + qk_rope_head_dim ([kv_a_layernorm(c_kv) ; roped k_pe]),
// v_floats_per_token = 0. WeightBytesPerToken counts float32 bytes of every non-expert weight,
// the router and correction bias, num_experts_per_tok routed experts and the shared experts per
// MoE layer, lm_head and one embedding row.
//
// The returned model's Forward reuses internal scratch buffers: not thread-safe (one step at a
// time, like the KvCache). Its logits are batch invariant: a sequence's logits do not depend on
// the other sequences of the step or on how its prompt is chunked.
//
// Errors: NotFound "missing tensor <name>", InvalidArgument naming a tensor with the wrong
// shape/dtype, or "deepseek_v3 config: ..." for an unsupported/inconsistent config value.
absl::StatusOr<std::unique_ptr<Model>> LoadDeepseekV3(const ModelConfig& config,
                                                      const Checkpoint& checkpoint);

}  // namespace sluice

#endif  // SLUICE_ENGINE_MODEL_DEEPSEEK_V3_H_
