#include "services/kvstore/block_store.h"

#include <cstring>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace sluice::kvstore {
namespace {

absl::Status CheckDistinct(absl::Span<const BlockKey> keys) {
  absl::flat_hash_set<BlockKey> seen;
  seen.reserve(keys.size());
  for (const BlockKey& k : keys) {
    if (!seen.insert(k).second) {
      return absl::InvalidArgumentError(absl::StrCat("duplicate block key ", k.ToHex()));
    }
  }
  return absl::OkStatus();
}

}  // namespace

BlockStore::BlockStore(const BlockStoreOptions& options, std::unique_ptr<SsdTier> ssd)
    : options_(options),
      ssd_(std::move(ssd)),
      dram_(DramTierOptions{options.dram_arena, options.dram_bytes, options.dram_page_bytes}) {}

absl::StatusOr<std::unique_ptr<BlockStore>> BlockStore::Open(const BlockStoreOptions& options) {
  if (options.dram_arena == nullptr) return absl::InvalidArgumentError("no DRAM arena");
  if (options.dram_page_bytes <= 0 || options.dram_bytes < options.dram_page_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("dram_bytes (", options.dram_bytes,
                                                   ") must hold at least one page of ",
                                                   options.dram_page_bytes, " bytes"));
  }
  if (options.max_lease <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("max_lease must be > 0");
  }
  SsdTierOptions ssd;
  ssd.dir = options.ssd_dir;
  ssd.capacity_bytes = options.ssd_bytes;
  ssd.ttl = options.ttl;
  ssd.sync_writes = options.ssd_sync_writes;
  ssd.clock = options.clock;
  absl::StatusOr<std::unique_ptr<SsdTier>> tier = SsdTier::Open(ssd);
  if (!tier.ok()) return tier.status();
  return std::unique_ptr<BlockStore>(new BlockStore(options, std::move(*tier)));
}

absl::Duration BlockStore::ClampLease(absl::Duration d) const {
  if (d <= absl::ZeroDuration() || d > options_.max_lease) return options_.max_lease;
  return d;
}

DramTier::EvictFn BlockStore::EvictToSsd() {
  return [this](SlotId id, const DramTier::Slot& s) {
    if (s.on_ssd && ssd_->Contains(s.key)) {
      ssd_->Touch(s.key);  // the SSD copy inherits the DRAM copy's recency
      return;
    }
    // Not written through (an earlier SSD write failed) or the SSD copy is gone (evicted for
    // capacity): write it now. The stored checksum is the client's, so a DRAM bit flip since
    // then is caught when the file is read.
    const absl::Status st =
        ssd_->Write(s.key, absl::MakeConstSpan(dram_.data(id), dram_.block_bytes(id)), s.checksum);
    (void)st;  // on failure the block is simply gone: a future miss, never wrong data
  };
}

absl::Status BlockStore::CheckLayoutLocked(uint64_t layout_id, int64_t block_bytes) {
  auto it = layout_block_bytes_.find(layout_id);
  if (it != layout_block_bytes_.end() && it->second != block_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("layout ", layout_id, " has blocks of ",
                                                   it->second, " bytes, not ", block_bytes));
  }
  return absl::OkStatus();
}

void BlockStore::EndLeaseLocked(Lease& lease) {
  if (lease.is_put) {
    for (size_t i = 0; i < lease.keys.size(); ++i) {
      if (lease.outcomes[i] == PutOutcome::kStored) dram_.Unpin(lease.slots[i]);
    }
  } else {
    for (SlotId id : lease.slots) dram_.Unpin(id);
  }
}

void BlockStore::ReapLeasesLocked(absl::Time now) {
  for (auto it = leases_.begin(); it != leases_.end();) {
    if (it->second.expiry <= now) {
      EndLeaseLocked(it->second);
      it = leases_.erase(it);
    } else {
      ++it;
    }
  }
}

std::vector<Tier> BlockStore::Exists(absl::Span<const BlockKey> keys) {
  std::vector<Tier> out(keys.size(), Tier::kNone);
  absl::MutexLock lock(&mu_);
  const absl::Time now = options_.clock();
  for (size_t i = 0; i < keys.size(); ++i) {
    if (std::optional<SlotId> id = dram_.Find(keys[i]);
        id && now - dram_.slot(*id).last_access <= options_.ttl) {
      out[i] = Tier::kDram;
    } else if (ssd_->Contains(keys[i])) {
      out[i] = Tier::kSsd;
    }
  }
  return out;
}

absl::StatusOr<PutGrant> BlockStore::BeginPut(absl::Span<const BlockKey> keys,
                                              int64_t block_bytes, absl::Duration lease) {
  if (block_bytes <= 0 || block_bytes > options_.dram_page_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("block_bytes ", block_bytes, " not in [1, ",
                                                   options_.dram_page_bytes, "]"));
  }
  if (absl::Status s = CheckDistinct(keys); !s.ok()) return s;
  PutGrant grant;
  grant.outcomes.assign(keys.size(), PutOutcome::kNoSpace);
  grant.slots.assign(keys.size(), SlotId{});
  std::vector<BlockKey> touch_on_ssd;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = options_.clock();
    ReapLeasesLocked(now);
    for (const BlockKey& k : keys) {
      if (absl::Status s = CheckLayoutLocked(k.layout_id, block_bytes); !s.ok()) return s;
    }
    for (const BlockKey& k : keys) layout_block_bytes_[k.layout_id] = block_bytes;
    const DramTier::EvictFn evict = EvictToSsd();
    bool any = false;
    for (size_t i = 0; i < keys.size(); ++i) {
      if (std::optional<SlotId> id = dram_.Find(keys[i])) {
        dram_.Touch(*id, now);
        grant.outcomes[i] = PutOutcome::kPresent;
      } else if (ssd_->Contains(keys[i])) {
        touch_on_ssd.push_back(keys[i]);
        grant.outcomes[i] = PutOutcome::kPresent;
      } else if (std::optional<SlotId> slot = dram_.Allocate(keys[i], block_bytes, evict)) {
        grant.outcomes[i] = PutOutcome::kStored;
        grant.slots[i] = *slot;
        any = true;
      }
    }
    if (any) {
      grant.lease_id = next_lease_id_++;
      grant.expiry = now + ClampLease(lease);
      Lease& l = leases_[grant.lease_id];
      l.is_put = true;
      l.expiry = grant.expiry;
      l.keys.assign(keys.begin(), keys.end());
      l.outcomes = grant.outcomes;
      l.slots = grant.slots;
    }
  }
  for (const BlockKey& k : touch_on_ssd) ssd_->Touch(k);
  return grant;
}

absl::StatusOr<std::vector<PutOutcome>> BlockStore::CommitPut(
    uint64_t lease_id, absl::Span<const uint64_t> checksums) {
  Lease lease;
  {
    absl::MutexLock lock(&mu_);
    ReapLeasesLocked(options_.clock());
    auto it = leases_.find(lease_id);
    if (it == leases_.end() || !it->second.is_put) {
      return absl::NotFoundError(absl::StrCat("no put lease ", lease_id, " (expired?)"));
    }
    if (checksums.size() != it->second.keys.size()) {
      return absl::InvalidArgumentError(absl::StrCat("commit has ", checksums.size(),
                                                     " checksums for ",
                                                     it->second.keys.size(), " keys"));
    }
    lease = std::move(it->second);
    leases_.erase(it);  // its pins now travel with `lease` until the end of this call
  }
  std::vector<PutOutcome>& out = lease.outcomes;
  // Verify outside the lock: the slots are pinned kWriting, so nobody else touches them.
  std::vector<bool> intact(out.size(), false);
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] != PutOutcome::kStored) continue;
    const SlotId id = lease.slots[i];
    intact[i] = BlockChecksum(slot_data(id), page(id.page).block_bytes) == checksums[i];
  }
  std::vector<size_t> published;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = options_.clock();
    for (size_t i = 0; i < out.size(); ++i) {
      if (out[i] != PutOutcome::kStored) continue;
      const SlotId id = lease.slots[i];
      if (!intact[i]) {
        out[i] = PutOutcome::kChecksumMismatch;
        counters_.put_checksum_mismatches++;
        dram_.Unpin(id);  // kWriting: freed
      } else if (!dram_.Publish(id, checksums[i], /*on_ssd=*/false, now)) {
        out[i] = PutOutcome::kPresent;  // a concurrent put won
        dram_.Unpin(id);
      } else {
        published.push_back(i);  // stays pinned through its SSD write
      }
    }
  }
  // Write through before acknowledging: an acknowledged block survives a crash of the store.
  std::vector<bool> on_ssd(out.size(), false);
  for (size_t i : published) {
    const SlotId id = lease.slots[i];
    on_ssd[i] = ssd_->Write(lease.keys[i],
                            absl::MakeConstSpan(slot_data(id), page(id.page).block_bytes),
                            checksums[i])
                    .ok();
  }
  absl::MutexLock lock(&mu_);
  for (size_t i : published) {
    const SlotId id = lease.slots[i];
    dram_.slot(id).on_ssd = on_ssd[i];
    if (!on_ssd[i]) out[i] = PutOutcome::kSsdFailed;
    counters_.blocks_stored++;
    dram_.Unpin(id);
  }
  return out;
}

absl::StatusOr<GetGrant> BlockStore::BeginGet(absl::Span<const BlockKey> keys,
                                              absl::Duration lease) {
  if (absl::Status s = CheckDistinct(keys); !s.ok()) return s;
  GetGrant grant;
  grant.blocks.assign(keys.size(), std::nullopt);
  grant.busy.assign(keys.size(), false);
  enum class Source { kMiss, kDram, kSsd, kBusy };
  std::vector<Source> source(keys.size(), Source::kMiss);
  std::vector<SlotId> slots(keys.size());
  std::vector<uint64_t> checksums(keys.size(), 0);
  std::vector<int64_t> sizes(keys.size(), 0);
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = options_.clock();
    ReapLeasesLocked(now);
    const DramTier::EvictFn evict = EvictToSsd();
    for (size_t i = 0; i < keys.size(); ++i) {
      if (std::optional<SlotId> id = dram_.Find(keys[i])) {
        const DramTier::Slot& s = dram_.slot(*id);
        if (now - s.last_access > options_.ttl && s.pins == 0) {
          dram_.Drop(*id);
          counters_.expired++;
        } else {
          dram_.Pin(*id);
          dram_.Touch(*id, now);
          source[i] = Source::kDram;
          slots[i] = *id;
          checksums[i] = s.checksum;
          sizes[i] = dram_.block_bytes(*id);
          continue;
        }
      }
      std::optional<int64_t> bytes = ssd_->PayloadBytes(keys[i]);
      if (!bytes || *bytes > options_.dram_page_bytes) continue;
      if (std::optional<SlotId> id = dram_.Allocate(keys[i], *bytes, evict)) {
        source[i] = Source::kSsd;
        slots[i] = *id;
        sizes[i] = *bytes;
      } else {
        source[i] = Source::kBusy;
      }
    }
  }
  // Checksums and SSD reads outside the lock, on pinned slots.
  std::vector<bool> ok(keys.size(), false);
  for (size_t i = 0; i < keys.size(); ++i) {
    if (source[i] == Source::kMiss || source[i] == Source::kBusy) continue;
    const absl::Span<uint8_t> bytes(slot_data(slots[i]), static_cast<size_t>(sizes[i]));
    if (source[i] == Source::kDram) {
      ok[i] = BlockChecksum(bytes) == checksums[i];
    } else if (source[i] == Source::kSsd) {
      absl::StatusOr<bool> hit = ssd_->Read(keys[i], bytes, &checksums[i]);
      ok[i] = hit.ok() && *hit;
    }
  }
  // A DRAM hit is a use of the block: keep its SSD copy's recency (and TTL) in step, so a block
  // hot in DRAM does not expire on SSD and vanish at its next eviction or a restart.
  for (size_t i = 0; i < keys.size(); ++i) {
    if (source[i] == Source::kDram && ok[i]) ssd_->Touch(keys[i]);
  }
  absl::MutexLock lock(&mu_);
  const absl::Time now = options_.clock();
  std::vector<SlotId> pinned;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (source[i] == Source::kMiss) {
      counters_.misses++;
      continue;
    }
    if (source[i] == Source::kBusy) {
      grant.busy[i] = true;
      continue;
    }
    SlotId id = slots[i];
    if (!ok[i]) {
      if (source[i] == Source::kDram) {
        counters_.corrupt_blocks++;
        dram_.Drop(id);  // freed at the Unpin below (or a concurrent reader's)
      }
      dram_.Unpin(id);
      counters_.misses++;
      continue;
    }
    if (source[i] == Source::kSsd && !dram_.Publish(id, checksums[i], /*on_ssd=*/true, now)) {
      // Promoted concurrently by another reader: use that copy.
      dram_.Unpin(id);
      std::optional<SlotId> other = dram_.Find(keys[i]);
      if (!other) {
        counters_.misses++;
        continue;
      }
      id = *other;
      dram_.Pin(id);
      checksums[i] = dram_.slot(id).checksum;
    }
    (source[i] == Source::kDram ? counters_.hits_dram : counters_.hits_ssd)++;
    grant.blocks[i] = SlotRef{id, checksums[i]};
    pinned.push_back(id);
  }
  if (!pinned.empty()) {
    grant.lease_id = next_lease_id_++;
    grant.expiry = now + ClampLease(lease);
    Lease& l = leases_[grant.lease_id];
    l.expiry = grant.expiry;
    l.slots = std::move(pinned);
  }
  return grant;
}

absl::Status BlockStore::Release(uint64_t lease_id) {
  absl::MutexLock lock(&mu_);
  auto it = leases_.find(lease_id);
  if (it == leases_.end()) {
    return absl::NotFoundError(absl::StrCat("no lease ", lease_id, " (expired?)"));
  }
  EndLeaseLocked(it->second);
  leases_.erase(it);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<PutOutcome>> BlockStore::Put(
    absl::Span<const BlockKey> keys, absl::Span<const std::string_view> payloads) {
  if (keys.size() != payloads.size()) {
    return absl::InvalidArgumentError("keys and payloads differ in number");
  }
  if (keys.empty()) return std::vector<PutOutcome>{};
  const int64_t block_bytes = static_cast<int64_t>(payloads[0].size());
  for (std::string_view p : payloads) {
    if (static_cast<int64_t>(p.size()) != block_bytes) {
      return absl::InvalidArgumentError("payloads of one put must have the same size");
    }
  }
  absl::StatusOr<PutGrant> grant = BeginPut(keys, block_bytes, options_.max_lease);
  if (!grant.ok()) return grant.status();
  if (grant->lease_id == 0) return grant->outcomes;
  std::vector<uint64_t> checksums(keys.size(), 0);
  for (size_t i = 0; i < keys.size(); ++i) {
    if (grant->outcomes[i] != PutOutcome::kStored) continue;
    std::memcpy(slot_data(grant->slots[i]), payloads[i].data(), payloads[i].size());
    checksums[i] = BlockChecksum(payloads[i].data(), payloads[i].size());
  }
  return CommitPut(grant->lease_id, checksums);
}

absl::StatusOr<std::vector<std::optional<std::string>>> BlockStore::Get(
    absl::Span<const BlockKey> keys) {
  std::vector<std::optional<std::string>> out(keys.size());
  // Rounds: keys that found no free DRAM slot to be promoted into (busy) go again after this
  // round's lease is released, while that helps.
  std::vector<size_t> pending(keys.size());
  for (size_t i = 0; i < pending.size(); ++i) pending[i] = i;
  while (!pending.empty()) {
    std::vector<BlockKey> round;
    for (size_t i : pending) round.push_back(keys[i]);
    absl::StatusOr<GetGrant> grant = BeginGet(round, options_.max_lease);
    if (!grant.ok()) return grant.status();
    std::vector<size_t> busy;
    for (size_t j = 0; j < round.size(); ++j) {
      if (grant->busy[j]) busy.push_back(pending[j]);
      if (!grant->blocks[j]) continue;
      const SlotId id = grant->blocks[j]->slot;
      out[pending[j]].emplace(reinterpret_cast<const char*>(slot_data(id)),
                              static_cast<size_t>(page(id.page).block_bytes));
    }
    if (grant->lease_id != 0) (void)Release(grant->lease_id);
    if (busy.size() == pending.size()) break;  // no progress: leave them as misses
    pending = std::move(busy);
  }
  return out;
}

void BlockStore::ExpireOld() {
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = options_.clock();
    ReapLeasesLocked(now);
    // Expired DRAM blocks are not written down: their SSD copy is at least as old.
    counters_.expired += dram_.ExpireOlderThan(now - options_.ttl, nullptr);
  }
  ssd_->ExpireOld();
}

BlockStoreStats BlockStore::stats() const {
  const SsdTierStats ssd = ssd_->stats();
  absl::MutexLock lock(&mu_);
  BlockStoreStats s = counters_;
  s.dram_blocks = dram_.num_blocks();
  s.dram_bytes = dram_.num_bytes();
  s.dram_capacity_bytes = static_cast<int64_t>(dram_.num_pages()) * options_.dram_page_bytes;
  s.evictions_dram = dram_.num_evicted();
  s.ssd_blocks = ssd.num_blocks;
  s.ssd_bytes = ssd.num_bytes;
  s.ssd_capacity_bytes = options_.ssd_bytes;
  s.evictions_ssd = ssd.num_evicted;
  s.expired += ssd.num_expired;
  s.corrupt_blocks += ssd.num_corrupt;
  s.active_leases = static_cast<int64_t>(leases_.size());
  return s;
}

DramTier::Page BlockStore::page(int32_t p) const {
  absl::MutexLock lock(&mu_);
  return dram_.page(p);
}

uint8_t* BlockStore::slot_data(SlotId id) const {
  absl::MutexLock lock(&mu_);
  return dram_.data(id);
}

}  // namespace sluice::kvstore
