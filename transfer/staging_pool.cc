#include "transfer/staging_pool.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace sluice::transfer {

absl::StatusOr<std::unique_ptr<StagingPool>> StagingPool::Create(KvTransferAgent* agent,
                                                                 int num_members,
                                                                 const CopierFactory& make_copier,
                                                                 const StagingOptions& options) {
  if (num_members < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("a staging pool needs at least one member, got ", num_members));
  }
  std::unique_ptr<StagingPool> pool(new StagingPool());
  pool->members_.reserve(num_members);
  for (int i = 0; i < num_members; ++i) {
    absl::StatusOr<std::unique_ptr<DeviceCopier>> copier = make_copier();
    if (!copier.ok()) return copier.status();
    Member member;
    member.copier = *std::move(copier);
    absl::StatusOr<std::unique_ptr<StagedKvTransfer>> transfer =
        StagedKvTransfer::Create(agent, member.copier.get(), options);
    if (!transfer.ok()) return transfer.status();
    member.transfer = *std::move(transfer);
    pool->members_.push_back(std::move(member));
  }
  absl::MutexLock lock(&pool->mu_);
  for (int i = num_members - 1; i >= 0; --i) pool->free_.push_back(i);
  return pool;
}

int StagingPool::Acquire(absl::Time deadline) {
  mu_.LockWhenWithDeadline(absl::Condition(this, &StagingPool::HasFree), deadline);
  int member = -1;
  if (!free_.empty()) {
    member = free_.back();
    free_.pop_back();
  }
  mu_.Unlock();
  return member;
}

void StagingPool::Release(int member) {
  absl::MutexLock lock(&mu_);
  free_.push_back(member);
}

template <typename Move>
absl::Status StagingPool::OnFreeMember(absl::Time deadline, const Move& move) {
  const int m = Acquire(deadline);
  if (m < 0) {
    return absl::DeadlineExceededError("no KV staging slots came free before the deadline");
  }
  absl::Status status = move(*members_[m].transfer);
  Release(m);
  return status;
}

absl::Status StagingPool::Pull(const RemoteKvDescriptor& remote,
                               absl::Span<const BlockRun> remote_runs,
                               absl::Span<const KvRegion> local_regions,
                               absl::Span<const BlockRun> local_runs, absl::Time deadline) {
  return OnFreeMember(deadline, [&](StagedKvTransfer& t) {
    return t.Pull(remote, remote_runs, local_regions, local_runs, deadline);
  });
}

absl::Status StagingPool::Push(const RemoteKvDescriptor& remote,
                               absl::Span<const BlockRun> remote_runs,
                               absl::Span<const KvRegion> local_regions,
                               absl::Span<const BlockRun> local_runs, absl::Time deadline) {
  return OnFreeMember(deadline, [&](StagedKvTransfer& t) {
    return t.Push(remote, remote_runs, local_regions, local_runs, deadline);
  });
}

StagedTransferStats StagingPool::stats() const {
  StagedTransferStats sum;
  for (const Member& member : members_) {
    const StagedTransferStats s = member.transfer->stats();
    sum.num_chunks += s.num_chunks;
    sum.num_device_copies += s.num_device_copies;
    sum.bytes_pulled += s.bytes_pulled;
    sum.bytes_pushed += s.bytes_pushed;
  }
  return sum;
}

}  // namespace sluice::transfer
