// SsdTier: the kvstore's persistent tier: one file per block under a directory, with an
// in-memory index rebuilt from the files' headers when the store opens.
//
// File `<dir>/blocks/<xx>/<key hex>.blk` = a 64-byte header (magic, key, payload size, creation
// time, XXH3-64 of the payload, XXH3-64 of the header itself) followed by the payload. Files are
// written to `<dir>/tmp/` and renamed into place, so a reader (or a restart after kill -9) sees a
// whole old file or a whole new one, never a torn one; a file torn by power loss or bit rot fails
// its checksum, is deleted and reads as a miss. Why files and not RocksDB: services/kvstore/README.md.
//
// Retention: an entry expires `ttl` after its last access (write, read hit, or its DRAM copy being
// evicted, see Touch); the file's mtime stores the last access, so recency survives a restart.
// Capacity: total file bytes stay <= capacity_bytes by deleting least recently used files.
//
// Thread safety: all methods may be called concurrently. File I/O for Read and Write runs outside
// the index lock; deletes happen under it (an open reader keeps an unlinked file readable).
#ifndef SLUICE_SERVICES_KVSTORE_SSD_TIER_H_
#define SLUICE_SERVICES_KVSTORE_SSD_TIER_H_

#include <atomic>
#include <cstdint>
#include <list>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "services/kvstore/block_key.h"

namespace sluice::kvstore {

struct SsdTierOptions {
  std::string dir;              // created if missing
  int64_t capacity_bytes = 0;   // > 0; counts whole files (header + payload)
  absl::Duration ttl = absl::Hours(72);
  // fdatasync each file before its rename: survives power loss, not only process death.
  bool sync_writes = false;
  Clock clock = SystemClock();
};

// SsdTierStats: a snapshot; counters are cumulative since Open.
struct SsdTierStats {
  int64_t num_blocks = 0;
  int64_t num_bytes = 0;          // file bytes (header + payload)
  int64_t num_evicted = 0;        // deleted for capacity
  int64_t num_expired = 0;        // deleted by TTL
  int64_t num_corrupt = 0;        // failed a checksum/header check (deleted)
  int64_t num_write_errors = 0;
};

class SsdTier {
 public:
  static constexpr int64_t kHeaderBytes = 64;

  // Open: creates the directories, removes leftover temporary files, and indexes every block file
  // (header checked; files with a bad header or size are deleted, expired ones too), then evicts
  // down to capacity. Errors: InvalidArgument (empty dir, capacity <= 0), Internal (I/O).
  static absl::StatusOr<std::unique_ptr<SsdTier>> Open(const SsdTierOptions& options);

  // Write: stores `payload` (its XXH3-64 `checksum` already computed by the caller) under `key`,
  // replacing any previous file, then evicts least recently used files to capacity.
  // Errors: ResourceExhausted (file larger than the capacity), Internal (I/O; nothing is indexed).
  absl::Status Write(const BlockKey& key, absl::Span<const uint8_t> payload, uint64_t checksum);

  // Read: copies the payload of `key` into `out` and sets `*checksum`. Returns true on a hit,
  // false on a miss: absent, expired (deleted), or corrupt (deleted, counted): never wrong bytes.
  // Errors: InvalidArgument if `out.size()` differs from the stored payload size.
  absl::StatusOr<bool> Read(const BlockKey& key, absl::Span<uint8_t> out, uint64_t* checksum);

  // PayloadBytes: the stored payload size of a live entry (expired entries are deleted), or
  // nullopt.
  std::optional<int64_t> PayloadBytes(const BlockKey& key);
  bool Contains(const BlockKey& key) { return PayloadBytes(key).has_value(); }

  // Touch: marks `key` used now (index and file mtime); no-op if absent.
  void Touch(const BlockKey& key);
  // Erase: deletes `key`'s file if present.
  void Erase(const BlockKey& key);
  // ExpireOld: deletes every entry whose last access is older than the TTL; returns how many.
  int64_t ExpireOld();

  SsdTierStats stats() const;
  // PathOf: the block file of `key` (whether or not it exists); for tools and tests.
  std::string PathOf(const BlockKey& key) const;

 private:
  struct Entry {
    int64_t file_bytes = 0;
    int64_t payload_bytes = 0;
    absl::Time last_access;
    std::list<BlockKey>::iterator lru;  // position in lru_ (front = most recent)
  };

  explicit SsdTier(const SsdTierOptions& options);
  absl::Status Scan();
  void InsertLocked(const BlockKey& key, int64_t payload_bytes, absl::Time last_access)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EraseLocked(const BlockKey& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Deletes least recently used entries other than `keep` until bytes <= capacity.
  void EvictToCapacityLocked(const BlockKey* keep) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool ExpiredLocked(const Entry& e, absl::Time now) const;
  // A corrupt or unreadable file: delete it and count it.
  void DropCorrupt(const BlockKey& key);

  const SsdTierOptions options_;
  std::atomic<uint64_t> next_tmp_{0};
  mutable absl::Mutex mu_;
  absl::flat_hash_map<BlockKey, Entry> index_ ABSL_GUARDED_BY(mu_);
  std::list<BlockKey> lru_ ABSL_GUARDED_BY(mu_);
  SsdTierStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sluice::kvstore

#endif  // SLUICE_SERVICES_KVSTORE_SSD_TIER_H_
