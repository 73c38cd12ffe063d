#include "services/common/misconfigured_peer.h"

#include <string>
#include <utility>

#include "absl/strings/cord.h"

namespace sluice {
namespace {

// The payload's type URL (absl::Status payloads are keyed by one); its value is unused.
constexpr absl::string_view kCauseUrl = "type.googleapis.com/sluice.v1.ErrorCause";
constexpr absl::string_view kMisconfigured = "ERROR_CAUSE_WORKER_MISCONFIGURED";

}  // namespace

absl::Status MisconfiguredPeerError(absl::string_view message) {
  return AsMisconfiguredPeer(absl::FailedPreconditionError(message));
}

absl::Status AsMisconfiguredPeer(absl::Status status) {
  if (!status.ok()) status.SetPayload(kCauseUrl, absl::Cord(kMisconfigured));
  return status;
}

bool IsMisconfiguredPeer(const absl::Status& status) {
  const auto cause = status.GetPayload(kCauseUrl);  // absl::optional<absl::Cord>
  return cause.has_value() && *cause == kMisconfigured;
}

void ErrorToWire(const absl::Status& status, v1::Error* out) {
  out->set_code(static_cast<int32_t>(status.code()));
  out->set_message(std::string(status.message()));
  if (IsMisconfiguredPeer(status)) out->set_cause(v1::ERROR_CAUSE_WORKER_MISCONFIGURED);
}

absl::Status ErrorCauseFromWire(const v1::Error& error, absl::Status status) {
  if (error.cause() == v1::ERROR_CAUSE_WORKER_MISCONFIGURED) {
    return AsMisconfiguredPeer(std::move(status));
  }
  return status;
}

grpc::Status ToGrpcWithCause(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  const auto code = static_cast<grpc::StatusCode>(status.code());
  if (!IsMisconfiguredPeer(status)) return grpc::Status(code, std::string(status.message()));
  v1::Error error;
  ErrorToWire(status, &error);
  return grpc::Status(code, std::string(status.message()), error.SerializeAsString());
}

absl::Status FromGrpcWithCause(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  absl::Status out(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
  v1::Error error;
  if (!status.error_details().empty() && error.ParseFromString(status.error_details())) {
    out = ErrorCauseFromWire(error, std::move(out));
  }
  return out;
}

}  // namespace sluice
