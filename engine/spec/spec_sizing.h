// Sizes a speculative-decoding set-up plans with before the engine starts: the logits rows a
// device target needs per decode sequence, and the blocks of a draft model's host KV cache.
#ifndef SLUICE_ENGINE_SPEC_SPEC_SIZING_H_
#define SLUICE_ENGINE_SPEC_SPEC_SIZING_H_

#include <cstdint>
#include <string>

namespace sluice {

// MaxVerifiedDrafts: the most drafts one sequence verifies in a step with
// --num-speculative-tokens `num_speculative_tokens` and --speculative-verify `verify` (k, or the
// fixed count), so a step has at most k + 1 logits rows per decode sequence. Values that
// SpeculativeOptions::Validate / ParseVerifyMode refuse give kMaxSpeculativeTokens (sizing
// never hides their error).
int32_t MaxVerifiedDrafts(int32_t num_speculative_tokens, const std::string& verify);

// DraftKvBlocks: how many blocks of `draft_block_bytes` (the draft model's host float32 KV per
// block) the drafter gets beside a target of `target_blocks` blocks. A target whose KV is
// host memory shares its budget's block count (the draft's blocks are smaller). A target whose
// KV lives on a device (a CUDA runner: its block count comes from device memory and can reach
// hundreds of thousands) gets at most what `host_kv_bytes` (EngineOptions::kv_cache_bytes)
// holds of draft blocks, and at least 1: a sequence whose draft blocks run out is only not
// drafted for.
int64_t DraftKvBlocks(int64_t target_blocks, bool target_kv_on_device, int64_t host_kv_bytes,
                      int64_t draft_block_bytes);

}  // namespace sluice

#endif  // SLUICE_ENGINE_SPEC_SPEC_SIZING_H_
