#include "engine/kv/kv_block_allocator.h"

#include <cstdio>
#include <cstdlib>

namespace sluice {

KvBlockAllocator::KvBlockAllocator(int64_t num_blocks) : ref_counts_(num_blocks, 0) {
  free_list_.reserve(num_blocks);
  // Hand out low ids first.
  for (int64_t b = num_blocks - 1; b >= 0; --b) free_list_.push_back(static_cast<int32_t>(b));
}

bool KvBlockAllocator::Allocate(int64_t n, std::vector<int32_t>& out) {
  if (n > num_free_blocks()) return false;
  for (int64_t i = 0; i < n; ++i) {
    int32_t block = free_list_.back();
    free_list_.pop_back();
    ref_counts_[block] = 1;
    out.push_back(block);
  }
  return true;
}

void KvBlockAllocator::Free(const std::vector<int32_t>& blocks) {
  for (int32_t block : blocks) {
    if (ref_counts_[block] <= 0) {
      std::fprintf(stderr, "KvBlockAllocator: double free of block %d\n", block);
      std::abort();
    }
    if (--ref_counts_[block] == 0) free_list_.push_back(block);
  }
}

}  // namespace sluice
