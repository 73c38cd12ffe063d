// RegistrationClient: keeps a worker registered with the router (Registry service): registers,
// heartbeats within the lease with the worker's load, registers again when the router forgot the
// worker (NOT_FOUND: lease expired or router restarted), drains on shutdown and deregisters at
// its end. One background thread; every RPC has a deadline. A refusal for good (the worker's
// settings differ from the router's pool) stops it and tells the worker (on_refused).
#ifndef SLUICE_SERVICES_COMMON_REGISTRATION_CLIENT_H_
#define SLUICE_SERVICES_COMMON_REGISTRATION_CLIENT_H_

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include <grpcpp/security/credentials.h>

#include "absl/time/time.h"
#include "sluice/v1/registry.grpc.pb.h"

namespace sluice {

struct RegistrationOptions {
  std::string router_address;  // host:port of the router's gRPC Registry
  v1::WorkerInfo worker;
  absl::Duration rpc_timeout = absl::Seconds(2);
  absl::Duration retry_interval = absl::Milliseconds(500);  // while the router is unreachable
  // Credentials of the channel to the router (mTLS); nullptr: plaintext.
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  // Called once, from the client's thread, when the router refuses the worker for good
  // (Register answered FAILED_PRECONDITION: settings that differ from its pool's), with the
  // router's reason; the client then stops (no retry, no heartbeat). Must not destroy the
  // client. Empty: the refusal is logged and retried like any failed Register.
  std::function<void(const std::string& why)> on_refused;
};

class RegistrationClient {
 public:
  // `load` is called from the client's thread before each heartbeat; it must be thread-safe.
  RegistrationClient(RegistrationOptions options, std::function<v1::WorkerLoad()> load);
  ~RegistrationClient();  // stops the thread (no drain, no deregistration)

  // Drain tells the router to stop routing new work here (bounded by rpc_timeout).
  void Drain();
  // Deregister stops heartbeating and has the router remove this worker at once, cancelling
  // its calls still in flight here so that they fail over (bounded by rpc_timeout). Call once,
  // last, before the server stops; registered() is false afterwards.
  void Deregister();
  bool registered() const;

 private:
  void Loop();
  // RegisterOnce: true once registered; sets stop_ when refused for good.
  bool RegisterOnce();
  bool HeartbeatOnce();

  RegistrationOptions options_;
  std::function<v1::WorkerLoad()> load_;
  std::unique_ptr<v1::Registry::Stub> stub_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;             // guarded by mu_
  std::string worker_id_;         // guarded by mu_; empty: not registered
  absl::Duration lease_ = absl::Seconds(3);  // guarded by mu_
  bool draining_ = false;         // guarded by mu_
  std::thread thread_;
};

}  // namespace sluice

#endif  // SLUICE_SERVICES_COMMON_REGISTRATION_CLIENT_H_
