#include "engine/model/model.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/model/deepseek_v3.h"
#include "engine/model/llama.h"
#include "engine/model/safetensors.h"

namespace sluice {

KvCache::KvCache(const KvCacheSpec& spec, int64_t num_blocks, int64_t block_size,
                 bool allocate_storage)
    : spec_(spec), num_blocks_(num_blocks), block_size_(block_size) {
  if (!allocate_storage) return;
  const size_t tokens = static_cast<size_t>(num_blocks * block_size);
  k_.resize(static_cast<size_t>(spec.num_layers));
  v_.resize(static_cast<size_t>(spec.num_layers));
  for (int64_t l = 0; l < spec.num_layers; ++l) {
    k_[l].assign(tokens * static_cast<size_t>(spec.k_floats_per_token), 0.0f);
    v_[l].assign(tokens * static_cast<size_t>(spec.v_floats_per_token), 0.0f);
  }
}

absl::StatusOr<std::unique_ptr<Model>> LoadModel(const std::string& dir) {
  auto config = ModelConfig::Load(dir);
  if (!config.ok()) return config.status();
  auto checkpoint = Checkpoint::Open(dir);
  if (!checkpoint.ok()) return checkpoint.status();
  switch (config->architecture) {
    case Architecture::kLlama:
    case Architecture::kQwen3:
      return LoadLlama(*config, **checkpoint);
    case Architecture::kDeepseekV3:
      return LoadDeepseekV3(*config, **checkpoint);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unsupported architecture ", config->architecture_name));
}

}  // namespace sluice
