#include "services/kvstore/kvstore_buffer_pool.h"

#include <cstdlib>
#include <iterator>
#include <utility>

#include "absl/strings/str_cat.h"

namespace sluice::kvstore {
namespace {
constexpr int64_t kAlign = 64;
constexpr int64_t kPage = 4096;
}  // namespace

absl::StatusOr<std::unique_ptr<KvStoreBufferPool>> KvStoreBufferPool::Create(
    transfer::KvTransferAgent* agent, int64_t bytes) {
  if (agent == nullptr) return absl::InvalidArgumentError("a buffer pool needs a UCX agent");
  if (bytes <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("kvstore buffer pool of ", bytes, " bytes"));
  }
  const int64_t rounded = (bytes + kPage - 1) / kPage * kPage;
  void* base = std::aligned_alloc(kPage, static_cast<size_t>(rounded));
  if (base == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate a kvstore buffer pool of ", rounded, " bytes"));
  }
  absl::StatusOr<transfer::RegionHandle> region = agent->RegisterRegion(base, rounded);
  if (!region.ok()) {
    std::free(base);
    return region.status();
  }
  return std::unique_ptr<KvStoreBufferPool>(new KvStoreBufferPool(agent, *region, bytes));
}

KvStoreBufferPool::KvStoreBufferPool(transfer::KvTransferAgent* agent,
                                     transfer::RegionHandle region, int64_t bytes)
    : agent_(agent),
      region_(std::move(region)),
      base_(static_cast<uint8_t*>(region_.base)),
      state_(std::make_shared<State>()) {
  state_->free.emplace(0, bytes);
  state_->stats.arena_bytes = bytes;
}

KvStoreBufferPool::~KvStoreBufferPool() {
  (void)agent_->DeregisterRegion(region_.id);
  std::free(base_);
}

KvBlockBuffer KvStoreBufferPool::Allocate(size_t bytes) {
  const int64_t want = (static_cast<int64_t>(bytes) + kAlign - 1) / kAlign * kAlign;
  if (want > 0) {
    std::lock_guard<std::mutex> lock(state_->mu);
    for (auto it = state_->free.begin(); it != state_->free.end(); ++it) {
      if (it->second < want) continue;
      const int64_t offset = it->first, left = it->second - want;
      state_->free.erase(it);
      if (left > 0) state_->free.emplace(offset + want, left);
      state_->stats.lent_bytes += want;
      ++state_->stats.num_lent;
      std::weak_ptr<State> weak = state_;
      uint8_t* const base = base_;
      return KvBlockBuffer(base + offset, bytes, [weak, base, offset, want](uint8_t*, size_t) {
        if (std::shared_ptr<State> state = weak.lock()) Give(*state, offset, want);
      });
    }
    ++state_->stats.num_heap_fallbacks;
  }
  return KvBlockBuffer(bytes);
}

void KvStoreBufferPool::Give(State& state, int64_t offset, int64_t bytes) {
  std::lock_guard<std::mutex> lock(state.mu);
  state.stats.lent_bytes -= bytes;
  auto next = state.free.lower_bound(offset);
  if (next != state.free.end() && offset + bytes == next->first) {  // merge the one after
    bytes += next->second;
    next = state.free.erase(next);
  }
  if (next != state.free.begin()) {  // merge the one before
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {
      prev->second += bytes;
      return;
    }
  }
  state.free.emplace(offset, bytes);
}

bool KvStoreBufferPool::Contains(const void* data, size_t bytes) const {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  return p >= base_ && p + bytes <= base_ + region_.bytes;
}

KvStoreBufferPoolStats KvStoreBufferPool::stats() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->stats;
}

}  // namespace sluice::kvstore
