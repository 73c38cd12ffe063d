#include "transfer/block_runs_wire.h"

#include <limits>

#include "absl/strings/str_cat.h"

namespace sluice::transfer {

void RunsToWire(absl::Span<const int32_t> block_ids, v1::KvBlocks* out) {
  for (const BlockRun& run : CoalesceBlocks(block_ids)) {
    v1::BlockRun* w = out->add_runs();
    w->set_first_block(static_cast<uint32_t>(run.first_block));
    w->set_num_blocks(static_cast<uint32_t>(run.num_blocks));
  }
}

absl::StatusOr<std::vector<BlockRun>> RunsFromWire(const v1::KvBlocks& in, int64_t max_blocks) {
  constexpr uint64_t kMaxId = std::numeric_limits<int32_t>::max();
  std::vector<BlockRun> runs;
  runs.reserve(static_cast<size_t>(in.runs_size()));
  int64_t total = 0;
  for (int i = 0; i < in.runs_size(); ++i) {
    const v1::BlockRun& w = in.runs(i);
    // uint64 sums: first_block and num_blocks are each < 2^32.
    if (w.num_blocks() == 0 ||
        uint64_t{w.first_block()} + uint64_t{w.num_blocks()} - 1 > kMaxId) {
      return absl::InvalidArgumentError(absl::StrCat("KV block run ", i, " is invalid: first_block=",
                                                     w.first_block(), " num_blocks=",
                                                     w.num_blocks()));
    }
    total += w.num_blocks();
    if (total > max_blocks) {
      return absl::InvalidArgumentError(absl::StrCat("KV block runs cover more than ", max_blocks,
                                                     " blocks"));
    }
    runs.push_back({static_cast<int32_t>(w.first_block()), static_cast<int32_t>(w.num_blocks())});
  }
  return runs;
}

}  // namespace sluice::transfer
