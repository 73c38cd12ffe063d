// Misconfigured peers: a KV transfer two workers could not make because they were started with
// different settings (--kv-transfer-mode, --swa-replay-tokens on/off, KV layouts). Such an error
// is the deployment's fault, neither the client's (the request was fine) nor a worker failure
// another attempt would get past. It keeps its code, FAILED_PRECONDITION, and is marked with a
// cause that travels with it: in-process as an absl::Status payload, between services as
// v1::Error.cause (sluice/v1/common.proto ErrorCause) in a stream's final message or in a unary
// RPC's status details. The router answers a marked error as a server error (INTERNAL, HTTP 500)
// and never retries it.
#ifndef SLUICE_SERVICES_COMMON_MISCONFIGURED_PEER_H_
#define SLUICE_SERVICES_COMMON_MISCONFIGURED_PEER_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "sluice/v1/common.pb.h"

namespace sluice {

// MisconfiguredPeerError: FAILED_PRECONDITION with `message` (which names both sides'
// values), marked as a misconfiguration.
absl::Status MisconfiguredPeerError(absl::string_view message);
// AsMisconfiguredPeer: `status` (not OK) marked as a misconfiguration, code and message kept.
absl::Status AsMisconfiguredPeer(absl::Status status);
// IsMisconfiguredPeer: `status` carries the mark.
bool IsMisconfiguredPeer(const absl::Status& status);

// ErrorToWire: `status`'s code, message and cause into `out` (status not OK).
void ErrorToWire(const absl::Status& status, v1::Error* out);
// ErrorCauseFromWire: `status` (made from `error`'s code and message) with `error`'s cause.
absl::Status ErrorCauseFromWire(const v1::Error& error, absl::Status status);

// ToGrpcWithCause / FromGrpcWithCause: proto/grpc_status.h's ToGrpc / FromGrpc for a unary
// RPC's status, the mark carried in the gRPC status's binary details (a serialized v1::Error).
grpc::Status ToGrpcWithCause(const absl::Status& status);
absl::Status FromGrpcWithCause(const grpc::Status& status);

}  // namespace sluice

#endif  // SLUICE_SERVICES_COMMON_MISCONFIGURED_PEER_H_
