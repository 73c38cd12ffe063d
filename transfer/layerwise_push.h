// LayerwisePush: pushes one request's prompt KV into a peer's reserved blocks layer by layer
// (or by groups of layers) while prefill still computes the later layers, so the transfer of
// the first layers overlaps the compute of the rest (disaggregated prefill, push mode
// "layerwise": docs/design.md, "KV bytes never ride the RPC path").
//
// The caller names every moved region's layer (k and v of one layer share it). Once the blocks
// holding the prompt are known (Start) it reports layers as their K/V become complete
// (LayerReady, in order 0..num_layers-1, once each, typically from the model forward's per-layer
// hook); when a group's last layer is ready the group's regions are pushed, one coalesced RMA
// per run pair and region, on the executor. Groups are pushed one at a time, in order. The
// first failure (a push error, a wait error, the deadline, Cancel) stops it: no later group is
// posted, and Done fires once no push runs any more (the transport's deadline contract: when a
// push returns, no RMA touches the buffers).
#ifndef SLUICE_TRANSFER_LAYERWISE_PUSH_H_
#define SLUICE_TRANSFER_LAYERWISE_PUSH_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "transfer/block_runs.h"
#include "transfer/kv_transfer.h"

namespace sluice::transfer {

class LayerwisePush : public std::enable_shared_from_this<LayerwisePush> {
 public:
  // PushFn: one push with KvTransferAgent::Push's contract (or StagedKvTransfer::Push's).
  using PushFn = std::function<absl::Status(
      const RemoteKvDescriptor& remote, absl::Span<const BlockRun> remote_runs,
      absl::Span<const KvRegion> local_regions, absl::Span<const BlockRun> local_runs,
      absl::Time deadline)>;
  // Executor: runs a job on another thread (a pool); the pushes run there, never on the caller.
  using Executor = std::function<void(std::function<void()>)>;
  // LayerWait: blocks until the layer's K/V is complete in memory (a device event); null when it
  // already is when reported (the CPU forward).
  using LayerWait = std::function<absl::Status()>;
  using DoneCallback = std::function<void(absl::Status)>;

  struct Options {
    int32_t num_layers = 0;
    int32_t layers_per_group = 1;  // layers per push (the last group may hold fewer)
    absl::Time deadline = absl::InfiniteFuture();  // every push ends by then
  };

  // Create: `remote` and `local` pair region by region (as in Push); region_layers[i] is region
  // i's layer in [0, num_layers); `remote_runs`: the peer's reserved blocks (at least as many as
  // Start's). Errors: InvalidArgument for mismatched sizes, a layer out of range, options out
  // of range.
  static absl::StatusOr<std::shared_ptr<LayerwisePush>> Create(
      PushFn push, Executor executor, RemoteKvDescriptor remote, std::vector<BlockRun> remote_runs,
      std::vector<KvRegion> local, std::vector<int32_t> region_layers, const Options& options);

  // Start: the local blocks holding the prompt's KV, in sequence order; they pair with the first
  // as many of the peer's blocks. Validated in full here (ValidateTransfer). Call once, before
  // LayerReady; an error also fails the push (Done fires with it).
  absl::Status Start(absl::Span<const int32_t> local_block_ids);
  // LayerReady: `layer`'s K/V is complete once `wait` returns OK. Non-blocking. Out of order,
  // repeated, or before Start: the push fails with FailedPrecondition.
  void LayerReady(int32_t layer, LayerWait wait);
  // Cancel: stop with `why` (non-OK): nothing more is posted; Done fires once the push in flight
  // (if any) ended. No-op once done.
  void Cancel(absl::Status why);
  // OnDone: `done` runs once, with OK when every group landed, else the first error; at once
  // (on the caller's thread) when already done, else on the thread that ends the push. Several
  // callbacks run in the order they were given.
  void OnDone(DoneCallback done);

  int32_t num_groups() const { return num_groups_; }
  int32_t num_groups_pushed() const;
  int64_t bytes_pushed() const;

 private:
  LayerwisePush(PushFn push, Executor executor, RemoteKvDescriptor remote,
                std::vector<BlockRun> remote_runs, std::vector<KvRegion> local,
                std::vector<int32_t> region_layers, const Options& options);
  struct Ready {
    int32_t group = 0;
    std::vector<LayerWait> waits;
  };
  void Drain();
  absl::Status PushGroup(int32_t group);
  // FailLocked records the first error. TakeDoneLocked: the done callback bound to the outcome,
  // to run outside mu_, once the push is done (else null).
  void FailLocked(absl::Status why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::function<void()> TakeDoneLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool DoneLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const PushFn push_;
  const Executor executor_;
  const RemoteKvDescriptor remote_;
  const std::vector<BlockRun> remote_runs_;
  const std::vector<KvRegion> local_;
  const Options options_;
  const int32_t num_groups_;
  // Per group: its regions' indices, and their descriptor and local regions.
  std::vector<RemoteKvDescriptor> group_remote_;
  std::vector<std::vector<KvRegion>> group_local_;

  mutable absl::Mutex mu_;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<BlockRun> local_runs_ ABSL_GUARDED_BY(mu_);
  std::vector<BlockRun> dest_runs_ ABSL_GUARDED_BY(mu_);  // the peer's first blocks, paired
  int64_t num_blocks_ ABSL_GUARDED_BY(mu_) = 0;
  int32_t next_layer_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<LayerWait> pending_waits_ ABSL_GUARDED_BY(mu_);  // of the group being reported
  std::deque<Ready> queue_ ABSL_GUARDED_BY(mu_);
  bool running_ ABSL_GUARDED_BY(mu_) = false;
  int32_t pushed_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  std::vector<DoneCallback> done_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sluice::transfer

#endif  // SLUICE_TRANSFER_LAYERWISE_PUSH_H_
