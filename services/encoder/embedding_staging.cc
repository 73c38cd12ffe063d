#include "services/encoder/embedding_staging.h"

#include <xxhash.h>

#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace sluice {

absl::StatusOr<std::unique_ptr<EmbeddingStaging>> EmbeddingStaging::Create(
    transfer::KvTransferAgent* agent, const EmbeddingStagingOptions& options) {
  absl::StatusOr<std::unique_ptr<kvstore::KvStoreBufferPool>> pool =
      kvstore::KvStoreBufferPool::Create(agent, options.arena_bytes);
  if (!pool.ok()) return pool.status();
  return std::unique_ptr<EmbeddingStaging>(
      new EmbeddingStaging(agent, *std::move(pool), options));
}

EmbeddingStaging::EmbeddingStaging(transfer::KvTransferAgent* agent,
                                   std::unique_ptr<kvstore::KvStoreBufferPool> pool,
                                   const EmbeddingStagingOptions& options)
    : agent_(agent), pool_(std::move(pool)), options_(options) {
  stats_.arena_bytes = pool_->stats().arena_bytes;
}

absl::StatusOr<v1::EmbeddingRef> EmbeddingStaging::Stage(absl::Span<const uint8_t> bytes,
                                                         absl::Time now) {
  if (bytes.empty()) return absl::InvalidArgumentError("no embeddings to stage");
  std::lock_guard<std::mutex> lock(mu_);
  SweepLocked(now);
  KvBlockBuffer slot = pool_->Allocate(bytes.size());
  if (!slot.lent()) {  // the pool's heap fallback: memory no peer can read
    ++stats_.num_full;
    return absl::ResourceExhaustedError(
        absl::StrCat("the embedding staging arena has no room for ", bytes.size(), " bytes"));
  }
  const transfer::KvRegion region{slot.data(), 1, static_cast<int64_t>(bytes.size())};
  absl::StatusOr<transfer::RemoteKvDescriptor> described = agent_->Describe({&region, 1});
  if (!described.ok()) return described.status();
  std::memcpy(slot.data(), bytes.data(), bytes.size());
  const uint64_t id = next_lease_id_++;
  v1::EmbeddingRef ref;
  ref.set_worker_address(described->worker_address);
  ref.set_address(described->regions[0].base_address);
  ref.set_rkey(described->regions[0].rkey);
  ref.set_size(static_cast<int64_t>(bytes.size()));
  ref.set_lease_id(id);
  ref.set_token(tokens_.Issue(absl::StrCat("embeddings#", id)));
  ref.set_checksum(XXH3_64bits(bytes.data(), bytes.size()));
  ref.set_lease_ms(static_cast<int32_t>(absl::ToInt64Milliseconds(options_.lease)));
  leases_.emplace(id, Lease{std::move(slot), now + options_.lease});
  stats_.staged_bytes += static_cast<int64_t>(bytes.size());
  ++stats_.num_staged_leases;
  stats_.bytes_staged_total += static_cast<int64_t>(bytes.size());
  return ref;
}

absl::StatusOr<std::string> EmbeddingStaging::Release(uint64_t lease_id, absl::string_view token,
                                                      bool return_values, absl::Time now) {
  // The token first: a wrong one learns nothing about which leases exist.
  if (absl::Status s = tokens_.Check(absl::StrCat("embeddings#", lease_id), token,
                                     absl::StrCat("ReleaseEmbeddings of lease ", lease_id));
      !s.ok()) {
    return s;
  }
  KvBlockBuffer slot;  // freed after the lock
  std::string values;
  {
    std::lock_guard<std::mutex> lock(mu_);
    SweepLocked(now);
    auto it = leases_.find(lease_id);
    if (it == leases_.end()) {
      return absl::NotFoundError(absl::StrCat(
          "embedding lease ", lease_id, " ended (released, expired or cancelled)"));
    }
    slot = std::move(it->second.slot);
    leases_.erase(it);
    stats_.staged_bytes -= static_cast<int64_t>(slot.size());
    --stats_.num_staged_leases;
    ++stats_.num_released;
  }
  if (return_values) values.assign(reinterpret_cast<const char*>(slot.data()), slot.size());
  return values;
}

void EmbeddingStaging::Cancel(uint64_t lease_id) {
  KvBlockBuffer slot;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = leases_.find(lease_id);
  if (it == leases_.end()) return;
  slot = std::move(it->second.slot);
  leases_.erase(it);
  stats_.staged_bytes -= static_cast<int64_t>(slot.size());
  --stats_.num_staged_leases;
  ++stats_.num_cancelled;
}

int64_t EmbeddingStaging::Sweep(absl::Time now) {
  std::lock_guard<std::mutex> lock(mu_);
  return SweepLocked(now);
}

int64_t EmbeddingStaging::SweepLocked(absl::Time now) {
  int64_t n = 0;
  for (auto it = leases_.begin(); it != leases_.end();) {
    if (it->second.expiry > now) {
      ++it;
      continue;
    }
    stats_.staged_bytes -= static_cast<int64_t>(it->second.slot.size());
    --stats_.num_staged_leases;
    ++stats_.num_expired;
    ++n;
    it = leases_.erase(it);  // gives the slot back to the pool
  }
  return n;
}

EmbeddingStagingStats EmbeddingStaging::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace sluice
