// CudaModel: the Model interface (engine/model/model.h) over a CudaLlamaRunner, so code written
// against Model — the golden-test driver, the CPU engine's step loop — can run on the GPU.
//
// The runner keeps its own bf16 KV cache in device memory; the KvCache passed to Forward only
// supplies the geometry (num_blocks, block_size) and its float32 storage is never touched
// (kv_cache_spec() reports the Llama layout so the plan's slots mean the same thing). The device
// cache is (re)allocated when the geometry changes. Logits come back as bf16 values widened to
// float32. Not thread-safe.
#ifndef SLUICE_ENGINE_CUDA_CUDA_MODEL_H_
#define SLUICE_ENGINE_CUDA_CUDA_MODEL_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/cuda/cuda_llama_runner.h"
#include "engine/model/model.h"

namespace sluice::cuda_runner {

// WrapRunner makes a Model of `runner`. Forward errors: those of CudaLlamaRunner::Step, and
// InvalidArgument when the KvCache's block size differs from runner->options().block_size.
std::unique_ptr<Model> WrapRunner(std::unique_ptr<CudaLlamaRunner> runner);

// LoadCudaModel is CudaLlamaRunner::Load wrapped as a Model.
absl::StatusOr<std::unique_ptr<Model>> LoadCudaModel(const std::string& dir,
                                                     const CudaRunnerOptions& options);

}  // namespace sluice::cuda_runner

#endif  // SLUICE_ENGINE_CUDA_CUDA_MODEL_H_
