// KvIndex: the router's view of which worker's prefix cache holds which KV blocks
// (docs/design.md, "KV events are a replayable stream" and "Route on overlap and live load
// together").
//
// Workers publish their engine's KV event log (engine/kv/kv_events.h: stored / removed /
// all_cleared, numbered 1, 2, 3, ... per log); the router applies each worker's events in
// sequence-number order. A gap (a batch that does not start at last_seq + 1, a reader that fell
// behind the worker's bounded buffer, or a restarted log with a new log_id) marks the worker for
// resync: its entries stay as an approximation until ApplySnapshot replaces them wholesale.
//
// Structure: a flat map block hash -> {worker slot -> state}. No prefix tree is needed because
// block hashes are chained (engine/kv/block_hash.h): a block's hash already covers every token
// before it, so "worker W holds the first k blocks of this prompt" is "W holds hashes h_0..h_{k-1}"
// and the longest match is a walk over the prompt's hashes that stops at the first miss, exactly
// as the engine's own prefix lookup stops. A stored event's parent hash is therefore not needed to
// answer matches and is not kept.
//
// Routing decisions are recorded at once (RecordRouting) as provisional entries, so a burst of
// requests sharing a prefix sees the first one's choice before the worker's stored event arrives.
// A provisional entry becomes confirmed when a stored event names it and expires
// `provisional_ttl` after it was recorded otherwise (the request failed, or the engine evicted
// the block before we read the event).
#ifndef SLUICE_SERVICES_ROUTER_KV_INDEX_H_
#define SLUICE_SERVICES_ROUTER_KV_INDEX_H_

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "engine/kv/block_hash.h"
#include "engine/kv/kv_events.h"

namespace sluice {

struct KvIndexOptions {
  // How long a routing decision stands in for the worker's stored event. Events normally arrive
  // within one poll interval (~100 ms); 10 s also covers a long prefill queue.
  absl::Duration provisional_ttl = absl::Seconds(10);
};

// KvIndexWorkerState: one worker's event-stream position, for the poller and /metrics.
struct KvIndexWorkerState {
  uint64_t log_id = 0;     // 0: no snapshot applied yet
  uint64_t last_seq = 0;   // the newest event applied (pass as after_seq)
  bool needs_resync = true;
  int64_t num_confirmed_blocks = 0;
  int64_t num_provisional_blocks = 0;  // recorded, not confirmed, maybe expired (not pruned yet)
  int64_t num_resyncs = 0;             // snapshots applied
};

// KvIndex is thread-safe. Time comes from `clock` so tests drive expiry deterministically.
class KvIndex {
 public:
  using Clock = std::function<absl::Time()>;
  explicit KvIndex(KvIndexOptions options = {}, Clock clock = &absl::Now);

  // ApplyEvents applies `batch` (a ReadKvEvents answer) to `worker_id`'s entries. Returns true
  // when every event was applied (or was an already-applied duplicate), false when the worker
  // needs a snapshot: it was already marked, batch.fell_behind, batch.log_id differs from the
  // log the worker's entries came from, or the first new event is not last_seq + 1. An unknown
  // worker is added, marked for resync.
  bool ApplyEvents(const std::string& worker_id, const KvEventBatch& batch);
  // ApplySnapshot replaces `worker_id`'s confirmed entries with `snapshot` (events up to
  // snapshot.seq of log snapshot.log_id) and clears the resync mark. Provisional entries stay
  // unless the snapshot confirms them.
  void ApplySnapshot(const std::string& worker_id, const KvSnapshot& snapshot);
  // MarkForResync: the caller saw a gap the index cannot see (e.g. the worker restarted).
  void MarkForResync(const std::string& worker_id);

  // RecordRouting records that the prompt whose full-block hashes are `hashes` (chain order) was
  // sent to `worker_id`: hashes the worker does not hold confirmed become provisional until
  // now + provisional_ttl (a later record extends it).
  void RecordRouting(const std::string& worker_id, absl::Span<const BlockHash> hashes);

  // RemoveWorker drops every entry of `worker_id` (it left the registry) and frees its slot for
  // the next new worker: a router whose workers restart under new ids keeps one slot per live
  // worker, not one per id ever seen. No-op when unknown.
  void RemoveWorker(const std::string& worker_id);

  // MatchPrefix returns, for every worker holding at least the first block, the number of
  // leading blocks of `hashes` (chain order) it holds, confirmed or unexpired provisional.
  // Workers with no match are absent.
  std::map<std::string, int64_t> MatchPrefix(absl::Span<const BlockHash> hashes) const;

  // PruneExpired drops provisional entries past their expiry; returns how many. Matches ignore
  // expired entries anyway; pruning only bounds memory (RecordRouting calls it every
  // `kPruneEvery` records).
  int64_t PruneExpired();

  // State of `worker_id`; a default state (needs_resync) when unknown.
  KvIndexWorkerState WorkerState(const std::string& worker_id) const;
  std::vector<std::string> Workers() const;  // sorted
  // Number of distinct block hashes with at least one entry.
  int64_t NumHashes() const;
  // Worker slots allocated, in use or free (bounded by the most workers known at once).
  int64_t NumSlots() const;

 private:
  static constexpr int64_t kPruneEvery = 256;
  // Per-hash, per-worker state. expiry is absl::InfiniteFuture() when confirmed.
  struct Holder {
    int32_t slot;
    bool confirmed;
    absl::Time expiry;
  };
  struct Worker {
    std::string id;
    KvIndexWorkerState state;
    absl::flat_hash_set<BlockHash> confirmed;
    absl::flat_hash_set<BlockHash> provisional;
  };

  int32_t SlotFor(const std::string& worker_id);  // creates; requires mu_
  // Entry edits by worker slot; require mu_.
  void Confirm(int32_t slot, const BlockHash& hash);
  void Drop(int32_t slot, const BlockHash& hash);
  void DropAll(int32_t slot, bool keep_provisional);
  bool Holds(const Holder& holder, absl::Time now) const {
    return holder.confirmed || holder.expiry > now;
  }

  KvIndexOptions options_;
  Clock clock_;
  mutable std::mutex mu_;
  // A removed worker's slot is reused only after every Holder naming it was dropped, so a
  // stale Holder never aliases a new worker.
  std::vector<Worker> workers_;                                         // guarded by mu_
  std::vector<int32_t> free_slots_;                                     // guarded by mu_
  absl::flat_hash_map<std::string, int32_t> slot_of_;                   // guarded by mu_
  absl::flat_hash_map<BlockHash, std::vector<Holder>> holders_;         // guarded by mu_
  int64_t records_since_prune_ = 0;                                     // guarded by mu_
};

}  // namespace sluice

#endif  // SLUICE_SERVICES_ROUTER_KV_INDEX_H_
