// RemoteBackend: the InferenceBackend of `sluice router` — requests run on
// remote prefill and decode workers over gRPC (sluice.v1.PrefillWorker /
// DecodeWorker), chosen by WorkerRegistry, so the same OpenAI HTTP handlers as
// `sluice serve` serve the router's API.
//
// One request (pull mode):
//   1. pick a decode worker D and (prompt >= min_remote_prefill_tokens) a
//   prefill worker P;
//   2. P.Prefill, and D.Reserve: at once when P was idle (nothing else this router sent
//   runs there and P reported no queue), so the blocks are ready when P answers; else when P
//   answers — a request queued behind other prefills holds no decode blocks that requests
//   whose KV is ready could use;
//   3. the first token from P is delivered to the caller as soon as P answers and D reserved;
//   4. D.Decode(prefill result) streams the second token on (D pulls the KV
//   from P over UCX).
// Short prompts (or no live prefill worker) skip step 2: D.Decode prefills
// locally and streams from the first token. Every RPC has a deadline; Abort
// cancels every RPC of the request but a Reserve, whose answer brings the token the Cancel of
// its reservation needs (it is short: bounded by reserve_attempt_wait). Failures: a prefill worker failing
// (UNAVAILABLE, deadline, removed from the registry) → the prefill is retried
// on another one; a decode worker failing before any token reached the caller →
// retried on another decode worker; after a token was delivered → the request
// is continued: if the decode worker failed before it streamed anything after a
// remote prefill's first token, while the prefill worker still pins the KV
// (prefill_pin_timeout), another decode worker reserves and pulls from the same
// prefill response; otherwise (migration) the prompt plus every token delivered so
// far is prefilled again: on a prefill worker when one is live (prompt + those tokens
// >= min_remote_prefill_tokens, and both it and the decode worker advertise
// kResumeCapability), which samples the next token and hands the KV to another decode
// worker as for a new request (reserve, pull or push); else, or when that prefill
// fails, on the new decode worker itself (its prefix cache and KV store first), which
// streams on from the next token. Either way the caller's stream
// goes on seamlessly, greedy output equal to an undisturbed run, each token counted
// once; max_migrations bounds the moves, after which the request ends with
// FinishReason::kError and an UNAVAILABLE status naming the worker. "Failed" is a
// broken stream or connection, and also a decode worker ending the request with a
// recoverable error (its reservation expired, it drained) or an abort the client
// did not ask for. A worker whose RPC failed
// is probed (WorkerProber) and, when nothing answers at its address, removed
// from the registry at once rather than at the end of its lease.
//
// Images (vision-language models): a request whose images have no embeddings yet (the API
// checked them and kept their bytes) goes to an encoder worker (sluice.v1.Encoder,
// WorkerRole::kEncoder, PickEncoder: cache affinity within load); one that fails (UNAVAILABLE,
// deadline, removed) is probed and the images go to another, up to max_encode_attempts within
// encode_deadline. Meanwhile the workers are picked and D.Reserve is made (as in step 2), with
// the images as bytes (D encodes them only if it computes the prompt itself), when a live decode
// worker and every live prefill worker advertise kImageEncodeCapability (else the images are
// encoded first); P.Prefill, or a local D.Decode, waits for the embeddings. An encode that fails
// ends the request with its error and cancels the reservation; a request that ends first
// cancels the Encode. The embeddings travel with the prompt to prefill
// (PrefillRequest.mm_inputs) and decode (DecodeRequest, and ReserveRequest once encoded: a
// decode worker recomputes prompt positions after a preemption, and prefills itself for short
// prompts and migrations). Without a live encoder worker, or once every one tried failed, the
// images go to prefill and decode as bytes and the workers encode them themselves
// (self_encode_fallback; only workers advertising kImageEncodeCapability are picked then, and if
// no decode worker does, the request is refused: Unavailable, 503).
//
// KV blocks on decode (the queue): each Reserve lets the decode worker wait at
// most reserve_attempt_wait for free blocks; a worker that has none is skipped
// for another live decode worker; when all are full the router tries them again
// with exponential backoff until decode_queue_timeout after the request arrived
// (and before the prefill pin runs out), then fails the request with
// UNAVAILABLE (503) saying so. The first token is sent only once decode blocks
// are reserved, so a request that times out in the queue gets a clean 503.
#ifndef SLUICE_SERVICES_ROUTER_REMOTE_BACKEND_H_
#define SLUICE_SERVICES_ROUTER_REMOTE_BACKEND_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>

#include "absl/time/time.h"
#include "services/api/inference_backend.h"
#include "services/common/task_pool.h"
#include "services/router/worker_prober.h"
#include "services/router/worker_registry.h"

namespace grpc {
class Channel;
}  // namespace grpc

namespace sluice {

class KvRouter;

struct RemoteBackendOptions {
  int32_t max_model_len = 4096;           // tokens (prompt + output) per sequence
  int32_t min_remote_prefill_tokens = 0;  // shorter prompts prefill on the decode worker
  absl::Duration control_deadline = absl::Seconds(5);  // Reserve, Cancel
  // All Prefill attempts of one request together (retries share it).
  absl::Duration prefill_deadline = absl::Seconds(120);
  absl::Duration decode_deadline = absl::Seconds(600);  // one whole Decode stream
  int32_t max_prefill_attempts = 3;
  // All Encode attempts of one request together, and how many encoder workers it may try.
  absl::Duration encode_deadline = absl::Seconds(60);
  int32_t max_encode_attempts = 3;
  // No encoder worker could encode a request's images: the prefill / decode workers that can
  // encode them themselves (false: the request fails with 503 instead).
  bool self_encode_fallback = true;
  int32_t max_decode_attempts = 2;  // only while no token reached the caller
  // After tokens reached the caller: how many times one request may move to another decode
  // worker (migration, see the file comment) before a decode failure ends it.
  int32_t max_migrations = 3;
  // One connection probe of a worker whose RPC failed (see WorkerProber).
  absl::Duration probe_timeout = absl::Seconds(2);
  // Waiting for decode KV blocks (see the file comment): per Reserve, the most a decode
  // worker waits for free blocks before answering (ReserveRequest.max_wait_ms); the backoff
  // between rounds over all decode workers (doubling from initial to max); the whole wait,
  // from the request's arrival (--decode-queue-timeout-s).
  absl::Duration reserve_attempt_wait = absl::Milliseconds(500);
  absl::Duration reserve_backoff_initial = absl::Milliseconds(50);
  absl::Duration reserve_backoff_max = absl::Seconds(1);
  absl::Duration decode_queue_timeout = absl::Seconds(120);
  // The prefill workers' --kv-pin-timeout-s: their pinned KV is freed this long after they
  // answered. Waits and decode retries that rely on it end kPinMargin (2 s) earlier.
  absl::Duration prefill_pin_timeout = absl::Seconds(30);
  // The decode workers' --reserve-timeout-s: a reservation no Decode claimed is freed this long
  // after it was made (a claimed one lives through its transfer: the transfer's time counts
  // from the claim). So the lease a reservation needs from the router is only the Decode call's
  // way there: when prefill answers with less than kPinMargin (2 s) of it left (a retried
  // prefill that queued behind others), the router reserves again instead of sending a Decode
  // that would find its reservation gone. A reservation lost anyway (the decode worker ends the
  // request with a recoverable error after the first token) is retried or migrated, not
  // reported to the client.
  absl::Duration decode_reserve_timeout = absl::Seconds(30);
  // Test only (fault tests): delay between sending a remote prefill's first token and the
  // first Decode call, a window to kill the chosen decode worker in.
  absl::Duration test_decode_start_delay = absl::ZeroDuration();
  // Worker choice by --routing-policy (services/router/kv_router.h); nullptr: the registry's
  // load-only Pick. Borrowed; must outlive the backend.
  KvRouter* kv_router = nullptr;
  // Credentials of the channels to workers (mTLS: services/common/peer_tls.h); nullptr:
  // plaintext.
  std::shared_ptr<grpc::ChannelCredentials> channel_credentials;
  // Called for each accepted request with images to encode, with their count, on the
  // submitting thread (the planner's arrival rate of image requests); may be empty.
  std::function<void(int64_t num_images)> on_image_request;
};

// RemoteBackendCounters: cumulative outcomes for /metrics.
struct RemoteBackendCounters {
  int64_t num_remote_prefills = 0;  // requests whose first token came from a prefill worker
  int64_t num_local_prefills = 0;   // requests prefilled on their decode worker
  int64_t num_prefill_retries = 0;
  int64_t num_encoded_images = 0;  // images sent to encoder workers (each once per request)
  int64_t num_encode_retries = 0;  // Encode calls tried again on another encoder worker
  // Images sent as bytes for the prefill / decode workers to encode (no encoder worker could).
  int64_t num_self_encoded_images = 0;
  int64_t num_decode_retries = 0;
  // Of those: after the first token was sent, on another decode worker pulling the same
  // pinned prefill KV.
  int64_t num_decode_retries_pinned_kv = 0;
  // Reservations made again because prefill answered after they (nearly) expired.
  int64_t num_decode_rereserves = 0;
  // Requests continued on another decode worker after theirs failed mid-stream.
  int64_t num_migrations = 0;
  // Of those moves: re-prefilled (prompt + streamed tokens) on a prefill worker, whose answer
  // gave the next token; the others re-prefilled on their new decode worker.
  int64_t num_migration_prefills = 0;
  int64_t num_reserve_full = 0;           // Reserve calls a decode worker answered without blocks
  int64_t num_decode_queue_timeouts = 0;  // requests failed: no decode blocks within the wait
  // Requests ended with an error because a worker failed and no other could continue them
  // (not those retried or migrated, nor decode queue timeouts); counted before delivery.
  int64_t num_worker_failures = 0;
  int64_t num_workers_dropped = 0;  // workers removed because a connection probe failed
};

// PickWorkerFor: the worker of `role` that takes `request` (`kv_router`'s choice when set,
// else `registry`'s load-based one) outside `exclude`, counted against it (release with the
// router's or registry's Release). A grammar-constrained request goes only to prefill and
// decode workers that advertised kGrammarCapability: one from before grammars would answer
// unconstrained. nullopt when none qualifies.
std::optional<WorkerSnapshot> PickWorkerFor(WorkerRegistry& registry, KvRouter* kv_router,
                                            WorkerRole role, const EngineRequest& request,
                                            int64_t tokens_needed,
                                            const std::set<std::string>& exclude);

// RemoteBackend is thread-safe and has no thread per request: every worker RPC
// uses gRPC's callback API, and a request's next step runs in the callback of
// its previous RPC (on gRPC's threads), so thousands of concurrent streams need
// no thousands of threads. Destruction aborts everything in flight and waits
// (bounded by the RPC deadlines) until every request has delivered its final
// output.
class RemoteBackend : public InferenceBackend {
 public:
  // `registry` is borrowed and must outlive the backend.
  RemoteBackend(WorkerRegistry* registry, RemoteBackendOptions options);
  ~RemoteBackend() override;

  // Submit: errors InvalidArgument (empty prompt, prompt >= max_model_len),
  // AlreadyExists (duplicate id in flight), Unavailable (no live decode worker, images without
  // a live encoder worker, or shutting down).
  absl::Status Submit(EngineRequest request, OutputCallback on_output) override;
  void Abort(const std::string& request_id) override;
  // Stats sums the load the workers reported with their last heartbeats.
  BackendStats Stats() const override;
  int32_t max_model_len() const override { return options_.max_model_len; }

  RemoteBackendCounters counters() const;
  int64_t num_in_flight() const;
  // StartDrain: new requests are refused (Unavailable) while those in flight go on (the
  // router's SIGTERM: it waits for num_in_flight() == 0, bounded, before it exits).
  void StartDrain();
  bool draining() const;

 private:
  class Call;          // one request's state machine (remote_backend.cc)
  class DecodeReader;  // the Decode stream of one attempt

  void OnWorkerRemoved(const WorkerSnapshot& worker, const absl::Status& why);
  std::shared_ptr<grpc::Channel> ChannelTo(const std::string& address);
  void Count(int64_t RemoteBackendCounters::*counter);
  // Forget drops a finished request; the last thing a request does.
  void Forget(const std::string& request_id);
  // PickWorker (PickWorkerFor with this backend's registry and kv_router) / ReleaseWorker:
  // options_.kv_router's choice when set, else the registry's.
  std::optional<WorkerSnapshot> PickWorker(WorkerRole role, const EngineRequest& request,
                                           int64_t tokens_needed,
                                           const std::set<std::string>& exclude);
  void ReleaseWorker(const std::string& worker_id, const std::string& request_id);
  // CanSelfEncode: the fallback is on and a live decode worker encodes images (a decode worker
  // serves every request; prefill workers that cannot encode are skipped).
  bool CanSelfEncode() const;

  WorkerRegistry* registry_;
  RemoteBackendOptions options_;

  mutable std::mutex mu_;
  std::condition_variable idle_cv_;
  std::map<std::string, std::shared_ptr<Call>> calls_;              // guarded by mu_
  std::map<std::string, std::shared_ptr<grpc::Channel>> channels_;  // guarded by mu_
  RemoteBackendCounters counters_;                                  // guarded by mu_
  bool shutting_down_ = false;                                      // guarded by mu_
  bool draining_ = false;                                           // guarded by mu_
  // One thread running delayed steps (backoff waits); outlives every Call (the destructor
  // waits for them before members go).
  TaskPool timers_{1};
  // Last member: destroyed first, while the registry and the backend still
  // exist.
  WorkerProber prober_;
};

}  // namespace sluice

#endif  // SLUICE_SERVICES_ROUTER_REMOTE_BACKEND_H_
