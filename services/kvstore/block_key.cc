#include "services/kvstore/block_key.h"

#include <xxhash.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"

namespace sluice::kvstore {

std::string BlockKey::ToHex() const {
  return absl::StrFormat("%016x%016x%016x", layout_id, hash_hi, hash_lo);
}

bool BlockKey::FromHex(std::string_view hex, BlockKey* key) {
  if (hex.size() != 48) return false;
  for (char c : hex) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  uint64_t parts[3];
  for (int i = 0; i < 3; ++i) {
    if (!absl::SimpleHexAtoi(absl::string_view(hex.data() + 16 * i, 16), &parts[i])) return false;
  }
  *key = BlockKey{parts[0], parts[1], parts[2]};
  return true;
}

uint64_t BlockChecksum(const void* data, size_t size) { return XXH3_64bits(data, size); }

uint64_t BlockChecksum(absl::Span<const uint8_t> bytes) {
  return BlockChecksum(bytes.data(), bytes.size());
}

}  // namespace sluice::kvstore
