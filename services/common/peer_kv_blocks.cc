#include "services/common/peer_kv_blocks.h"

#include "absl/strings/str_cat.h"

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

}  // namespace sluice
