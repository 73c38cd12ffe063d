// Rotary position embedding ("RoFormer", Su et al. 2021), rotate-half layout as in
// transformers' `apply_rotary_pos_emb`, with optional DeepSeek interleave and YaRN scaling.
#ifndef SLUICE_KERNELS_ROPE_ROPE_H_
#define SLUICE_KERNELS_ROPE_ROPE_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace sluice::kernels {

// RopeTable holds per-frequency inverse frequencies and the attention scaling factor
// (YaRN's mscale multiplies cos/sin).
struct RopeTable {
  std::vector<float> inv_freq;  // [rotary_dim / 2]
  float attention_scaling = 1.0f;
};

struct RopeParams {
  std::string rope_type = "default";  // default | linear | yarn | llama3
  double theta = 10000.0;
  int64_t rotary_dim = 0;
  double factor = 1.0;
  int64_t original_max_position_embeddings = 0;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double mscale = 1.0;
  double mscale_all_dim = 0.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
};

// MakeRopeTable computes inverse frequencies as transformers' rope init functions do
// (`_compute_default_rope_parameters`, `_compute_yarn_parameters`, ...).
// Errors: InvalidArgument for an unknown rope_type or odd rotary_dim.
absl::StatusOr<RopeTable> MakeRopeTable(const RopeParams& params);

// RopeCpu rotates, in place, the first rotary_dim channels starting at channel `offset` of
// every head: x is [num_tokens, num_heads, ...] with token stride `token_stride` and head
// stride `head_stride` (floats). positions: [num_tokens]. With `interleave`, channels are
// first reordered from pairs (x0,x1),(x2,x3).. to halves [x0,x2,..,x1,x3,..] (DeepSeek's
// `rope_interleave`), then rotated rotate-half style.
void RopeCpu(float* x, int64_t num_tokens, int64_t num_heads, int64_t token_stride,
             int64_t head_stride, int64_t offset, const int32_t* positions,
             const RopeTable& table, bool interleave);

}  // namespace sluice::kernels

#endif  // SLUICE_KERNELS_ROPE_ROPE_H_
