#include "engine/tokenizer/bpe_word_cache.h"

#include "absl/hash/hash.h"

namespace sluice {

BpeWordCache::BpeWordCache(size_t capacity)
    : shard_capacity_((capacity + kNumShards - 1) / kNumShards) {}

BpeWordCache::Shard& BpeWordCache::ShardFor(std::string_view word) const {
  const size_t h = absl::Hash<absl::string_view>{}(absl::string_view(word.data(), word.size()));
  return shards_[(h >> 48) % kNumShards];
}

bool BpeWordCache::Lookup(std::string_view word, std::vector<int32_t>* out) const {
  if (word.size() > kMaxWordBytes || shard_capacity_ == 0) return false;
  Shard& shard = ShardFor(word);
  std::lock_guard<std::mutex> lock(shard.mu);
  const auto it = shard.map.find(absl::string_view(word.data(), word.size()));
  if (it == shard.map.end()) return false;
  out->insert(out->end(), it->second.begin(), it->second.end());
  return true;
}

void BpeWordCache::Insert(std::string_view word, absl::Span<const int32_t> ids) {
  if (word.size() > kMaxWordBytes || shard_capacity_ == 0) return;
  Shard& shard = ShardFor(word);
  std::lock_guard<std::mutex> lock(shard.mu);
  if (shard.map.size() >= shard_capacity_) return;
  shard.map.try_emplace(std::string(word), ids.begin(), ids.end());
}

}  // namespace sluice
