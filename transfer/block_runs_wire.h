// KV block runs on the wire: transfer::BlockRun lists as sluice.v1.KvBlocks.runs, both ways.
// What arrives comes from a peer worker and is untrusted: RunsFromWire checks every run before
// the transfer code sees it (fuzzed by tests/fuzz/worker_wire_fuzz).
#ifndef SLUICE_TRANSFER_BLOCK_RUNS_WIRE_H_
#define SLUICE_TRANSFER_BLOCK_RUNS_WIRE_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "sluice/v1/kv.pb.h"
#include "transfer/block_runs.h"

namespace sluice::transfer {

// RunsToWire appends `block_ids` to `out->runs` as coalesced runs (CoalesceBlocks).
void RunsToWire(absl::Span<const int32_t> block_ids, v1::KvBlocks* out);

// RunsFromWire reads a peer's run list: every run must start at a block id <= INT32_MAX, hold
// >= 1 block and end at or below INT32_MAX, and the runs may cover at most `max_blocks` blocks
// in total. Errors: InvalidArgument naming the run or the total.
absl::StatusOr<std::vector<BlockRun>> RunsFromWire(const v1::KvBlocks& in, int64_t max_blocks);

}  // namespace sluice::transfer

#endif  // SLUICE_TRANSFER_BLOCK_RUNS_WIRE_H_
