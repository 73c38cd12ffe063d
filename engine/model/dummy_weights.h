// `--load-format dummy`: deterministic random weights built from a config.json alone, for
// benchmarks of models whose weights we do not have (Llama-3-8B or DeepSeek-V2-Lite shapes).
//
// Every tensor of the Hugging Face checkpoint layout the loaders expect (llama.cc,
// deepseek_v3.cc) is given a value rule:
//   matrices (projections, embeddings, routers)  normal(0, kDummyStd²)
//   RMSNorm weights                              1
//   biases (incl. DeepSeek e_score_correction)   0
// Element i of tensor `name` is DummyNormal(DummyTensorSeed(seed, name), i): a counter-based
// hash (splitmix64) turned into a normal sample (Box–Muller), so any backend — the CPU loader
// here, the CUDA runner's fill kernel — produces the same values without sharing a file, and a
// tensor can be generated in any order or in parallel.
//
// Scale: std 0.02 is transformers' default `initializer_range`; with unit norm weights the
// activations stay O(1) through any depth, so the kernels see realistic magnitudes (no
// overflow, no denormals) and greedy decoding emits valid, non-constant token ids.
#ifndef SLUICE_ENGINE_MODEL_DUMMY_WEIGHTS_H_
#define SLUICE_ENGINE_MODEL_DUMMY_WEIGHTS_H_

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/model.h"
#include "engine/model/model_config.h"

#if defined(__CUDACC__)
#define SLUICE_DUMMY_HD __host__ __device__
#else
#define SLUICE_DUMMY_HD
#endif

namespace sluice {

inline constexpr float kDummyStd = 0.02f;
inline constexpr uint64_t kDefaultDummySeed = 0x5eed;

enum class DummyInit { kNormal, kOnes, kZeros };

// DummyTensorSpec: one checkpoint tensor (Hugging Face name, row-major shape) and its rule.
struct DummyTensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  DummyInit init = DummyInit::kNormal;
  int64_t NumElements() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

// SplitMix64 finalizer (Steele, Lea, Flood: "Fast splittable pseudorandom number generators",
// OOPSLA 2014): a bijective 64-bit mix with full avalanche.
SLUICE_DUMMY_HD inline uint64_t DummyMix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// DummyTensorSeed: 64-bit FNV-1a of `name`, mixed with the global seed.
inline uint64_t DummyTensorSeed(uint64_t seed, std::string_view name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : name) h = (h ^ c) * 0x100000001b3ull;
  return DummyMix64(h ^ DummyMix64(seed));
}

// DummyNormal: element `index` of the tensor with seed `tensor_seed`, normal(0, kDummyStd²):
// two 24-bit uniforms u1 ∈ (0, 1], u2 ∈ [0, 1) from one hash, z = sqrt(-2 ln u1)·cos(2π u2)
// (Box–Muller). Float math only, so host and device agree to a few ulps (bf16-identical in
// practice; tests compare with tolerances anyway).
SLUICE_DUMMY_HD inline float DummyNormal(uint64_t tensor_seed, uint64_t index) {
  const uint64_t h = DummyMix64(tensor_seed + index * 0x9e3779b97f4a7c15ull);
  const float u1 = (static_cast<float>(h >> 40) + 1.0f) * (1.0f / 16777216.0f);
  const float u2 = static_cast<float>((h >> 16) & 0xffffffull) * (1.0f / 16777216.0f);
  return kDummyStd * sqrtf(-2.0f * logf(u1)) * cosf(6.28318530718f * u2);
}

// DummyTensorSpecs lists the tensors LoadModel reads for `config` (Llama, Qwen3, DeepSeek-V3
// layouts, incl. optional biases, q/k norms, tied embeddings, MoE experts), in load order.
// Errors: InvalidArgument for an architecture without a dummy layout.
absl::StatusOr<std::vector<DummyTensorSpec>> DummyTensorSpecs(const ModelConfig& config);

// FillDummyTensor writes spec.NumElements() floats of `spec` (seeded by `seed`) into `out`.
void FillDummyTensor(const DummyTensorSpec& spec, uint64_t seed, float* out);

// WriteDummyCheckpoint writes `<out_dir>/model.safetensors` (all of DummyTensorSpecs(config),
// stored as BF16 — the precision the GPU runs in, so CPU and GPU dummy models hold the same
// values). Meant for small configs: the file is fully materialized.
// Errors: those of DummyTensorSpecs; Internal for I/O failures (naming the path).
absl::Status WriteDummyCheckpoint(const ModelConfig& config, uint64_t seed,
                                  const std::string& out_dir);

// LoadDummyModel is LoadModel for `--load-format dummy`: reads `<dir>/config.json` (and
// generation_config.json), writes a dummy checkpoint to a private temporary folder under
// $TMPDIR (or /tmp), loads it with LoadModel and removes the folder. CPU backend, float32
// weights: for small and medium configs (an 8B model would need 32 GB of host memory).
// Errors: those of ModelConfig::Load, DummyTensorSpecs, WriteDummyCheckpoint and LoadModel.
absl::StatusOr<std::unique_ptr<Model>> LoadDummyModel(const std::string& dir,
                                                      uint64_t seed = kDefaultDummySeed);

}  // namespace sluice

#endif  // SLUICE_ENGINE_MODEL_DUMMY_WEIGHTS_H_
