#include "engine/spec/spec_sizing.h"

#include <algorithm>

#include "engine/spec/speculative.h"

namespace sluice {

int32_t MaxVerifiedDrafts(int32_t num_speculative_tokens, const std::string& verify) {
  SpeculativeOptions spec;
  spec.num_speculative_tokens = num_speculative_tokens;
  if (!spec.Validate().ok() ||
      !ParseVerifyMode(verify, &spec.verify, &spec.num_speculative_tokens).ok()) {
    return kMaxSpeculativeTokens;
  }
  return spec.num_speculative_tokens;
}

int64_t DraftKvBlocks(int64_t target_blocks, bool target_kv_on_device, int64_t host_kv_bytes,
                      int64_t draft_block_bytes) {
  if (!target_kv_on_device) return target_blocks;
  const int64_t fit = host_kv_bytes / std::max<int64_t>(1, draft_block_bytes);
  return std::max<int64_t>(1, std::min(target_blocks, fit));
}

}  // namespace sluice
