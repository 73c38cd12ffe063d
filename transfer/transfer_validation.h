// ValidateTransfer: the checks every KV transfer (KvTransferAgent, StagedKvTransfer, a
// layer-by-layer push) runs before any byte moves, so a bad descriptor or bad runs from a peer
// are an error, never a crash or a stray RMA.
#ifndef SLUICE_TRANSFER_TRANSFER_VALIDATION_H_
#define SLUICE_TRANSFER_TRANSFER_VALIDATION_H_

#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "transfer/block_runs.h"
#include "transfer/kv_transfer.h"

namespace sluice::transfer {

// ValidateTransfer checks a Pull/Push request (kv_transfer.h's contract) and returns its paired
// runs (PairRuns). InvalidArgument when: the descriptor and `local_regions` hold different
// numbers of regions; the runs do not pair (bad run, different totals); a region pair has
// different or non-positive block_bytes, or a null local base; a run reaches past num_blocks
// of either side. Transport-specific checks (worker address, remote keys, registration) stay
// with the transport.
absl::StatusOr<std::vector<RunPair>> ValidateTransfer(const RemoteKvDescriptor& remote,
                                                      absl::Span<const BlockRun> remote_runs,
                                                      absl::Span<const KvRegion> local_regions,
                                                      absl::Span<const BlockRun> local_runs);

}  // namespace sluice::transfer

#endif  // SLUICE_TRANSFER_TRANSFER_VALIDATION_H_
