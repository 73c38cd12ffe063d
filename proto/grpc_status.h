// absl::Status <-> grpc::Status across the gRPC edge: the same code (the two enums share their
// numbering, both following google.rpc.Code) and message, so an error keeps its meaning — and
// its OpenAI HTTP mapping — on the far side of a hop.
#ifndef SLUICE_PROTO_GRPC_STATUS_H_
#define SLUICE_PROTO_GRPC_STATUS_H_

#include <string>

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace sluice {

inline grpc::Status ToGrpc(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

inline absl::Status FromGrpc(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

}  // namespace sluice

#endif  // SLUICE_PROTO_GRPC_STATUS_H_
