// The kvstore's request handling with arbitrary requests: the gRPC service's inline calls
// (KvStoreService::PutInline/GetInline/Exists/Release/PutCommit, called directly, no network)
// and the two-phase put/get of its BlockStore that the UCX path drives (BeginPut with any
// block size, CommitPut with right, wrong or missing checksums, BeginGet, Release of known and
// unknown leases), over a small DRAM arena and SSD tier so eviction and promotion happen.
//
// Input: a sequence of operations, each an opcode byte and argument bytes. Checks beyond "no
// crash": a block read back (inline or through a get lease) has exactly the bytes last stored
// under its key, and the checksum the store reports for it.
#include <sys/types.h>
#include <unistd.h>
#include <xxhash.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "services/kvstore/block_store.h"
#include "services/kvstore/kvstore_service.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

namespace kvstore = sluice::kvstore;
namespace v1 = sluice::v1;

constexpr int64_t kPageBytes = 16 << 10;
constexpr int64_t kArenaBytes = 4 * kPageBytes;
const int64_t kBlockSizes[] = {64, 64, 128, 4096, 0, -8, kPageBytes, kPageBytes + 1, 1000};

struct Key {
  uint64_t layout, hash;
  bool operator<(const Key& o) const { return std::tie(layout, hash) < std::tie(o.layout, o.hash); }
};

class Harness {
 public:
  explicit Harness(sluice::fuzz::Input* in) : in_(in) {}

  Key NextKey() { return Key{in_->Byte() % 3u, in_->Byte() % 6u}; }
  kvstore::BlockKey ToBlockKey(Key k) { return kvstore::BlockKey{k.layout, k.hash, ~k.hash}; }
  void SetId(Key k, v1::BlockId* id) {
    id->set_layout_id(k.layout);
    id->set_hash_hi(k.hash);
    id->set_hash_lo(~k.hash);
  }
  std::string Payload(Key k, int64_t size, uint8_t salt) {
    std::string p(static_cast<size_t>(std::max<int64_t>(size, 0)), '\0');
    for (size_t i = 0; i < p.size(); ++i) p[i] = static_cast<char>(k.hash * 31 + salt + i * 7);
    return p;
  }
  // CheckRead: `bytes` read for `k` must be what was last stored under it.
  void CheckRead(Key k, std::string_view bytes) {
    auto it = stored_.find(k);
    if (it == stored_.end() || it->second != bytes) __builtin_trap();
  }

  void Run(kvstore::BlockStore& store, kvstore::KvStoreService& service) {
    for (int step = 0; step < 64; ++step) {
      const uint8_t op = in_->Byte();
      if (op == 0 && step > 0) return;  // input exhausted
      switch (op % 8) {
        case 0: case 1: {  // PutInline
          v1::KvPutInlineRequest req;
          v1::KvPutInlineResponse resp;
          const int n = 1 + in_->Byte() % 3;
          const int64_t size = kBlockSizes[in_->Byte() % std::size(kBlockSizes)];
          const uint8_t salt = in_->Byte();
          std::vector<Key> keys;
          for (int i = 0; i < n; ++i) {
            keys.push_back(NextKey());
            SetId(keys.back(), req.add_blocks());
            // A ragged size now and then: every payload must have the call's size.
            req.add_payloads(Payload(keys.back(), size + ((salt & 0x80) && i == 1 ? 1 : 0), salt));
          }
          if (service.PutInline(nullptr, &req, &resp).ok()) {
            if (resp.outcomes_size() != n) __builtin_trap();
            for (int i = 0; i < n; ++i) {
              if (resp.outcomes(i) == v1::KV_PUT_STORED) stored_[keys[i]] = req.payloads(i);
            }
          }
          break;
        }
        case 2: {  // GetInline
          v1::KvGetInlineRequest req;
          v1::KvGetInlineResponse resp;
          std::vector<Key> keys;
          for (int i = 1 + in_->Byte() % 3; i > 0; --i) {
            keys.push_back(NextKey());
            SetId(keys.back(), req.add_blocks());
          }
          if (service.GetInline(nullptr, &req, &resp).ok()) {
            for (size_t i = 0; i < keys.size(); ++i) {
              if (resp.found(i)) CheckRead(keys[i], resp.payloads(i));
            }
          }
          break;
        }
        case 3: {  // Exists, Stats, Health
          v1::KvExistsRequest req;
          v1::KvExistsResponse resp;
          for (int i = in_->Byte() % 4; i > 0; --i) SetId(NextKey(), req.add_blocks());
          (void)service.Exists(nullptr, &req, &resp);
          v1::KvStatsResponse stats;
          (void)service.Stats(nullptr, nullptr, &stats);
          break;
        }
        case 4: {  // BeginPut (the UCX path's first phase), then the client's writes
          const int n = 1 + in_->Byte() % 3;
          const int64_t size = kBlockSizes[in_->Byte() % std::size(kBlockSizes)];
          const uint8_t salt = in_->Byte();
          std::vector<kvstore::BlockKey> keys;
          std::vector<Key> ks;
          for (int i = 0; i < n; ++i) {
            ks.push_back(NextKey());
            keys.push_back(ToBlockKey(ks.back()));
          }
          auto grant = store.BeginPut(keys, size, absl::Milliseconds(in_->Byte() * 100));
          if (!grant.ok()) break;
          PendingPut pending{grant->lease_id, ks, {}, {}};
          for (int i = 0; i < n; ++i) {
            std::string bytes = Payload(ks[i], size, salt);
            if (grant->outcomes[i] == kvstore::PutOutcome::kStored) {
              const kvstore::SlotId slot = grant->slots[i];
              if (store.page(slot.page).block_bytes != size) __builtin_trap();
              std::memcpy(store.slot_data(slot), bytes.data(), bytes.size());
            }
            pending.checksums.push_back(XXH3_64bits(bytes.data(), bytes.size()));
            pending.bytes.push_back(std::move(bytes));
          }
          puts_.push_back(std::move(pending));
          break;
        }
        case 5: {  // CommitPut through the service: a known lease or any id, checksums right,
                   // corrupted or of the wrong count, the lease's token or a forged one
          v1::KvPutCommitRequest req;
          v1::KvPutCommitResponse resp;
          const uint8_t how = in_->Byte();
          PendingPut* put = puts_.empty() ? nullptr : &puts_[how % puts_.size()];
          req.set_lease_id(put != nullptr && !(how & 0x40) ? put->lease_id : how);
          const bool forged = how & 0x10;
          req.set_lease_token(forged ? std::string(16, static_cast<char>(how))
                                     : service.LeaseToken(req.lease_id()));
          if (put != nullptr) {
            for (size_t i = 0; i < put->checksums.size(); ++i) {
              req.add_checksums(put->checksums[i] ^ ((how & 0x80) && i == 0 ? 1 : 0));
            }
            if (how & 0x20) req.add_checksums(0);
          }
          const bool committed = service.PutCommit(nullptr, &req, &resp).ok();
          if (committed && forged) __builtin_trap();  // a forged token was accepted
          if (committed && put != nullptr && req.lease_id() == put->lease_id) {
            for (int i = 0; i < resp.outcomes_size() && i < static_cast<int>(put->keys.size()); ++i) {
              if (resp.outcomes(i) == v1::KV_PUT_STORED) {
                if (how & 0x80 && i == 0) __builtin_trap();  // a wrong checksum was stored
                stored_[put->keys[i]] = put->bytes[i];
              }
            }
          }
          break;
        }
        case 6: {  // BeginGet (the UCX read path) and the slot contents it leases
          std::vector<kvstore::BlockKey> keys;
          std::vector<Key> ks;
          for (int i = 1 + in_->Byte() % 3; i > 0; --i) {
            ks.push_back(NextKey());
            keys.push_back(ToBlockKey(ks.back()));
          }
          auto grant = store.BeginGet(keys, absl::Milliseconds(in_->Byte() * 100));
          if (!grant.ok()) break;
          for (size_t i = 0; i < ks.size(); ++i) {
            if (!grant->blocks[i]) continue;
            const kvstore::SlotId slot = grant->blocks[i]->slot;
            const std::string_view bytes(reinterpret_cast<const char*>(store.slot_data(slot)),
                                         static_cast<size_t>(store.page(slot.page).block_bytes));
            CheckRead(ks[i], bytes);
            if (XXH3_64bits(bytes.data(), bytes.size()) != grant->blocks[i]->checksum) {
              __builtin_trap();
            }
          }
          if (grant->lease_id != 0) gets_.push_back(grant->lease_id);
          break;
        }
        default: {  // Release: a known lease or any id
          v1::KvReleaseRequest req;
          v1::KvReleaseResponse resp;
          const uint8_t which = in_->Byte();
          if (!gets_.empty() && (which & 1)) {
            req.set_lease_id(gets_[which % gets_.size()]);
          } else if (!puts_.empty() && (which & 2)) {
            req.set_lease_id(puts_[which % puts_.size()].lease_id);
          } else {
            req.set_lease_id(which);
          }
          const bool forged = which & 4;
          req.set_lease_token(forged ? std::string(16, static_cast<char>(which))
                                     : service.LeaseToken(req.lease_id()));
          if (service.Release(nullptr, &req, &resp).ok() && forged) __builtin_trap();
          break;
        }
      }
    }
  }

 private:
  struct PendingPut {
    uint64_t lease_id;
    std::vector<Key> keys;
    std::vector<uint64_t> checksums;
    std::vector<std::string> bytes;
  };
  sluice::fuzz::Input* in_;
  std::map<Key, std::string> stored_;
  std::vector<PendingPut> puts_;
  std::vector<uint64_t> gets_;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static std::vector<uint8_t>* arena = new std::vector<uint8_t>(kArenaBytes);
  static const std::string dir = "/dev/shm/sluice_kvstore_fuzz_" + std::to_string(getpid());
  // Each input starts from an empty store: drop the previous input's block files (keeping the
  // 256 block folders, whose re-creation made the target 10x slower).
  std::error_code ec;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir, ec)) {
    if (entry.is_regular_file()) std::filesystem::remove(entry.path(), ec);
  }
  kvstore::BlockStoreOptions options;
  options.dram_arena = arena->data();
  options.dram_bytes = kArenaBytes;
  options.dram_page_bytes = kPageBytes;
  options.ssd_dir = dir;
  options.ssd_bytes = 4 * kArenaBytes;
  auto store = kvstore::BlockStore::Open(options);
  if (!store.ok()) {
    std::fprintf(stderr, "fuzz: %s\n", store.status().ToString().c_str());
    std::abort();
  }
  kvstore::KvStoreService service(store->get(), /*agent=*/nullptr);
  sluice::fuzz::Input in(data, size);
  Harness(&in).Run(**store, service);
  return 0;
}
