#include "transfer/block_runs.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"

namespace sluice::transfer {

std::vector<BlockRun> CoalesceBlocks(absl::Span<const int32_t> block_ids) {
  std::vector<BlockRun> runs;
  for (int32_t id : block_ids) {
    if (!runs.empty()) {
      BlockRun& last = runs.back();
      // int64 so a run ending at INT32_MAX does not overflow.
      if (static_cast<int64_t>(last.first_block) + last.num_blocks == id) {
        ++last.num_blocks;
        continue;
      }
    }
    runs.push_back({id, 1});
  }
  return runs;
}

std::vector<int32_t> ExpandRuns(absl::Span<const BlockRun> runs) {
  std::vector<int32_t> ids;
  ids.reserve(static_cast<size_t>(std::max<int64_t>(0, TotalBlocks(runs))));
  for (const BlockRun& run : runs) {
    for (int32_t i = 0; i < run.num_blocks; ++i) ids.push_back(run.first_block + i);
  }
  return ids;
}

int64_t TotalBlocks(absl::Span<const BlockRun> runs) {
  int64_t total = 0;
  for (const BlockRun& run : runs) total += run.num_blocks;
  return total;
}

std::vector<int32_t> FirstBlocks(absl::Span<const BlockRun> runs, size_t n) {
  std::vector<int32_t> ids;
  ids.reserve(std::min<size_t>(n, static_cast<size_t>(TotalBlocks(runs))));
  for (const BlockRun& run : runs) {
    for (int32_t i = 0; i < run.num_blocks && ids.size() < n; ++i) {
      ids.push_back(run.first_block + i);
    }
    if (ids.size() == n) break;
  }
  return ids;
}

namespace {

absl::Status ValidateRuns(absl::Span<const BlockRun> runs, const char* side) {
  for (size_t i = 0; i < runs.size(); ++i) {
    const BlockRun& run = runs[i];
    if (run.first_block < 0 || run.num_blocks < 1 ||
        static_cast<int64_t>(run.first_block) + run.num_blocks - 1 >
            std::numeric_limits<int32_t>::max()) {
      return absl::InvalidArgumentError(absl::StrCat(side, " run ", i,
                                                     " is invalid: first_block=", run.first_block,
                                                     " num_blocks=", run.num_blocks));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<RunPair>> PairRuns(absl::Span<const BlockRun> remote_runs,
                                              absl::Span<const BlockRun> local_runs) {
  if (absl::Status s = ValidateRuns(remote_runs, "remote"); !s.ok()) return s;
  if (absl::Status s = ValidateRuns(local_runs, "local"); !s.ok()) return s;
  const int64_t remote_total = TotalBlocks(remote_runs);
  const int64_t local_total = TotalBlocks(local_runs);
  if (remote_total != local_total) {
    return absl::InvalidArgumentError(absl::StrCat("remote runs cover ", remote_total,
                                                   " blocks but local runs cover ", local_total));
  }
  std::vector<RunPair> pairs;
  size_t ri = 0, li = 0;
  int32_t r_used = 0,
          l_used = 0;  // blocks already consumed from the current run on each side
  while (ri < remote_runs.size() && li < local_runs.size()) {
    const int32_t r_left = remote_runs[ri].num_blocks - r_used;
    const int32_t l_left = local_runs[li].num_blocks - l_used;
    const int32_t n = std::min(r_left, l_left);
    pairs.push_back({remote_runs[ri].first_block + r_used, local_runs[li].first_block + l_used, n});
    r_used += n;
    l_used += n;
    if (r_used == remote_runs[ri].num_blocks) {
      ++ri;
      r_used = 0;
    }
    if (l_used == local_runs[li].num_blocks) {
      ++li;
      l_used = 0;
    }
  }
  return pairs;
}

}  // namespace sluice::transfer
