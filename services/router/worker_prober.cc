#include "services/router/worker_prober.h"

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"

namespace sluice {

WorkerProber::WorkerProber(WorkerRegistry* registry, absl::Duration timeout,
                           std::shared_ptr<grpc::ChannelCredentials> credentials)
    : registry_(registry),
      timeout_(timeout),
      credentials_(credentials != nullptr ? std::move(credentials)
                                          : grpc::InsecureChannelCredentials()),
      thread_([this] { Loop(); }) {}

WorkerProber::~WorkerProber() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void WorkerProber::Suspect(const WorkerSnapshot& worker) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_ || !pending_.insert(worker.worker_id).second) return;
    queue_.push_back(Target{worker.worker_id, worker.address, worker.role});
  }
  cv_.notify_one();
}

int64_t WorkerProber::num_removed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return num_removed_;
}

WorkerProber::Probe WorkerProber::Connect(const std::string& address) const {
  grpc::ChannelArguments args;
  // A connection of its own: the backend's channel to the worker may sit in
  // reconnect backoff, or share a subchannel that still looks connected.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateCustomChannel(address, credentials_, args);
  const auto deadline = std::chrono::system_clock::now() + absl::ToChronoMicroseconds(timeout_);
  for (;;) {
    const grpc_connectivity_state state = channel->GetState(/*try_to_connect=*/true);
    if (state == GRPC_CHANNEL_READY) return Probe::kUp;
    // One refused or failed connect is enough: nothing listens at the address.
    if (state == GRPC_CHANNEL_TRANSIENT_FAILURE || state == GRPC_CHANNEL_SHUTDOWN) {
      return Probe::kFailed;
    }
    if (!channel->WaitForStateChange(state, deadline)) return Probe::kTimedOut;
  }
}

void WorkerProber::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (stop_) return;
    Target target = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    const Probe probe = Connect(target.address);
    bool removed = false;
    if (probe == Probe::kFailed) {
      // NotFound: the lease or a restart removed it first.
      removed = registry_
                    ->Remove(target.worker_id,
                             absl::UnavailableError(absl::StrCat(
                                 WorkerRoleName(target.role), " worker '", target.worker_id,
                                 "' at ", target.address, " is unreachable (connection failed)")))
                    .ok();
    }
    lock.lock();
    pending_.erase(target.worker_id);
    if (removed) ++num_removed_;
  }
}

}  // namespace sluice
