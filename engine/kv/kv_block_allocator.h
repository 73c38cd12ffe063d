// KvBlockAllocator: hands out fixed-size KV blocks of the paged cache.
//
// A block holds `block_size` tokens' KV for every layer. Blocks are reference-counted so a
// block can later be shared by several sequences (prefix caching); Free drops one reference
// and returns the block to the free list at zero. Not thread-safe: owned by the scheduler.
#ifndef SLUICE_ENGINE_KV_KV_BLOCK_ALLOCATOR_H_
#define SLUICE_ENGINE_KV_KV_BLOCK_ALLOCATOR_H_

#include <cstdint>
#include <vector>

namespace sluice {

class KvBlockAllocator {
 public:
  explicit KvBlockAllocator(int64_t num_blocks);

  int64_t num_total_blocks() const { return static_cast<int64_t>(ref_counts_.size()); }
  int64_t num_free_blocks() const { return static_cast<int64_t>(free_list_.size()); }

  // Allocate appends `n` fresh block ids (ref count 1) to `out` and returns true, or returns
  // false and changes nothing when fewer than `n` blocks are free.
  bool Allocate(int64_t n, std::vector<int32_t>& out);
  // Free drops one reference to each block. A block whose count reaches zero is free again.
  // Freeing a block with count zero is a corruption bug and aborts the process.
  void Free(const std::vector<int32_t>& blocks);
  int32_t ref_count(int32_t block) const { return ref_counts_[block]; }

 private:
  std::vector<int32_t> ref_counts_;  // [num_blocks]
  std::vector<int32_t> free_list_;   // LIFO: recently freed blocks are warm in cache
};

// NumBlocksFor returns ceil(num_tokens / block_size).
inline int64_t NumBlocksFor(int64_t num_tokens, int64_t block_size) {
  return (num_tokens + block_size - 1) / block_size;
}

}  // namespace sluice

#endif  // SLUICE_ENGINE_KV_KV_BLOCK_ALLOCATOR_H_
