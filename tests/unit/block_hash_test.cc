// Block-hash scheme (engine/kv/block_hash.h): exact values for fixed inputs, and the properties
// the prefix cache, router and kvstore rely on (chaining, salt namespaces, identity seeds, only
// full blocks hashed).
//
// The expected values were computed independently of this code, with python-xxhash 4.1.0
// (libxxhash 0.8.4) from the byte layout documented in block_hash.h:
//   seed = xxh3_64_intdigest(identity, seed=0)
//   h128(b) = xxh3_128_intdigest(b, seed); lo = h & (2**64-1), hi = h >> 64
//   root(salt) = h128(b"R" + salt)
//   block(parent, toks, extra) = h128(b"B" + pack("<QQ", lo, hi) + pack("<I", len(toks)) +
//       b"".join(pack("<i", t) for t in toks) + pack("<I", len(extra)) +
//       b"".join(pack("<QQ", e.lo, e.hi) for e in extra))
#include "engine/kv/block_hash.h"

#include <cstdint>
#include <vector>

#include <gtest/gtest.h>

#include "absl/container/flat_hash_set.h"

namespace sluice {
namespace {

const char* const kIdentity = "sluice-kv/1;model=test-model;block_size=4;dtype=f32;layers=2;k=8;v=8";

TEST(BlockHashTest, IdentityStringFormat) {
  EXPECT_EQ(KvLayoutIdentity("test-model", 4, "f32", 2, 8, 8), kIdentity);
}

TEST(BlockHashTest, ExactValuesMatchIndependentImplementation) {
  BlockHasher hasher(kIdentity, 4);
  EXPECT_EQ(hasher.seed(), 0xb2c90db2503f1e76ULL);

  const BlockHash root = hasher.RootHash("");
  EXPECT_EQ(root, (BlockHash{0xbdaf13006298d1dbULL, 0xa348f9601a6d8d6aULL}));
  EXPECT_EQ(hasher.RootHash("tenant-a"),
            (BlockHash{0xf922b82777beba2aULL, 0x6a68f6d760fb64c4ULL}));

  const std::vector<int32_t> tokens = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
  std::vector<BlockHash> hashes;
  hasher.ExtendFullBlockHashes(root, tokens, hashes);
  ASSERT_EQ(hashes.size(), 2u);  // 10 tokens: two full blocks of 4, the partial one unhashed
  EXPECT_EQ(hashes[0], (BlockHash{0x6ed0cf81b90db019ULL, 0x9fa22946462a0f5eULL}));
  EXPECT_EQ(hashes[1], (BlockHash{0x60e382eb3c855dc7ULL, 0x5e3d99d9d8f355efULL}));
  EXPECT_EQ(hashes[0].ToHex(), "9fa22946462a0f5e6ed0cf81b90db019");

  const BlockHash image{0x0123456789abcdefULL, 0xfedcba9876543210ULL};
  EXPECT_EQ(hasher.HashBlock(root, std::vector<int32_t>{100, 8191, 0x7fffffff, 7}, {image}),
            (BlockHash{0xcd7a16bcd76bce9aULL, 0x33443b8ee1d1d76bULL}));
}

TEST(BlockHashTest, ChainingMakesEachHashDependOnTheWholePrefix) {
  BlockHasher hasher(kIdentity, 4);
  const BlockHash root = hasher.RootHash("");
  std::vector<int32_t> a = {10, 11, 12, 13, 20, 21, 22, 23};
  std::vector<int32_t> b = a;
  b[0] = 99;  // first block differs, second block's tokens are equal
  std::vector<BlockHash> ha, hb;
  hasher.ExtendFullBlockHashes(root, a, ha);
  hasher.ExtendFullBlockHashes(root, b, hb);
  ASSERT_EQ(ha.size(), 2u);
  ASSERT_EQ(hb.size(), 2u);
  EXPECT_NE(ha[0], hb[0]);
  EXPECT_NE(ha[1], hb[1]);  // same tokens, different parent
  EXPECT_EQ(ha[1], hasher.HashBlock(ha[0], std::vector<int32_t>{20, 21, 22, 23}));

  // Extending is incremental: hashing a longer sequence keeps the earlier hashes.
  std::vector<int32_t> longer = a;
  for (int32_t t : {30, 31, 32, 33, 40}) longer.push_back(t);
  std::vector<BlockHash> hl = ha;
  hasher.ExtendFullBlockHashes(root, longer, hl);
  std::vector<BlockHash> fresh;
  hasher.ExtendFullBlockHashes(root, longer, fresh);
  EXPECT_EQ(hl, fresh);
  EXPECT_EQ(hl.size(), 3u);
}

TEST(BlockHashTest, SaltChangesEveryHash) {
  BlockHasher hasher(kIdentity, 4);
  std::vector<int32_t> tokens;
  for (int32_t i = 0; i < 64; ++i) tokens.push_back(i * 3 + 1);
  std::vector<BlockHash> shared, salted;
  hasher.ExtendFullBlockHashes(hasher.RootHash(""), tokens, shared);
  hasher.ExtendFullBlockHashes(hasher.RootHash("tenant-b"), tokens, salted);
  ASSERT_EQ(shared.size(), 16u);
  ASSERT_EQ(salted.size(), 16u);
  absl::flat_hash_set<BlockHash> all(shared.begin(), shared.end());
  all.insert(salted.begin(), salted.end());
  EXPECT_EQ(all.size(), 32u);
}

TEST(BlockHashTest, IdentitySeedsSeparateModelsAndLayouts) {
  const std::vector<int32_t> tokens = {1, 2, 3, 4};
  BlockHasher a(KvLayoutIdentity("model-a", 4, "f32", 2, 8, 8), 4);
  BlockHasher b(KvLayoutIdentity("model-b", 4, "f32", 2, 8, 8), 4);
  BlockHasher bf16(KvLayoutIdentity("model-a", 4, "bf16", 2, 8, 8), 4);
  const BlockHash ha = a.HashBlock(a.RootHash(""), tokens);
  EXPECT_NE(ha, b.HashBlock(b.RootHash(""), tokens));
  EXPECT_NE(ha, bf16.HashBlock(bf16.RootHash(""), tokens));
  // Same identity string: same hashes (router, engines and kvstore agree).
  BlockHasher a2(KvLayoutIdentity("model-a", 4, "f32", 2, 8, 8), 4);
  EXPECT_EQ(ha, a2.HashBlock(a2.RootHash(""), tokens));
}

TEST(BlockHashTest, LengthAndExtraKeysAreHashed) {
  BlockHasher hasher(kIdentity, 4);
  const BlockHash root = hasher.RootHash("");
  const BlockHash plain = hasher.HashBlock(root, std::vector<int32_t>{1, 2, 3, 4});
  EXPECT_NE(plain, hasher.HashBlock(root, std::vector<int32_t>{1, 2, 3}));
  EXPECT_NE(plain, hasher.HashBlock(root, std::vector<int32_t>{1, 2, 3, 4}, {BlockHash{1, 0}}));
  EXPECT_NE(hasher.HashBlock(root, std::vector<int32_t>{1, 2, 3, 4}, {BlockHash{1, 0}}),
            hasher.HashBlock(root, std::vector<int32_t>{1, 2, 3, 4}, {BlockHash{2, 0}}));
  // A partial block is never hashed.
  std::vector<BlockHash> hashes;
  hasher.ExtendFullBlockHashes(root, std::vector<int32_t>{1, 2, 3}, hashes);
  EXPECT_TRUE(hashes.empty());
}

}  // namespace
}  // namespace sluice
