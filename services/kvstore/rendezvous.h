// RendezvousHash: which kvstore shard owns a block, by rendezvous (highest random weight, HRW)
// hashing: every shard scores the key with a hash of (shard, key) and the highest score wins.
// Adding or removing one of N shards moves only the keys that shard wins or won (about 1/N of
// them), and every client computes the same owner from the shard list alone, with no ring or
// virtual nodes. Source: D. G. Thaler and C. V. Ravishankar, "A Name-Based Mapping Scheme for
// Rendezvous", University of Michigan tech. report CSE-TR-316-96 (1996); journal version "Using
// Name-Based Mappings to Increase Hit Rates", IEEE/ACM Trans. on Networking 6(1), 1998.
//
// Score(shard, key) = XXH3-64(key bytes, seed = XXH3-64(shard name)). The shard name is its
// stable identity (e.g. the StatefulSet pod's DNS name), not its position in the list, so the
// owner does not depend on list order. Immutable; thread-safe.
#ifndef SLUICE_SERVICES_KVSTORE_RENDEZVOUS_H_
#define SLUICE_SERVICES_KVSTORE_RENDEZVOUS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "services/kvstore/block_key.h"

namespace sluice::kvstore {

class RendezvousHash {
 public:
  // `shards`: distinct names; may be empty (then Pick returns -1).
  explicit RendezvousHash(std::vector<std::string> shards);

  // Pick: the index (into the constructor's list) of the shard owning `key`; -1 if no shards.
  int Pick(const BlockKey& key) const;
  static uint64_t Score(uint64_t shard_seed, const BlockKey& key);

  const std::vector<std::string>& shards() const { return shards_; }

 private:
  std::vector<std::string> shards_;
  std::vector<uint64_t> seeds_;
};

}  // namespace sluice::kvstore

#endif  // SLUICE_SERVICES_KVSTORE_RENDEZVOUS_H_
