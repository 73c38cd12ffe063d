// CudaDeepseekRunner: the DeepSeek-V3 forward pass (MLA attention + DeepSeekMoE) on one NVIDIA
// GPU — bf16 weights, a paged bf16 latent KV cache, the step machinery of cuda_runner.h
// (metadata staging, decode CUDA graphs per batch bucket, device-side greedy sampling).
// Reference: engine/model/deepseek_v3.{h,cc} (the CPU model, itself following transformers'
// modeling_deepseek_v3.py and "DeepSeek-V3 Technical Report", arXiv:2412.19437).
//
// Per layer (pre-norm): [Add]RmsNorm → fused [q_a_proj | q_proj ; kv_a_proj_with_mqa] GEMM →
//   query: q_a_layernorm → q_b_proj (q_lora_rank > 0) or q_proj's rows;
//   latent: kv_a_layernorm(c_kv) and the shared key k_pe, roped, written to the latent cache
//     (one row [kv_lora_rank + qk_rope_head_dim] per token and layer);
//   absorbed attention (arXiv:2405.04434 §2.1.3): q_lat_h = W_UK_hᵀ q_nope_h (per-head batched
//     GEMM), [q_lat_h, rope(q_pe_h)] against the cached rows (kernels/mla_attention), the
//     latent output through W_UV_h (batched GEMM) → o_proj;
// → AddRmsNorm → MLP: dense SwiGLU for layers < first_k_dense_replace, else router logits in
//   fp32 → group-limited top-k routing (sigmoid/softmax, e_score_correction_bias) → routed
//   experts (kernels/moe/moe_cuda.h) + shared experts (one SwiGLU of moe_intermediate_size ·
//   n_shared_experts); steps of at most kernels::kMoeFusedMaxTokens tokens take the fused MoE
//   decode path (kernels/moe/moe_cuda.h: routing, then the routed and shared experts in two
//   launches). The latent row write and the queries' rope run in one launch (MlaPrologueCuda,
//   kernels/mla_attention/mla_plumbing_cuda.h) and, for steps of at most kMlaAbsorbMaxTokens tokens, together with the
//   query absorption as a GEMV (MlaPrologueAbsorbCuda) instead of cuBLAS's batched GEMM, and the
//   split-KV combine with W_UV (MlaLatentAttentionVUpCuda). Steps with long queries
//   (CudaRunnerOptions::mla) take MLA's MHA form. Then the final AddRmsNorm, the wanted rows,
//   lm_head, argmax.
// RoPE: the config's table (default or YaRN with its mscale) on the last qk_rope_head_dim
// channels, `rope_interleave` honoured; softmax scale (qk_nope + qk_rope)^-½ times
// yarn_get_mscale(factor, mscale_all_dim)² when rope scaling sets mscale_all_dim, as the CPU
// model computes it.
//
// Supported: DeepseekV3ForCausalLM and DeepseekV2ForCausalLM configs the CPU model accepts
// (ModelConfig::deepseek_v2: no correction bias, routed as with a zero one), with the CUDA
// kernels' limits:
// kv_lora_rank even and ≤ 512, (kv_lora_rank + qk_rope_head_dim) a multiple of 8 and ≤ 1024,
// hidden and moe_intermediate_size multiples of 8, n_routed_experts ≤ 1024. MTP layers are not
// loaded. Not thread-safe: one caller drives a runner.
#ifndef SLUICE_ENGINE_CUDA_CUDA_DEEPSEEK_RUNNER_H_
#define SLUICE_ENGINE_CUDA_CUDA_DEEPSEEK_RUNNER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/cuda/cuda_runner.h"
#include "engine/model/model_config.h"

namespace sluice::cuda_runner {

class CudaDeepseekRunner : public CudaRunner {
 public:
  // Load reads config.json + safetensors from `dir` (weights converted to bf16 on the host;
  // e_score_correction_bias kept in float32).
  // Errors: those of ModelConfig::Load / Checkpoint / LoadWeight (NotFound "missing tensor
  // <name>", InvalidArgument for a wrong shape), InvalidArgument "deepseek_v3 config: ..." for
  // a config outside the supported set, Unimplemented for another architecture, Internal for
  // CUDA/cuBLAS failures (e.g. out of device memory).
  static absl::StatusOr<std::unique_ptr<CudaDeepseekRunner>> Load(
      const std::string& dir, const CudaRunnerOptions& options);
  // CreateDummy builds the model of `config` with dummy weights generated on the device
  // (engine/model/dummy_weights.h: the values LoadDummyModel uses, rounded to bf16).
  static absl::StatusOr<std::unique_ptr<CudaDeepseekRunner>> CreateDummy(
      const ModelConfig& config, uint64_t seed, const CudaRunnerOptions& options);

 private:
  using CudaRunner::CudaRunner;
};

}  // namespace sluice::cuda_runner

#endif  // SLUICE_ENGINE_CUDA_CUDA_DEEPSEEK_RUNNER_H_
