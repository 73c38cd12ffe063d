// PrefillService: the PrefillWorker gRPC service (proto/sluice/v1/worker.proto) around an
// AsyncEngine in prefill mode: Prefill runs the prompt with hold_kv_blocks, answers the first
// token and the pinned blocks' descriptor; Release frees them. Push mode (--kv-transfer-mode
// push): PushKv writes the pinned blocks into a decode worker's reservation over UCX (RMA put,
// TaskPool thread, deadline), then frees them. Layerwise mode (--kv-transfer-mode layerwise):
// a Prefill that carries the decode worker's reservation pushes each layer's KV into it as the
// forward of the last prompt chunk completes the layer (transfer::LayerwisePush, fed by the
// engine's KvLayerObserver), and answers with kv_pushed once every layer landed; without a
// reservation it behaves as push mode. KV the UCX agent cannot reach (device memory it cannot
// register) is pushed through pinned host staging (options.staging). Callback (reactor) API: no thread is held per request;
// the engine thread (or the push's last pool job) finishes each Prefill call.
#ifndef SLUICE_SERVICES_PREFILL_PREFILL_SERVICE_H_
#define SLUICE_SERVICES_PREFILL_PREFILL_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "engine/sched/async_engine.h"
#include "services/common/grant_tokens.h"
#include "services/common/peer_kv_blocks.h"
#include "services/common/task_pool.h"
#include "services/common/worker_images.h"
#include "services/common/worker_metrics.h"
#include "sluice/v1/worker.grpc.pb.h"
#include "transfer/block_runs.h"
#include "transfer/kv_transfer.h"
#include "transfer/layerwise_push.h"
#include "transfer/staging_pool.h"
#include "services/common/worker_grammar.h"

namespace sluice {

struct PrefillServiceOptions {
  v1::KvTransferMode transfer_mode = v1::KV_TRANSFER_MODE_PULL;
  // The engine's kv_hold_timeout: a push must end this long after the blocks were pinned (less
  // a margin), before the engine may free and reuse them.
  absl::Duration pin_timeout = absl::Seconds(30);
  absl::Duration default_push_timeout = absl::Seconds(10);  // PushKv with timeout_ms 0
  int push_threads = 4;
  // Layerwise mode: model layers per push (their K/V regions move in one RMA batch per run).
  int layerwise_group_layers = 1;
  // Test only: >= 0 makes the push of this layer group fail (Unavailable), as a dead peer would.
  int test_fail_layer_group = -1;
  // Where pushes read the prompt's KV. Null: the agent RMA-writes straight from the service's
  // `regions` (registered with it). Set: `regions` are not registered with the agent (device
  // memory its UCX context cannot register, or staging chosen for the transport): every push,
  // PushKv and layerwise alike (each layer group), copies them through the registered host
  // slots of a free pool member (StagedKvTransfer::Push, device copies overlapping the
  // network): as many pushes stage at once as the pool has members, and one finding none free
  // waits for one, at most until its deadline. Such a worker serves push and layerwise modes
  // only: a decode worker could not pull its KV. Borrowed.
  transfer::StagingPool* staging = nullptr;
  // SWA bounded replay in effect (EffectiveSwaReplayTokens of --swa-replay-tokens): > 0: only the
  // full-attention layers' KV is moved (announced in PrefillResponse.kv.swa_replay_tokens).
  int64_t swa_replay_tokens = 0;
  // Compiles the grammars requests carry (SamplingParams.grammar_ebnf); borrowed. Null: such
  // requests are refused with INVALID_ARGUMENT.
  WorkerGrammars* grammars = nullptr;
  // Checks images the router sent as bytes (self-encode fallback), which the engine encodes
  // (it has the same WorkerImages as its ImageEncoder); borrowed. Null: a request with such
  // images fails (FAILED_PRECONDITION).
  const WorkerImages* images = nullptr;
};

class PrefillService final : public v1::PrefillWorker::CallbackService {
 public:
  // `engine`, `agent` and `metrics` must outlive the service. `regions`: the engine's KV regions
  // (KvRegionsOf), registered with `agent`; `kv_descriptor` their serialized descriptor.
  // `advertised_address`: host:port decode workers call Release/PushKv on.
  PrefillService(AsyncEngine* engine, transfer::KvTransferAgent* agent,
                 std::vector<transfer::KvRegion> regions, std::string kv_descriptor,
                 std::string advertised_address, WorkerMetrics* metrics,
                 PrefillServiceOptions options);
  ~PrefillService() override;

  grpc::ServerUnaryReactor* Prefill(grpc::CallbackServerContext* context,
                                    const v1::PrefillRequest* request,
                                    v1::PrefillResponse* response) override;
  grpc::ServerUnaryReactor* Release(grpc::CallbackServerContext* context,
                                    const v1::ReleaseRequest* request,
                                    v1::ReleaseResponse* response) override;
  grpc::ServerUnaryReactor* PushKv(grpc::CallbackServerContext* context,
                                   const v1::PushKvRequest* request,
                                   v1::PushKvResponse* response) override;

  // Prompt tokens admitted and not yet answered (for heartbeats).
  int64_t num_queued_prefill_tokens() const { return queued_tokens_.load(); }
  void set_draining(bool draining) { draining_.store(draining); }
  // DropRequest aborts a request (queued, running, or finished with pinned blocks: freed) unless
  // a push reads its blocks. Used by cancelled Prefill calls.
  void DropRequest(const std::string& request_id);
  // set_advertised_address: call before the first Prefill (once the port is bound).
  void set_advertised_address(std::string address) { advertised_address_ = std::move(address); }

 private:
  // Held: a finished prefill's pinned blocks (push mode only; pull mode leaves them to the engine).
  struct Held {
    std::vector<int32_t> block_ids;  // sequence order
    absl::Time pinned_at;
    bool pushing = false;  // a PushKv job reads the blocks: Release leaves them to it
  };
  // MakeLayerwisePush: the layer-by-layer push of `request_id`'s prompt KV into `destination`
  // (a decode reservation), ending by `deadline`. Errors: FailedPrecondition for another KV
  // layout, InvalidArgument for a bad descriptor or runs.
  absl::StatusOr<std::shared_ptr<transfer::LayerwisePush>> MakeLayerwisePush(
      const std::string& request_id, const v1::KvBlocks& destination, absl::Time deadline);
  // DropNow: DropRequest's work once no push reads the request's blocks.
  void DropNow(const std::string& request_id);
  // RememberHeld records the pin and returns its transfer token (PrefillResponse.kv).
  std::string RememberHeld(const std::string& request_id, std::vector<int32_t> block_ids);
  // HeldFor: the pin of `request_id`, for a call (`call`: "Release", "PushKv") that presented
  // `token`; call with mu_ held. Errors: NotFound when nothing is pinned (never pinned here,
  // released, aborted or timed out), PermissionDenied unless `token` is the pin's transfer token.
  absl::StatusOr<Held*> HeldFor(const std::string& request_id, const std::string& token,
                                const char* call);
  // Destination: where a push writes, once checked (CheckDestination).
  struct Destination {
    TransferRegions regions;               // both sides' regions a transfer moves
    std::vector<transfer::BlockRun> runs;  // the decode worker's reserved blocks
  };
  // CheckDestination: a decode worker's reservation (`destination`) checked for pushing
  // `request_id`'s KV: the same KV layout (else FailedPrecondition naming both layouts, marked
  // as misconfigured peers: services/common/misconfigured_peer.h), a descriptor that parses,
  // valid block runs (InvalidArgument).
  absl::StatusOr<Destination> CheckDestination(const std::string& request_id,
                                               const v1::KvBlocks& destination) const;
  // PushRuns: one push of paired runs, straight from the registered KV (agent) or through the
  // staging (options.staging): KvTransferAgent::Push's contract either way (a staging device
  // copy that failed is Unavailable, as a failed RMA is).
  absl::Status PushRuns(const transfer::RemoteKvDescriptor& remote,
                        absl::Span<const transfer::BlockRun> remote_runs,
                        absl::Span<const transfer::KvRegion> local,
                        absl::Span<const transfer::BlockRun> local_runs, absl::Time deadline);
  // RunPush: the PushKv job (pool thread). Frees the pinned blocks afterwards.
  absl::Status RunPush(const std::string& request_id, const v1::PushKvRequest& request,
                       std::vector<int32_t> block_ids, absl::Time deadline, int64_t* bytes);

  AsyncEngine* engine_;
  transfer::KvTransferAgent* agent_;
  std::vector<transfer::KvRegion> regions_;
  std::vector<int32_t> transfer_region_indices_;  // of regions_: what a transfer moves
  std::string kv_descriptor_;
  std::string advertised_address_;
  WorkerMetrics* metrics_;
  PrefillServiceOptions options_;
  std::atomic<int64_t> queued_tokens_{0};
  std::atomic<bool> draining_{false};
  std::mutex mu_;
  std::unordered_map<std::string, Held> held_;  // guarded by mu_
  // Layerwise pushes not yet ended, by request id; guarded by mu_.
  std::unordered_map<std::string, std::shared_ptr<transfer::LayerwisePush>> layer_pushes_;
  const GrantTokens tokens_;                    // transfer tokens of the pins
  TaskPool pool_;                               // last: joined first
};

}  // namespace sluice

#endif  // SLUICE_SERVICES_PREFILL_PREFILL_SERVICE_H_
