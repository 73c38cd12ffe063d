#include "transfer/staged_transfer.h"

#include <algorithm>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "transfer/transfer_validation.h"

namespace sluice::transfer {
namespace {

constexpr char kCopyFailureUrl[] = "type.sluice.dev/transfer.StagingCopyFailure";

// CopyFailure: a copier's error, marked and saying which direction failed.
absl::Status CopyFailure(const absl::Status& status, bool to_device) {
  absl::Status marked(status.code(),
                      absl::StrCat(to_device ? "host -> device" : "device -> host",
                                   " copy of a staged KV transfer failed: ", status.message()));
  marked.SetPayload(kCopyFailureUrl, absl::Cord("1"));
  return marked;
}

}  // namespace

bool IsStagingCopyFailure(const absl::Status& status) {
  return !status.ok() && status.GetPayload(kCopyFailureUrl).has_value();
}

absl::StatusOr<std::unique_ptr<StagedKvTransfer>> StagedKvTransfer::Create(
    KvTransferAgent* agent, DeviceCopier* copier, const StagingOptions& options) {
  if (agent == nullptr || copier == nullptr) {
    return absl::InvalidArgumentError("StagedKvTransfer needs an agent and a copier");
  }
  if (options.slot_bytes <= 0 || options.num_slots < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("staging needs slot_bytes > 0 and num_slots >= 1, got ", options.slot_bytes,
                     " and ", options.num_slots));
  }
  if (copier->num_lanes() < options.num_slots) {
    return absl::InvalidArgumentError(absl::StrCat("the copier has ", copier->num_lanes(),
                                                   " lanes for ", options.num_slots, " slots"));
  }
  std::unique_ptr<StagedKvTransfer> staged(new StagedKvTransfer(agent, copier, options));
  const int64_t bytes = options.slot_bytes * options.num_slots;
  absl::StatusOr<void*> memory = copier->AllocateStaging(bytes);
  if (!memory.ok()) return memory.status();
  staged->staging_ = static_cast<char*>(*memory);
  absl::StatusOr<RegionHandle> handle = agent->RegisterRegion(staged->staging_, bytes);
  if (!handle.ok()) return handle.status();  // the destructor frees the memory
  staged->staging_region_ = handle->id;
  return staged;
}

StagedKvTransfer::~StagedKvTransfer() {
  if (staging_region_ != 0) (void)agent_->DeregisterRegion(staging_region_);
  if (staging_ != nullptr) copier_->FreeStaging(staging_);
}

StagedTransferStats StagedKvTransfer::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

absl::StatusOr<std::vector<StagedKvTransfer::Chunk>> StagedKvTransfer::PlanChunks(
    absl::Span<const RunPair> pairs, absl::Span<const KvRegion> regions, int64_t slot_bytes) {
  std::vector<Chunk> chunks;
  for (size_t i = 0; i < regions.size(); ++i) {
    const int64_t block_bytes = regions[i].block_bytes;
    const int64_t capacity = block_bytes > 0 ? slot_bytes / block_bytes : 0;
    if (capacity < 1) {
      return absl::InvalidArgumentError(absl::StrCat("region ", i, ": a block of ", block_bytes,
                                                     " bytes does not fit a staging slot of ",
                                                     slot_bytes, " bytes"));
    }
    Chunk chunk{i, {}, 0};
    for (RunPair p : pairs) {
      while (p.num_blocks > 0) {
        if (chunk.num_blocks == capacity) {
          chunks.push_back(std::move(chunk));
          chunk = Chunk{i, {}, 0};
        }
        const int32_t take =
            static_cast<int32_t>(std::min<int64_t>(p.num_blocks, capacity - chunk.num_blocks));
        chunk.pairs.push_back({p.remote_first, p.local_first, take});
        chunk.num_blocks += take;
        p.remote_first += take;
        p.local_first += take;
        p.num_blocks -= take;
      }
    }
    if (chunk.num_blocks > 0) chunks.push_back(std::move(chunk));
  }
  return chunks;
}

absl::Status StagedKvTransfer::Pull(const RemoteKvDescriptor& remote,
                                    absl::Span<const BlockRun> remote_runs,
                                    absl::Span<const KvRegion> local_regions,
                                    absl::Span<const BlockRun> local_runs, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  return Transfer(remote, remote_runs, local_regions, local_runs, deadline, /*is_push=*/false);
}

absl::Status StagedKvTransfer::Push(const RemoteKvDescriptor& remote,
                                    absl::Span<const BlockRun> remote_runs,
                                    absl::Span<const KvRegion> local_regions,
                                    absl::Span<const BlockRun> local_runs, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  return Transfer(remote, remote_runs, local_regions, local_runs, deadline, /*is_push=*/true);
}

absl::Status StagedKvTransfer::EnqueueCopies(const Chunk& chunk, const KvRegion& local, int slot,
                                             bool to_device) {
  char* host = staging_ + slot * options_.slot_bytes;
  char* device = static_cast<char*>(local.base);
  for (const RunPair& p : chunk.pairs) {
    const int64_t bytes = int64_t{p.num_blocks} * local.block_bytes;
    char* dev = device + int64_t{p.local_first} * local.block_bytes;
    absl::Status s = to_device
                         ? copier_->CopyAsync(slot, dev, host, bytes, CopyDirection::kHostToDevice)
                         : copier_->CopyAsync(slot, host, dev, bytes, CopyDirection::kDeviceToHost);
    if (!s.ok()) return CopyFailure(s, to_device);
    host += bytes;
    ++stats_.num_device_copies;
  }
  return absl::OkStatus();
}

absl::Status StagedKvTransfer::MoveChunk(const RemoteKvDescriptor& region_desc, const Chunk& chunk,
                                         int64_t block_bytes, int slot, absl::Time deadline,
                                         bool is_push) {
  const KvRegion slot_region{staging_ + slot * options_.slot_bytes,
                             options_.slot_bytes / block_bytes, block_bytes};
  std::vector<BlockRun> remote_runs;
  remote_runs.reserve(chunk.pairs.size());
  for (const RunPair& p : chunk.pairs) remote_runs.push_back({p.remote_first, p.num_blocks});
  const BlockRun slot_run{0, static_cast<int32_t>(chunk.num_blocks)};
  ++stats_.num_chunks;
  return is_push ? agent_->Push(region_desc, remote_runs, {&slot_region, 1}, {&slot_run, 1},
                                deadline)
                 : agent_->Pull(region_desc, remote_runs, {&slot_region, 1}, {&slot_run, 1},
                                deadline);
}

absl::Status StagedKvTransfer::Transfer(const RemoteKvDescriptor& remote,
                                        absl::Span<const BlockRun> remote_runs,
                                        absl::Span<const KvRegion> local_regions,
                                        absl::Span<const BlockRun> local_runs, absl::Time deadline,
                                        bool is_push) {
  // Validate everything before the first byte moves (the agent re-checks each chunk).
  absl::StatusOr<std::vector<RunPair>> pairs =
      ValidateTransfer(remote, remote_runs, local_regions, local_runs);
  if (!pairs.ok()) return pairs.status();
  absl::StatusOr<std::vector<Chunk>> chunks =
      PlanChunks(*pairs, local_regions, options_.slot_bytes);
  if (!chunks.ok()) return chunks.status();
  std::vector<RemoteKvDescriptor> region_descs;
  for (size_t i = 0; i < remote.regions.size(); ++i) {
    absl::StatusOr<RemoteKvDescriptor> d = remote.SelectRegions(i, 1);
    if (!d.ok()) return d.status();
    region_descs.push_back(*std::move(d));
  }

  const int slots = options_.num_slots;
  const size_t n = chunks->size();
  absl::Status status;
  // A lane's copies done; a copy that failed comes back marked (IsStagingCopyFailure).
  auto wait_lane = [&](int lane) {
    absl::Status s = copier_->Wait(lane);
    return s.ok() ? s : CopyFailure(s, /*to_device=*/!is_push);
  };
  auto check_deadline = [&] {
    return absl::Now() < deadline
               ? absl::OkStatus()
               : absl::DeadlineExceededError("staged KV transfer did not complete in time");
  };
  if (!is_push) {
    // Read chunk k while chunk k - 1's host -> device copies run.
    for (size_t k = 0; k < n && status.ok(); ++k) {
      const Chunk& c = (*chunks)[k];
      const int slot = static_cast<int>(k % slots);
      if (k >= static_cast<size_t>(slots)) status = wait_lane(slot);  // slot drained
      if (status.ok()) status = check_deadline();
      if (status.ok()) {
        status = MoveChunk(region_descs[c.region], c, local_regions[c.region].block_bytes, slot,
                           deadline, /*is_push=*/false);
      }
      if (status.ok()) status = EnqueueCopies(c, local_regions[c.region], slot, /*to_device=*/true);
    }
  } else if (n > 0) {
    // Write chunk k while chunk k + 1's device -> host copies run.
    const Chunk& first = (*chunks)[0];
    status = EnqueueCopies(first, local_regions[first.region], 0, /*to_device=*/false);
    for (size_t k = 0; k < n && status.ok(); ++k) {
      const Chunk& c = (*chunks)[k];
      const int slot = static_cast<int>(k % slots);
      status = wait_lane(slot);  // chunk k is in its slot
      // Chunk k + 1 goes to the slot chunk k + 1 - slots used: already written to the peer
      // (with one slot, that is chunk k's: fill it only after the write below).
      auto stage_next = [&] {
        if (k + 1 >= n) return absl::OkStatus();
        const Chunk& next = (*chunks)[k + 1];
        return EnqueueCopies(next, local_regions[next.region], static_cast<int>((k + 1) % slots),
                             /*to_device=*/false);
      };
      if (status.ok() && slots > 1) status = stage_next();
      if (status.ok()) status = check_deadline();
      if (status.ok()) {
        status = MoveChunk(region_descs[c.region], c, local_regions[c.region].block_bytes, slot,
                           deadline, /*is_push=*/true);
      }
      if (status.ok() && slots == 1) status = stage_next();
    }
  }
  // Drain every lane on every path: no copy may touch the buffers after we return.
  for (int lane = 0; lane < slots; ++lane) {
    absl::Status s = wait_lane(lane);
    if (status.ok()) status = s;
  }
  if (status.ok()) {
    int64_t bytes = 0;
    for (const Chunk& c : *chunks) bytes += c.num_blocks * local_regions[c.region].block_bytes;
    (is_push ? stats_.bytes_pushed : stats_.bytes_pulled) += bytes;
  }
  return status;
}

}  // namespace sluice::transfer
