#include "services/router/worker_registry.h"

#include <algorithm>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"

namespace sluice {

const char* WorkerRoleName(WorkerRole role) {
  switch (role) {
    case WorkerRole::kPrefill:
      return "prefill";
    case WorkerRole::kEncoder:
      return "encoder";
    case WorkerRole::kDecode:
      break;
  }
  return "decode";
}

WorkerRegistry::WorkerRegistry(WorkerRegistryOptions options, Clock clock)
    : options_(options), clock_(std::move(clock)) {}

HeartbeatLease WorkerRegistry::NewLease() const {
  HeartbeatLeaseOptions o;
  o.floor = options_.lease;
  o.cap = options_.max_lease;
  o.k = options_.lease_jitter_k;
  o.window = options_.lease_window;
  return HeartbeatLease(o);
}

absl::StatusOr<WorkerRegistry::Registration> WorkerRegistry::Register(
    WorkerRole role, const std::string& address, const WorkerLoad& load,
    std::vector<std::string> capabilities, bool layerwise_push,
    std::optional<KvPeerConfig> kv_peer) {
  if (address.empty()) return absl::InvalidArgumentError("worker address is empty");
  std::vector<WorkerSnapshot> replaced;
  RemovedCallback callback;
  Registration registration;
  absl::Status refused;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = workers_.begin(); it != workers_.end();) {
      if (it->second.address == address) {
        replaced.push_back(std::move(it->second));
        leases_.erase(it->first);
        it = workers_.erase(it);
      } else {
        ++it;
      }
    }
    callback = on_removed_;
    // Under the same lock as the insertion: two workers that disagree cannot both join.
    if (kv_peer.has_value() && role != WorkerRole::kEncoder) {
      refused = CheckKvPeer(role, address, *kv_peer);
    }
    if (refused.ok()) {
      registration.worker_id = absl::StrCat(WorkerRoleName(role), "-", next_id_++);
      registration.lease = options_.lease;
      WorkerSnapshot& worker = workers_[registration.worker_id];
      worker.worker_id = registration.worker_id;
      worker.role = role;
      worker.address = address;
      worker.load = load;
      worker.layerwise_push = layerwise_push;
      worker.kv_peer = std::move(kv_peer);
      const absl::Time now = clock_();
      HeartbeatLease& lease =
          leases_.insert_or_assign(registration.worker_id, NewLease()).first->second;
      lease.Observe(now);
      worker.lease = lease.Lease();
      worker.lease_expiry = now + worker.lease;
      worker.capabilities = std::move(capabilities);
    }
  }
  for (const WorkerSnapshot& old : replaced) {
    if (callback) {
      callback(old, absl::UnavailableError(
                        absl::StrCat("worker '", old.worker_id, "' restarted at ", address)));
    }
  }
  if (!refused.ok()) return refused;
  return registration;
}

absl::Status WorkerRegistry::CheckKvPeer(WorkerRole role, const std::string& address,
                                         const KvPeerConfig& kv_peer) const {
  const std::string joining = absl::StrCat(WorkerRoleName(role), " worker ", address);
  for (const auto& [id, w] : workers_) {
    if (w.role == WorkerRole::kEncoder || w.draining || !w.kv_peer.has_value()) continue;
    const std::string member = absl::StrCat("the registered ", WorkerRoleName(w.role),
                                            " worker ", id, " (", w.address, ")");
    std::optional<std::string> mismatch = KvPeerMismatch(kv_peer, joining, *w.kv_peer, member);
    // The mismatch alone: it names the joining worker, and each reader says the refusal in
    // its own words (the worker: "the router at ... refused this decode worker: ...").
    if (mismatch.has_value()) return absl::FailedPreconditionError(*mismatch);
  }
  return absl::OkStatus();
}

absl::Status WorkerRegistry::Heartbeat(const std::string& worker_id, const WorkerLoad& load) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) {
    return absl::NotFoundError(absl::StrCat("worker '", worker_id, "' is not registered"));
  }
  it->second.load = load;
  const absl::Time now = clock_();
  HeartbeatLease& lease = leases_.try_emplace(worker_id, NewLease()).first->second;
  lease.Observe(now);
  it->second.lease = lease.Lease();
  it->second.lease_expiry = now + it->second.lease;
  it->second.suspect = false;
  return absl::OkStatus();
}

absl::Status WorkerRegistry::Drain(const std::string& worker_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) {
    return absl::NotFoundError(absl::StrCat("worker '", worker_id, "' is not registered"));
  }
  it->second.draining = true;
  return absl::OkStatus();
}

absl::Status WorkerRegistry::Deregister(const std::string& worker_id) {
  return Remove(worker_id, absl::UnavailableError("worker deregistered"));
}

absl::Status WorkerRegistry::Remove(const std::string& worker_id, const absl::Status& why) {
  WorkerSnapshot removed;
  RemovedCallback callback;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = workers_.find(worker_id);
    if (it == workers_.end()) {
      return absl::NotFoundError(absl::StrCat("worker '", worker_id, "' is not registered"));
    }
    removed = std::move(it->second);
    workers_.erase(it);
    leases_.erase(worker_id);
    callback = on_removed_;
  }
  if (callback) callback(removed, why);
  return absl::OkStatus();
}

std::vector<std::string> WorkerRegistry::ExpireLeases() {
  std::vector<WorkerSnapshot> removed;
  std::vector<WorkerSnapshot> lapsed;
  RemovedCallback callback;
  LeaseLapsedCallback lapsed_callback;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const absl::Time now = clock_();
    for (auto it = workers_.begin(); it != workers_.end();) {
      WorkerSnapshot& worker = it->second;
      if (worker.lease_expiry + options_.suspect_grace < now) {
        leases_.erase(it->first);
        removed.push_back(std::move(worker));
        it = workers_.erase(it);
        continue;
      }
      if (worker.lease_expiry < now && !worker.suspect) {
        worker.suspect = true;
        lapsed.push_back(worker);
      }
      ++it;
    }
    callback = on_removed_;
    lapsed_callback = on_lease_lapsed_;
  }
  if (lapsed_callback) {
    for (const WorkerSnapshot& worker : lapsed) lapsed_callback(worker);
  }
  std::vector<std::string> ids;
  for (const WorkerSnapshot& worker : removed) {
    ids.push_back(worker.worker_id);
    if (callback) {
      callback(worker, absl::UnavailableError(absl::StrCat(
                           WorkerRoleName(worker.role), " worker '", worker.worker_id,
                           "' missed its lease by more than ",
                           absl::FormatDuration(options_.suspect_grace))));
    }
  }
  return ids;
}

std::optional<WorkerSnapshot> WorkerRegistry::Pick(WorkerRole role, int64_t tokens_needed,
                                                   const std::set<std::string>& exclude) {
  std::lock_guard<std::mutex> lock(mu_);
  const absl::Time now = clock_();
  WorkerSnapshot* best = nullptr;
  // (cannot fit, load score, times picked, id): lexicographic, lower is better.
  std::tuple<bool, double, int64_t, std::string> best_key;
  for (auto& [id, worker] : workers_) {
    if (worker.role != role || worker.draining || worker.lease_expiry < now) continue;
    if (exclude.count(id) > 0) continue;
    const WorkerLoad& load = worker.load;
    const double reported =
        static_cast<double>(load.num_waiting_requests + load.num_running_requests);
    const double usage = load.num_total_blocks > 0
                             ? 1.0 - static_cast<double>(load.num_free_blocks) /
                                         static_cast<double>(load.num_total_blocks)
                             : 0.0;
    const double score = std::max(static_cast<double>(worker.num_assigned), reported) +
                         options_.kv_usage_weight * usage;
    const bool cannot_fit =
        load.num_total_blocks > 0 && load.num_free_blocks * load.block_size < tokens_needed;
    auto key = std::make_tuple(cannot_fit, score, worker.num_picked_total, id);
    if (best == nullptr || key < best_key) {
      best = &worker;
      best_key = std::move(key);
    }
  }
  if (best == nullptr) return std::nullopt;
  ++best->num_assigned;
  ++best->num_picked_total;
  return *best;
}

void WorkerRegistry::Release(const std::string& worker_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = workers_.find(worker_id);
  if (it != workers_.end() && it->second.num_assigned > 0) --it->second.num_assigned;
}

std::optional<WorkerSnapshot> WorkerRegistry::Get(const std::string& worker_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) return std::nullopt;
  return it->second;
}

std::vector<WorkerSnapshot> WorkerRegistry::List() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<WorkerSnapshot> out;
  out.reserve(workers_.size());
  for (const auto& [id, worker] : workers_) out.push_back(worker);
  return out;
}

int64_t WorkerRegistry::CountLive(WorkerRole role) const {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t count = 0;
  for (const auto& [id, worker] : workers_) {
    if (worker.role == role && !worker.draining) ++count;
  }
  return count;
}

int64_t WorkerRegistry::CountLiveWith(WorkerRole role, std::string_view capability) const {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t count = 0;
  for (const auto& [id, worker] : workers_) {
    if (worker.role == role && !worker.draining && worker.Has(capability)) ++count;
  }
  return count;
}

void WorkerRegistry::OnRemoved(RemovedCallback callback) {
  std::lock_guard<std::mutex> lock(mu_);
  on_removed_ = std::move(callback);
}

void WorkerRegistry::OnLeaseLapsed(LeaseLapsedCallback callback) {
  std::lock_guard<std::mutex> lock(mu_);
  on_lease_lapsed_ = std::move(callback);
}

}  // namespace sluice
