#include "services/router/registry_service.h"

#include <grpcpp/grpcpp.h>

#include <optional>
#include <string>

#include "services/common/peer_tls.h"
#include "services/serve/log.h"

namespace sluice {
namespace {

grpc::Status ToGrpc(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

// KvPeerOf: what the worker's KV peers must share, when it reported it (WorkerInfo.kv_peer).
std::optional<KvPeerConfig> KvPeerOf(const v1::WorkerInfo& info) {
  if (!info.has_kv_peer()) return std::nullopt;
  KvPeerConfig config;
  switch (info.kv_transfer_mode()) {
    case v1::KV_TRANSFER_MODE_PUSH:
      config.transfer_mode = "push";
      break;
    case v1::KV_TRANSFER_MODE_LAYERWISE:
      config.transfer_mode = "layerwise";
      break;
    default:
      config.transfer_mode = "pull";  // UNSPECIFIED: a peer that predates the field
  }
  config.swa_replay_tokens = info.kv_peer().swa_replay_tokens();
  const v1::KvLayout& layout = info.kv_peer().layout();
  config.block_size = layout.block_size();
  config.num_layers = layout.num_layers();
  config.values_per_token = layout.floats_per_token();
  config.dtype_bytes = layout.dtype_bytes();
  return config;
}

int32_t LeaseMs(absl::Duration lease) {
  return static_cast<int32_t>(absl::ToInt64Milliseconds(lease));
}

}  // namespace

grpc::Status RegistryService::CheckCaller(const grpc::ServerContext& context) const {
  if (!require_client_certificate_ || HasVerifiedPeerCertificate(context)) {
    return grpc::Status::OK;
  }
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                      "the Registry needs a client certificate of the cluster CA (mTLS)");
}

grpc::Status RegistryService::Register(grpc::ServerContext* context,
                                       const v1::RegisterRequest* request,
                                       v1::RegisterResponse* response) {
  if (grpc::Status caller = CheckCaller(*context); !caller.ok()) return caller;
  const v1::WorkerInfo& info = request->worker();
  WorkerRole role;
  switch (info.role()) {
    case v1::WORKER_ROLE_PREFILL:
      role = WorkerRole::kPrefill;
      break;
    case v1::WORKER_ROLE_DECODE:
      role = WorkerRole::kDecode;
      break;
    case v1::WORKER_ROLE_ENCODER:
      role = WorkerRole::kEncoder;
      break;
    default:
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "worker.role is unspecified");
  }
  WorkerLoad load;
  load.num_total_blocks = info.num_total_blocks();
  load.num_free_blocks = info.num_total_blocks();  // until the first heartbeat says otherwise
  load.block_size = info.kv_block_size();
  auto registration = registry_->Register(
      role, info.address(), load,
      std::vector<std::string>(info.capabilities().begin(), info.capabilities().end()),
      info.kv_transfer_mode() == v1::KV_TRANSFER_MODE_LAYERWISE, KvPeerOf(info));
  if (!registration.ok()) {
    if (absl::IsFailedPrecondition(registration.status())) {
      // A misconfigured worker: it exits on this answer; the operator reads why here too.
      spdlog::error("refused {} worker {}: {}", WorkerRoleName(role), info.address(),
                    std::string(registration.status().message()));
    }
    return ToGrpc(registration.status());
  }
  response->set_worker_id(registration->worker_id);
  response->set_lease_ms(LeaseMs(registration->lease));
  return grpc::Status::OK;
}

grpc::Status RegistryService::Heartbeat(grpc::ServerContext* context,
                                        const v1::HeartbeatRequest* request,
                                        v1::HeartbeatResponse* response) {
  if (grpc::Status caller = CheckCaller(*context); !caller.ok()) return caller;
  const v1::WorkerLoad& wire = request->load();
  auto previous = registry_->Get(request->worker_id());
  WorkerLoad load;
  load.num_waiting_requests = wire.num_waiting_requests();
  load.num_running_requests = wire.num_running_requests();
  load.num_free_blocks = wire.num_free_blocks();
  load.num_total_blocks = wire.num_total_blocks();
  load.block_size = previous.has_value() ? previous->load.block_size : 0;
  for (auto [from, to] : {std::pair{&wire.prefill_steps(), &load.prefill_steps},
                          std::pair{&wire.decode_steps(), &load.decode_steps},
                          std::pair{&wire.encode_steps(), &load.encode_steps}}) {
    to->num_steps = from->num_steps();
    to->num_tokens = from->num_tokens();
    to->seconds = from->seconds();
  }
  load.num_images_answered = wire.num_images_answered();
  absl::Status status = registry_->Heartbeat(request->worker_id(), load);
  if (status.ok() && wire.draining()) status = registry_->Drain(request->worker_id());
  if (!status.ok()) return ToGrpc(status);
  response->set_lease_ms(LeaseMs(registry_->lease()));
  auto worker = registry_->Get(request->worker_id());
  response->set_drain(worker.has_value() && worker->draining);
  return grpc::Status::OK;
}

grpc::Status RegistryService::Drain(grpc::ServerContext* context, const v1::DrainRequest* request,
                                    v1::DrainResponse* response) {
  if (grpc::Status caller = CheckCaller(*context); !caller.ok()) return caller;
  return ToGrpc(registry_->Drain(request->worker_id()));
}

grpc::Status RegistryService::Deregister(grpc::ServerContext* context,
                                         const v1::DeregisterRequest* request,
                                         v1::DeregisterResponse* response) {
  if (grpc::Status caller = CheckCaller(*context); !caller.ok()) return caller;
  return ToGrpc(registry_->Deregister(request->worker_id()));
}

}  // namespace sluice
