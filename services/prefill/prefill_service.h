// PrefillService: the PrefillWorker gRPC service (proto/sluice/v1/worker.proto) around an
// AsyncEngine in prefill mode: Prefill runs the prompt with hold_kv_blocks, answers the first
// token and the pinned blocks' descriptor; Release frees them. Push mode (--kv-transfer-mode
// push): PushKv writes the pinned blocks into a decode worker's reservation over UCX (RMA put,
// TaskPool thread, deadline), then frees them. Callback (reactor) API: no thread is held per
// request; the engine thread finishes each Prefill call.
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
#include "services/worker_common/task_pool.h"
#include "services/worker_common/worker_metrics.h"
#include "sluice/v1/worker.grpc.pb.h"
#include "transfer/kv_transfer.h"
#include "services/worker_common/worker_grammar.h"

namespace sluice {

struct PrefillServiceOptions {
  v1::KvTransferMode transfer_mode = v1::KV_TRANSFER_MODE_PULL;
  // The engine's kv_hold_timeout: a push must end this long after the blocks were pinned (less
  // a margin), before the engine may free and reuse them.
  absl::Duration pin_timeout = absl::Seconds(30);
  absl::Duration default_push_timeout = absl::Seconds(10);  // PushKv with timeout_ms 0
  int push_threads = 4;
  // SWA bounded replay in effect (EffectiveSwaReplayTokens of --swa-replay-tokens): > 0: only the
  // full-attention layers' KV is moved (announced in PrefillResponse.kv.swa_replay_tokens).
  int64_t swa_replay_tokens = 0;
  // Compiles the grammars requests carry (SamplingParams.grammar_ebnf); borrowed. Null: such
  // requests are refused with INVALID_ARGUMENT.
  WorkerGrammars* grammars = nullptr;
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
  // RememberHeld records the pin and returns its transfer token (PrefillResponse.kv).
  std::string RememberHeld(const std::string& request_id, std::vector<int32_t> block_ids);
  // CheckToken: PERMISSION_DENIED unless `token` is the transfer token of `held`.
  absl::Status CheckToken(const std::string& request_id, const Held& held,
                          const std::string& token, const char* call) const;
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
  const GrantTokens tokens_;                    // transfer tokens of the pins
  TaskPool pool_;                               // last: joined first
};

}  // namespace sluice

#endif  // SLUICE_SERVICES_PREFILL_PREFILL_SERVICE_H_
