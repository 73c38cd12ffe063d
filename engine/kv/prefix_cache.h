// PrefixCache: content-addressed reuse of full KV blocks (automatic prefix caching).
//
// Every full block whose KV has been computed is registered under its chained block hash
// (engine/kv/block_hash.h). A new sequence looks up the longest run of its leading block hashes
// that are registered and shares those blocks (reference counts, KvBlockAllocator) instead of
// recomputing them. A registered block nobody references stays cached in the allocator's LRU
// until an allocation finds no empty block and evicts it. Every registration, eviction and
// reset is published to a KvEventLog.
//
// Exactness: a block's KV depends only on the tokens up to its end (causal attention; sliding
// layers also keep every token's KV in this cache) and on the model, all covered by the hash, so
// a hit reproduces what recomputation would have written. Not thread-safe: owned by the
// scheduler (the event log is the thread-safe part).
#ifndef SLUICE_ENGINE_KV_PREFIX_CACHE_H_
#define SLUICE_ENGINE_KV_PREFIX_CACHE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/types/span.h"
#include "engine/kv/block_hash.h"
#include "engine/kv/kv_block_allocator.h"
#include "engine/kv/kv_events.h"

namespace sluice {

struct PrefixCacheStats {
  int64_t num_cached_blocks = 0;   // registered blocks (in use or free)
  int64_t num_evicted_blocks = 0;  // cumulative
  int64_t num_queried_blocks = 0;  // cumulative blocks looked up
  int64_t num_hit_blocks = 0;      // cumulative blocks reused
};

class PrefixCache {
 public:
  // `num_blocks`: the KV cache's blocks. `enabled` false: lookups miss and nothing is
  // registered (plain paged allocation). `events` (may be null) receives the changes.
  PrefixCache(int64_t num_blocks, bool enabled, std::shared_ptr<KvEventLog> events);

  bool enabled() const { return enabled_; }
  KvBlockAllocator& allocator() { return allocator_; }
  const KvBlockAllocator& allocator() const { return allocator_; }

  // Allocate: as KvBlockAllocator::Allocate; evicted cached blocks are unregistered and
  // published as removed.
  bool Allocate(int64_t n, std::vector<int32_t>& out);
  // Free drops one reference to each of a sequence's blocks (given in sequence order). They are
  // released tail first, so a sequence's later blocks are evicted before its shared prefix.
  void Free(const std::vector<int32_t>& blocks);

  // Lookup returns the blocks of the longest prefix of `hashes` that is registered, at most
  // `max_blocks`, each with one reference added (the caller owns them; Free returns them).
  std::vector<int32_t> AcquirePrefix(absl::Span<const BlockHash> hashes, int64_t max_blocks);

  // CountCachedPrefix: how many leading blocks of `hashes` (at most `max_blocks`) are
  // registered, as AcquirePrefix would return, without taking them or counting a query.
  int64_t CountCachedPrefix(absl::Span<const BlockHash> hashes, int64_t max_blocks) const;

  // Register publishes consecutive full blocks of one sequence: blocks[i] holds the KV of the
  // block hashed hashes[i]; `parent` is the hash before hashes[0] (nullopt at the sequence
  // start). A hash already registered to another block is skipped (that copy stays private and
  // is freed as an empty block). The blocks must be in use (referenced).
  void Register(absl::Span<const int32_t> blocks, absl::Span<const BlockHash> hashes,
                std::optional<BlockHash> parent);

  // Reset unregisters every block (in use or not) and publishes all_cleared.
  void Reset();

  const PrefixCacheStats& stats() const { return stats_; }

 private:
  void Unregister(const std::vector<int32_t>& blocks);

  bool enabled_;
  KvBlockAllocator allocator_;
  std::shared_ptr<KvEventLog> events_;
  absl::flat_hash_map<BlockHash, int32_t> block_of_hash_;
  std::vector<BlockHash> hash_of_block_;  // [num_blocks], valid where allocator_.is_cached()
  std::vector<int32_t> evicted_;          // scratch
  PrefixCacheStats stats_;
};

}  // namespace sluice

#endif  // SLUICE_ENGINE_KV_PREFIX_CACHE_H_
