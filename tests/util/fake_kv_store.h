// An in-memory KV block store for connector tests: FakeKvStore holds blocks by hash (their
// bytes kept), FakeKvBackend is a KvBlockStoreBackend over it; several connectors' backends may
// share one store. The switches let a test make the store fail in the ways a real one does.
#ifndef SLUICE_TESTS_UTIL_FAKE_KV_STORE_H_
#define SLUICE_TESTS_UTIL_FAKE_KV_STORE_H_

#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "engine/kv/block_hash.h"
#include "engine/kv/kv_connector.h"

namespace sluice::testing {

// Set the switches under `mu` while a connector may be calling; notify `cv` after clearing
// block_gets.
struct FakeKvStore {
  std::mutex mu;
  std::condition_variable cv;
  absl::flat_hash_map<BlockHash, std::vector<uint8_t>> blocks;
  absl::flat_hash_set<BlockHash> corrupt;  // listed by Exists, fail verification on Get
  bool down = false;        // every call answers Unavailable
  bool block_gets = false;  // Get waits (until its deadline) for block_gets to be cleared
  bool stall_gets = false;  // Get waits out its deadline and answers DeadlineExceeded
  int64_t num_exists_calls = 0;
};

class FakeKvBackend final : public KvBlockStoreBackend {
 public:
  explicit FakeKvBackend(FakeKvStore* store) : store_(store) {}

  absl::Status Bind(const KvConnectorLayout& layout) override {
    block_bytes_ = static_cast<size_t>(layout.block_bytes);
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<bool>> Exists(absl::Span<const BlockHash> hashes,
                                           absl::Time) override {
    std::lock_guard<std::mutex> lock(store_->mu);
    ++store_->num_exists_calls;
    if (store_->down) return absl::UnavailableError("kvstore down");
    std::vector<bool> found;
    for (const BlockHash& h : hashes) found.push_back(store_->blocks.contains(h));
    return found;
  }

  // A block is found when it is stored with this backend's block size and not corrupt.
  absl::StatusOr<std::vector<bool>> Get(absl::Span<const BlockHash> hashes,
                                        absl::Span<uint8_t> out, absl::Time deadline) override {
    std::unique_lock<std::mutex> lock(store_->mu);
    if (store_->stall_gets) {
      lock.unlock();
      absl::SleepFor(deadline - absl::Now());
      return absl::DeadlineExceededError("kvstore get: deadline exceeded");
    }
    store_->cv.wait_until(lock, absl::ToChronoTime(deadline), [&] { return !store_->block_gets; });
    if (store_->down) return absl::UnavailableError("kvstore down");
    std::vector<bool> found;
    for (size_t i = 0; i < hashes.size(); ++i) {
      auto it = store_->blocks.find(hashes[i]);
      const bool ok = it != store_->blocks.end() && it->second.size() == block_bytes_ &&
                      !store_->corrupt.contains(hashes[i]);
      if (ok) std::memcpy(out.data() + i * block_bytes_, it->second.data(), block_bytes_);
      found.push_back(ok);
    }
    return found;
  }

  // Blocks already stored are counted as present and kept (first write wins).
  absl::StatusOr<PutCounts> Put(absl::Span<const BlockHash> hashes,
                                absl::Span<const uint8_t> bytes, absl::Time) override {
    std::lock_guard<std::mutex> lock(store_->mu);
    if (store_->down) return absl::UnavailableError("kvstore down");
    PutCounts counts;
    for (size_t i = 0; i < hashes.size(); ++i) {
      auto [it, inserted] = store_->blocks.try_emplace(hashes[i]);
      if (!inserted) {
        ++counts.present;
        continue;
      }
      it->second.assign(bytes.begin() + i * block_bytes_, bytes.begin() + (i + 1) * block_bytes_);
      ++counts.stored;
    }
    return counts;
  }

 private:
  FakeKvStore* store_;
  size_t block_bytes_ = 0;
};

}  // namespace sluice::testing

#endif  // SLUICE_TESTS_UTIL_FAKE_KV_STORE_H_
