// Checks on what a peer worker sends about KV blocks (PrefillResponse.kv,
// PushKvRequest.destination): its serialized RemoteKvDescriptor (its block runs:
// transfer/block_runs_wire.h). A peer is untrusted input here: every field is validated before
// it reaches the transfer agent. Pure functions of the message and the local geometry (fuzzed
// by tests/fuzz/worker_wire_fuzz).
#ifndef SLUICE_SERVICES_COMMON_PEER_KV_BLOCKS_H_
#define SLUICE_SERVICES_COMMON_PEER_KV_BLOCKS_H_

#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "transfer/kv_transfer.h"

namespace sluice {

// TransferRegions: the regions one transfer moves on both sides, paired by position.
struct TransferRegions {
  transfer::RemoteKvDescriptor remote;
  std::vector<transfer::KvRegion> local;
};
// ParseTransferRegions parses a peer's serialized RemoteKvDescriptor and keeps regions
// `indices` (TransferRegionIndices) of it and of `local`, in that order. Errors: those of
// RemoteKvDescriptor::Parse; InvalidArgument for an index out of range (another layout).
absl::StatusOr<TransferRegions> ParseTransferRegions(std::string_view descriptor,
                                                     const std::vector<transfer::KvRegion>& local,
                                                     const std::vector<int32_t>& indices);

}  // namespace sluice

#endif  // SLUICE_SERVICES_COMMON_PEER_KV_BLOCKS_H_
