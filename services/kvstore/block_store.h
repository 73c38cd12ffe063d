// BlockStore: the kvstore's storage engine: a DRAM tier (DramTier) over an SSD tier (SsdTier),
// with leases for slots that clients read or write over UCX, TTL and capacity retention, and
// checksums verified on every read.
//
// Put (two phases, so a client can push bytes by RMA between them):
//   BeginPut allocates a DRAM slot per new key (kWriting, pinned by the lease);
//   the bytes land in the slots (a client's UCX push, or a memcpy for inline puts);
//   CommitPut verifies each slot against the checksum the client computed over its source bytes
//   (end to end: a torn or misdirected write is refused, never stored), publishes the slots and
//   writes them through to the SSD tier before it returns, so an acknowledged block survives a
//   kill -9 of the store.
// Get:
//   BeginGet pins the DRAM slot of each key found, after verifying its checksum, promoting blocks
//   found only on SSD into DRAM first (the SSD read verifies its checksum too); the lease keeps
//   the slots from being evicted or reused until Release or its expiry.
// A block that fails a checksum anywhere is deleted from that tier and reads as a miss.
//
// Retention: a block expires `ttl` after its last access (Exists does not count as an access);
// capacity evicts least recently used blocks per tier; a block evicted from DRAM that is not on
// SSD yet is written there first.
//
// Thread safety: every method may be called concurrently. One mutex guards the DRAM tier and the
// leases; SSD file I/O and checksum passes run outside it on pinned slots.
#ifndef SLUICE_SERVICES_KVSTORE_BLOCK_STORE_H_
#define SLUICE_SERVICES_KVSTORE_BLOCK_STORE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "services/kvstore/block_key.h"
#include "services/kvstore/dram_tier.h"
#include "services/kvstore/ssd_tier.h"

namespace sluice::kvstore {

struct BlockStoreOptions {
  uint8_t* dram_arena = nullptr;  // not owned; e.g. UCX-allocated, registered memory
  int64_t dram_bytes = 0;
  int64_t dram_page_bytes = 64ll << 20;  // also the largest accepted block
  std::string ssd_dir;
  int64_t ssd_bytes = 0;
  bool ssd_sync_writes = false;
  absl::Duration ttl = absl::Hours(72);
  absl::Duration max_lease = absl::Minutes(5);  // longer lease requests are clamped
  Clock clock = SystemClock();
};

enum class Tier { kNone = 0, kDram = 1, kSsd = 2 };

// PutOutcome: what happened to one key of a put.
enum class PutOutcome {
  kStored = 0,            // stored now (DRAM + SSD)
  kPresent = 1,           // was already stored; nothing to send
  kNoSpace = 2,           // no DRAM slot could be had (all pinned)
  kChecksumMismatch = 3,  // the bytes that arrived do not match the client's checksum
  kSsdFailed = 4,         // stored in DRAM only (SSD write failed; retried at eviction)
};

// SlotRef: where a leased block lives in the DRAM arena.
struct SlotRef {
  SlotId slot;
  uint64_t checksum = 0;  // XXH3-64 of the block's bytes
};

struct PutGrant {
  uint64_t lease_id = 0;       // 0 if no slot was allocated (nothing to commit)
  absl::Time expiry;
  std::vector<PutOutcome> outcomes;   // per key: kStored (= slot granted), kPresent or kNoSpace
  std::vector<SlotId> slots;          // per key; valid where outcomes[i] == kStored
};

struct GetGrant {
  uint64_t lease_id = 0;  // 0 if nothing was found
  absl::Time expiry;
  std::vector<std::optional<SlotRef>> blocks;  // per key; nullopt = miss or busy
  // Per key: on SSD but no DRAM slot was free to promote it into (all leased, e.g. by this very
  // grant): not a miss; ask again after releasing this lease.
  std::vector<bool> busy;
};

struct BlockStoreStats {
  int64_t dram_blocks = 0, dram_bytes = 0, dram_capacity_bytes = 0;
  int64_t ssd_blocks = 0, ssd_bytes = 0, ssd_capacity_bytes = 0;
  int64_t hits_dram = 0, hits_ssd = 0, misses = 0;
  int64_t evictions_dram = 0, evictions_ssd = 0;
  int64_t expired = 0;
  int64_t corrupt_blocks = 0;  // failed a checksum on a read (DRAM or SSD) and were deleted
  int64_t blocks_stored = 0, put_checksum_mismatches = 0;
  int64_t active_leases = 0;
};

class BlockStore {
 public:
  // Open: opens the SSD tier (re-indexing what a previous run left) and cuts the arena into
  // pages. Errors: InvalidArgument (no arena, dram_bytes < page size, bad SSD options),
  // Internal (SSD I/O).
  static absl::StatusOr<std::unique_ptr<BlockStore>> Open(const BlockStoreOptions& options);

  // Exists: per key, the fastest tier holding it (kNone if absent or expired).
  std::vector<Tier> Exists(absl::Span<const BlockKey> keys);

  // BeginPut: grants DRAM slots for the keys not stored yet. `block_bytes` is every block's size
  // (1..dram_page_bytes); a layout's size is fixed by its first block. `lease` is clamped to
  // (0, max_lease]. Errors: InvalidArgument (bad block_bytes, a layout stored with another size,
  // duplicate keys).
  absl::StatusOr<PutGrant> BeginPut(absl::Span<const BlockKey> keys, int64_t block_bytes,
                                    absl::Duration lease);
  // CommitPut: `checksums[i]` is the client's XXH3-64 of key i's bytes (ignored where the grant
  // was not kStored). Returns the final outcome per key of the grant and ends the lease.
  // Errors: NotFound (unknown or expired lease), InvalidArgument (wrong number of checksums).
  absl::StatusOr<std::vector<PutOutcome>> CommitPut(uint64_t lease_id,
                                                    absl::Span<const uint64_t> checksums);

  // BeginGet: leases the blocks found (see the file comment). Never an error for a miss.
  // Errors: InvalidArgument (duplicate keys).
  absl::StatusOr<GetGrant> BeginGet(absl::Span<const BlockKey> keys, absl::Duration lease);
  // Release: ends a lease early (its slots become evictable). Errors: NotFound (unknown/expired).
  absl::Status Release(uint64_t lease_id);

  // Put / Get: one-call copies for the gRPC fallback path and tests (payloads[i] is key i's bytes,
  // all of block_bytes). Get returns nullopt per miss.
  absl::StatusOr<std::vector<PutOutcome>> Put(absl::Span<const BlockKey> keys,
                                              absl::Span<const std::string_view> payloads);
  absl::StatusOr<std::vector<std::optional<std::string>>> Get(absl::Span<const BlockKey> keys);

  // ExpireOld: drops every block past its TTL from both tiers and ends expired leases.
  void ExpireOld();

  BlockStoreStats stats() const;
  // page: the geometry of a DRAM page (for building UCX descriptors of granted slots).
  DramTier::Page page(int32_t p) const;
  uint8_t* slot_data(SlotId id) const;
  SsdTier& ssd() { return *ssd_; }

 private:
  struct Lease {
    bool is_put = false;
    absl::Time expiry;
    std::vector<BlockKey> keys;
    std::vector<PutOutcome> outcomes;  // put leases
    std::vector<SlotId> slots;         // put: per key (valid where kStored); get: the pinned slots
  };

  BlockStore(const BlockStoreOptions& options, std::unique_ptr<SsdTier> ssd);
  absl::Duration ClampLease(absl::Duration d) const;
  // Ends leases past their expiry (frees unwritten put slots, unpins get slots).
  void ReapLeasesLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EndLeaseLocked(Lease& lease) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  DramTier::EvictFn EvictToSsd() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckLayoutLocked(uint64_t layout_id, int64_t block_bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const BlockStoreOptions options_;
  std::unique_ptr<SsdTier> ssd_;
  mutable absl::Mutex mu_;
  DramTier dram_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, int64_t> layout_block_bytes_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, Lease> leases_ ABSL_GUARDED_BY(mu_);
  uint64_t next_lease_id_ ABSL_GUARDED_BY(mu_) = 1;
  BlockStoreStats counters_ ABSL_GUARDED_BY(mu_);  // the cumulative counters only
};

}  // namespace sluice::kvstore

#endif  // SLUICE_SERVICES_KVSTORE_BLOCK_STORE_H_
