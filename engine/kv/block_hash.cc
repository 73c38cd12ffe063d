#include "engine/kv/block_hash.h"

#include <cstdio>

// Inlined: the hash is a few hundred instructions per block and needs no link dependency.
#define XXH_INLINE_ALL
#include <xxhash.h>

namespace sluice {
namespace {

// Little-endian serialization, independent of the host's byte order.
void PutU32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void PutU64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

BlockHash Hash128(const std::string& bytes, uint64_t seed) {
  XXH128_hash_t h = XXH3_128bits_withSeed(bytes.data(), bytes.size(), seed);
  return BlockHash{h.low64, h.high64};
}

}  // namespace

std::string BlockHash::ToHex() const {
  char buf[33];
  std::snprintf(buf, sizeof(buf), "%016llx%016llx", static_cast<unsigned long long>(hi),
                static_cast<unsigned long long>(lo));
  return std::string(buf, 32);
}

std::string KvLayoutIdentity(std::string_view model_id, int64_t block_size,
                             std::string_view kv_dtype, int64_t num_layers,
                             int64_t k_floats_per_token, int64_t v_floats_per_token) {
  // std::string_view is not absl::string_view in this Abseil: build without StrCat.
  std::string id(BlockHasher::kSchemeVersion);
  id.append(";model=").append(model_id);
  id.append(";block_size=").append(std::to_string(block_size));
  id.append(";dtype=").append(kv_dtype);
  id.append(";layers=").append(std::to_string(num_layers));
  id.append(";k=").append(std::to_string(k_floats_per_token));
  id.append(";v=").append(std::to_string(v_floats_per_token));
  return id;
}

BlockHasher::BlockHasher(std::string identity, int64_t block_size)
    : identity_(std::move(identity)),
      block_size_(block_size),
      seed_(XXH3_64bits_withSeed(identity_.data(), identity_.size(), 0)) {}

BlockHash BlockHasher::RootHash(std::string_view cache_salt) const {
  std::string bytes = "R";
  bytes.append(cache_salt.data(), cache_salt.size());
  return Hash128(bytes, seed_);
}

BlockHash BlockHasher::HashBlock(const BlockHash& parent, absl::Span<const int32_t> tokens,
                                 absl::Span<const BlockHash> extra_keys) const {
  std::string bytes;
  bytes.reserve(1 + 16 + 4 + 4 * tokens.size() + 4 + 16 * extra_keys.size());
  bytes.push_back('B');
  PutU64(bytes, parent.lo);
  PutU64(bytes, parent.hi);
  PutU32(bytes, static_cast<uint32_t>(tokens.size()));
  for (int32_t t : tokens) PutU32(bytes, static_cast<uint32_t>(t));
  PutU32(bytes, static_cast<uint32_t>(extra_keys.size()));
  for (const BlockHash& k : extra_keys) {
    PutU64(bytes, k.lo);
    PutU64(bytes, k.hi);
  }
  return Hash128(bytes, seed_);
}

void BlockHasher::ExtendFullBlockHashes(const BlockHash& root, absl::Span<const int32_t> tokens,
                                        std::vector<BlockHash>& hashes) const {
  const size_t num_full = tokens.size() / static_cast<size_t>(block_size_);
  for (size_t b = hashes.size(); b < num_full; ++b) {
    const BlockHash& parent = b == 0 ? root : hashes[b - 1];
    hashes.push_back(HashBlock(parent, tokens.subspan(b * block_size_, block_size_)));
  }
}

void BlockHasher::ExtendFullBlockHashes(const BlockHash& root, absl::Span<const int32_t> tokens,
                                        absl::Span<const BlockExtraKeySpan> spans,
                                        std::vector<BlockHash>& hashes) const {
  if (spans.empty()) {
    ExtendFullBlockHashes(root, tokens, hashes);
    return;
  }
  const size_t num_full = tokens.size() / static_cast<size_t>(block_size_);
  std::vector<BlockHash> keys;
  for (size_t b = hashes.size(); b < num_full; ++b) {
    const int64_t begin = static_cast<int64_t>(b) * block_size_, end = begin + block_size_;
    keys.clear();
    for (const BlockExtraKeySpan& s : spans) {
      if (s.start < end && s.end > begin) keys.push_back(s.key);
    }
    const BlockHash& parent = b == 0 ? root : hashes[b - 1];
    hashes.push_back(HashBlock(parent, tokens.subspan(b * block_size_, block_size_), keys));
  }
}

}  // namespace sluice
