// StagedKvBlockCopier: whole KV blocks between a KV cache in device memory (Model::DeviceKvArrays)
// and host bytes in the KV connector's block serialization (kv_connector.h), through pinned
// staging slots of a transfer::DeviceCopier — how the kvstore sits behind a GPU KV cache:
// write-through gathers newly full blocks device -> pinned -> host bytes, a load scatters the
// store's bytes host -> pinned -> device.
//
// Serialized block (dtype-blind): the selected arrays' pieces of the block, in array order —
// per layer K then V ([L0.K | L0.V | L1.K | ...], V absent for the MLA latent cache), each
// piece the array's block_bytes. The layout identity the connector is bound with names the
// dtype, so bf16 device blocks never share keys with float32 host ones.
//
// Pipeline: the call's blocks are cut into chunks that fit one slot; within a chunk each array's
// runs of consecutive block ids move in one copy (coalesced block runs) into an array-major slot
// layout, and the host repacks to block-major. Chunk k uses slot and lane k % num_slots, so the
// copies of one chunk overlap the host repacking of the previous one. On every return, errors
// included, no copy is pending (the caller may reuse or free its buffers and blocks).
// One caller at a time.
#ifndef SLUICE_ENGINE_KV_STAGED_KV_BLOCKS_H_
#define SLUICE_ENGINE_KV_STAGED_KV_BLOCKS_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "engine/model/model.h"
#include "transfer/device_copier.h"

namespace sluice {

// SelectKvArrays: the arrays holding `layers` (empty: every layer), in serialization order, of a
// device cache laid out as Model::DeviceKvArrays describes for `spec` (per layer K, then V when
// spec.v_floats_per_token > 0). Errors: InvalidArgument when the array count does not match the
// spec, a layer is out of range or not increasing, or the arrays differ in block count.
absl::StatusOr<std::vector<DeviceKvArray>> SelectKvArrays(absl::Span<const DeviceKvArray> arrays,
                                                          const KvCacheSpec& spec,
                                                          absl::Span<const int32_t> layers);

struct StagedKvBlocksOptions {
  // Bytes of one staging slot (pinned with CUDA); grown to one serialized block when a block is
  // larger. Chunks hold floor(slot_bytes / block bytes) blocks.
  int64_t slot_bytes = 16LL << 20;
  // Slots and copier lanes in flight; the copier needs at least this many lanes.
  int num_slots = 2;
  // A call whose device copies have not finished this long after it began fails with
  // DeadlineExceeded (see Gather). Infinite: no deadline.
  absl::Duration copy_timeout = absl::InfiniteDuration();
};

struct StagedKvBlocksStats {
  int64_t num_chunks = 0;
  int64_t num_device_copies = 0;  // one per array per run of consecutive block ids per chunk
  int64_t bytes_gathered = 0;     // device -> host
  int64_t bytes_scattered = 0;    // host -> device
  int64_t num_deadline_exceeded = 0;  // calls that failed on copy_timeout
};

class StagedKvBlockCopier {
 public:
  // Create takes the copier (its lanes carry the copies). Staging is allocated at first use.
  // Errors: InvalidArgument for no copier, slot_bytes <= 0, num_slots < 1 or a copier with
  // fewer lanes than slots.
  static absl::StatusOr<std::unique_ptr<StagedKvBlockCopier>> Create(
      std::unique_ptr<transfer::DeviceCopier> copier, const StagedKvBlocksOptions& options);
  ~StagedKvBlockCopier();  // waits for every lane, frees the staging
  StagedKvBlockCopier(const StagedKvBlockCopier&) = delete;
  StagedKvBlockCopier& operator=(const StagedKvBlockCopier&) = delete;

  // Gather copies blocks `blocks` (ids in `arrays`, any order, repeats allowed) into `out`, block
  // i at out[i * B, (i + 1) * B) with B = Σ arrays' block_bytes. Scatter is the reverse, from
  // `in`. Errors (nothing copied): InvalidArgument for no arrays, an array without memory, a
  // block id outside an array, a buffer that is not blocks.size() * B bytes; those of the
  // copier (Internal), after which the blocks' contents are undefined (Scatter) or `out` is
  // (Gather). DeadlineExceeded when the copies outlive options.copy_timeout: the result is
  // undefined as for Internal, and copies may still be pending — the staging stays theirs
  // (the next call first waits for them within its own deadline, else fails at once with
  // DeadlineExceeded, nothing copied), and for a Scatter the blocks may still be written:
  // device work on them must follow StalledFences().
  // `after` (null: none) orders the device copies after device work — the fence of the step
  // that wrote the blocks (Gather), or of every step that may still touch them (Scatter): each
  // lane waits for it on the device (DeviceCopier::WaitFence) before its first copy, so the
  // host never waits for steps in flight beyond it.
  absl::Status Gather(absl::Span<const DeviceKvArray> arrays, absl::Span<const int32_t> blocks,
                      absl::Span<uint8_t> out, const void* after = nullptr);
  absl::Status Scatter(absl::Span<const DeviceKvArray> arrays, absl::Span<const uint8_t> in,
                       absl::Span<const int32_t> blocks, const void* after = nullptr);

  StagedKvBlocksStats stats() const { return stats_; }
  // StalledFences: after a DeadlineExceeded, one fence per lane (DeviceCopier::RecordFence,
  // null ones left out) that completes with the copies still pending; empty when none is.
  absl::StatusOr<std::vector<const void*>> StalledFences();
  // Bytes of one staging slot as allocated (0 before first use).
  int64_t slot_bytes() const { return slot_bytes_; }

  // A chunk: blocks [first, first + count) of one call.
  struct Chunk {
    size_t first = 0;
    size_t count = 0;
  };
  // PlanChunks cuts `num_blocks` blocks of `block_bytes` into chunks of at most
  // max(1, slot_bytes / block_bytes) blocks. Exposed for tests.
  static std::vector<Chunk> PlanChunks(size_t num_blocks, int64_t block_bytes, int64_t slot_bytes);

 private:
  StagedKvBlockCopier(std::unique_ptr<transfer::DeviceCopier> copier,
                      const StagedKvBlocksOptions& options)
      : copier_(std::move(copier)), options_(options) {}
  // Validate checks the call and returns B (bytes of one serialized block).
  absl::StatusOr<int64_t> Validate(absl::Span<const DeviceKvArray> arrays,
                                   absl::Span<const int32_t> blocks, size_t buffer_bytes) const;
  // EnsureSlots (re)allocates the slots to hold at least one block of `block_bytes`.
  absl::Status EnsureSlots(int64_t block_bytes);
  // EnqueueChunk: the device copies of `chunk` between slot `slot` (array-major) and the arrays.
  absl::Status EnqueueChunk(absl::Span<const DeviceKvArray> arrays,
                            absl::Span<const int32_t> blocks, const Chunk& chunk, int slot,
                            bool to_device);
  // OrderAfter makes every lane wait for `after` (see Gather).
  absl::Status OrderAfter(const void* after);
  // WaitLane waits for `lane` until `deadline`; a DeadlineExceeded marks the copier stalled.
  absl::Status WaitLane(int lane, absl::Time deadline);
  // WaitAll waits for every lane until `deadline`; returns `status` or, if that is OK, the
  // first wait error.
  absl::Status WaitAll(absl::Status status, absl::Time deadline = absl::InfiniteFuture());
  // Begin starts a call: its deadline, and the stalled copies of an earlier call drained.
  absl::Status Begin(absl::Time& deadline);
  // A Gather's or Scatter's checked arguments: B, the call's deadline and its chunks.
  struct CopyPlan {
    int64_t block_bytes = 0;
    absl::Time deadline;
    std::vector<Chunk> chunks;  // empty: nothing to copy
  };
  // Open is the start both directions share: Validate, then (when there are blocks) Begin,
  // EnsureSlots and PlanChunks.
  absl::StatusOr<CopyPlan> Open(absl::Span<const DeviceKvArray> arrays,
                                absl::Span<const int32_t> blocks, size_t buffer_bytes);
  uint8_t* Slot(int slot) const { return staging_ + slot * slot_bytes_; }

  std::unique_ptr<transfer::DeviceCopier> copier_;
  const StagedKvBlocksOptions options_;
  uint8_t* staging_ = nullptr;  // num_slots * slot_bytes_
  int64_t slot_bytes_ = 0;
  bool stalled_ = false;  // copies of a call that exceeded its deadline may still be pending
  StagedKvBlocksStats stats_;
};

}  // namespace sluice

#endif  // SLUICE_ENGINE_KV_STAGED_KV_BLOCKS_H_
