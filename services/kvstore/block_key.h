// BlockKey: how the kvstore names a KV block: (layout id, block hash).
//
// The kvstore never interprets either part. The layout id identifies the bytes' meaning (model,
// block size, KV layout, dtype): blocks of one layout id all have the same size. The block hash is
// the engine's chained prefix hash (docs/design.md, "One block-hash scheme everywhere"), carried
// as an opaque 128-bit value; a 64-bit hash is stored with hash_hi = 0.
#ifndef SLUICE_SERVICES_KVSTORE_BLOCK_KEY_H_
#define SLUICE_SERVICES_KVSTORE_BLOCK_KEY_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace sluice::kvstore {

struct BlockKey {
  uint64_t layout_id = 0;
  uint64_t hash_hi = 0;
  uint64_t hash_lo = 0;

  bool operator==(const BlockKey&) const = default;

  template <typename H>
  friend H AbslHashValue(H h, const BlockKey& k) {
    return H::combine(std::move(h), k.layout_id, k.hash_hi, k.hash_lo);
  }

  // ToHex: 48 lowercase hex digits "<layout_id><hash_hi><hash_lo>" (file names, logs).
  std::string ToHex() const;
  // FromHex: the inverse of ToHex; false on anything else.
  static bool FromHex(std::string_view hex, BlockKey* key);
};

// BlockChecksum: XXH3-64 (seed 0) of a block's bytes; stored with every block and verified on
// every read (https://github.com/Cyan4973/xxHash, XXH3_64bits).
uint64_t BlockChecksum(absl::Span<const uint8_t> bytes);
uint64_t BlockChecksum(const void* data, size_t size);

// Clock: the time source for TTL and LRU stamps; tests inject a manual one.
using Clock = std::function<absl::Time()>;
inline Clock SystemClock() {
  return [] { return absl::Now(); };
}

}  // namespace sluice::kvstore

#endif  // SLUICE_SERVICES_KVSTORE_BLOCK_KEY_H_
