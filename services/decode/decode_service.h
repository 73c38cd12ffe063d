// DecodeService: the DecodeWorker gRPC service (proto/sluice/v1/worker.proto) around an
// AsyncEngine in decode mode.
//
// Per request (a DecodeSession): Reserve (or Decode without a prior Reserve) reserves blocks for
// prompt + 1 tokens; Decode with a prefill result pulls the prompt KV from the prefill worker
// over UCX into the first reserved blocks (TaskPool thread, deadline; through pinned host
// staging slots when the KV is not registered, options.staging), acks with
// PrefillWorker.Release, completes the transfer in the engine and streams TokenOutput from the
// second token on. Push mode (--kv-transfer-mode push): instead of pulling, decode asks the
// prefill worker to write the KV into its reserved blocks (PrefillWorker.PushKv with this
// worker's descriptor and block runs); when that call fails without proof that the put ended,
// the blocks are freed only after the push's deadline plus a grace period. Decode without a
// prefill result runs the whole request locally (all tokens streamed). A cancelled call or Cancel
// RPC aborts; an abort during a transfer waits for the transfer to end (no block is freed while
// a transfer into it may run). Every transfer ends before the engine's reservation timeout.
#ifndef SLUICE_SERVICES_DECODE_DECODE_SERVICE_H_
#define SLUICE_SERVICES_DECODE_DECODE_SERVICE_H_

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <grpcpp/security/credentials.h>

#include "absl/time/time.h"
#include "engine/sched/async_engine.h"
#include "services/common/grant_tokens.h"
#include "services/common/task_pool.h"
#include "services/common/worker_images.h"
#include "services/common/worker_metrics.h"
#include "sluice/v1/worker.grpc.pb.h"
#include "transfer/kv_transfer.h"
#include "transfer/staging_pool.h"
#include "services/common/worker_grammar.h"

namespace sluice {

struct DecodeServiceOptions {
  // A reservation no Decode claimed within this is freed (also the longest wait for free
  // blocks). Once claimed, the transfer has transfer_timeout from the claim: a request making
  // progress never loses its blocks to this timeout. The engine's own reservation timeout is a
  // backstop and must exceed reserve_timeout + transfer_timeout (worker_command sets it).
  absl::Duration reserve_timeout = absl::Seconds(30);
  absl::Duration transfer_timeout = absl::Seconds(10);  // KV pull, when the request gives none
  absl::Duration release_timeout = absl::Seconds(2);    // Release ack RPC
  int transfer_threads = 4;
  v1::KvTransferMode transfer_mode = v1::KV_TRANSFER_MODE_PULL;
  // A Cancel for an unknown id is remembered this long: a Reserve or Decode for it arriving
  // later (reordered behind the Cancel) is refused instead of reserving blocks nobody claims.
  absl::Duration cancel_memory = absl::Seconds(10);
  // Push mode: after a PushKv call failed without an answer from the prefill worker's push job,
  // its put may still run until the push deadline; blocks stay reserved this much longer.
  absl::Duration push_grace = absl::Seconds(1);
  // SWA bounded replay in effect (the engine's swa_replay_tokens()): > 0: only the
  // full-attention layers' KV is moved and the engine replays the rest; the prefill worker must
  // announce the same (PrefillResponse.kv.swa_replay_tokens > 0), else FAILED_PRECONDITION.
  int64_t swa_replay_tokens = 0;
  // Compiles the grammars requests carry (SamplingParams.grammar_ebnf); borrowed. Null: such
  // requests are refused with INVALID_ARGUMENT.
  WorkerGrammars* grammars = nullptr;
  // Checks images the router sent as bytes (self-encode fallback), which the engine encodes
  // (it has the same WorkerImages as its ImageEncoder); borrowed. Null: a request with such
  // images fails (FAILED_PRECONDITION).
  const WorkerImages* images = nullptr;
  absl::Duration test_transfer_delay = absl::ZeroDuration();  // test only: hold each transfer
  // Test only: hold each transfer's completion (the engine's CompleteTransfer) this long after
  // the transfer returned (a race check: KV still landing when the push was reported done).
  absl::Duration test_post_transfer_delay = absl::ZeroDuration();
  // Test only: hold each Reserve's answer this long after its token was issued (the window in
  // which an answer is on its way while the caller gives up).
  absl::Duration test_reserve_answer_delay = absl::ZeroDuration();
  // Credentials of the channels to prefill workers (mTLS); nullptr: plaintext.
  std::shared_ptr<grpc::ChannelCredentials> channel_credentials;
  // Pull mode, KV this worker's UCX cannot register (device KV without a CUDA-aware UCX, or
  // staging chosen for the transport: --kv-staging): every pull reads the prefill worker's KV
  // into registered host slots of a free pool member and copies it from there into the
  // reserved blocks (StagedKvTransfer::Pull; with no member free it waits, at most until its
  // deadline); borrowed. Null: pulls land in the registered KV directly.
  transfer::StagingPool* staging = nullptr;
};

// RecomputeReason: why a decode worker recomputes a prompt instead of using the KV it was sent
// (the `reason` label of sluice_decode_recomputes_total, logged with every recompute):
//   kPinGone            the pull ran, but the prefill worker's ack said nothing was pinned any
//                       more (pin timeout, or released by another attempt): the blocks read may
//                       have been reused
//   kAckFailed          the pull ran, but the ack RPC failed (prefill worker unreachable or too
//                       slow): the pin is not confirmed
//   kTransferTimeout    the pull or push missed its deadline
//   kReservationExpired no time was left for the transfer when it could start
//   kTransferFailed     the pull or push failed (UCX error, peer gone)
//   kStagingCopyFailed  a staged pull's device copy (a staging slot -> the reserved blocks)
//                       failed: the RMA read may have landed, but the blocks are not whole
// (The same metric's reason "swa_replay_failed" is the engine's: the transfer succeeded but the
// sliding-window layers could not be rebuilt; RecomputeCause::kSwaReplayFailed.)
enum class RecomputeReason { kPinGone, kAckFailed, kTransferTimeout, kReservationExpired,
                             kTransferFailed, kStagingCopyFailed };
const char* RecomputeReasonName(RecomputeReason reason);

class DecodeSession;

class DecodeService final : public v1::DecodeWorker::CallbackService {
 public:
  // `engine` and `agent` must outlive the service; `regions` are the engine's KV regions
  // (KvRegionsOf), registered with `agent` unless options.staging is set; `kv_descriptor` their
  // serialized descriptor (empty with staging: nothing can push into them).
  // `metrics` must outlive the service. Stop the engine (AsyncEngine::Shutdown) before the
  // service goes: its final outputs reach the service's sessions.
  DecodeService(AsyncEngine* engine, transfer::KvTransferAgent* agent,
                std::vector<transfer::KvRegion> regions, std::string kv_descriptor,
                WorkerMetrics* metrics, DecodeServiceOptions options);
  ~DecodeService() override;

  grpc::ServerUnaryReactor* Reserve(grpc::CallbackServerContext* context,
                                    const v1::ReserveRequest* request,
                                    v1::ReserveResponse* response) override;
  grpc::ServerUnaryReactor* Cancel(grpc::CallbackServerContext* context,
                                   const v1::CancelRequest* request,
                                   v1::CancelResponse* response) override;
  grpc::ServerWriteReactor<v1::TokenOutput>* Decode(grpc::CallbackServerContext* context,
                                                    const v1::DecodeRequest* request) override;

  void set_draining(bool draining) { draining_.store(draining); }
  int64_t num_sessions() const;

  // Used by DecodeSession.
  AsyncEngine* engine() { return engine_; }
  WorkerMetrics* metrics() { return metrics_; }
  void Forget(const std::string& request_id, const DecodeSession* session);
  void StartTransfer(std::shared_ptr<DecodeSession> session);
  // ExpireUnclaimed frees `session`'s reservation at reserve_timeout unless a Decode claimed it.
  void ExpireUnclaimed(const std::shared_ptr<DecodeSession>& session);
  // AbortReservation frees a cancelled reservation: at once, except in layerwise mode, where a
  // prefill worker may still write into it until its pushes' deadline — which the router bounds
  // by the reservation's life (PrefillRequest.decode_reservation_ttl_ms) —, so at
  // `reserved_at` + reserve_timeout; then only if `session`'s engine request has not ended
  // meanwhile (its engine id may by then name a later session's request).
  void AbortReservation(const std::shared_ptr<DecodeSession>& session, absl::Time reserved_at);

 private:
  // NewSession: a session reserving blocks for `request` (a Decode that came without a
  // Reserve); null with `error` set when its grammar fails or its id exists.
  std::shared_ptr<DecodeSession> NewSession(const v1::DecodeRequest& request,
                                            std::vector<MultimodalInput> mm_inputs,
                                            absl::Status* error);
  void RunTransfer(const std::shared_ptr<DecodeSession>& session);  // pool thread
  v1::PrefillWorker::Stub* PrefillStub(const std::string& address);
  bool WasCancelled(const std::string& request_id) const;
  // EndCall answers a Decode call with `status` alone, touching no session.
  grpc::ServerWriteReactor<v1::TokenOutput>* EndCall(const std::string& request_id,
                                                     grpc::Status status);
  // CheckGrant: OK when `token` is the token of `session`'s reservation; PERMISSION_DENIED
  // otherwise, and always for a session a Decode call started (it has no token).
  absl::Status CheckGrant(const DecodeSession& session, const std::string& token,
                          const char* call) const;
  // Transfer steps (pool thread). `deadline`: the transfer must be over by then.
  absl::Status PullKv(const v1::PrefillResponse& prefill, const std::vector<int32_t>& blocks,
                      absl::Time deadline);
  // RequestPush asks the prefill worker to push; *safe_at is when the blocks may be reused if
  // the call failed (absl::InfinitePast(): at once).
  absl::Status RequestPush(const std::string& request_id, const v1::PrefillResponse& prefill,
                           const std::vector<int32_t>& blocks, absl::Time deadline,
                           absl::Time* safe_at);
  // SendRelease acks a transfer: the prefill worker frees its pinned blocks. OK when they were
  // still pinned; NotFound when nothing was pinned (released by an earlier decode attempt or
  // expired — a pull that ran may then have read reused blocks); the RPC's error otherwise.
  // `prefill` carries the worker's address and the pin's transfer token.
  absl::Status SendRelease(const std::string& request_id, const v1::PrefillResponse& prefill);

  AsyncEngine* engine_;
  transfer::KvTransferAgent* agent_;
  std::vector<transfer::KvRegion> regions_;
  std::vector<int32_t> transfer_region_indices_;  // of regions_: what a transfer moves
  std::string kv_descriptor_;
  WorkerMetrics* metrics_;
  DecodeServiceOptions options_;
  std::atomic<bool> draining_{false};
  mutable std::mutex mu_;
  std::unordered_map<std::string, std::shared_ptr<DecodeSession>> sessions_;  // guarded by mu_
  std::unordered_map<std::string, std::unique_ptr<v1::PrefillWorker::Stub>> stubs_;  // mu_
  std::unordered_map<std::string, absl::Time> cancelled_;  // id -> forget after; guarded by mu_
  const GrantTokens tokens_;                 // reservation grant tokens
  std::atomic<uint64_t> next_grant_{1};      // serial of the next reservation's grant
  TaskPool pool_;  // last: joined first
};

}  // namespace sluice

#endif  // SLUICE_SERVICES_DECODE_DECODE_SERVICE_H_
