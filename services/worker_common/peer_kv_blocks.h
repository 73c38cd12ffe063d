// Checks on what a peer worker sends about KV blocks (PrefillResponse.kv,
// PushKvRequest.destination): its serialized RemoteKvDescriptor and its block runs. A peer is
// untrusted input here: every field is validated before it reaches the transfer agent.
// Pure functions of the message and the local geometry (fuzzed by tests/fuzz/worker_wire_fuzz).
#ifndef SLUICE_SERVICES_WORKER_COMMON_PEER_KV_BLOCKS_H_
#define SLUICE_SERVICES_WORKER_COMMON_PEER_KV_BLOCKS_H_

#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "sluice/v1/kv.pb.h"
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
// RunsFromWire reads a peer's BlockRun list, which is untrusted: every run must start at a
// block id <= INT32_MAX, hold >= 1 block and end at or below INT32_MAX, and the runs may cover
// at most `max_blocks` blocks in total. Errors: InvalidArgument naming the run or the total.
absl::StatusOr<std::vector<transfer::BlockRun>> RunsFromWire(const v1::KvBlocks& in,
                                                            int64_t max_blocks);
// FirstBlocks: the first `n` block ids of `runs` in order (all of them when they cover fewer),
// without expanding the rest (a peer's runs may cover far more than is used).
std::vector<int32_t> FirstBlocks(absl::Span<const transfer::BlockRun> runs, size_t n);

}  // namespace sluice

#endif  // SLUICE_SERVICES_WORKER_COMMON_PEER_KV_BLOCKS_H_
