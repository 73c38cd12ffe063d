// KvStoreBufferPool: a host arena (page-aligned heap memory, registered with a UCX agent: the
// worker only initiates RMA from and into it, so it need not be memory the store maps), lent out as KvBlockBuffers, so the blocks a worker writes through to the kvstore, and those
// it loads, move by one-sided RMA straight from and into the buffer the engine gathers into
// and scatters from (on a GPU worker: device -> pinned staging slots -> this buffer -> UCX put
// into the store's DRAM slots, and back). First fit over the arena, neighbours merged on
// release; a request that does not fit gets heap memory (the caller then moves it by the inline
// gRPC calls), counted, never a wait.
//
// Thread safety: every method may be called from any thread; buffers may be released on any
// thread, also after the pool is gone (the release is then a no-op; the memory itself lives as
// as long as the pool, which the owner must keep past the last buffer it uses).
#ifndef SLUICE_SERVICES_KVSTORE_KVSTORE_BUFFER_POOL_H_
#define SLUICE_SERVICES_KVSTORE_KVSTORE_BUFFER_POOL_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>

#include "absl/status/statusor.h"
#include "engine/kv/kv_block_buffer.h"
#include "transfer/kv_transfer.h"

namespace sluice::kvstore {

struct KvStoreBufferPoolStats {
  int64_t arena_bytes = 0;
  int64_t lent_bytes = 0;          // now
  int64_t num_lent = 0;            // buffers lent from the arena, ever
  int64_t num_heap_fallbacks = 0;  // requests that got heap memory (arena full)
};

class KvStoreBufferPool {
 public:
  // Create allocates `bytes` and registers them with `agent` (not owned; must outlive the pool).
  // Errors: InvalidArgument for bytes <= 0 or no agent; ResourceExhausted; those of
  // RegisterRegion.
  static absl::StatusOr<std::unique_ptr<KvStoreBufferPool>> Create(transfer::KvTransferAgent* agent,
                                                                   int64_t bytes);
  ~KvStoreBufferPool();  // deregisters and frees the arena
  KvStoreBufferPool(const KvStoreBufferPool&) = delete;
  KvStoreBufferPool& operator=(const KvStoreBufferPool&) = delete;

  // Allocate: `bytes` of the arena (64-byte aligned), else of the heap. Never blocks.
  KvBlockBuffer Allocate(size_t bytes);
  // Contains: whether [data, data + bytes) lies in the registered arena (RMA can move it).
  bool Contains(const void* data, size_t bytes) const;
  KvStoreBufferPoolStats stats() const;

 private:
  struct State {
    std::mutex mu;
    std::map<int64_t, int64_t> free;  // offset -> bytes, disjoint, merged
    KvStoreBufferPoolStats stats;
  };
  // `bytes` of `region` (its size rounded up to whole pages) are lent.
  KvStoreBufferPool(transfer::KvTransferAgent* agent, transfer::RegionHandle region,
                    int64_t bytes);
  static void Give(State& state, int64_t offset, int64_t bytes);

  transfer::KvTransferAgent* const agent_;
  const transfer::RegionHandle region_;
  uint8_t* const base_;
  std::shared_ptr<State> state_;
};

}  // namespace sluice::kvstore

#endif  // SLUICE_SERVICES_KVSTORE_KVSTORE_BUFFER_POOL_H_
