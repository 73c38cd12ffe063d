// Contiguous runs of KV blocks: the unit of one RMA operation per region.
//
// A request's blocks are scattered over the paged KV cache; transferring one
// block per RMA post makes posts (not bytes) the bottleneck. Runs of
// consecutive block ids move with one post each.
#ifndef SLUICE_TRANSFER_BLOCK_RUNS_H_
#define SLUICE_TRANSFER_BLOCK_RUNS_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace sluice::transfer {

// BlockRun: `num_blocks` consecutive block ids starting at `first_block`
// (first_block, first_block + 1, ..., first_block + num_blocks - 1). Valid runs
// have first_block >= 0 and num_blocks >= 1.
struct BlockRun {
  int32_t first_block = 0;
  int32_t num_blocks = 0;

  bool operator==(const BlockRun&) const = default;
};

// CoalesceBlocks: splits `block_ids` into maximal runs of ids that increase by
// exactly one, preserving order. [5,6,7,20,21,40] -> {5,3},{20,2},{40,1}; [3,2]
// -> {3,1},{2,1} (a descending pair is two runs: runs only go up). Empty input
// -> empty output. Ids are not validated here.
std::vector<BlockRun> CoalesceBlocks(absl::Span<const int32_t> block_ids);

// ExpandRuns: the inverse of CoalesceBlocks: the block ids covered by `runs`,
// in order.
std::vector<int32_t> ExpandRuns(absl::Span<const BlockRun> runs);

// TotalBlocks: sum of num_blocks over `runs` (int64 so it cannot overflow).
int64_t TotalBlocks(absl::Span<const BlockRun> runs);

// FirstBlocks: the first `n` block ids of `runs` in order (all of them when they cover fewer),
// without expanding the rest (a peer's runs may cover far more than is used).
std::vector<int32_t> FirstBlocks(absl::Span<const BlockRun> runs, size_t n);

// RunPair: one RMA operation: `num_blocks` blocks from remote block
// `remote_first` to local block `local_first` (or back, for a push).
struct RunPair {
  int32_t remote_first = 0;
  int32_t local_first = 0;
  int32_t num_blocks = 0;

  bool operator==(const RunPair&) const = default;
};

// PairRuns: matches the i-th remote block with the i-th local block and returns
// the fewest operations that are contiguous on both sides: a run is split
// wherever either side's run ends. Example: remote {5,3},{20,2},{40,1} with
// local {10,6} -> (5->10,3),(20->13,2),(40->15,1). Errors: InvalidArgument if a
// run has num_blocks < 1 or first_block < 0, if a run's end overflows int32, or
// if the two sides cover different numbers of blocks.
absl::StatusOr<std::vector<RunPair>> PairRuns(absl::Span<const BlockRun> remote_runs,
                                              absl::Span<const BlockRun> local_runs);

}  // namespace sluice::transfer

#endif  // SLUICE_TRANSFER_BLOCK_RUNS_H_
