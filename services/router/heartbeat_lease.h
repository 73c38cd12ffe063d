// HeartbeatLease: one worker's lease, tuned from the jitter of its heartbeats.
//
// A fixed lease is wrong in both directions: on a quiet machine a worker heartbeats like a
// clock and a stall is noticed late; on a loaded one (or one that stalls for seconds now and
// then) heartbeats arrive late and a fixed lease marks healthy workers suspect. The router
// records each worker's heartbeat inter-arrival times (the last `window`) and, once it has
// `min_samples` of them, grants the lease
//
//   clamp(mean + k · stddev, floor, cap)
//
// — a heartbeat later than mean + k·σ is unlikely for any distribution (Chebyshev: at most
// 1/k² of them), as in the accrual failure detectors of Hayashibara et al. 2004. `floor` is
// the configured lease (the worker heartbeats at a third of it, so the floor still tolerates
// two lost heartbeats), `cap` bounds how late a silent worker is noticed. k = 0: always floor.
// Not thread-safe (WorkerRegistry guards it).
#ifndef SLUICE_SERVICES_ROUTER_HEARTBEAT_LEASE_H_
#define SLUICE_SERVICES_ROUTER_HEARTBEAT_LEASE_H_

#include <cstddef>
#include <vector>

#include "absl/time/time.h"

namespace sluice {

struct HeartbeatLeaseOptions {
  absl::Duration floor = absl::Seconds(6);
  absl::Duration cap = absl::Seconds(30);  // below floor: floor
  double k = 4.0;                           // >= 0
  size_t window = 32;                       // inter-arrival times kept, >= 1
  size_t min_samples = 4;                   // before that: floor
};

class HeartbeatLease {
 public:
  explicit HeartbeatLease(HeartbeatLeaseOptions options = {});

  // Observe records one heartbeat (or the registration) at `now`; from the second on, the
  // time since the previous one is an inter-arrival sample.
  void Observe(absl::Time now);
  // Lease: the lease granted now (see the banner).
  absl::Duration Lease() const;
  size_t num_samples() const { return gaps_.size(); }

 private:
  HeartbeatLeaseOptions options_;
  std::vector<double> gaps_;  // seconds; a ring of the last options_.window
  size_t next_ = 0;
  bool seen_ = false;
  absl::Time last_;
};

}  // namespace sluice

#endif  // SLUICE_SERVICES_ROUTER_HEARTBEAT_LEASE_H_
