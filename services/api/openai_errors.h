// Mapping of absl::Status to OpenAI-style error responses.
//
// Codes follow Abseil's meaning (InvalidArgument→400, NotFound→404, ResourceExhausted→429,
// Unavailable→503, DeadlineExceeded→504, Internal→500). Body, as the OpenAI API returns it:
// {"error": {"message": ..., "type": ..., "param": ..., "code": ...}}.
#ifndef SLUICE_SERVICES_API_OPENAI_ERRORS_H_
#define SLUICE_SERVICES_API_OPENAI_ERRORS_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "nlohmann/json.hpp"

namespace sluice {

// HttpStatusFor returns the HTTP status code for a non-OK status.
int HttpStatusFor(const absl::Status& status);

// RetryAfterFor returns the Retry-After header (whole seconds) an error response carries: the
// wait a ResourceExhausted quota status names (auth/quota_limiter.h), or
// kUnavailableRetryAfterSeconds for Unavailable (503: overloaded, draining, no worker free; a
// retry soon may succeed, elsewhere or here); nothing for other errors.
inline constexpr int64_t kUnavailableRetryAfterSeconds = 1;
std::optional<int64_t> RetryAfterFor(const absl::Status& status);

// OpenAiErrorJson builds the error body. `param` names the offending request field, if any
// (it is also read from the status payload "param" when empty).
nlohmann::json OpenAiErrorJson(const absl::Status& status, const std::string& param = "");

// InvalidParam returns InvalidArgument carrying `param` as a payload, so the error body names it.
absl::Status InvalidParam(const std::string& param, const std::string& message);

// WithParam returns `status` carrying `param` as its payload (any code, e.g. NotFound "model").
absl::Status WithParam(absl::Status status, const std::string& param);

}  // namespace sluice

#endif  // SLUICE_SERVICES_API_OPENAI_ERRORS_H_
