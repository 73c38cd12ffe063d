#include "services/kvstore/ssd_tier.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace sluice::kvstore {
namespace {

static_assert(std::endian::native == std::endian::little, "block files are little-endian");

constexpr char kMagic[8] = {'S', 'L', 'K', 'V', 'B', 'L', 'K', '1'};

// FileHeader: the first 64 bytes of a block file (little-endian).
struct FileHeader {
  char magic[8];
  uint64_t layout_id;
  uint64_t hash_hi;
  uint64_t hash_lo;
  uint64_t payload_bytes;
  int64_t created_unix_micros;
  uint64_t payload_checksum;  // XXH3-64 of the payload
  uint64_t header_checksum;   // XXH3-64 of the 56 bytes above
};
static_assert(sizeof(FileHeader) == SsdTier::kHeaderBytes);
constexpr size_t kHeaderChecksummedBytes = offsetof(FileHeader, header_checksum);

// The largest payload a file may claim (a sanity bound against corrupt headers: 1 GiB).
constexpr uint64_t kMaxPayloadBytes = 1ull << 30;

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

bool PreadAll(int fd, void* buf, size_t n, off_t offset) {
  auto* p = static_cast<char*>(buf);
  while (n > 0) {
    const ssize_t r = pread(fd, p, n, offset);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
    offset += r;
  }
  return true;
}

bool WriteAll(int fd, const void* buf, size_t n) {
  const auto* p = static_cast<const char*>(buf);
  while (n > 0) {
    const ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

// ValidHeader: magic, header checksum, sane size and (if given) the expected key.
bool ValidHeader(const FileHeader& h, const BlockKey* key) {
  if (std::memcmp(h.magic, kMagic, sizeof(kMagic)) != 0) return false;
  if (BlockChecksum(&h, kHeaderChecksummedBytes) != h.header_checksum) return false;
  if (h.payload_bytes == 0 || h.payload_bytes > kMaxPayloadBytes) return false;
  if (key != nullptr &&
      (h.layout_id != key->layout_id || h.hash_hi != key->hash_hi || h.hash_lo != key->hash_lo)) {
    return false;
  }
  return true;
}

void SetMtime(const std::string& path, absl::Time t) {
  const timespec ts = absl::ToTimespec(t);
  const timespec times[2] = {ts, ts};
  utimensat(AT_FDCWD, path.c_str(), times, 0);  // best effort: recency is a hint
}

}  // namespace

SsdTier::SsdTier(const SsdTierOptions& options) : options_(options) {}

absl::StatusOr<std::unique_ptr<SsdTier>> SsdTier::Open(const SsdTierOptions& options) {
  if (options.dir.empty()) return absl::InvalidArgumentError("ssd dir is empty");
  if (options.capacity_bytes <= 0) {
    return absl::InvalidArgumentError("ssd capacity_bytes must be > 0");
  }
  if (options.ttl <= absl::ZeroDuration()) return absl::InvalidArgumentError("ttl must be > 0");
  std::unique_ptr<SsdTier> tier(new SsdTier(options));
  absl::Status s = tier->Scan();
  if (!s.ok()) return s;
  return tier;
}

std::string SsdTier::PathOf(const BlockKey& key) const {
  return absl::StrFormat("%s/blocks/%02x/%s.blk", options_.dir, key.hash_lo & 0xff, key.ToHex());
}

absl::Status SsdTier::Scan() {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path root(options_.dir);
  fs::create_directories(root / "tmp", ec);
  if (ec) return absl::InternalError(absl::StrCat("create ", options_.dir, ": ", ec.message()));
  for (int i = 0; i < 256; ++i) {
    fs::create_directories(root / "blocks" / absl::StrFormat("%02x", i), ec);
    if (ec) return absl::InternalError(absl::StrCat("create block dirs: ", ec.message()));
  }
  // Temporary files are writes a crash interrupted: never indexed, so delete them.
  for (const auto& entry : fs::directory_iterator(root / "tmp", ec)) fs::remove(entry.path(), ec);

  struct Found {
    BlockKey key;
    int64_t payload_bytes;
    absl::Time mtime;
  };
  std::vector<Found> found;
  const absl::Time now = options_.clock();
  for (const auto& entry : fs::recursive_directory_iterator(root / "blocks", ec)) {
    if (!entry.is_regular_file()) continue;
    const std::string path = entry.path().string();
    const std::string name = entry.path().filename().string();
    BlockKey key;
    if (!absl::EndsWith(name, ".blk") ||
        !BlockKey::FromHex(std::string_view(name).substr(0, name.size() - 4), &key)) {
      continue;  // not ours: leave it alone
    }
    Fd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
    struct stat st;
    FileHeader h;
    if (fd.get() < 0 || fstat(fd.get(), &st) != 0 || !PreadAll(fd.get(), &h, sizeof(h), 0) ||
        !ValidHeader(h, &key) ||
        st.st_size != static_cast<off_t>(kHeaderBytes + h.payload_bytes) ||
        path != PathOf(key)) {
      fs::remove(entry.path(), ec);
      stats_.num_corrupt++;
      continue;
    }
    absl::Time mtime = absl::TimeFromTimespec(st.st_mtim);
    if (mtime > now) mtime = now;
    if (now - mtime > options_.ttl) {
      fs::remove(entry.path(), ec);
      stats_.num_expired++;
      continue;
    }
    found.push_back({key, static_cast<int64_t>(h.payload_bytes), mtime});
  }
  if (ec) return absl::InternalError(absl::StrCat("scan ", options_.dir, ": ", ec.message()));
  // Oldest first, so the most recent ends at the LRU front.
  std::sort(found.begin(), found.end(),
            [](const Found& a, const Found& b) { return a.mtime < b.mtime; });
  absl::MutexLock lock(&mu_);
  for (const Found& f : found) InsertLocked(f.key, f.payload_bytes, f.mtime);
  EvictToCapacityLocked(nullptr);
  return absl::OkStatus();
}

void SsdTier::InsertLocked(const BlockKey& key, int64_t payload_bytes, absl::Time last_access) {
  auto it = index_.find(key);
  if (it != index_.end()) {
    stats_.num_bytes -= it->second.file_bytes;
    stats_.num_blocks--;
    lru_.erase(it->second.lru);
    index_.erase(it);
  }
  lru_.push_front(key);
  Entry e;
  e.payload_bytes = payload_bytes;
  e.file_bytes = kHeaderBytes + payload_bytes;
  e.last_access = last_access;
  e.lru = lru_.begin();
  index_.emplace(key, e);
  stats_.num_bytes += e.file_bytes;
  stats_.num_blocks++;
}

void SsdTier::EraseLocked(const BlockKey& key) {
  auto it = index_.find(key);
  if (it == index_.end()) return;
  std::error_code ec;
  std::filesystem::remove(PathOf(key), ec);
  stats_.num_bytes -= it->second.file_bytes;
  stats_.num_blocks--;
  lru_.erase(it->second.lru);
  index_.erase(it);
}

void SsdTier::EvictToCapacityLocked(const BlockKey* keep) {
  auto it = lru_.end();
  while (stats_.num_bytes > options_.capacity_bytes && it != lru_.begin()) {
    --it;
    if (keep != nullptr && *it == *keep) continue;
    const BlockKey victim = *it;
    it = std::next(it);  // EraseLocked invalidates the victim's iterator only
    EraseLocked(victim);
    stats_.num_evicted++;
  }
}

bool SsdTier::ExpiredLocked(const Entry& e, absl::Time now) const {
  return now - e.last_access > options_.ttl;
}

absl::Status SsdTier::Write(const BlockKey& key, absl::Span<const uint8_t> payload,
                            uint64_t checksum) {
  if (payload.empty() || payload.size() > kMaxPayloadBytes) {
    return absl::InvalidArgumentError(absl::StrCat("block payload of ", payload.size(), " bytes"));
  }
  const int64_t file_bytes = kHeaderBytes + static_cast<int64_t>(payload.size());
  if (file_bytes > options_.capacity_bytes) {
    return absl::ResourceExhaustedError("block larger than the ssd tier");
  }
  const absl::Time now = options_.clock();
  FileHeader h;
  std::memcpy(h.magic, kMagic, sizeof(kMagic));
  h.layout_id = key.layout_id;
  h.hash_hi = key.hash_hi;
  h.hash_lo = key.hash_lo;
  h.payload_bytes = payload.size();
  h.created_unix_micros = absl::ToUnixMicros(now);
  h.payload_checksum = checksum;
  h.header_checksum = BlockChecksum(&h, kHeaderChecksummedBytes);

  const std::string tmp = absl::StrCat(options_.dir, "/tmp/", key.ToHex(), ".",
                                       next_tmp_.fetch_add(1), ".tmp");
  const std::string path = PathOf(key);
  bool ok;
  {
    Fd fd(open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    ok = fd.get() >= 0 && WriteAll(fd.get(), &h, sizeof(h)) &&
         WriteAll(fd.get(), payload.data(), payload.size()) &&
         (!options_.sync_writes || fdatasync(fd.get()) == 0);
  }
  if (ok) {
    SetMtime(tmp, now);
    ok = rename(tmp.c_str(), path.c_str()) == 0;
  }
  if (!ok) {
    const int err = errno;
    unlink(tmp.c_str());
    absl::MutexLock lock(&mu_);
    stats_.num_write_errors++;
    return absl::InternalError(absl::StrCat("write ", path, ": ", std::strerror(err)));
  }
  absl::MutexLock lock(&mu_);
  InsertLocked(key, static_cast<int64_t>(payload.size()), now);
  EvictToCapacityLocked(&key);
  return absl::OkStatus();
}

void SsdTier::DropCorrupt(const BlockKey& key) {
  absl::MutexLock lock(&mu_);
  if (!index_.contains(key)) {
    // Already replaced or deleted by someone else; make sure a stray bad file goes too.
    std::error_code ec;
    std::filesystem::remove(PathOf(key), ec);
  } else {
    EraseLocked(key);
  }
  stats_.num_corrupt++;
}

absl::StatusOr<bool> SsdTier::Read(const BlockKey& key, absl::Span<uint8_t> out,
                                   uint64_t* checksum) {
  {
    absl::MutexLock lock(&mu_);
    auto it = index_.find(key);
    if (it == index_.end()) return false;
    if (ExpiredLocked(it->second, options_.clock())) {
      EraseLocked(key);
      stats_.num_expired++;
      return false;
    }
    if (it->second.payload_bytes != static_cast<int64_t>(out.size())) {
      return absl::InvalidArgumentError(absl::StrCat("block ", key.ToHex(), " holds ",
                                                     it->second.payload_bytes, " bytes, not ",
                                                     out.size()));
    }
  }
  Fd fd(open(PathOf(key).c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) {
    // Deleted concurrently (evicted) or by hand: a miss; forget it if it is still indexed.
    if (errno == ENOENT) {
      absl::MutexLock lock(&mu_);
      EraseLocked(key);
      return false;
    }
    DropCorrupt(key);
    return false;
  }
  FileHeader h;
  if (!PreadAll(fd.get(), &h, sizeof(h), 0) || !ValidHeader(h, &key) ||
      h.payload_bytes != out.size() ||
      !PreadAll(fd.get(), out.data(), out.size(), kHeaderBytes) ||
      BlockChecksum(out) != h.payload_checksum) {
    DropCorrupt(key);
    return false;
  }
  *checksum = h.payload_checksum;
  Touch(key);
  return true;
}

std::optional<int64_t> SsdTier::PayloadBytes(const BlockKey& key) {
  absl::MutexLock lock(&mu_);
  auto it = index_.find(key);
  if (it == index_.end()) return std::nullopt;
  if (ExpiredLocked(it->second, options_.clock())) {
    EraseLocked(key);
    stats_.num_expired++;
    return std::nullopt;
  }
  return it->second.payload_bytes;
}

void SsdTier::Touch(const BlockKey& key) {
  const absl::Time now = options_.clock();
  {
    absl::MutexLock lock(&mu_);
    auto it = index_.find(key);
    if (it == index_.end()) return;
    it->second.last_access = now;
    lru_.splice(lru_.begin(), lru_, it->second.lru);
  }
  SetMtime(PathOf(key), now);
}

void SsdTier::Erase(const BlockKey& key) {
  absl::MutexLock lock(&mu_);
  EraseLocked(key);
}

int64_t SsdTier::ExpireOld() {
  const absl::Time now = options_.clock();
  absl::MutexLock lock(&mu_);
  int64_t n = 0;
  // The LRU back holds the oldest access: stop at the first live entry.
  while (!lru_.empty() && ExpiredLocked(index_.at(lru_.back()), now)) {
    EraseLocked(lru_.back());
    ++n;
  }
  stats_.num_expired += n;
  return n;
}

SsdTierStats SsdTier::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

}  // namespace sluice::kvstore
