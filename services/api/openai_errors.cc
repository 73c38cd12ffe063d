#include "services/api/openai_errors.h"

#include <optional>

#include "absl/strings/cord.h"
#include "services/api/auth/quota_limiter.h"

namespace sluice {
namespace {
constexpr char kParamPayload[] = "sluice.param";
}  // namespace

int HttpStatusFor(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kOk: return 200;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange: return 400;
    case absl::StatusCode::kUnauthenticated: return 401;
    case absl::StatusCode::kPermissionDenied: return 403;
    case absl::StatusCode::kNotFound: return 404;
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kAborted: return 409;
    case absl::StatusCode::kResourceExhausted: return 429;
    case absl::StatusCode::kCancelled: return 499;
    case absl::StatusCode::kUnimplemented: return 501;
    case absl::StatusCode::kUnavailable: return 503;
    case absl::StatusCode::kDeadlineExceeded: return 504;
    default: return 500;
  }
}

std::optional<int64_t> RetryAfterFor(const absl::Status& status) {
  if (absl::IsResourceExhausted(status)) return RetryAfterSeconds(status);
  if (absl::IsUnavailable(status)) {
    return RetryAfterSeconds(status).value_or(kUnavailableRetryAfterSeconds);
  }
  return std::nullopt;
}

absl::Status InvalidParam(const std::string& param, const std::string& message) {
  absl::Status status = absl::InvalidArgumentError(message);
  status.SetPayload(kParamPayload, absl::Cord(param));
  return status;
}

absl::Status WithParam(absl::Status status, const std::string& param) {
  status.SetPayload(kParamPayload, absl::Cord(param));
  return status;
}

nlohmann::json OpenAiErrorJson(const absl::Status& status, const std::string& param) {
  std::string p = param;
  if (p.empty()) {
    if (auto payload = status.GetPayload(kParamPayload)) {
      p = std::string(*payload);
    }
  }
  const int http = HttpStatusFor(status);
  // OpenAI's error types: client errors (400/404/405/413/...) are "invalid_request_error",
  // rate limits "rate_limit_error", and 5xx "server_error".
  const char* type = http == 429 ? "rate_limit_error"
                     : http < 500 ? "invalid_request_error"
                                  : "server_error";
  nlohmann::json error = {{"message", std::string(status.message())},
                          {"type", type},
                          {"param", p.empty() ? nlohmann::json(nullptr) : nlohmann::json(p)},
                          {"code", http}};
  return nlohmann::json{{"error", error}};
}

}  // namespace sluice
