#include "engine/kv/kv_block_allocator.h"

#include <cstdio>
#include <cstdlib>

namespace sluice {

KvBlockAllocator::KvBlockAllocator(int64_t num_blocks)
    : ref_counts_(num_blocks, 0),
      cached_(num_blocks, 0),
      lru_prev_(num_blocks + 1, static_cast<int32_t>(num_blocks)),
      lru_next_(num_blocks + 1, static_cast<int32_t>(num_blocks)) {
  free_list_.reserve(num_blocks);
  // Hand out low ids first.
  for (int64_t b = num_blocks - 1; b >= 0; --b) free_list_.push_back(static_cast<int32_t>(b));
}

void KvBlockAllocator::Corrupt(const char* what, int32_t block) {
  std::fprintf(stderr, "KvBlockAllocator: %s (block %d)\n", what, block);
  std::abort();
}

void KvBlockAllocator::LruPushBack(int32_t block) {
  const int32_t sentinel = static_cast<int32_t>(ref_counts_.size());
  const int32_t last = lru_prev_[sentinel];
  lru_prev_[block] = last;
  lru_next_[block] = sentinel;
  lru_next_[last] = block;
  lru_prev_[sentinel] = block;
  ++num_lru_blocks_;
}

void KvBlockAllocator::LruUnlink(int32_t block) {
  lru_next_[lru_prev_[block]] = lru_next_[block];
  lru_prev_[lru_next_[block]] = lru_prev_[block];
  --num_lru_blocks_;
}

bool KvBlockAllocator::Allocate(int64_t n, std::vector<int32_t>& out,
                                std::vector<int32_t>* evicted) {
  if (n > num_free_blocks()) return false;
  const int32_t sentinel = static_cast<int32_t>(ref_counts_.size());
  for (int64_t i = 0; i < n; ++i) {
    int32_t block;
    if (!free_list_.empty()) {
      block = free_list_.back();
      free_list_.pop_back();
    } else {
      block = lru_next_[sentinel];  // least recently freed cached block
      LruUnlink(block);
      cached_[block] = 0;
      if (evicted == nullptr) Corrupt("evicting a cached block without an eviction list", block);
      evicted->push_back(block);
    }
    ref_counts_[block] = 1;
    out.push_back(block);
  }
  return true;
}

void KvBlockAllocator::Free(const std::vector<int32_t>& blocks) {
  for (int32_t block : blocks) {
    if (ref_counts_[block] <= 0) Corrupt("double free", block);
    if (--ref_counts_[block] > 0) continue;
    if (cached_[block]) {
      LruPushBack(block);
    } else {
      free_list_.push_back(block);
    }
  }
}

void KvBlockAllocator::Acquire(int32_t block) {
  if (ref_counts_[block] == 0) {
    if (!cached_[block]) Corrupt("acquiring an empty free block", block);
    LruUnlink(block);
  }
  ++ref_counts_[block];
}

void KvBlockAllocator::SetCached(int32_t block, bool cached) {
  if (static_cast<bool>(cached_[block]) == cached) return;
  if (ref_counts_[block] == 0) {
    // Only in-use blocks are marked (their KV was just computed); unmarking a free cached block
    // moves it to the empty pool.
    if (cached) Corrupt("marking a free block cached", block);
    LruUnlink(block);
    free_list_.push_back(block);
  }
  cached_[block] = cached ? 1 : 0;
}

}  // namespace sluice
