// KvBlockAllocator: hands out fixed-size KV blocks of the paged cache.
//
// A block holds `block_size` tokens' KV for every layer. Blocks are reference-counted so one
// block can be shared by several sequences (prefix caching). A block whose count drops to zero
// is free: an empty free block goes back to the free list; a block marked cached (its content is
// addressable by a block hash, see PrefixCache) goes to the tail of an LRU list instead, where it
// stays reusable (Acquire) until Allocate runs out of empty blocks and evicts it from the LRU
// head. Not thread-safe: owned by the scheduler.
#ifndef SLUICE_ENGINE_KV_KV_BLOCK_ALLOCATOR_H_
#define SLUICE_ENGINE_KV_KV_BLOCK_ALLOCATOR_H_

#include <cstdint>
#include <vector>

namespace sluice {

class KvBlockAllocator {
 public:
  explicit KvBlockAllocator(int64_t num_blocks);

  int64_t num_total_blocks() const { return static_cast<int64_t>(ref_counts_.size()); }
  // Free blocks: empty ones plus cached ones nobody references (those are evictable).
  int64_t num_free_blocks() const {
    return static_cast<int64_t>(free_list_.size()) + num_lru_blocks_;
  }
  int64_t num_evictable_blocks() const { return num_lru_blocks_; }

  // Allocate appends `n` fresh block ids (ref count 1) to `out` and returns true, or returns
  // false and changes nothing when fewer than `n` blocks are free. Empty blocks go first; then
  // the least recently freed cached blocks are evicted (their cached mark cleared) and their ids
  // appended to `evicted` (may be null only when no block is ever marked cached).
  bool Allocate(int64_t n, std::vector<int32_t>& out, std::vector<int32_t>* evicted = nullptr);
  // Free drops one reference to each block, in the given order (later blocks of a call become
  // more recently used). Freeing a block with count zero is a corruption bug and aborts.
  void Free(const std::vector<int32_t>& blocks);
  // Acquire adds a reference to a block that is in use or cached (a free cached block leaves
  // the LRU). Acquiring an empty free block is a bug and aborts.
  void Acquire(int32_t block);
  // SetCached marks or unmarks a block's content as addressable. Unmarking a free cached block
  // moves it from the LRU to the empty free list.
  void SetCached(int32_t block, bool cached);
  bool is_cached(int32_t block) const { return cached_[block] != 0; }
  int32_t ref_count(int32_t block) const { return ref_counts_[block]; }

 private:
  void LruPushBack(int32_t block);
  void LruUnlink(int32_t block);
  [[noreturn]] static void Corrupt(const char* what, int32_t block);

  std::vector<int32_t> ref_counts_;  // [num_blocks]
  std::vector<uint8_t> cached_;      // [num_blocks] 1: content addressable by a block hash
  std::vector<int32_t> free_list_;   // empty free blocks, LIFO: recently freed are warm
  // Intrusive doubly linked LRU of free cached blocks; index num_blocks is the sentinel.
  std::vector<int32_t> lru_prev_;  // [num_blocks + 1]
  std::vector<int32_t> lru_next_;  // [num_blocks + 1]
  int64_t num_lru_blocks_ = 0;
};

// NumBlocksFor returns ceil(num_tokens / block_size).
inline int64_t NumBlocksFor(int64_t num_tokens, int64_t block_size) {
  return (num_tokens + block_size - 1) / block_size;
}

}  // namespace sluice

#endif  // SLUICE_ENGINE_KV_KV_BLOCK_ALLOCATOR_H_
