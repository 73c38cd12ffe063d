// WorkerProber: confirms a suspected worker death within milliseconds, so the
// router drops a killed worker on the failure of its connection rather than at
// the end of its lease (seconds during which new requests would still pick it).
//
// RemoteBackend calls Suspect() after an RPC to a worker failed the way calls to
// a dead process fail (UNAVAILABLE, reset stream), and when a worker's lease
// lapsed. The prober's thread opens a fresh connection to the worker's address:
// if the connection attempt fails (refused: nothing listens there), the worker is
// removed from the registry (WorkerRegistry::Remove, which runs the removal
// callback: RemoteBackend then cancels the worker's other RPCs). A worker that
// answers stays, and so does one whose connect neither succeeds nor fails within
// `timeout` (a stalled or stopped process, a slow network): its RPCs keep their own
// deadlines and its lease decides. A live worker removed by mistake gets NotFound
// on its next heartbeat and registers again.
#ifndef SLUICE_SERVICES_ROUTER_WORKER_PROBER_H_
#define SLUICE_SERVICES_ROUTER_WORKER_PROBER_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include <grpcpp/security/credentials.h>

#include "absl/time/time.h"
#include "services/router/worker_registry.h"

namespace sluice {

class WorkerProber {
 public:
  // `registry` is borrowed and must outlive the prober. `timeout` bounds one
  // probe (a connect that neither succeeds nor fails in time leaves the worker).
  // `credentials`: those of the router's channels to workers (mTLS; a failed handshake fails
  // the probe); nullptr: plaintext.
  WorkerProber(WorkerRegistry* registry, absl::Duration timeout,
               std::shared_ptr<grpc::ChannelCredentials> credentials = nullptr);
  // Stops the thread; waits for at most the probe in progress (<= timeout).
  ~WorkerProber();

  // Suspect queues a probe of `worker` (non-blocking, thread-safe). A worker
  // already queued or being probed is not queued twice.
  void Suspect(const WorkerSnapshot& worker);

  // Number of workers removed by a failed probe so far.
  int64_t num_removed() const;

 private:
  struct Target {
    std::string worker_id;
    std::string address;
    WorkerRole role;
  };
  void Loop();
  enum class Probe { kUp, kFailed, kTimedOut };
  // Connect connects to `address` with a channel of its own: kUp once the
  // connection is up, kFailed when it failed, kTimedOut when `timeout_` passed.
  Probe Connect(const std::string& address) const;

  WorkerRegistry* registry_;
  absl::Duration timeout_;
  std::shared_ptr<grpc::ChannelCredentials> credentials_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Target> queue_;       // guarded by mu_
  std::set<std::string> pending_;  // worker ids queued or in probe; guarded by mu_
  int64_t num_removed_ = 0;        // guarded by mu_
  bool stop_ = false;              // guarded by mu_
  std::thread thread_;
};

}  // namespace sluice

#endif  // SLUICE_SERVICES_ROUTER_WORKER_PROBER_H_
