#include "services/worker_common/peer_kv_blocks.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "transfer/block_runs.h"

namespace sluice {

namespace {

template <typename Region>
absl::StatusOr<std::vector<Region>> SelectByIndex(const std::vector<Region>& regions,
                                                  const std::vector<int32_t>& indices) {
  std::vector<Region> out;
  for (int32_t i : indices) {
    if (i < 0 || i >= static_cast<int32_t>(regions.size())) {
      return absl::InvalidArgumentError(absl::StrCat("KV region ", i, " of ", regions.size(),
                                                     " does not exist (KV layouts differ)"));
    }
    out.push_back(regions[static_cast<size_t>(i)]);
  }
  return out;
}

}  // namespace

absl::StatusOr<TransferRegions> ParseTransferRegions(std::string_view descriptor,
                                                     const std::vector<transfer::KvRegion>& local,
                                                     const std::vector<int32_t>& indices) {
  absl::StatusOr<transfer::RemoteKvDescriptor> remote =
      transfer::RemoteKvDescriptor::Parse(descriptor);
  if (!remote.ok()) return remote.status();
  absl::StatusOr<std::vector<transfer::RemoteRegion>> remote_regions =
      SelectByIndex(remote->regions, indices);
  if (!remote_regions.ok()) return remote_regions.status();
  absl::StatusOr<std::vector<transfer::KvRegion>> local_regions = SelectByIndex(local, indices);
  if (!local_regions.ok()) return local_regions.status();
  TransferRegions out;
  out.remote.worker_address = std::move(remote->worker_address);
  out.remote.regions = *std::move(remote_regions);
  out.local = *std::move(local_regions);
  return out;
}

absl::StatusOr<std::vector<transfer::BlockRun>> RunsFromWire(const v1::KvBlocks& in,
                                                            int64_t max_blocks) {
  constexpr uint64_t kMaxId = std::numeric_limits<int32_t>::max();
  std::vector<transfer::BlockRun> runs;
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

std::vector<int32_t> FirstBlocks(absl::Span<const transfer::BlockRun> runs, size_t n) {
  std::vector<int32_t> ids;
  ids.reserve(std::min<size_t>(n, static_cast<size_t>(transfer::TotalBlocks(runs))));
  for (const transfer::BlockRun& run : runs) {
    for (int32_t i = 0; i < run.num_blocks && ids.size() < n; ++i) {
      ids.push_back(run.first_block + i);
    }
    if (ids.size() == n) break;
  }
  return ids;
}

}  // namespace sluice
