#include "transfer/transfer_validation.h"

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"

namespace sluice::transfer {

absl::StatusOr<std::vector<RunPair>> ValidateTransfer(const RemoteKvDescriptor& remote,
                                                      absl::Span<const BlockRun> remote_runs,
                                                      absl::Span<const KvRegion> local_regions,
                                                      absl::Span<const BlockRun> local_runs) {
  if (remote.regions.size() != local_regions.size()) {
    return absl::InvalidArgumentError(absl::StrCat("descriptor has ", remote.regions.size(),
                                                   " regions but ", local_regions.size(),
                                                   " local regions were given"));
  }
  absl::StatusOr<std::vector<RunPair>> pairs = PairRuns(remote_runs, local_runs);
  if (!pairs.ok()) return pairs.status();
  int64_t max_remote_end = 0, max_local_end = 0;
  for (const RunPair& p : *pairs) {
    max_remote_end = std::max<int64_t>(max_remote_end, int64_t{p.remote_first} + p.num_blocks);
    max_local_end = std::max<int64_t>(max_local_end, int64_t{p.local_first} + p.num_blocks);
  }
  for (size_t i = 0; i < local_regions.size(); ++i) {
    const RemoteRegion& rr = remote.regions[i];
    const KvRegion& lr = local_regions[i];
    if (lr.base == nullptr || rr.block_bytes != lr.block_bytes || lr.block_bytes <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "region ", i, ": remote block_bytes ", rr.block_bytes, " != local block_bytes ",
          lr.block_bytes, lr.base == nullptr ? " (local base is null)" : ""));
    }
    if (max_remote_end > rr.num_blocks || max_local_end > lr.num_blocks) {
      return absl::InvalidArgumentError(absl::StrCat(
          "region ", i, ": block runs reach block ", std::max(max_remote_end, max_local_end) - 1,
          " beyond remote num_blocks ", rr.num_blocks, " or local num_blocks ", lr.num_blocks));
    }
  }
  return pairs;
}

}  // namespace sluice::transfer
