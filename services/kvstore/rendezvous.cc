#include "services/kvstore/rendezvous.h"

#include <xxhash.h>

namespace sluice::kvstore {

RendezvousHash::RendezvousHash(std::vector<std::string> shards) : shards_(std::move(shards)) {
  seeds_.reserve(shards_.size());
  for (const std::string& s : shards_) seeds_.push_back(XXH3_64bits(s.data(), s.size()));
}

uint64_t RendezvousHash::Score(uint64_t shard_seed, const BlockKey& key) {
  const uint64_t words[3] = {key.layout_id, key.hash_hi, key.hash_lo};
  return XXH3_64bits_withSeed(words, sizeof(words), shard_seed);
}

int RendezvousHash::Pick(const BlockKey& key) const {
  int best = -1;
  uint64_t best_score = 0;
  for (size_t i = 0; i < seeds_.size(); ++i) {
    const uint64_t score = Score(seeds_[i], key);
    // Ties (astronomically rare) go to the smaller seed, so list order never matters.
    if (best < 0 || score > best_score ||
        (score == best_score && seeds_[i] < seeds_[static_cast<size_t>(best)])) {
      best = static_cast<int>(i);
      best_score = score;
    }
  }
  return best;
}

}  // namespace sluice::kvstore
