// PagedDraftKv: the paged, prefix-cached KV cache a drafter keeps for its own model — a draft
// model (DraftModelDrafter) or the target's MTP module (MtpDrafter): float32 blocks of its own
// KvCache handed out by its own PrefixCache, full blocks addressed by hashes chained under the
// drafter's identity and each request's root (which covers its cache_salt).
//
// Which tokens address an entry is the drafter's: a draft model's entry at position i is
// computed from t_0..t_i, an MTP entry from t_0..t_{i+1}. Callers pass that run as `hashed`
// (block b's entries are addressed by hashed[b·bs, (b+1)·bs)): the sequence's tokens, or the
// tokens shifted by one. Not thread-safe (the engine's step thread).
#ifndef SLUICE_ENGINE_SPEC_PAGED_DRAFT_KV_H_
#define SLUICE_ENGINE_SPEC_PAGED_DRAFT_KV_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "engine/kv/block_hash.h"
#include "engine/kv/prefix_cache.h"
#include "engine/model/model.h"

namespace sluice {

class PagedDraftKv {
 public:
  // One request's blocks.
  struct Blocks {
    BlockHash root;
    std::vector<int32_t> table;
    std::vector<BlockHash> hashes;  // of the leading full blocks hashed so far
    int32_t num_committed = 0;      // leading blocks registered in the prefix cache
  };

  // `identity` names the drafter's weights and layout in the block hashes (KvLayoutIdentity's
  // model id, e.g. "draft:<dir>"); num_kv_blocks and block_size > 0 (the drafters check).
  // `host_storage` false: the KvCache holds the geometry only (a model on a device keeps its
  // own KV).
  PagedDraftKv(const KvCacheSpec& spec, const std::string& identity, int64_t block_size,
               int64_t num_kv_blocks, bool enable_prefix_caching, bool host_storage = true);

  int64_t block_size() const { return block_size_; }
  bool prefix_caching() const { return cache_.enabled(); }
  KvCache& kv_cache() { return kv_cache_; }
  const BlockHasher& hasher() const { return hasher_; }

  // The KV slot of position `pos` (its block must be in b.table).
  int64_t Slot(const Blocks& b, int64_t pos) const {
    return static_cast<int64_t>(b.table[pos / block_size_]) * block_size_ + pos % block_size_;
  }
  // AcquirePrefix: for blocks still empty, takes the longest run of cached full blocks that
  // `hashed` addresses, at most max_blocks, and counts them committed; returns the positions
  // they cover. 0 without prefix caching or when b already holds blocks.
  int32_t AcquirePrefix(Blocks& b, absl::Span<const int32_t> hashed, int64_t max_blocks);
  // Commit registers b's blocks [num_committed, full) in the prefix cache, addressed by
  // hashed[0, full·bs) (entries final: computed from real tokens). Nothing without caching.
  void Commit(Blocks& b, absl::Span<const int32_t> hashed, int32_t full);
  // Grow gives b blocks for `num_kv_tokens` positions; false when the blocks ran out (b keeps
  // what it had).
  bool Grow(Blocks& b, int64_t num_kv_tokens);
  // Free returns b's blocks (cached ones stay in the prefix cache) and empties it.
  void Free(Blocks& b);

  int64_t num_free_blocks() const { return cache_.allocator().num_free_blocks(); }
  int64_t num_total_blocks() const { return cache_.allocator().num_total_blocks(); }
  const PrefixCacheStats& prefix_cache_stats() const { return cache_.stats(); }

 private:
  int64_t block_size_;
  KvCache kv_cache_;
  BlockHasher hasher_;
  PrefixCache cache_;
};

}  // namespace sluice

#endif  // SLUICE_ENGINE_SPEC_PAGED_DRAFT_KV_H_
