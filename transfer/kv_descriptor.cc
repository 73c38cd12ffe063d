// RemoteKvDescriptor wire format (all integers little-endian):
//   u32 magic 'SKVD' (0x44564b53), u32 version (1),
//   u32 worker_address length, bytes,
//   u32 num_regions, then per region: u64 base_address, i64 num_blocks, i64
//   block_bytes, u32 rkey length, bytes.
#include <bit>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "transfer/kv_transfer.h"

namespace sluice::transfer {
namespace {

constexpr uint32_t kMagic = 0x44564b53;  // "SKVD" read as little-endian u32
constexpr uint32_t kVersion = 1;
// Bounds that no real descriptor comes near; they keep a hostile length from
// allocating GiBs.
constexpr uint32_t kMaxBlobBytes = 1 << 20;
constexpr uint32_t kMaxRegions = 1 << 16;

static_assert(std::endian::native == std::endian::little,
              "descriptor encoding assumes a little-endian host");

template <typename T>
void Put(std::string& out, T value) {
  char buf[sizeof(T)];
  std::memcpy(buf, &value, sizeof(T));
  out.append(buf, sizeof(T));
}

void PutBlob(std::string& out, const std::string& blob) {
  Put<uint32_t>(out, static_cast<uint32_t>(blob.size()));
  out.append(blob);
}

class Reader {
 public:
  explicit Reader(std::string_view bytes) : bytes_(bytes) {}

  template <typename T>
  bool Get(T* value) {
    if (bytes_.size() - pos_ < sizeof(T)) return false;
    std::memcpy(value, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }

  bool GetBlob(std::string* blob) {
    uint32_t n = 0;
    if (!Get(&n) || n > kMaxBlobBytes || bytes_.size() - pos_ < n) return false;
    blob->assign(bytes_.data() + pos_, n);
    pos_ += n;
    return true;
  }

  bool AtEnd() const { return pos_ == bytes_.size(); }

 private:
  std::string_view bytes_;
  size_t pos_ = 0;
};

absl::Status Truncated(const char* what) {
  return absl::InvalidArgumentError(absl::StrCat("KV descriptor truncated or oversized at ", what));
}

}  // namespace

std::string RemoteKvDescriptor::Serialize() const {
  std::string out;
  Put<uint32_t>(out, kMagic);
  Put<uint32_t>(out, kVersion);
  PutBlob(out, worker_address);
  Put<uint32_t>(out, static_cast<uint32_t>(regions.size()));
  for (const RemoteRegion& r : regions) {
    Put<uint64_t>(out, r.base_address);
    Put<int64_t>(out, r.num_blocks);
    Put<int64_t>(out, r.block_bytes);
    PutBlob(out, r.rkey);
  }
  return out;
}

absl::StatusOr<RemoteKvDescriptor> RemoteKvDescriptor::Parse(std::string_view bytes) {
  Reader reader(bytes);
  uint32_t magic = 0, version = 0;
  if (!reader.Get(&magic) || magic != kMagic) {
    return absl::InvalidArgumentError("not a KV descriptor (bad magic)");
  }
  if (!reader.Get(&version) || version != kVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat("unsupported KV descriptor version ", version, " (want ", kVersion, ")"));
  }
  RemoteKvDescriptor desc;
  if (!reader.GetBlob(&desc.worker_address)) return Truncated("worker address");
  if (desc.worker_address.empty()) {
    return absl::InvalidArgumentError("KV descriptor has an empty worker address");
  }
  uint32_t num_regions = 0;
  if (!reader.Get(&num_regions) || num_regions > kMaxRegions) return Truncated("region count");
  desc.regions.resize(num_regions);
  for (uint32_t i = 0; i < num_regions; ++i) {
    RemoteRegion& r = desc.regions[i];
    if (!reader.Get(&r.base_address) || !reader.Get(&r.num_blocks) || !reader.Get(&r.block_bytes) ||
        !reader.GetBlob(&r.rkey)) {
      return Truncated("region");
    }
    // The region's last byte must be addressable: base + num_blocks *
    // block_bytes <= 2^64.
    if (r.num_blocks < 0 || r.block_bytes <= 0 || r.rkey.empty() ||
        (r.num_blocks > 0 &&
         static_cast<unsigned __int128>(r.num_blocks) * static_cast<uint64_t>(r.block_bytes) >
             std::numeric_limits<uint64_t>::max() - r.base_address)) {
      return absl::InvalidArgumentError(
          absl::StrCat("KV descriptor region ", i, " has invalid geometry or remote key"));
    }
  }
  if (!reader.AtEnd()) return absl::InvalidArgumentError("trailing bytes after KV descriptor");
  return desc;
}

absl::StatusOr<RemoteKvDescriptor> RemoteKvDescriptor::SelectRegions(size_t first,
                                                                     size_t count) const {
  if (first > regions.size() || count > regions.size() - first) {
    return absl::InvalidArgumentError(absl::StrCat("regions [", first, ", ", first + count,
                                                   ") out of range; descriptor has ",
                                                   regions.size()));
  }
  RemoteKvDescriptor out;
  out.worker_address = worker_address;
  out.regions.assign(regions.begin() + first, regions.begin() + first + count);
  return out;
}

}  // namespace sluice::transfer
