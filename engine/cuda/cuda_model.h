// CudaModel: the Model interface (engine/model/model.h) over a CudaRunner (CudaLlamaRunner or
// CudaDeepseekRunner), so code written against Model — the golden-test driver, the CPU engine's
// step loop — can run on the GPU.
//
// The runner keeps its own bf16 KV cache in device memory; the KvCache passed to Forward only
// supplies the geometry (num_blocks, block_size) and its float32 storage is never touched
// (kv_cache_spec() reports the runner's layout — K/V heads for Llama, the MLA latent for
// DeepSeek — so the plan's slots mean the same thing). The device
// cache is (re)allocated when the geometry changes. Logits come back as bf16 values widened to
// float32. Not thread-safe.
#ifndef SLUICE_ENGINE_CUDA_CUDA_MODEL_H_
#define SLUICE_ENGINE_CUDA_CUDA_MODEL_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/cuda/cuda_runner.h"
#include "engine/model/model.h"

namespace sluice::cuda_runner {

// LoadCudaRunner loads the model in `dir` with the runner of its architecture: Llama →
// CudaLlamaRunner, DeepSeek-V3 → CudaDeepseekRunner. Errors: those of ModelConfig::Load and of
// the runner's Load (Unimplemented for other architectures).
absl::StatusOr<std::unique_ptr<CudaRunner>> LoadCudaRunner(const std::string& dir,
                                                           const CudaRunnerOptions& options);

// CreateDummyCudaRunner is the runner of config.architecture with dummy weights (the runners'
// CreateDummy). Errors: as LoadCudaRunner.
absl::StatusOr<std::unique_ptr<CudaRunner>> CreateDummyCudaRunner(
    const ModelConfig& config, uint64_t seed, const CudaRunnerOptions& options);

// WrapRunner makes a Model of `runner`. Forward errors: those of CudaRunner::Step, and
// InvalidArgument when the KvCache's block size differs from runner->options().block_size.
std::unique_ptr<Model> WrapRunner(std::unique_ptr<CudaRunner> runner);

// LoadCudaModel is LoadCudaRunner wrapped as a Model.
absl::StatusOr<std::unique_ptr<Model>> LoadCudaModel(const std::string& dir,
                                                     const CudaRunnerOptions& options);

}  // namespace sluice::cuda_runner

#endif  // SLUICE_ENGINE_CUDA_CUDA_MODEL_H_
