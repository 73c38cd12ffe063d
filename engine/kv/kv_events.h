// KV events: the replayable stream of prefix-cache changes an engine publishes for KV-aware
// routing (docs/design.md, "KV events are a replayable stream").
//
// The engine appends `stored(block hashes, parent hash)`, `removed(block hashes)` and
// `all_cleared` events, numbered 1, 2, 3, ... within one log, to a bounded buffer. A reader
// polls ReadKvEvents(after_seq) with the last sequence number it applied; when the events it
// needs were already dropped from the buffer (or the log restarted: different log_id) it gets
// fell_behind = true and must resync from Snapshot(), whose `seq` says which events the snapshot
// already includes.
#ifndef SLUICE_ENGINE_KV_KV_EVENTS_H_
#define SLUICE_ENGINE_KV_KV_EVENTS_H_

#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "engine/kv/block_hash.h"

namespace sluice {

enum class KvEventType { kStored, kRemoved, kAllCleared };

// KvEvent: one change to the set of cached block hashes.
struct KvEvent {
  uint64_t seq = 0;  // 1, 2, 3, ... within a log
  KvEventType type = KvEventType::kStored;
  // kStored: consecutive blocks of one sequence, in chain order. kRemoved: any order.
  // kAllCleared: empty (every hash of this log is gone).
  std::vector<BlockHash> block_hashes;
  // kStored: the hash of the block before block_hashes[0]; nullopt when block_hashes[0] is a
  // sequence's first block (its parent is the salt's root hash, not a block).
  std::optional<BlockHash> parent_hash;
};

// KvEventBatch: the answer to a read.
struct KvEventBatch {
  uint64_t log_id = 0;
  std::vector<KvEvent> events;  // ascending seq, contiguous, starting at after_seq + 1
  bool fell_behind = false;     // events after after_seq are gone: resync from a snapshot
  uint64_t last_seq = 0;        // the newest seq in the log (0: none yet)
};

// KvCacheSnapshot: every block hash cached now, consistent with the events up to `seq`.
struct KvSnapshot {
  uint64_t log_id = 0;
  uint64_t seq = 0;
  std::vector<BlockHash> block_hashes;  // unordered
};

// KvEventLog: the bounded event buffer plus the current hash set (for snapshots). Appends come
// from the engine thread; reads from any thread. Thread-safe.
class KvEventLog {
 public:
  // `capacity` >= 1: events kept for readers; older ones are dropped. The log id is random, so a
  // restarted engine's log is told apart from its predecessor's.
  explicit KvEventLog(size_t capacity);

  uint64_t log_id() const { return log_id_; }

  // Stored: `hashes` (non-empty, chain order) were added to the cache under `parent`.
  void Stored(std::optional<BlockHash> parent, std::vector<BlockHash> hashes);
  // Removed: `hashes` (non-empty) were evicted or unregistered.
  void Removed(std::vector<BlockHash> hashes);
  // AllCleared: every cached hash is gone.
  void AllCleared();

  // Read returns up to `max_events` events with seq > after_seq. fell_behind is true when
  // after_seq + 1 was already dropped from the buffer, or after_seq is newer than the log's last
  // event (a reader of a different, restarted log); events is empty then.
  KvEventBatch Read(uint64_t after_seq, size_t max_events = 1024) const;
  KvSnapshot Snapshot() const;

 private:
  void Append(KvEvent event) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const size_t capacity_;
  const uint64_t log_id_;
  mutable std::mutex mu_;
  std::deque<KvEvent> events_ ABSL_GUARDED_BY(mu_);  // seqs (last_seq_ - size, last_seq_]
  uint64_t last_seq_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_set<BlockHash> cached_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sluice

#endif  // SLUICE_ENGINE_KV_KV_EVENTS_H_
