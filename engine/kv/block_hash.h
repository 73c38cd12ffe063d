// Block hashes: the ONE content address of a full KV block, shared by the router, every engine
// and the kvstore (docs/design.md, "One block-hash scheme everywhere").
//
// A block's hash is chained: it covers its parent block's hash, its own block_size token ids and
// optional extra keys (e.g. image content hashes of images overlapping the block). The first
// block's parent is a root hash derived from the per-tenant cache salt. Every hash is seeded by
// the model/layout identity (model id, block size, KV dtype and per-token layout), so two models,
// two block sizes or two KV layouts never share an address. Only full blocks are hashed: a
// partial block's KV still grows and is never shared.
//
// Algorithm (version "sluice-kv/1"; any change to it must change kSchemeVersion):
//   seed     = XXH3_64bits(identity bytes, seed 0)
//   root     = XXH3_128bits_withSeed("R" || salt bytes, seed)
//   hash(b)  = XXH3_128bits_withSeed("B" || parent.lo || parent.hi || u32 num_tokens ||
//                                    tokens as i32 || u32 num_extra || (extra.lo || extra.hi)*,
//                                    seed)
// with every integer little-endian. The explicit lengths keep token bytes and extra-key bytes
// from ever aliasing each other. xxHash: https://github.com/Cyan4973/xxHash (XXH3, v0.8).
//
// Why 128 bits: a hash collision silently serves another prefix's KV (wrong output, no error).
// With N distinct blocks alive in a fleet's caches (kvstore retention is 72 h by default, so N
// reaches 1e9 and more), the birthday bound puts the chance of any collision near N^2 / 2^(b+1):
// 2.7% at N = 1e9 for b = 64, but 1.5e-21 for b = 128. XXH3-128 costs about the same as
// XXH3-64 on 64-byte inputs. It is not a cryptographic hash: tenants that must not share KV (or
// could craft collisions against each other) are separated by distinct cache salts.
#ifndef SLUICE_ENGINE_KV_BLOCK_HASH_H_
#define SLUICE_ENGINE_KV_BLOCK_HASH_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/types/span.h"

namespace sluice {

// BlockHash: a 128-bit block address (XXH128 low and high halves).
struct BlockHash {
  uint64_t lo = 0;
  uint64_t hi = 0;

  friend bool operator==(const BlockHash& a, const BlockHash& b) {
    return a.lo == b.lo && a.hi == b.hi;
  }
  friend bool operator!=(const BlockHash& a, const BlockHash& b) { return !(a == b); }
  template <typename H>
  friend H AbslHashValue(H h, const BlockHash& b) {
    return H::combine(std::move(h), b.lo, b.hi);
  }
  // ToHex: 32 lowercase hex digits, hi then lo (XXH128's canonical big-endian order).
  std::string ToHex() const;
};

// KvLayoutIdentity returns the identity string that seeds a BlockHasher:
//   "sluice-kv/1;model=<model_id>;block_size=<n>;dtype=<kv_dtype>;layers=<L>;k=<k>;v=<v>"
// `model_id` names the weights (e.g. the served model name or a checkpoint digest);
// `kv_dtype` the stored element type ("f32", "bf16"); k/v are the floats per token per layer.
std::string KvLayoutIdentity(std::string_view model_id, int64_t block_size,
                             std::string_view kv_dtype, int64_t num_layers,
                             int64_t k_floats_per_token, int64_t v_floats_per_token);

// BlockExtraKeySpan: an extra key that belongs to every block overlapping the token positions
// [start, end) — e.g. an image's content hash over its placeholder tokens, so two prompts that
// differ only in an image never share a block from the image on.
struct BlockExtraKeySpan {
  int64_t start = 0;
  int64_t end = 0;
  BlockHash key;
};

// BlockHasher computes block hashes for one model/layout identity. Immutable after construction;
// thread-safe.
class BlockHasher {
 public:
  static constexpr std::string_view kSchemeVersion = "sluice-kv/1";

  // `identity`: see KvLayoutIdentity (any string works; equal strings give equal hashes).
  // `block_size` > 0: tokens per block.
  BlockHasher(std::string identity, int64_t block_size);

  const std::string& identity() const { return identity_; }
  int64_t block_size() const { return block_size_; }
  uint64_t seed() const { return seed_; }

  // RootHash: the parent of a sequence's first block. An empty salt is the shared namespace.
  BlockHash RootHash(std::string_view cache_salt) const;
  // HashBlock: the hash of one full block (`tokens.size()` should equal block_size; the length
  // is hashed, so a shorter span never aliases a full block) under `parent`.
  BlockHash HashBlock(const BlockHash& parent, absl::Span<const int32_t> tokens,
                      absl::Span<const BlockHash> extra_keys = {}) const;
  // ExtendFullBlockHashes: `hashes` holds the chained hashes of the first hashes.size() full
  // blocks of `tokens` under `root`; appends the hashes of the remaining full blocks (a trailing
  // partial block gets none). Text only (no extra keys).
  void ExtendFullBlockHashes(const BlockHash& root, absl::Span<const int32_t> tokens,
                             std::vector<BlockHash>& hashes) const;
  // ExtendFullBlockHashes with extra keys: block b is hashed with the keys of the `spans`
  // overlapping its positions [b·block_size, (b+1)·block_size), in the order of `spans`
  // (blocks no span overlaps hash as text-only blocks).
  void ExtendFullBlockHashes(const BlockHash& root, absl::Span<const int32_t> tokens,
                             absl::Span<const BlockExtraKeySpan> spans,
                             std::vector<BlockHash>& hashes) const;

 private:
  std::string identity_;
  int64_t block_size_;
  uint64_t seed_;
};

}  // namespace sluice

#endif  // SLUICE_ENGINE_KV_BLOCK_HASH_H_
