// CudaLlamaRunner: the Llama-family forward pass on one NVIDIA GPU — bf16 weights and a paged
// bf16 KV cache in device memory, one forward per engine step over the flattened batch
// (engine/model/model.h's ForwardInput plan), greedy argmax on the device, and decode steps
// replayed from CUDA graphs captured per batch-size bucket.
//
// Per layer (transformers' modeling_llama.py, pre-norm): [Add]RmsNorm → fused QKV GEMM →
// (Qwen3: per-head RMSNorm of q and k, modeling_qwen3.py) → RoPE on q and k (in place, in the
// QKV rows) fused with the K/V write into the paged cache (one launch) → paged attention
// (Qwen3 sliding layers: keys i - sliding_window < j <= i) → o_proj → AddRmsNorm → fused
// gate/up GEMM → SiLU·mul → down GEMM.
// Then the final AddRmsNorm, the rows whose logits are wanted are gathered, lm_head, argmax.
//
// The step machinery (metadata staging, graphs, sampling) is RunnerCore's (cuda_runner.h).
//
// Supported: LlamaForCausalLM (any GQA ratio, attention/MLP biases, tied embeddings, rope
// default/linear/llama3/YaRN) and Qwen3ForCausalLM (per-head q/k norms, hybrid sliding-window
// layers per ModelConfig::layer_is_sliding), and the language model of
// LlavaForConditionalGeneration (text_config; `language_model.*` or `model.language_model.*`
// tensor names): an eager step carrying ForwardInput::embedding_rows overwrites those rows of
// the gathered token embeddings with the given image features, rounded to bf16
// (kernels::ScatterRowsCuda), before layer 0. Every layer keeps a full-length KV cache.
// SWA bounded replay (engine/kv/swa_replay.h): a step carrying ForwardInput::kv_frozen_layers
// runs RoPE of its frozen layers with no slot (nothing written; their attention reads the
// cache as it is), and one carrying a sliding_kv_start > 0 runs its sliding layers' attention
// on kernels::PagedAttentionBoundedCuda (keys max(sliding_kv_start, i - window + 1)..i). Those
// layers never fuse RoPE into attention; every other launch is unchanged. Steps with frozen
// layers run eagerly; bounded decode steps (after a replay shorter than the window) replay
// decode graphs captured with the bounded sliding attention (RunnerCore::CaptureBucket).
// Not thread-safe: one caller drives a runner.
#ifndef SLUICE_ENGINE_CUDA_CUDA_LLAMA_RUNNER_H_
#define SLUICE_ENGINE_CUDA_CUDA_LLAMA_RUNNER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/cuda/cuda_runner.h"
#include "engine/model/model_config.h"

namespace sluice::cuda_runner {

class CudaLlamaRunner : public CudaRunner {
 public:
  // Load reads config.json + safetensors from `dir` (weights converted to bf16 on the device).
  // Errors: those of ModelConfig::Load / Checkpoint / LoadWeight (NotFound "missing tensor
  // <name>", InvalidArgument for a wrong shape), Unimplemented for unsupported architectures,
  // Internal for CUDA/cuBLAS failures (e.g. out of device memory).
  static absl::StatusOr<std::unique_ptr<CudaLlamaRunner>> Load(const std::string& dir,
                                                               const CudaRunnerOptions& options);
  // CreateDummy builds the model of `config` with dummy weights generated on the device
  // (engine/model/dummy_weights.h: the same values as LoadDummyModel, rounded to bf16).
  static absl::StatusOr<std::unique_ptr<CudaLlamaRunner>> CreateDummy(
      const ModelConfig& config, uint64_t seed, const CudaRunnerOptions& options);

 private:
  using CudaRunner::CudaRunner;
};

}  // namespace sluice::cuda_runner

#endif  // SLUICE_ENGINE_CUDA_CUDA_LLAMA_RUNNER_H_
