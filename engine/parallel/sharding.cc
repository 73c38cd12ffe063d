#include "engine/parallel/sharding.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace sluice {

absl::StatusOr<Range> EvenShard(int64_t n, int32_t rank, int32_t world_size, const char* what) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " outside a world of ", world_size));
  }
  if (n % world_size != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " (", n, ") is not divisible by the parallel size ", world_size));
  }
  const int64_t count = n / world_size;
  return Range{rank * count, count};
}

Range TokenShard(int64_t n, int32_t rank, int32_t world_size) {
  const int64_t base = n / world_size, extra = n % world_size;
  return {rank * base + std::min<int64_t>(rank, extra), base + (rank < extra ? 1 : 0)};
}

absl::StatusOr<AttentionHeadShard> ShardAttentionHeads(int64_t num_heads, int64_t num_kv_heads,
                                                       int32_t rank, int32_t world_size) {
  AttentionHeadShard shard;
  auto q = EvenShard(num_heads, rank, world_size, "num_attention_heads");
  if (!q.ok()) return q.status();
  shard.q_heads = *q;
  if (num_kv_heads % world_size == 0) {
    shard.kv_heads = {rank * (num_kv_heads / world_size), num_kv_heads / world_size};
  } else if (num_kv_heads > 0 && world_size % num_kv_heads == 0) {
    shard.kv_heads = {rank / (world_size / num_kv_heads), 1};
  } else {
    return absl::InvalidArgumentError(absl::StrCat("num_key_value_heads (", num_kv_heads,
                                                   ") neither divides nor is divided by the "
                                                   "tensor-parallel size ",
                                                   world_size));
  }
  return shard;
}

std::vector<float> GatherRows(const std::vector<float>& w, int64_t cols,
                              absl::Span<const Range> blocks) {
  std::vector<float> out;
  for (const Range& b : blocks) {
    out.insert(out.end(), w.begin() + b.begin * cols, w.begin() + (b.begin + b.count) * cols);
  }
  return out;
}

std::vector<float> SliceColumns(const std::vector<float>& w, int64_t rows, int64_t num_cols,
                                Range cols) {
  std::vector<float> out;
  out.reserve(static_cast<size_t>(rows * cols.count));
  for (int64_t r = 0; r < rows; ++r) {
    const auto row = w.begin() + r * num_cols + cols.begin;
    out.insert(out.end(), row, row + cols.count);
  }
  return out;
}

}  // namespace sluice
