// Tensor-parallel weight slicing (Megatron-LM style, Shoeybi et al. 2019, arXiv:1909.08053 §3):
// a "column-parallel" linear y = x Wᵀ keeps a block of W's output rows per rank (q/k/v by
// heads, MLP gate/up by intermediate channels) and needs no communication; the following
// "row-parallel" linear keeps the matching block of input columns (o_proj, down_proj), each
// rank produces a partial sum of the full output, and one all-reduce completes it. Two
// all-reduces per transformer layer.
//
// Weights are row-major float32 [rows, cols] as the CPU models store them (engine/model).
#ifndef SLUICE_ENGINE_PARALLEL_SHARDING_H_
#define SLUICE_ENGINE_PARALLEL_SHARDING_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace sluice {

// Range is [begin, begin + count).
struct Range {
  int64_t begin = 0;
  int64_t count = 0;
};

// EvenShard returns rank's block of n items split evenly over world_size ranks.
// Errors: InvalidArgument naming `what` when n % world_size != 0 or rank is out of range.
absl::StatusOr<Range> EvenShard(int64_t n, int32_t rank, int32_t world_size, const char* what);

// TokenShard returns rank's contiguous share of n tokens when n need not divide evenly: the
// first n % world_size ranks get one more. Always succeeds for 0 <= rank < world_size.
Range TokenShard(int64_t n, int32_t rank, int32_t world_size);

// AttentionHeadShard is rank's query heads and KV heads under tensor parallelism.
struct AttentionHeadShard {
  Range q_heads;
  Range kv_heads;
};

// ShardAttentionHeads splits num_heads query heads evenly; KV heads are split evenly when
// world_size divides num_kv_heads, else replicated (each rank keeps the one KV head its query
// heads share; needs world_size % num_kv_heads == 0), as GQA models with fewer KV heads than
// ranks are served (vLLM's QKVParallelLinear does the same).
// Errors: InvalidArgument when num_heads % world_size != 0 or neither KV rule applies.
absl::StatusOr<AttentionHeadShard> ShardAttentionHeads(int64_t num_heads, int64_t num_kv_heads,
                                                       int32_t rank, int32_t world_size);

// GatherRows returns the rows of `w` [*, cols] listed by `blocks` (in order), concatenated:
// [Σ count, cols]. Used for fused weights (qkv, gate_up) whose parts are split separately.
std::vector<float> GatherRows(const std::vector<float>& w, int64_t cols,
                              absl::Span<const Range> blocks);

// SliceColumns returns columns [cols.begin, +cols.count) of `w` [rows, num_cols]:
// [rows, cols.count].
std::vector<float> SliceColumns(const std::vector<float>& w, int64_t rows, int64_t num_cols,
                                Range cols);

// Scale returns r with begin and count multiplied by `factor` (heads → channels).
inline Range Scale(Range r, int64_t factor) { return {r.begin * factor, r.count * factor}; }
// Offset returns r shifted by `offset` rows.
inline Range Offset(Range r, int64_t offset) { return {r.begin + offset, r.count}; }

}  // namespace sluice

#endif  // SLUICE_ENGINE_PARALLEL_SHARDING_H_
