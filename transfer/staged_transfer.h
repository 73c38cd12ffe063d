// StagedKvTransfer: KV block transfer for local KV in device memory over a transport that cannot
// read it (tcp across hosts, a UCX without CUDA): blocks pass through pinned host staging slots
// registered with the agent, and the device copies overlap the network.
//
// Pull: the paired runs of every region are cut into chunks of whole blocks that fit one slot;
// chunk k is RMA-read into slot k % num_slots, then copied host -> device on copy lane
// k % num_slots while chunk k + 1 is read. Push mirrors it: chunk k + 1 is copied device -> host
// while chunk k is written to the peer. A slot is reused only after its lane's copies are done.
// The peer's regions must be reachable by the transport (its host memory, or its own staging).
//
// Same contract as KvTransferAgent::Pull/Push (kv_transfer.h): region i pairs with descriptor
// region i, block_bytes must match, runs are coalesced block runs, one deadline for the whole
// transfer, and on every return (error included) no copy or RMA touches the buffers any more.
// Layer-by-layer push: Push with the layer's regions (RemoteKvDescriptor::SelectRegions and the
// matching local subspan), as with the agent.
// A failed device copy (DeviceCopier::CopyAsync or Wait) is returned with its code and marked
// (IsStagingCopyFailure), so a caller can tell it from the network's errors: a decode worker
// recomputes the prompt after either, under its own cause.
#ifndef SLUICE_TRANSFER_STAGED_TRANSFER_H_
#define SLUICE_TRANSFER_STAGED_TRANSFER_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "transfer/block_runs.h"
#include "transfer/device_copier.h"
#include "transfer/kv_transfer.h"

namespace sluice::transfer {

struct StagingOptions {
  // Bytes of one staging slot: the largest piece one RMA operation and one device copy move.
  // Must hold at least one block of every region transferred.
  int64_t slot_bytes = 8 << 20;
  // Slots (and copy lanes) in flight: 2 overlaps one copy with one network operation.
  int num_slots = 2;
};

struct StagedTransferStats {
  int64_t num_chunks = 0;        // slot fills (each one RMA batch and its device copies)
  int64_t num_device_copies = 0;
  int64_t bytes_pulled = 0;
  int64_t bytes_pushed = 0;
};

// IsStagingCopyFailure: `status` is a staged transfer's failed device copy (host <-> device
// through a staging slot), not an RMA error.
bool IsStagingCopyFailure(const absl::Status& status);

class StagedKvTransfer {
 public:
  // Create allocates num_slots * slot_bytes of staging through `copier` and registers it with
  // `agent` (both must outlive this object). Errors: InvalidArgument for slot_bytes <= 0,
  // num_slots < 1 or a copier with fewer lanes than slots; those of AllocateStaging and
  // RegisterRegion.
  static absl::StatusOr<std::unique_ptr<StagedKvTransfer>> Create(KvTransferAgent* agent,
                                                                  DeviceCopier* copier,
                                                                  const StagingOptions& options);
  ~StagedKvTransfer();
  StagedKvTransfer(const StagedKvTransfer&) = delete;
  StagedKvTransfer& operator=(const StagedKvTransfer&) = delete;

  // Pull / Push: as KvTransferAgent::Pull / Push, with `local_regions` in device memory (not
  // registered with the agent). Extra error: InvalidArgument when a region's block does not fit
  // a slot. Transfers on one object run one at a time (they share the slots).
  absl::Status Pull(const RemoteKvDescriptor& remote, absl::Span<const BlockRun> remote_runs,
                    absl::Span<const KvRegion> local_regions, absl::Span<const BlockRun> local_runs,
                    absl::Time deadline);
  absl::Status Push(const RemoteKvDescriptor& remote, absl::Span<const BlockRun> remote_runs,
                    absl::Span<const KvRegion> local_regions, absl::Span<const BlockRun> local_runs,
                    absl::Time deadline);

  StagedTransferStats stats() const;

  // A chunk: consecutive run pairs of one region whose blocks fill at most one slot.
  struct Chunk {
    size_t region = 0;
    std::vector<RunPair> pairs;
    int64_t num_blocks = 0;
  };
  // PlanChunks cuts the paired runs of every region into chunks of at most
  // slot_bytes / block_bytes blocks (a pair is split where it does not fit). Exposed for tests.
  static absl::StatusOr<std::vector<Chunk>> PlanChunks(absl::Span<const RunPair> pairs,
                                                       absl::Span<const KvRegion> regions,
                                                       int64_t slot_bytes);

 private:
  StagedKvTransfer(KvTransferAgent* agent, DeviceCopier* copier, const StagingOptions& options)
      : agent_(agent), copier_(copier), options_(options) {}
  absl::Status Transfer(const RemoteKvDescriptor& remote, absl::Span<const BlockRun> remote_runs,
                        absl::Span<const KvRegion> local_regions,
                        absl::Span<const BlockRun> local_runs, absl::Time deadline, bool is_push)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Enqueues the device copies of `chunk` between slot `slot` and the local region.
  absl::Status EnqueueCopies(const Chunk& chunk, const KvRegion& local, int slot, bool to_device)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The RMA of `chunk` between slot `slot` and the peer.
  absl::Status MoveChunk(const RemoteKvDescriptor& region_desc, const Chunk& chunk,
                         int64_t block_bytes, int slot, absl::Time deadline, bool is_push)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  KvTransferAgent* const agent_;
  DeviceCopier* const copier_;
  const StagingOptions options_;
  char* staging_ = nullptr;  // num_slots * slot_bytes
  uint64_t staging_region_ = 0;
  mutable absl::Mutex mu_;
  StagedTransferStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sluice::transfer

#endif  // SLUICE_TRANSFER_STAGED_TRANSFER_H_
