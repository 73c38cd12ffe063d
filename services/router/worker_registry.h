// WorkerRegistry: the router's view of its prefill and decode workers — who is
// alive (leases), who accepts new work (drain), and how loaded each one is —
// plus the load-aware choice of a worker for a new request. Transport-free: the
// gRPC Registry service and the tests drive it.
//
// Leases: a worker whose lease lapsed is only *suspect*: it gets no new work, but it stays
// registered and the RPCs already running on it go on (a machine-wide stall of a few seconds
// makes every worker miss its lease at once; its requests must not fail for that). The
// lease-lapsed callback lets the router probe its connection; only a failed connection
// (Remove), an explicit deregistration, a restart at the same address, or a lapse longer than
// `suspect_grace` removes it (and runs the removal callback, which cancels its RPCs). The
// next heartbeat of a suspect worker clears the suspicion. Each worker's lease is tuned from
// the jitter of its own heartbeats (HeartbeatLease): never shorter than the configured lease,
// longer for a worker whose heartbeats arrive irregularly.
#ifndef SLUICE_SERVICES_ROUTER_WORKER_REGISTRY_H_
#define SLUICE_SERVICES_ROUTER_WORKER_REGISTRY_H_

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "engine/sched/step_totals.h"
#include "services/router/heartbeat_lease.h"
#include "services/router/kv_peer_config.h"

namespace sluice {

// kEncoder: a vision encoder (images to embeddings); it has no KV cache.
enum class WorkerRole { kPrefill, kDecode, kEncoder };
const char* WorkerRoleName(WorkerRole role);  // "prefill" | "decode" | "encoder"

// WorkerLoad: what a worker reports with each heartbeat (counts, not rates).
struct WorkerLoad {
  int64_t num_waiting_requests = 0;  // queued in the worker's engine, not yet running
  int64_t num_running_requests = 0;  // being prefilled or decoded
  int64_t num_free_blocks = 0;       // KV cache blocks free
  int64_t num_total_blocks = 0;      // KV cache blocks in total
  int64_t block_size = 0;            // tokens per KV block
  StepTotals prefill_steps;          // cumulative timed engine steps (planner cost models)
  StepTotals decode_steps;
  // Encoder workers: Encode calls, images encoded (cache hits excluded), seconds; images
  // answered in all (WorkerLoad.encode_steps / num_images_answered).
  StepTotals encode_steps;
  int64_t num_images_answered = 0;
};

// WorkerSnapshot: a copy of one registry entry.
struct WorkerSnapshot {
  std::string worker_id;
  WorkerRole role = WorkerRole::kDecode;
  std::string address;  // gRPC "host:port"
  WorkerLoad load;
  bool draining = false;
  bool suspect = false;  // its lease lapsed: no new work until its next heartbeat
  // A prefill worker in layerwise KV transfer mode: it takes the decode reservation in its
  // Prefill call (WorkerInfo.kv_transfer_mode).
  bool layerwise_push = false;
  // Prefill and decode workers: the KV settings its peers must share, as registered; nullopt
  // for a worker that did not report them (one from before the check).
  std::optional<KvPeerConfig> kv_peer;
  int64_t num_assigned = 0;  // requests this router sent and has not released yet
  int64_t num_picked_total = 0;
  absl::Duration lease;  // granted at the last heartbeat (HeartbeatLease)
  absl::Time lease_expiry;
  // What the worker advertised at registration (WorkerInfo.capabilities), e.g. "grammar".
  std::vector<std::string> capabilities;
  bool Has(std::string_view capability) const {
    for (const std::string& c : capabilities) {
      if (c == capability) return true;
    }
    return false;
  }
};

// kGrammarCapability: the worker enforces SamplingParams.grammar_ebnf.
inline constexpr char kGrammarCapability[] = "grammar";
// kImageEncodeCapability: the worker encodes images sent as bytes (MultimodalInput.image) with
// its own vision tower: where no encoder worker could, prefill and decode encode themselves.
inline constexpr char kImageEncodeCapability[] = "image_encode";
// kResumeCapability: the worker continues a migrated request through prefill: a prefill worker
// prefills prompt + resumed_output_token_ids, a decode worker reserves for them and decodes on
// from the prefill's token (worker.proto).
inline constexpr char kResumeCapability[] = "resume";

struct WorkerRegistryOptions {
  // A worker silent for this long is suspect; workers heartbeat at a third of it. With
  // lease_jitter_k > 0 it is the floor of each worker's tuned lease (HeartbeatLease).
  absl::Duration lease = absl::Seconds(6);
  // Weight of KV pressure (usage ratio in [0, 1]) against one queued request in
  // the score.
  double kv_usage_weight = 4.0;
  // A suspect worker silent for this much longer than its lease is removed.
  absl::Duration suspect_grace = absl::Seconds(60);
  // The lease tuned from heartbeat jitter (HeartbeatLease): mean + k·stddev of the worker's
  // last lease_window heartbeat inter-arrival times, within [lease, max_lease]; k = 0: fixed.
  double lease_jitter_k = 4.0;
  absl::Duration max_lease = absl::Seconds(30);
  size_t lease_window = 32;
};

// WorkerRegistry is thread-safe. Time comes from `clock` (absl::Now by default)
// so tests can drive leases deterministically.
class WorkerRegistry {
 public:
  using Clock = std::function<absl::Time()>;
  // RemovedCallback runs (without the registry lock held) for each worker
  // removed by a lease expiry or deregistration, with the snapshot it had. Must
  // not call back into Register.
  using RemovedCallback = std::function<void(const WorkerSnapshot&, const absl::Status& why)>;
  // LeaseLapsedCallback runs (without the lock) once for each worker that became suspect.
  using LeaseLapsedCallback = std::function<void(const WorkerSnapshot&)>;

  explicit WorkerRegistry(WorkerRegistryOptions options = {}, Clock clock = &absl::Now);

  // Registration: what Register hands back to the worker.
  struct Registration {
    std::string worker_id;  // "<role>-<n>", unique for the registry's lifetime
    absl::Duration lease;
  };
  // Register adds a worker and assigns it a fresh id. A worker already
  // registered at the same address is replaced (a restart): the old entry is
  // removed first (OnRemoved runs for it). InvalidArgument for an empty
  // address. `layerwise_push`: WorkerSnapshot::layerwise_push.
  // `kv_peer` (prefill and decode workers): FailedPrecondition, naming both sides' values
  // (KvPeerMismatch), when it differs from the kv_peer of a live, non-draining prefill or
  // decode worker at another address: the worker is not added (an entry it replaces is still
  // removed: that process is gone). Workers without a kv_peer are not compared. A draining
  // worker takes no new requests, so a pool may change its settings by a rolling restart.
  absl::StatusOr<Registration> Register(WorkerRole role, const std::string& address,
                                        const WorkerLoad& load,
                                        std::vector<std::string> capabilities = {},
                                        bool layerwise_push = false,
                                        std::optional<KvPeerConfig> kv_peer = std::nullopt);
  // Heartbeat extends the lease and records `load`. NotFound when the worker is
  // unknown (its lease already expired): the worker must Register again.
  absl::Status Heartbeat(const std::string& worker_id, const WorkerLoad& load);
  // Drain stops new work for the worker; requests already assigned continue.
  // NotFound if unknown.
  absl::Status Drain(const std::string& worker_id);
  // Deregister removes the worker at once (clean shutdown). NotFound if
  // unknown.
  absl::Status Deregister(const std::string& worker_id);
  // Remove drops a worker the router found dead (its gRPC channel cannot
  // connect) without waiting for its lease; OnRemoved runs with `why`. A worker
  // that is in fact alive gets NotFound on its next heartbeat and registers
  // again. NotFound if unknown (already removed).
  absl::Status Remove(const std::string& worker_id, const absl::Status& why);
  // ExpireLeases marks every worker whose lease ended before now suspect (the
  // lease-lapsed callback runs for the newly suspect ones) and removes those
  // silent for longer than lease + suspect_grace; returns the removed ids.
  std::vector<std::string> ExpireLeases();

  // Pick chooses the least-loaded live, non-draining worker of `role`, skipping
  // `exclude`, and counts one assignment against it (undo with Release). Score
  // (lower is better):
  //   max(num_assigned, reported waiting + running) + kv_usage_weight * KV
  //   usage ratio,
  // where workers whose free KV (free blocks * block_size, in tokens) is below
  // `tokens_needed` rank after all others; ties go to the worker picked least
  // often, then to the smallest id. nullopt when none qualifies.
  std::optional<WorkerSnapshot> Pick(WorkerRole role, int64_t tokens_needed,
                                     const std::set<std::string>& exclude = {});
  // Release undoes one Pick of `worker_id` (no-op for a removed worker).
  void Release(const std::string& worker_id);

  std::optional<WorkerSnapshot> Get(const std::string& worker_id) const;
  std::vector<WorkerSnapshot> List() const;  // ordered by worker id
  int64_t CountLive(WorkerRole role) const;  // registered and not draining
  // CountLive of the workers that advertised `capability`.
  int64_t CountLiveWith(WorkerRole role, std::string_view capability) const;

  // OnRemoved sets the removal callback (replaces any previous one).
  void OnRemoved(RemovedCallback callback);
  // OnLeaseLapsed sets the lease-lapsed callback (replaces any previous one).
  void OnLeaseLapsed(LeaseLapsedCallback callback);
  // The configured lease (what workers are told; the floor of the tuned ones).
  absl::Duration lease() const { return options_.lease; }

 private:
  HeartbeatLease NewLease() const;
  // CheckKvPeer: Register's kv_peer check against the workers registered now; mu_ held.
  absl::Status CheckKvPeer(WorkerRole role, const std::string& address,
                           const KvPeerConfig& kv_peer) const;

  WorkerRegistryOptions options_;
  Clock clock_;
  mutable std::mutex mu_;
  std::map<std::string, WorkerSnapshot> workers_;  // guarded by mu_
  std::map<std::string, HeartbeatLease> leases_;   // by worker id; guarded by mu_
  int64_t next_id_ = 1;                            // guarded by mu_
  RemovedCallback on_removed_;                     // guarded by mu_
  LeaseLapsedCallback on_lease_lapsed_;            // guarded by mu_
};

}  // namespace sluice

#endif  // SLUICE_SERVICES_ROUTER_WORKER_REGISTRY_H_
