#include "engine/kv/prefix_cache.h"

#include <algorithm>
#include <utility>

namespace sluice {

PrefixCache::PrefixCache(int64_t num_blocks, bool enabled, std::shared_ptr<KvEventLog> events)
    : enabled_(enabled),
      allocator_(num_blocks),
      events_(std::move(events)),
      hash_of_block_(enabled ? num_blocks : 0) {}

bool PrefixCache::Allocate(int64_t n, std::vector<int32_t>& out) {
  evicted_.clear();
  if (!allocator_.Allocate(n, out, &evicted_)) return false;
  if (!evicted_.empty()) Unregister(evicted_);
  return true;
}

void PrefixCache::Unregister(const std::vector<int32_t>& blocks) {
  std::vector<BlockHash> removed;
  removed.reserve(blocks.size());
  for (int32_t b : blocks) {
    block_of_hash_.erase(hash_of_block_[b]);
    removed.push_back(hash_of_block_[b]);
  }
  stats_.num_evicted_blocks += static_cast<int64_t>(blocks.size());
  stats_.num_cached_blocks = static_cast<int64_t>(block_of_hash_.size());
  if (events_ != nullptr) events_->Removed(std::move(removed));
}

void PrefixCache::Free(const std::vector<int32_t>& blocks) {
  if (!enabled_) {
    allocator_.Free(blocks);
    return;
  }
  allocator_.Free(std::vector<int32_t>(blocks.rbegin(), blocks.rend()));
}

std::vector<int32_t> PrefixCache::AcquirePrefix(absl::Span<const BlockHash> hashes,
                                                int64_t max_blocks) {
  std::vector<int32_t> blocks;
  if (!enabled_) return blocks;
  const size_t limit =
      std::min(hashes.size(), static_cast<size_t>(std::max<int64_t>(0, max_blocks)));
  for (size_t i = 0; i < limit; ++i) {
    auto it = block_of_hash_.find(hashes[i]);
    if (it == block_of_hash_.end()) break;
    blocks.push_back(it->second);
  }
  for (int32_t b : blocks) allocator_.Acquire(b);
  stats_.num_queried_blocks += static_cast<int64_t>(limit);
  stats_.num_hit_blocks += static_cast<int64_t>(blocks.size());
  return blocks;
}

int64_t PrefixCache::CountCachedPrefix(absl::Span<const BlockHash> hashes,
                                       int64_t max_blocks) const {
  if (!enabled_) return 0;
  const size_t limit =
      std::min(hashes.size(), static_cast<size_t>(std::max<int64_t>(0, max_blocks)));
  size_t n = 0;
  while (n < limit && block_of_hash_.contains(hashes[n])) ++n;
  return static_cast<int64_t>(n);
}

void PrefixCache::Register(absl::Span<const int32_t> blocks, absl::Span<const BlockHash> hashes,
                           std::optional<BlockHash> parent) {
  if (!enabled_) return;
  // Newly registered runs are published as one stored event each; a skipped duplicate breaks
  // the run (the next run's parent is the skipped block's hash, registered elsewhere).
  std::vector<BlockHash> run;
  std::optional<BlockHash> run_parent = parent;
  auto flush = [&] {
    if (!run.empty() && events_ != nullptr) events_->Stored(run_parent, std::move(run));
    run.clear();
  };
  for (size_t i = 0; i < blocks.size(); ++i) {
    const int32_t b = blocks[i];
    const bool fresh = !allocator_.is_cached(b) && block_of_hash_.emplace(hashes[i], b).second;
    if (fresh) {
      hash_of_block_[b] = hashes[i];
      allocator_.SetCached(b, true);
      if (run.empty()) run_parent = i == 0 ? parent : std::optional<BlockHash>(hashes[i - 1]);
      run.push_back(hashes[i]);
    } else {
      flush();
    }
  }
  flush();
  stats_.num_cached_blocks = static_cast<int64_t>(block_of_hash_.size());
}

void PrefixCache::Reset() {
  if (!enabled_) return;
  for (const auto& [hash, block] : block_of_hash_) allocator_.SetCached(block, false);
  block_of_hash_.clear();
  stats_.num_cached_blocks = 0;
  if (events_ != nullptr) events_->AllCleared();
}

}  // namespace sluice
