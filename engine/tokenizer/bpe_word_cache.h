// BpeWordCache: a bounded, thread-safe map from a pre-tokenized word (raw bytes) to its BPE
// token ids, so repeated words skip the merge loop.
#ifndef SLUICE_ENGINE_TOKENIZER_BPE_WORD_CACHE_H_
#define SLUICE_ENGINE_TOKENIZER_BPE_WORD_CACHE_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/types/span.h"

namespace sluice {

// BpeWordCache holds at most `capacity` words (split over 16 mutex-guarded shards). Like HF
// tokenizers' BPE cache it stops inserting once full instead of evicting: a tokenizer's hot
// words show up early, and no eviction keeps lookups cheap. Thread-safe.
class BpeWordCache {
 public:
  // Words longer than kMaxWordBytes are never cached (they rarely repeat).
  static constexpr size_t kMaxWordBytes = 256;

  explicit BpeWordCache(size_t capacity);

  // Lookup appends the cached ids of `word` to `out` and returns true, or returns false.
  bool Lookup(std::string_view word, std::vector<int32_t>* out) const;
  // Insert stores `ids` for `word` unless the shard is full or the word is too long.
  void Insert(std::string_view word, absl::Span<const int32_t> ids);

 private:
  using Ids = absl::InlinedVector<int32_t, 4>;
  // std::mutex rather than absl::Mutex: the distro's Abseil is built with deadlock detection,
  // which made every uncontended lock a graph lookup (measured: ~10% of encode time).
  struct Shard {
    mutable std::mutex mu;
    absl::flat_hash_map<std::string, Ids> map ABSL_GUARDED_BY(mu);
  };
  static constexpr size_t kNumShards = 16;

  Shard& ShardFor(std::string_view word) const;

  size_t shard_capacity_;
  mutable std::array<Shard, kNumShards> shards_;
};

}  // namespace sluice

#endif  // SLUICE_ENGINE_TOKENIZER_BPE_WORD_CACHE_H_
