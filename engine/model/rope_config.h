// RoPE table of a model config: ModelConfig::rope (rope_parameters / rope_scaling) mapped onto
// kernels::RopeParams, one place for every backend (the CUDA runner uses it; llama.cc and
// deepseek_v3.cc carry the same mapping inline).
#ifndef SLUICE_ENGINE_MODEL_ROPE_CONFIG_H_
#define SLUICE_ENGINE_MODEL_ROPE_CONFIG_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "engine/model/model_config.h"
#include "kernels/rope/rope.h"

namespace sluice {

// MakeModelRopeTable builds the table for `rotary_dim` channels (head_dim for Llama/Qwen3,
// qk_rope_head_dim for DeepSeek MLA); original_max_position_embeddings falls back to
// max_position_embeddings as transformers does. Errors: those of kernels::MakeRopeTable.
absl::StatusOr<kernels::RopeTable> MakeModelRopeTable(const ModelConfig& config,
                                                      int64_t rotary_dim);

}  // namespace sluice

#endif  // SLUICE_ENGINE_MODEL_ROPE_CONFIG_H_
