// RegistryService: the router's sluice.v1.Registry gRPC service over a
// WorkerRegistry (Register / Heartbeat / Drain / Deregister from prefill and
// decode workers).
#ifndef SLUICE_SERVICES_ROUTER_REGISTRY_SERVICE_H_
#define SLUICE_SERVICES_ROUTER_REGISTRY_SERVICE_H_

#include "services/router/worker_registry.h"
#include "sluice/v1/registry.grpc.pb.h"

namespace sluice {

// RegistryService maps the wire messages onto `registry` (borrowed, must outlive the service).
// Errors: INVALID_ARGUMENT (unspecified role, empty address), FAILED_PRECONDITION (Register of a
// prefill or decode worker whose KV settings differ from the pool's: WorkerRegistry::Register;
// logged as an error), NOT_FOUND (unknown worker id on Heartbeat/Drain/Deregister: on Heartbeat
// the worker must Register again), UNAUTHENTICATED (with require_client_certificate: a caller
// without a verified certificate of the cluster CA, see services/common/peer_tls.h). Thread-safe
// as WorkerRegistry is.
class RegistryService final : public v1::Registry::Service {
 public:
  explicit RegistryService(WorkerRegistry* registry, bool require_client_certificate = false)
      : registry_(registry), require_client_certificate_(require_client_certificate) {}

  grpc::Status Register(grpc::ServerContext* context, const v1::RegisterRequest* request,
                        v1::RegisterResponse* response) override;
  grpc::Status Heartbeat(grpc::ServerContext* context, const v1::HeartbeatRequest* request,
                         v1::HeartbeatResponse* response) override;
  grpc::Status Drain(grpc::ServerContext* context, const v1::DrainRequest* request,
                     v1::DrainResponse* response) override;
  grpc::Status Deregister(grpc::ServerContext* context, const v1::DeregisterRequest* request,
                          v1::DeregisterResponse* response) override;

 private:
  // UNAUTHENTICATED unless the caller may act as a worker.
  grpc::Status CheckCaller(const grpc::ServerContext& context) const;

  WorkerRegistry* registry_;
  const bool require_client_certificate_;
};

}  // namespace sluice

#endif  // SLUICE_SERVICES_ROUTER_REGISTRY_SERVICE_H_
