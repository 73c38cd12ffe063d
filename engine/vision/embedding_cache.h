// EmbeddingCache: projected image embeddings by content hash, bounded in bytes, least recently
// used evicted first. The key covers the image bytes and the preprocessing config
// (ImageContentHash), so a hit is exactly the embeddings the encoder would compute again.
// Thread-safe.
#ifndef SLUICE_ENGINE_VISION_EMBEDDING_CACHE_H_
#define SLUICE_ENGINE_VISION_EMBEDDING_CACHE_H_

#include <cstdint>
#include <list>
#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "engine/kv/block_hash.h"

namespace sluice::vision {

// ImageContentHash: XXH3-128 of the image bytes, seeded with XXH3-64("I" || the preprocessing
// fingerprint) (ImageProcessorConfig::Fingerprint). Used as the embedding cache key and as the block-hash
// extra key of the image's placeholder tokens.
BlockHash ImageContentHash(std::string_view image_bytes, std::string_view preprocess_fingerprint);

struct EmbeddingCacheStats {
  int64_t hits = 0;
  int64_t misses = 0;
  int64_t evictions = 0;
  int64_t entries = 0;
  int64_t bytes = 0;
};

class EmbeddingCache {
 public:
  using Embeddings = std::shared_ptr<const std::vector<float>>;
  // capacity_bytes: float bytes kept at most (an entry larger than that is not kept); 0
  // disables the cache (every Lookup misses).
  explicit EmbeddingCache(int64_t capacity_bytes) : capacity_bytes_(capacity_bytes) {}

  // Lookup returns the embeddings and marks them recently used, or null (a miss is counted).
  Embeddings Lookup(const BlockHash& key);
  // Insert stores `value` under `key` (replacing an entry with the same key), evicting least
  // recently used entries until the cache fits its capacity.
  void Insert(const BlockHash& key, Embeddings value);
  EmbeddingCacheStats stats() const;

 private:
  using Entry = std::pair<BlockHash, Embeddings>;
  static int64_t Bytes(const Embeddings& e) {
    return static_cast<int64_t>(e->size() * sizeof(float));
  }
  const int64_t capacity_bytes_;
  mutable absl::Mutex mu_;
  std::list<Entry> lru_ ABSL_GUARDED_BY(mu_);  // most recently used first
  absl::flat_hash_map<BlockHash, std::list<Entry>::iterator> index_ ABSL_GUARDED_BY(mu_);
  EmbeddingCacheStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sluice::vision

#endif  // SLUICE_ENGINE_VISION_EMBEDDING_CACHE_H_
