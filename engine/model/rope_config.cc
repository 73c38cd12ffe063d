#include "engine/model/rope_config.h"

namespace sluice {

absl::StatusOr<kernels::RopeTable> MakeModelRopeTable(const ModelConfig& c, int64_t rotary_dim) {
  const RopeScaling& r = c.rope;
  kernels::RopeParams p;
  p.rope_type = r.rope_type;
  p.theta = r.rope_theta;
  p.rotary_dim = rotary_dim;
  p.factor = r.factor;
  p.original_max_position_embeddings =
      r.original_max_position_embeddings > 0 ? r.original_max_position_embeddings
                                             : c.max_position_embeddings;
  p.beta_fast = r.beta_fast;
  p.beta_slow = r.beta_slow;
  p.mscale = r.mscale;
  p.mscale_all_dim = r.mscale_all_dim;
  p.low_freq_factor = r.low_freq_factor;
  p.high_freq_factor = r.high_freq_factor;
  return kernels::MakeRopeTable(p);
}

}  // namespace sluice
