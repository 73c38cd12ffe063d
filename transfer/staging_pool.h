// StagingPool: StagedKvTransfer (staged_transfer.h) for concurrent transfers. One staged
// transfer owns its slots and copy lanes for its whole length (and a DeviceCopier takes one
// caller at a time), so the pool keeps `num_members` of them, each with its own slots and
// copier: up to that many transfers run at once, and a transfer that finds every member busy
// waits for one, at most until its deadline.
#ifndef SLUICE_TRANSFER_STAGING_POOL_H_
#define SLUICE_TRANSFER_STAGING_POOL_H_

#include <functional>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "transfer/block_runs.h"
#include "transfer/device_copier.h"
#include "transfer/kv_transfer.h"
#include "transfer/staged_transfer.h"

namespace sluice::transfer {

class StagingPool {
 public:
  using CopierFactory = std::function<absl::StatusOr<std::unique_ptr<DeviceCopier>>()>;
  // Create makes `num_members` StagedKvTransfers over `agent` (which must outlive the pool),
  // each with a copier from `make_copier` (called once per member) and `options`' slots.
  // Errors: InvalidArgument for num_members < 1; those of make_copier and
  // StagedKvTransfer::Create.
  static absl::StatusOr<std::unique_ptr<StagingPool>> Create(KvTransferAgent* agent,
                                                             int num_members,
                                                             const CopierFactory& make_copier,
                                                             const StagingOptions& options);
  StagingPool(const StagingPool&) = delete;
  StagingPool& operator=(const StagingPool&) = delete;

  // Pull / Push: StagedKvTransfer::Pull / Push on a free member. Extra error: DeadlineExceeded
  // when no member came free before `deadline` (nothing moved).
  absl::Status Pull(const RemoteKvDescriptor& remote, absl::Span<const BlockRun> remote_runs,
                    absl::Span<const KvRegion> local_regions, absl::Span<const BlockRun> local_runs,
                    absl::Time deadline);
  absl::Status Push(const RemoteKvDescriptor& remote, absl::Span<const BlockRun> remote_runs,
                    absl::Span<const KvRegion> local_regions, absl::Span<const BlockRun> local_runs,
                    absl::Time deadline);

  int num_members() const { return static_cast<int>(members_.size()); }
  // member(i): the i-th staged transfer, for a caller that serializes its own use of it.
  StagedKvTransfer* member(int i) { return members_[i].transfer.get(); }
  // stats: the members' counters summed.
  StagedTransferStats stats() const;

 private:
  struct Member {
    std::unique_ptr<DeviceCopier> copier;
    std::unique_ptr<StagedKvTransfer> transfer;  // after copier: destroyed first
  };
  StagingPool() = default;
  // Acquire: a free member's index, waiting at most until `deadline`; -1 when none came free.
  int Acquire(absl::Time deadline);
  void Release(int member);
  // OnFreeMember: runs `move(transfer)` on a free member's StagedKvTransfer, then frees it.
  template <typename Move>
  absl::Status OnFreeMember(absl::Time deadline, const Move& move);
  bool HasFree() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !free_.empty(); }

  std::vector<Member> members_;  // fixed after Create
  mutable absl::Mutex mu_;
  std::vector<int> free_ ABSL_GUARDED_BY(mu_);  // indices of idle members
};

}  // namespace sluice::transfer

#endif  // SLUICE_TRANSFER_STAGING_POOL_H_
