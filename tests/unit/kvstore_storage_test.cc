// Storage tiers of the kvstore: SSD files (restart, checksums, TTL, LRU capacity), the DRAM tier
// through BlockStore (LRU eviction to SSD, promotion, leases, corruption), rendezvous hashing.
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "services/kvstore/block_store.h"
#include "services/kvstore/rendezvous.h"
#include "services/kvstore/ssd_tier.h"

namespace sluice::kvstore {
namespace {

namespace fs = std::filesystem;

// ManualClock: a clock tests move by hand (TTL without sleeping).
struct ManualClock {
  std::shared_ptr<absl::Time> now = std::make_shared<absl::Time>(absl::FromUnixSeconds(1.9e9));
  Clock clock() const {
    auto n = now;
    return [n] { return *n; };
  }
  void Advance(absl::Duration d) { *now += d; }
};

// TempDir: a fresh directory removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/kvstore_test_XXXXXX";
    path_ = mkdtemp(tmpl);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

BlockKey Key(uint64_t i, uint64_t layout = 7) { return BlockKey{layout, i * 31 + 1, i}; }

// Payload: `bytes` bytes derived from `seed` (distinct per block).
std::string Payload(uint64_t seed, size_t bytes) {
  std::string s(bytes, '\0');
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < bytes; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    s[i] = static_cast<char>(x);
  }
  return s;
}

absl::Span<const uint8_t> Bytes(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

std::unique_ptr<SsdTier> OpenSsd(const std::string& dir, int64_t capacity, const ManualClock& c) {
  SsdTierOptions o;
  o.dir = dir;
  o.capacity_bytes = capacity;
  o.ttl = absl::Hours(72);
  o.clock = c.clock();
  auto tier = SsdTier::Open(o);
  EXPECT_TRUE(tier.ok()) << tier.status();
  return tier.ok() ? std::move(*tier) : nullptr;
}

// ReadSsd: the payload of `key` or "" on a miss.
std::string ReadSsd(SsdTier& tier, const BlockKey& key, size_t bytes) {
  std::string out(bytes, '\0');
  uint64_t checksum = 0;
  auto hit = tier.Read(key, {reinterpret_cast<uint8_t*>(out.data()), out.size()}, &checksum);
  EXPECT_TRUE(hit.ok()) << hit.status();
  if (!hit.ok() || !*hit) return "";
  EXPECT_EQ(checksum, BlockChecksum(Bytes(out)));
  return out;
}

void FlipByte(const std::string& path, int64_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  ASSERT_TRUE(f.good()) << path;
  f.seekg(offset);
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x01);
  f.seekp(offset);
  f.write(&c, 1);
}

TEST(KvstoreBlockKey, HexRoundTrip) {
  const BlockKey k{0x0123456789abcdefull, 0xfedcba9876543210ull, 42};
  EXPECT_EQ(k.ToHex(), "0123456789abcdeffedcba9876543210000000000000002a");
  BlockKey back;
  ASSERT_TRUE(BlockKey::FromHex(k.ToHex(), &back));
  EXPECT_EQ(back, k);
  EXPECT_FALSE(BlockKey::FromHex("0123", &back));
  EXPECT_FALSE(BlockKey::FromHex(std::string(48, 'g'), &back));
}

TEST(KvstoreSsdTier, WriteReadAndRestartKeepsBlocks) {
  TempDir dir;
  ManualClock clock;
  const std::string a = Payload(1, 4096), b = Payload(2, 4096);
  {
    auto tier = OpenSsd(dir.path(), 1 << 20, clock);
    ASSERT_TRUE(tier->Write(Key(1), Bytes(a), BlockChecksum(Bytes(a))).ok());
    ASSERT_TRUE(tier->Write(Key(2), Bytes(b), BlockChecksum(Bytes(b))).ok());
    EXPECT_EQ(ReadSsd(*tier, Key(1), 4096), a);
    EXPECT_EQ(tier->stats().num_blocks, 2);
    EXPECT_EQ(tier->stats().num_bytes, 2 * (4096 + SsdTier::kHeaderBytes));
  }
  // A leftover temporary file (a write cut by a crash) is cleaned, never indexed.
  std::ofstream(dir.path() + "/tmp/junk.tmp") << "partial";
  auto tier = OpenSsd(dir.path(), 1 << 20, clock);
  EXPECT_EQ(tier->stats().num_blocks, 2);
  EXPECT_EQ(ReadSsd(*tier, Key(2), 4096), b);
  EXPECT_EQ(ReadSsd(*tier, Key(1), 4096), a);
  EXPECT_EQ(ReadSsd(*tier, Key(3), 4096), "");
  EXPECT_FALSE(fs::exists(dir.path() + "/tmp/junk.tmp"));
  // Asking with the wrong size is the caller's error, not a miss.
  std::string small(10, '\0');
  uint64_t c;
  EXPECT_EQ(tier->Read(Key(1), {reinterpret_cast<uint8_t*>(small.data()), 10}, &c).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(KvstoreSsdTier, CorruptPayloadIsAMissAndDeleted) {
  TempDir dir;
  ManualClock clock;
  const std::string a = Payload(1, 1000);
  auto tier = OpenSsd(dir.path(), 1 << 20, clock);
  ASSERT_TRUE(tier->Write(Key(1), Bytes(a), BlockChecksum(Bytes(a))).ok());
  const std::string path = tier->PathOf(Key(1));
  FlipByte(path, SsdTier::kHeaderBytes + 500);
  EXPECT_EQ(ReadSsd(*tier, Key(1), 1000), "");
  EXPECT_FALSE(fs::exists(path));
  EXPECT_FALSE(tier->Contains(Key(1)));
  EXPECT_EQ(tier->stats().num_corrupt, 1);
  EXPECT_EQ(tier->stats().num_blocks, 0);
}

TEST(KvstoreSsdTier, CorruptHeaderIsDroppedAtRestart) {
  TempDir dir;
  ManualClock clock;
  const std::string a = Payload(1, 1000), b = Payload(2, 1000);
  std::string path;
  {
    auto tier = OpenSsd(dir.path(), 1 << 20, clock);
    ASSERT_TRUE(tier->Write(Key(1), Bytes(a), BlockChecksum(Bytes(a))).ok());
    ASSERT_TRUE(tier->Write(Key(2), Bytes(b), BlockChecksum(Bytes(b))).ok());
    path = tier->PathOf(Key(1));
  }
  FlipByte(path, 20);  // inside the key fields
  auto tier = OpenSsd(dir.path(), 1 << 20, clock);
  EXPECT_EQ(tier->stats().num_blocks, 1);
  EXPECT_EQ(tier->stats().num_corrupt, 1);
  EXPECT_FALSE(fs::exists(path));
  EXPECT_EQ(ReadSsd(*tier, Key(2), 1000), b);
}

TEST(KvstoreSsdTier, TtlCountsFromLastAccessAndSurvivesRestart) {
  TempDir dir;
  ManualClock clock;
  const std::string a = Payload(1, 100), b = Payload(2, 100);
  {
    auto tier = OpenSsd(dir.path(), 1 << 20, clock);
    ASSERT_TRUE(tier->Write(Key(1), Bytes(a), BlockChecksum(Bytes(a))).ok());
    ASSERT_TRUE(tier->Write(Key(2), Bytes(b), BlockChecksum(Bytes(b))).ok());
    clock.Advance(absl::Hours(48));
    EXPECT_EQ(ReadSsd(*tier, Key(1), 100), a);  // refreshes key 1 only
    clock.Advance(absl::Hours(25));             // key 2: 73 h idle; key 1: 25 h
    EXPECT_EQ(tier->ExpireOld(), 1);
    EXPECT_FALSE(tier->Contains(Key(2)));
    EXPECT_TRUE(tier->Contains(Key(1)));
  }
  // The last access lives in the file's mtime: after a restart key 1 expires 72 h after its read.
  clock.Advance(absl::Hours(46));  // 71 h since the read
  {
    auto tier = OpenSsd(dir.path(), 1 << 20, clock);
    EXPECT_TRUE(tier->Contains(Key(1)));
  }
  clock.Advance(absl::Hours(2));
  auto tier = OpenSsd(dir.path(), 1 << 20, clock);
  EXPECT_FALSE(tier->Contains(Key(1)));
  EXPECT_EQ(tier->stats().num_expired, 1);
  EXPECT_EQ(tier->stats().num_blocks, 0);
}

TEST(KvstoreSsdTier, CapacityEvictsLeastRecentlyUsed) {
  TempDir dir;
  ManualClock clock;
  const int64_t file = 1000 + SsdTier::kHeaderBytes;
  auto tier = OpenSsd(dir.path(), 3 * file, clock);
  std::vector<std::string> p;
  for (int i = 0; i < 5; ++i) p.push_back(Payload(i, 1000));
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(tier->Write(Key(i), Bytes(p[i]), BlockChecksum(Bytes(p[i]))).ok());
    clock.Advance(absl::Seconds(1));
  }
  EXPECT_EQ(ReadSsd(*tier, Key(0), 1000), p[0]);  // 0 becomes the most recent; 1 the least
  clock.Advance(absl::Seconds(1));
  ASSERT_TRUE(tier->Write(Key(3), Bytes(p[3]), BlockChecksum(Bytes(p[3]))).ok());
  EXPECT_FALSE(tier->Contains(Key(1)));
  EXPECT_FALSE(fs::exists(tier->PathOf(Key(1))));
  EXPECT_TRUE(tier->Contains(Key(0)));
  EXPECT_TRUE(tier->Contains(Key(2)));
  EXPECT_TRUE(tier->Contains(Key(3)));
  EXPECT_EQ(tier->stats().num_evicted, 1);
  EXPECT_EQ(tier->stats().num_bytes, 3 * file);
  // A block larger than the whole tier is refused.
  const std::string huge = Payload(9, 4 * 1000);
  EXPECT_EQ(tier->Write(Key(9), Bytes(huge), BlockChecksum(Bytes(huge))).code(),
            absl::StatusCode::kResourceExhausted);
}

// StoreFixture: a BlockStore over a heap arena of `pages` pages of `page_bytes`.
class StoreFixture {
 public:
  StoreFixture(const std::string& dir, int pages, int64_t page_bytes, ManualClock clock,
               int64_t ssd_bytes = 1 << 24)
      : arena_(static_cast<size_t>(pages * page_bytes)) {
    BlockStoreOptions o;
    o.dram_arena = arena_.data();
    o.dram_bytes = static_cast<int64_t>(arena_.size());
    o.dram_page_bytes = page_bytes;
    o.ssd_dir = dir;
    o.ssd_bytes = ssd_bytes;
    o.clock = clock.clock();
    o.max_lease = absl::Seconds(30);
    auto s = BlockStore::Open(o);
    EXPECT_TRUE(s.ok()) << s.status();
    if (s.ok()) store = std::move(*s);
  }
  std::vector<uint8_t> arena_;
  std::unique_ptr<BlockStore> store;
};

std::vector<PutOutcome> PutOne(BlockStore& s, const BlockKey& k, const std::string& payload) {
  const std::string_view view(payload);
  auto r = s.Put({&k, 1}, {&view, 1});
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : std::vector<PutOutcome>{};
}

std::string GetOne(BlockStore& s, const BlockKey& k) {
  auto r = s.Get({&k, 1});
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() && (*r)[0] ? *(*r)[0] : "";
}

Tier ExistsOne(BlockStore& s, const BlockKey& k) { return s.Exists({&k, 1})[0]; }

TEST(KvstoreBlockStore, DramEvictsLeastRecentlyUsedToSsdAndPromotesBack) {
  TempDir dir;
  ManualClock clock;
  StoreFixture f(dir.path(), 1, 4 * 256, clock);  // one page: 4 slots of 256 bytes
  BlockStore& s = *f.store;
  std::vector<std::string> p;
  for (int i = 0; i < 6; ++i) p.push_back(Payload(i, 256));
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(PutOne(s, Key(i), p[i]), std::vector<PutOutcome>{PutOutcome::kStored});
    clock.Advance(absl::Seconds(1));
  }
  EXPECT_EQ(GetOne(s, Key(0)), p[0]);  // key 1 is now the least recently used
  clock.Advance(absl::Seconds(1));
  EXPECT_EQ(PutOne(s, Key(4), p[4]), std::vector<PutOutcome>{PutOutcome::kStored});
  EXPECT_EQ(ExistsOne(s, Key(1)), Tier::kSsd);
  EXPECT_EQ(ExistsOne(s, Key(0)), Tier::kDram);
  EXPECT_EQ(ExistsOne(s, Key(4)), Tier::kDram);
  EXPECT_EQ(ExistsOne(s, Key(5)), Tier::kNone);
  BlockStoreStats st = s.stats();
  EXPECT_EQ(st.dram_blocks, 4);
  EXPECT_EQ(st.dram_bytes, 4 * 256);
  EXPECT_EQ(st.ssd_blocks, 5);
  EXPECT_EQ(st.evictions_dram, 1);
  // Reading key 1 promotes it (evicting the next least recent, key 2) byte-exact.
  EXPECT_EQ(GetOne(s, Key(1)), p[1]);
  EXPECT_EQ(ExistsOne(s, Key(1)), Tier::kDram);
  EXPECT_EQ(ExistsOne(s, Key(2)), Tier::kSsd);
  st = s.stats();
  EXPECT_EQ(st.hits_ssd, 1);
  EXPECT_EQ(st.hits_dram, 1);
  // A put of a stored block sends nothing.
  EXPECT_EQ(PutOne(s, Key(2), p[2]), std::vector<PutOutcome>{PutOutcome::kPresent});
}

TEST(KvstoreBlockStore, RestartServesFromSsd) {
  TempDir dir;
  ManualClock clock;
  const std::string a = Payload(11, 512);
  {
    StoreFixture f(dir.path(), 2, 2048, clock);
    EXPECT_EQ(PutOne(*f.store, Key(1), a), std::vector<PutOutcome>{PutOutcome::kStored});
  }
  StoreFixture f(dir.path(), 2, 2048, clock);
  EXPECT_EQ(ExistsOne(*f.store, Key(1)), Tier::kSsd);
  EXPECT_EQ(GetOne(*f.store, Key(1)), a);
  EXPECT_EQ(f.store->stats().hits_ssd, 1);
}

TEST(KvstoreBlockStore, CorruptDramBlockIsAMissNeverWrongBytes) {
  TempDir dir;
  ManualClock clock;
  StoreFixture f(dir.path(), 1, 1024, clock);
  const std::string a = Payload(3, 1024);
  PutOne(*f.store, Key(1), a);
  f.arena_[100] ^= 0xff;  // bit rot in the slot
  EXPECT_EQ(GetOne(*f.store, Key(1)), "");
  EXPECT_EQ(f.store->stats().corrupt_blocks, 1);
  EXPECT_EQ(f.store->stats().dram_blocks, 0);
  // The SSD copy was written before the rot; the next read is served from it, intact.
  EXPECT_EQ(GetOne(*f.store, Key(1)), a);
}

TEST(KvstoreBlockStore, CorruptSsdBlockIsAMissAndDeleted) {
  TempDir dir;
  ManualClock clock;
  const std::string a = Payload(3, 1024);
  {
    StoreFixture f(dir.path(), 1, 1024, clock);
    PutOne(*f.store, Key(1), a);
  }
  StoreFixture f(dir.path(), 1, 1024, clock);
  const std::string path = f.store->ssd().PathOf(Key(1));
  FlipByte(path, SsdTier::kHeaderBytes + 7);
  EXPECT_EQ(GetOne(*f.store, Key(1)), "");
  EXPECT_FALSE(fs::exists(path));
  EXPECT_EQ(ExistsOne(*f.store, Key(1)), Tier::kNone);
  const BlockStoreStats st = f.store->stats();
  EXPECT_EQ(st.corrupt_blocks, 1);
  EXPECT_EQ(st.misses, 1);
  EXPECT_EQ(st.dram_blocks, 0);  // the promotion slot was freed
}

TEST(KvstoreBlockStore, CommitRefusesBytesThatDoNotMatchTheClientChecksum) {
  TempDir dir;
  ManualClock clock;
  StoreFixture f(dir.path(), 1, 1024, clock);
  const BlockKey k = Key(1);
  auto grant = f.store->BeginPut({&k, 1}, 1024, absl::Seconds(5));
  ASSERT_TRUE(grant.ok());
  ASSERT_EQ(grant->outcomes[0], PutOutcome::kStored);
  const std::string a = Payload(5, 1024);
  std::memcpy(f.store->slot_data(grant->slots[0]), a.data(), a.size());
  const uint64_t wrong = BlockChecksum(Bytes(a)) ^ 1;
  auto out = f.store->CommitPut(grant->lease_id, {&wrong, 1});
  ASSERT_TRUE(out.ok());
  EXPECT_EQ((*out)[0], PutOutcome::kChecksumMismatch);
  EXPECT_EQ(ExistsOne(*f.store, k), Tier::kNone);
  EXPECT_EQ(f.store->stats().put_checksum_mismatches, 1);
  EXPECT_EQ(f.store->CommitPut(grant->lease_id, {&wrong, 1}).status().code(),
            absl::StatusCode::kNotFound);
  // The slot came back: a correct put fits in the one-slot page.
  EXPECT_EQ(PutOne(*f.store, k, a), std::vector<PutOutcome>{PutOutcome::kStored});
}

TEST(KvstoreBlockStore, LeasedSlotsAreNotEvictedUntilReleasedOrExpired) {
  TempDir dir;
  ManualClock clock;
  StoreFixture f(dir.path(), 1, 2 * 512, clock);  // two slots
  BlockStore& s = *f.store;
  PutOne(s, Key(1), Payload(1, 512));
  PutOne(s, Key(2), Payload(2, 512));
  const BlockKey both[2] = {Key(1), Key(2)};
  auto get = s.BeginGet(both, absl::Seconds(10));
  ASSERT_TRUE(get.ok());
  ASSERT_TRUE(get->blocks[0] && get->blocks[1]);
  EXPECT_EQ(s.stats().active_leases, 1);
  EXPECT_EQ(PutOne(s, Key(3), Payload(3, 512)), std::vector<PutOutcome>{PutOutcome::kNoSpace});
  ASSERT_TRUE(s.Release(get->lease_id).ok());
  EXPECT_EQ(s.Release(get->lease_id).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(PutOne(s, Key(3), Payload(3, 512)), std::vector<PutOutcome>{PutOutcome::kStored});

  // An abandoned put lease frees its slot once it expires.
  const BlockKey k4 = Key(4);
  auto put = s.BeginPut({&k4, 1}, 512, absl::Seconds(5));
  ASSERT_TRUE(put.ok());
  ASSERT_EQ(put->outcomes[0], PutOutcome::kStored);
  auto get2 = s.BeginGet({&both[0], 1}, absl::Seconds(5));  // pins the other slot
  ASSERT_TRUE(get2.ok() && get2->blocks[0]);
  const BlockKey k5 = Key(5);
  EXPECT_EQ(PutOne(s, k5, Payload(5, 512)), std::vector<PutOutcome>{PutOutcome::kNoSpace});
  clock.Advance(absl::Seconds(6));
  EXPECT_EQ(PutOne(s, k5, Payload(5, 512)), std::vector<PutOutcome>{PutOutcome::kStored});
  const uint64_t c = 0;
  EXPECT_EQ(s.CommitPut(put->lease_id, {&c, 1}).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.stats().active_leases, 0);
}

TEST(KvstoreBlockStore, TtlExpiresIdleBlocksInBothTiers) {
  TempDir dir;
  ManualClock clock;
  StoreFixture f(dir.path(), 1, 4 * 256, clock);
  BlockStore& s = *f.store;
  const std::string a = Payload(1, 256), b = Payload(2, 256);
  PutOne(s, Key(1), a);
  PutOne(s, Key(2), b);
  clock.Advance(absl::Hours(71));
  EXPECT_EQ(GetOne(s, Key(1)), a);  // used: its clock restarts
  clock.Advance(absl::Hours(2));
  EXPECT_EQ(ExistsOne(s, Key(2)), Tier::kNone);
  s.ExpireOld();
  EXPECT_EQ(GetOne(s, Key(2)), "");
  EXPECT_EQ(GetOne(s, Key(1)), a);
  const BlockStoreStats st = s.stats();
  EXPECT_EQ(st.dram_blocks, 1);
  EXPECT_EQ(st.ssd_blocks, 1);
  EXPECT_EQ(st.expired, 2);  // key 2 in DRAM and on SSD
}

TEST(KvstoreBlockStore, LayoutsShareTheArenaByPages) {
  TempDir dir;
  ManualClock clock;
  StoreFixture f(dir.path(), 2, 1024, clock);  // two pages
  BlockStore& s = *f.store;
  const std::string small = Payload(1, 256), big = Payload(2, 1024);
  EXPECT_EQ(PutOne(s, Key(1, /*layout=*/1), small), std::vector<PutOutcome>{PutOutcome::kStored});
  EXPECT_EQ(PutOne(s, Key(2, 2), big), std::vector<PutOutcome>{PutOutcome::kStored});
  // Layout 3 takes back a page (its blocks go to SSD), and everything is still readable.
  EXPECT_EQ(PutOne(s, Key(3, 3), big), std::vector<PutOutcome>{PutOutcome::kStored});
  EXPECT_EQ(GetOne(s, Key(1, 1)), small);
  EXPECT_EQ(GetOne(s, Key(2, 2)), big);
  EXPECT_EQ(GetOne(s, Key(3, 3)), big);
  // A layout's block size is fixed; keys must be distinct; sizes must fit a page.
  const std::string odd = Payload(4, 128);
  const std::string_view v(odd);
  const BlockKey k = Key(9, 1);
  EXPECT_EQ(s.Put({&k, 1}, {&v, 1}).status().code(), absl::StatusCode::kInvalidArgument);
  const BlockKey dup[2] = {Key(5), Key(5)};
  EXPECT_EQ(s.BeginGet(dup, absl::Seconds(1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.BeginPut({&k, 1}, 4096, absl::Seconds(1)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(KvstoreBlockStore, OpenRejectsBadOptions) {
  BlockStoreOptions o;
  EXPECT_EQ(BlockStore::Open(o).status().code(), absl::StatusCode::kInvalidArgument);
  std::vector<uint8_t> arena(100);
  o.dram_arena = arena.data();
  o.dram_bytes = 100;
  o.dram_page_bytes = 1024;
  EXPECT_EQ(BlockStore::Open(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.dram_page_bytes = 100;
  o.ssd_dir = "";
  o.ssd_bytes = 1000;
  EXPECT_EQ(BlockStore::Open(o).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(KvstoreBlockStore, ConcurrentPutsAndGetsNeverReturnWrongBytes) {
  TempDir dir;
  ManualClock clock;
  // 6 slots for 48 keys: constant eviction to SSD, promotion back, and races on the same keys
  // (two puts of one key, two readers promoting one key, eviction next to a reader's lease).
  StoreFixture f(dir.path(), 2, 3 * 512, clock);
  BlockStore& s = *f.store;
  constexpr int kKeys = 48;
  std::vector<std::string> payload;
  for (int i = 0; i < kKeys; ++i) payload.push_back(Payload(500 + i, 512));
  std::atomic<int> wrong{0}, hits{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      uint64_t x = 88172645463325252ull + t;
      for (int step = 0; step < 300; ++step) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        const int a = static_cast<int>(x % kKeys), b = static_cast<int>((x >> 20) % kKeys);
        if (x & (1ull << 40)) {
          const std::string_view v(payload[a]);
          const BlockKey k = Key(a);
          (void)s.Put({&k, 1}, {&v, 1});
        } else {
          BlockKey keys[2] = {Key(a), Key(b)};
          const int n = a == b ? 1 : 2;
          auto got = s.Get({keys, static_cast<size_t>(n)});
          if (!got.ok()) {
            wrong++;
            continue;
          }
          for (int j = 0; j < n; ++j) {
            if (!(*got)[j]) continue;
            hits++;
            if (*(*got)[j] != payload[j == 0 ? a : b]) wrong++;
          }
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_GT(hits.load(), 0);
  const BlockStoreStats st = s.stats();
  EXPECT_EQ(st.active_leases, 0);
  EXPECT_EQ(st.corrupt_blocks, 0);
  EXPECT_LE(st.dram_blocks, 6);
  // Every key ever put is still readable, byte-exact, from one tier or the other.
  for (int i = 0; i < kKeys; ++i) {
    if (ExistsOne(s, Key(i)) != Tier::kNone) {
      EXPECT_EQ(GetOne(s, Key(i)), payload[i]) << i;
    }
  }
}

TEST(KvstoreRendezvous, AddingAShardMovesAboutOneNthOfTheKeysAllToIt) {
  std::vector<std::string> names;
  for (int i = 0; i < 4; ++i) names.push_back(absl::StrCat("kvstore-", i, ".kvstore:7300"));
  const RendezvousHash four(names);
  names.push_back("kvstore-4.kvstore:7300");
  const RendezvousHash five(names);
  // Reordering the list does not change any owner's name.
  std::vector<std::string> reversed(names.rbegin(), names.rend());
  const RendezvousHash five_reversed(reversed);

  constexpr int kKeys = 20000;
  int moved = 0;
  std::vector<int> load(5, 0);
  for (int i = 0; i < kKeys; ++i) {
    const BlockKey k{3, static_cast<uint64_t>(i) * 0x9E3779B97F4A7C15ull, static_cast<uint64_t>(i)};
    const int before = four.Pick(k);
    const int after = five.Pick(k);
    load[after]++;
    EXPECT_EQ(names[after], reversed[five_reversed.Pick(k)]);
    if (before != after) {
      ++moved;
      EXPECT_EQ(after, 4) << "a key moved between two old shards";
    }
  }
  // Expected share 1/5 = 4000 keys; binomial sd ~ 57, so +-400 is far outside noise.
  EXPECT_NEAR(moved, kKeys / 5, 400);
  for (int n : load) EXPECT_NEAR(n, kKeys / 5, 400);
  EXPECT_EQ(RendezvousHash({}).Pick(BlockKey{}), -1);
}

}  // namespace
}  // namespace sluice::kvstore
