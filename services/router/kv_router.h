// KvRouter: KV-aware worker choice for `sluice router` (--routing-policy kv|load|round_robin).
//
// It keeps a KvIndex fed from every registered worker's KV event log (a poller thread calls
// sluice.v1.KvEventSource.ReadKvEvents(after_seq) on each worker every poll interval and
// GetKvSnapshot on a gap; see proto/sluice/v1/kv_events.proto for why the router pulls), hashes
// each prompt with the block-hash identity the worker reported (engine/kv/block_hash.h), scores
// the candidates with KvAwarePolicy and records the choice in the index at once.
//
// Accounting: Pick counts one assignment in the WorkerRegistry (so its Release, the registry's
// load view and /v1/workers stay right) and keeps the request's new prefill tokens as the
// worker's router-side queue until Release.
#ifndef SLUICE_SERVICES_ROUTER_KV_ROUTER_H_
#define SLUICE_SERVICES_ROUTER_KV_ROUTER_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/security/credentials.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "engine/kv/block_hash.h"
#include "services/router/kv_aware_policy.h"
#include "services/router/kv_index.h"
#include "services/router/worker_registry.h"

namespace grpc {
class Channel;
}  // namespace grpc

namespace sluice {

enum class RoutingPolicy { kKv, kLoad, kRoundRobin };
// ParseRoutingPolicy: "kv" | "load" | "round_robin"; InvalidArgument naming the value otherwise.
absl::StatusOr<RoutingPolicy> ParseRoutingPolicy(const std::string& name);

struct KvRouterOptions {
  RoutingPolicy policy = RoutingPolicy::kKv;
  KvIndexOptions index;
  KvAwarePolicyOptions weights;
  absl::Duration poll_interval = absl::Milliseconds(50);
  absl::Duration rpc_deadline = absl::Seconds(2);  // one ReadKvEvents / GetKvSnapshot
  // Prompts shorter than this prefill on their decode worker (RemoteBackendOptions'
  // min_remote_prefill_tokens): the decode choice is KV-aware only for them, or when no prefill
  // worker is live.
  int64_t min_remote_prefill_tokens = 0;
  bool start_poller = true;  // false: tests call PollOnce
  // Credentials of the channels to workers (mTLS); nullptr: plaintext.
  std::shared_ptr<grpc::ChannelCredentials> channel_credentials;
};

// KvRouterCounters: cumulative, for /metrics and the bench.
struct KvRouterCounters {
  int64_t num_picks = 0;
  int64_t num_picks_with_overlap = 0;  // the chosen worker held >= 1 prompt block
  int64_t predicted_cached_tokens = 0; // sum of C_w of the chosen workers
  int64_t num_resyncs = 0;             // snapshots fetched
  int64_t num_poll_errors = 0;         // RPCs that failed (worker down, deadline)
};

// KvRouter is thread-safe.
class KvRouter {
 public:
  // `registry` is borrowed and must outlive the router.
  KvRouter(WorkerRegistry* registry, KvRouterOptions options);
  ~KvRouter();  // stops and joins the poller

  // Pick chooses a live, non-draining worker of `role` outside `exclude` for a request with
  // prompt `prompt` (token ids) under prefix-cache namespace `cache_salt` (empty: shared),
  // needing `tokens_needed` KV tokens in all, and counts it in the registry (undo with
  // Release). kLoad, and decode picks whose prompt prefills remotely, use the registry's
  // load-only Pick. `image_keys`: the prompt's images (content hash over their placeholder
  // runs), extra keys of the block hashes as the engines compute them. nullopt when none
  // qualifies.
  std::optional<WorkerSnapshot> Pick(WorkerRole role, const std::string& request_id,
                                     const std::vector<int32_t>& prompt,
                                     const std::string& cache_salt, int64_t tokens_needed,
                                     const std::set<std::string>& exclude,
                                     absl::Span<const BlockExtraKeySpan> image_keys = {});
  // Release undoes Pick's accounting for (worker_id, request_id).
  void Release(const std::string& worker_id, const std::string& request_id);

  // PollOnce reads every registered worker's new events (snapshot on a gap) and drops index
  // entries of workers that left the registry, and the channels to addresses no registered
  // worker has any more (a worker restarted elsewhere).
  void PollOnce();
  // Channels held to workers' KV event sources: at most one per registered worker's address.
  size_t NumChannels() const;

  KvIndex& index() { return index_; }
  KvRouterCounters counters() const;
  RoutingPolicy policy() const { return options_.policy; }

 private:
  struct WorkerKv {
    std::string address;
    std::string identity;  // empty until the worker answered once
    int64_t block_size = 0;
  };
  struct Outstanding {
    int64_t requests = 0;
    int64_t new_tokens = 0;
  };

  void PollWorker(const WorkerSnapshot& worker);
  std::shared_ptr<grpc::Channel> ChannelTo(const std::string& address);
  // Pick the one worker `id` in the registry (counts the assignment); `others` (the candidates)
  // and `excluded` (the caller's exclusions) are the workers it must not fall back to.
  std::optional<WorkerSnapshot> Assign(WorkerRole role, const std::string& id,
                                       int64_t tokens_needed,
                                       const std::vector<WorkerSnapshot>& others,
                                       const std::set<std::string>& excluded);
  void PollLoop();

  WorkerRegistry* registry_;
  KvRouterOptions options_;
  KvIndex index_;

  mutable std::mutex mu_;
  std::map<std::string, WorkerKv> workers_;                          // guarded by mu_
  std::map<std::string, std::shared_ptr<grpc::Channel>> channels_;   // guarded by mu_
  std::map<std::string, Outstanding> outstanding_;                   // guarded by mu_
  // (worker_id, request_id) -> new tokens counted in outstanding_.
  std::map<std::pair<std::string, std::string>, int64_t> assigned_;  // guarded by mu_
  std::map<std::string, std::unique_ptr<BlockHasher>> hashers_;      // by identity; mu_
  KvRouterCounters counters_;                                        // guarded by mu_
  uint64_t round_robin_next_[3] = {0, 0, 0};  // per WorkerRole; guarded by mu_

  std::mutex poll_mu_;  // one PollOnce at a time
  std::mutex stop_mu_;
  std::condition_variable stop_cv_;
  bool stopping_ = false;  // guarded by stop_mu_
  std::thread poller_;
};

}  // namespace sluice

#endif  // SLUICE_SERVICES_ROUTER_KV_ROUTER_H_
