#include "engine/vision/embedding_cache.h"

#include <string>

// Inlined like engine/kv/block_hash.cc: no link dependency.
#define XXH_INLINE_ALL
#include <xxhash.h>

namespace sluice::vision {

BlockHash ImageContentHash(std::string_view image_bytes, std::string_view fingerprint) {
  std::string seed_bytes = "I";
  seed_bytes.append(fingerprint.data(), fingerprint.size());
  const XXH64_hash_t seed = XXH3_64bits(seed_bytes.data(), seed_bytes.size());
  const XXH128_hash_t h = XXH3_128bits_withSeed(image_bytes.data(), image_bytes.size(), seed);
  return BlockHash{h.low64, h.high64};
}

EmbeddingCache::Embeddings EmbeddingCache::Lookup(const BlockHash& key) {
  absl::MutexLock lock(&mu_);
  auto it = index_.find(key);
  if (it == index_.end()) {
    ++stats_.misses;
    return nullptr;
  }
  ++stats_.hits;
  lru_.splice(lru_.begin(), lru_, it->second);
  return it->second->second;
}

void EmbeddingCache::Insert(const BlockHash& key, Embeddings value) {
  if (value == nullptr || Bytes(value) > capacity_bytes_) return;
  absl::MutexLock lock(&mu_);
  if (auto it = index_.find(key); it != index_.end()) {
    stats_.bytes -= Bytes(it->second->second);
    lru_.erase(it->second);
    index_.erase(it);
    --stats_.entries;
  }
  stats_.bytes += Bytes(value);
  lru_.emplace_front(key, std::move(value));
  index_[key] = lru_.begin();
  ++stats_.entries;
  while (stats_.bytes > capacity_bytes_ && !lru_.empty()) {
    stats_.bytes -= Bytes(lru_.back().second);
    index_.erase(lru_.back().first);
    lru_.pop_back();
    --stats_.entries;
    ++stats_.evictions;
  }
}

EmbeddingCacheStats EmbeddingCache::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

}  // namespace sluice::vision
