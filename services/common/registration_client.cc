#include "services/common/registration_client.h"

#include <chrono>
#include <utility>

#include <grpcpp/grpcpp.h>

#include "services/serve/log.h"

namespace sluice {
namespace {

std::chrono::system_clock::time_point DeadlineAfter(absl::Duration d) {
  return std::chrono::system_clock::now() + absl::ToChronoMicroseconds(d);
}

}  // namespace

RegistrationClient::RegistrationClient(RegistrationOptions options,
                                       std::function<v1::WorkerLoad()> load)
    : options_(std::move(options)), load_(std::move(load)) {
  stub_ = v1::Registry::NewStub(
      grpc::CreateChannel(options_.router_address, options_.credentials != nullptr
                                                       ? options_.credentials
                                                       : grpc::InsecureChannelCredentials()));
  thread_ = std::thread([this] { Loop(); });
}

RegistrationClient::~RegistrationClient() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

bool RegistrationClient::registered() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !worker_id_.empty();
}

bool RegistrationClient::RegisterOnce() {
  grpc::ClientContext context;
  context.set_deadline(DeadlineAfter(options_.rpc_timeout));
  v1::RegisterRequest request;
  *request.mutable_worker() = options_.worker;
  v1::RegisterResponse response;
  grpc::Status status = stub_->Register(&context, request, &response);
  if (status.error_code() == grpc::StatusCode::FAILED_PRECONDITION && options_.on_refused) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    options_.on_refused(status.error_message());
    return false;
  }
  if (!status.ok()) {
    spdlog::warn("register with router {} failed: {}", options_.router_address,
                 status.error_message());
    return false;
  }
  std::lock_guard<std::mutex> lock(mu_);
  worker_id_ = response.worker_id();
  if (response.lease_ms() > 0) lease_ = absl::Milliseconds(response.lease_ms());
  spdlog::info("registered with router {} as {} (lease {} ms)", options_.router_address,
               worker_id_, response.lease_ms());
  return true;
}

bool RegistrationClient::HeartbeatOnce() {
  v1::HeartbeatRequest request;
  {
    std::lock_guard<std::mutex> lock(mu_);
    request.set_worker_id(worker_id_);
  }
  *request.mutable_load() = load_();
  {
    std::lock_guard<std::mutex> lock(mu_);
    request.mutable_load()->set_draining(draining_);
  }
  grpc::ClientContext context;
  context.set_deadline(DeadlineAfter(options_.rpc_timeout));
  v1::HeartbeatResponse response;
  grpc::Status status = stub_->Heartbeat(&context, request, &response);
  std::lock_guard<std::mutex> lock(mu_);
  if (status.error_code() == grpc::StatusCode::NOT_FOUND) {
    spdlog::warn("router forgot worker {}; registering again", worker_id_);
    worker_id_.clear();
    return false;
  }
  if (!status.ok()) {
    spdlog::warn("heartbeat to router failed: {}", status.error_message());
    return false;
  }
  if (response.lease_ms() > 0) lease_ = absl::Milliseconds(response.lease_ms());
  return true;
}

void RegistrationClient::Loop() {
  for (;;) {
    bool have_id;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_) return;
      have_id = !worker_id_.empty();
    }
    bool ok = have_id ? HeartbeatOnce() : RegisterOnce();
    if (ok && !have_id) ok = HeartbeatOnce();  // report load right away
    std::unique_lock<std::mutex> lock(mu_);
    const absl::Duration wait = ok ? lease_ / 3 : options_.retry_interval;
    cv_.wait_for(lock, absl::ToChronoMicroseconds(wait), [&] { return stop_; });
  }
}

void RegistrationClient::Drain() {
  v1::DrainRequest request;
  {
    std::lock_guard<std::mutex> lock(mu_);
    draining_ = true;
    if (worker_id_.empty()) return;
    request.set_worker_id(worker_id_);
  }
  grpc::ClientContext context;
  context.set_deadline(DeadlineAfter(options_.rpc_timeout));
  v1::DrainResponse response;
  grpc::Status status = stub_->Drain(&context, request, &response);
  if (!status.ok()) spdlog::warn("drain: {}", status.error_message());
}

void RegistrationClient::Deregister() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  // No heartbeat or registration may run after this: one would re-register the worker.
  if (thread_.joinable()) thread_.join();
  v1::DeregisterRequest request;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (worker_id_.empty()) return;
    request.set_worker_id(worker_id_);
    worker_id_.clear();
  }
  grpc::ClientContext context;
  context.set_deadline(DeadlineAfter(options_.rpc_timeout));
  v1::DeregisterResponse response;
  grpc::Status status = stub_->Deregister(&context, request, &response);
  if (status.ok()) {
    spdlog::info("deregistered from router {}", options_.router_address);
  } else {
    spdlog::warn("deregister: {}", status.error_message());
  }
}

}  // namespace sluice
