// KvConnector: the engine's one interface to KV that lives outside its paged cache
// (docs/design.md, "One KV-connector interface, two sides"; services/kvstore/README.md).
//
// Scheduler side (engine thread, never blocks):
//   * at admission, after the local prefix-cache hit, the scheduler asks StartLoad for the
//     prompt's next full blocks (by block hash); the request waits in a "loading" state (not in
//     the waiting queue, holding only its local prefix blocks) while the engine keeps stepping;
//   * PollLoads hands back finished loads: the leading run of requested blocks that were found
//     and verified, as bytes. The engine allocates blocks for them, scatters the bytes in, counts
//     those tokens as computed and registers the blocks in the local prefix cache. A miss, a
//     checksum failure or a deadline cuts the run there: the rest is computed (never wrong KV).
// Worker side (after each step, engine thread):
//   * Save hands newly full, computed blocks (copied out of the cache, so a block can be reused
//     at once while the copy is written) to the connector, which writes them through off the
//     request's critical path, best effort.
//
// Block bytes (the one serialization every connector and the kvstore see; layout-blind stores
// keep it opaque): one block's KV over all layers, per layer its K then its V:
//   [L0.K | L0.V | L1.K | L1.V | ... ], piece = block_size * floats_per_token values in token
//   order (the KvCache layout of that block, engine/model/model.h): float32 on the CPU engine,
//   the device cache's dtype (bf16) for a model that keeps its KV on the GPU, whose blocks move
//   device -> pinned host -> store and back (Model::GatherKvBlocks, engine/kv/staged_kv_blocks.h;
//   the MLA latent cache has no V piece).
// Its meaning is fixed by the engine's KV identity (KvLayoutIdentity: model id, block size, dtype,
// layers and floats per token), which seeds every block hash, so two layouts never share a key:
// a bf16 GPU worker and a float32 CPU worker of one model miss each other's blocks.
// SWA bounded replay (EngineOptions::swa_replay_tokens on a sliding-window model): a block holds
// only the full-attention layers, in increasing order ([L3.K | L3.V | L7.K | L7.V] on
// sluice-mini-swa), and the identity given to Bind ends in ";stored_layers=3,7", so a store
// shared with engines that keep every layer never mixes the two.
#ifndef SLUICE_ENGINE_KV_KV_CONNECTOR_H_
#define SLUICE_ENGINE_KV_KV_CONNECTOR_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "engine/kv/block_hash.h"
#include "engine/kv/kv_block_buffer.h"
#include "engine/model/model.h"

namespace sluice {

// KvConnectorLayout: what a connector learns from the engine once (Bind).
struct KvConnectorLayout {
  std::string kv_identity;  // BlockHasher identity (KvLayoutIdentity)
  int64_t block_size = 0;   // tokens per block
  int64_t block_bytes = 0;  // serialized bytes of one block (KvBlockBytes)
};

// `layers` below: the serialized layers' ids, increasing (empty: every layer).
// KvBlockBytes: bytes of one serialized block = block_size * bytes per token of `layers`, with
// `dtype_bytes` per element (4: the host KvCache's float32; Model::KvDtypeBytes for device KV).
int64_t KvBlockBytes(const KvCacheSpec& spec, int64_t block_size,
                     absl::Span<const int32_t> layers = {}, int64_t dtype_bytes = 4);
// GatherKvBlock copies cache block `block` into `out` (KvBlockBytes bytes, layout above).
void GatherKvBlock(const KvCache& cache, int32_t block, absl::Span<uint8_t> out,
                   absl::Span<const int32_t> layers = {});
// ScatterKvBlock writes serialized `in` (KvBlockBytes bytes) into cache block `block`; other
// layers' entries are left as they are.
void ScatterKvBlock(absl::Span<const uint8_t> in, int32_t block, KvCache& cache,
                    absl::Span<const int32_t> layers = {});

// KvLoadResult: one finished load.
struct KvLoadResult {
  uint64_t ticket = 0;      // StartLoad's ticket
  int64_t num_blocks = 0;   // leading requested blocks found and verified
  KvBlockBuffer bytes;      // num_blocks * block_bytes, in request order
  absl::Status error;       // why the run stopped early, if it failed (informational)
};

// KvConnectorStats: cumulative, for metrics and tests.
struct KvConnectorStats {
  int64_t num_loads = 0;             // StartLoad calls
  int64_t num_load_queried_blocks = 0;
  int64_t num_loaded_blocks = 0;     // handed back verified
  int64_t num_load_errors = 0;       // loads that hit a store error or deadline
  int64_t num_load_skipped = 0;      // loads answered empty during a failure back-off
  int64_t num_saved_blocks = 0;      // written now
  int64_t num_save_present_blocks = 0;  // already stored
  int64_t num_save_failed_blocks = 0;   // not stored (store error, no space, deadline)
  int64_t num_save_dropped_blocks = 0;  // not attempted: the save queue was full
  // Block bytes moved to and from the store, by path: one-sided RMA between registered memory
  // (the kvstore's data path), or carried in RPC messages (fallback). Zero for backends that
  // do not tell (KvBlockStoreBackend::transfer_bytes).
  int64_t num_rma_bytes = 0;
  int64_t num_inline_bytes = 0;
};

class KvConnector {
 public:
  virtual ~KvConnector() = default;
  // Bind: called by the engine before any other call (by each engine sharing the connector).
  // Errors: InvalidArgument for a bad layout; FailedPrecondition for a layout the connector
  // cannot serve beside one it is bound to (AsyncKvConnector serves exactly one).
  virtual absl::Status Bind(const KvConnectorLayout& layout) = 0;
  // StartLoad: look up and fetch `hashes` (consecutive full blocks of one sequence, chain order).
  // Never blocks; the result comes from PollLoads under `ticket`, always, within the connector's
  // deadline.
  virtual void StartLoad(uint64_t ticket, std::vector<BlockHash> hashes) = 0;
  // PollLoads: loads finished since the last call. Never blocks.
  virtual std::vector<KvLoadResult> PollLoads() = 0;
  // Save: write `hashes`' blocks (bytes = hashes.size() * block_bytes, owned now) through.
  // Never blocks; best effort.
  virtual void Save(std::vector<BlockHash> hashes, KvBlockBuffer bytes) = 0;
  virtual KvConnectorStats stats() const = 0;
  // AllocateBlockBuffer: a buffer of `bytes` for blocks to Save, in the memory the connector
  // moves fastest (a connector whose store client does RMA lends registered memory, so the
  // engine's gather is the only copy on the host). Never blocks: heap memory when none is free.
  virtual KvBlockBuffer AllocateBlockBuffer(size_t bytes) { return KvBlockBuffer(bytes); }
};

// KvBlockStoreBackend: a synchronous block store (the kvstore client, a fake in tests) under
// AsyncKvConnector. Called from the connector's threads only, one call at a time per thread.
class KvBlockStoreBackend {
 public:
  virtual ~KvBlockStoreBackend() = default;
  virtual absl::Status Bind(const KvConnectorLayout& layout) = 0;
  // Exists: per hash, whether the store holds it. A failure reads as all absent.
  virtual absl::StatusOr<std::vector<bool>> Exists(absl::Span<const BlockHash> hashes,
                                                   absl::Time deadline) = 0;
  // Get: fetch each hash into out[i * block_bytes, (i+1) * block_bytes); found[i] true only when
  // those bytes are verified (checksum) — anything else is a miss.
  virtual absl::StatusOr<std::vector<bool>> Get(absl::Span<const BlockHash> hashes,
                                                absl::Span<uint8_t> out, absl::Time deadline) = 0;
  struct PutCounts {
    int64_t stored = 0, present = 0, failed = 0;
    absl::Status error;
  };
  virtual absl::StatusOr<PutCounts> Put(absl::Span<const BlockHash> hashes,
                                        absl::Span<const uint8_t> bytes, absl::Time deadline) = 0;
  // AllocateBuffer: where Get's `out` and Put's `bytes` should live (see
  // KvConnector::AllocateBlockBuffer); any thread, never blocks. Default: the heap.
  virtual KvBlockBuffer AllocateBuffer(size_t bytes) { return KvBlockBuffer(bytes); }
  // transfer_bytes: block bytes moved so far by RMA and inline (KvConnectorStats); any thread.
  struct TransferBytes {
    int64_t rma = 0, inline_bytes = 0;
  };
  virtual TransferBytes transfer_bytes() const { return {}; }
};

struct AsyncKvConnectorOptions {
  absl::Duration load_timeout = absl::Seconds(2);  // Exists + Get of one load
  absl::Duration save_timeout = absl::Seconds(5);  // one Put
  // Saves queued beyond this many bytes are dropped (counted), so a slow or dead store never
  // grows memory without bound.
  int64_t max_pending_save_bytes = 256LL << 20;
  // After a load fails with a store error or deadline, loads answer "nothing found" at once for
  // this long (no calls), so a dead or unreachable store costs at most one deadline per back-off
  // instead of one per request. Saves are not held back (they never delay a request).
  absl::Duration failure_backoff = absl::Seconds(5);
};

// AsyncKvConnector: runs a KvBlockStoreBackend on two background threads (loads; saves), so a
// slow save never delays a load. It serves one layout: a second Bind with the same layout is a
// no-op, with another one FailedPrecondition naming both (its backend keys every block by the
// one layout, so a second engine's blocks would be stored under the wrong layout id). A load = Exists over all hashes (one batch), then Get of the
// leading run found; the result is the leading run Get verified.
class AsyncKvConnector final : public KvConnector {
 public:
  AsyncKvConnector(std::unique_ptr<KvBlockStoreBackend> backend,
                   const AsyncKvConnectorOptions& options);
  ~AsyncKvConnector() override;  // drops queued work, waits for the calls in progress

  absl::Status Bind(const KvConnectorLayout& layout) override;
  void StartLoad(uint64_t ticket, std::vector<BlockHash> hashes) override;
  std::vector<KvLoadResult> PollLoads() override;
  void Save(std::vector<BlockHash> hashes, KvBlockBuffer bytes) override;
  KvConnectorStats stats() const override;
  KvBlockBuffer AllocateBlockBuffer(size_t bytes) override {
    return backend_->AllocateBuffer(bytes);
  }

  // WaitIdle: blocks until no load or save is queued or running, or `deadline`; false on
  // deadline. For tests and orderly shutdown (flush write-through).
  bool WaitIdle(absl::Time deadline);

 private:
  struct LoadJob {
    uint64_t ticket;
    std::vector<BlockHash> hashes;
  };
  struct SaveJob {
    std::vector<BlockHash> hashes;
    KvBlockBuffer bytes;
  };
  void LoadLoop();
  void SaveLoop();
  KvLoadResult RunLoad(const LoadJob& job);

  std::unique_ptr<KvBlockStoreBackend> backend_;
  AsyncKvConnectorOptions options_;
  int64_t block_bytes_ = 0;
  bool bound_ = false;
  KvConnectorLayout layout_;  // once bound

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::deque<LoadJob> loads_;
  std::deque<SaveJob> saves_;
  int64_t pending_save_bytes_ = 0;
  int32_t num_busy_ = 0;  // jobs taken off a queue and running
  absl::Time skip_loads_until_ = absl::InfinitePast();  // failure back-off (load thread only)
  std::vector<KvLoadResult> done_;
  KvConnectorStats stats_;
  std::thread load_thread_;
  std::thread save_thread_;
};

}  // namespace sluice

#endif  // SLUICE_ENGINE_KV_KV_CONNECTOR_H_
