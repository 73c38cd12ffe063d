#include "services/api/auth/quota_limiter.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace sluice {
namespace {

constexpr char kRetryAfterPayload[] = "sluice.retry_after_seconds";

absl::Status Exhausted(const std::string& message, std::optional<double> wait_seconds) {
  absl::Status status = absl::ResourceExhaustedError(message);
  if (wait_seconds.has_value()) {
    const int64_t seconds = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(*wait_seconds)));
    status.SetPayload(kRetryAfterPayload, absl::Cord(absl::StrCat(seconds)));
  }
  return status;
}

}  // namespace

std::optional<int64_t> RetryAfterSeconds(const absl::Status& status) {
  auto payload = status.GetPayload(kRetryAfterPayload);  // absl::optional on Debian
  int64_t seconds = 0;
  if (!payload.has_value() || !absl::SimpleAtoi(std::string(*payload), &seconds)) {
    return std::nullopt;
  }
  return seconds;
}

void QuotaLimiter::Bucket::Refill(double capacity, double rate, absl::Time now) {
  if (updated == absl::InfinitePast()) {
    level = capacity;
  } else if (now > updated) {
    level = std::min(capacity, level + rate * absl::ToDoubleSeconds(now - updated));
  }
  // A reload may lower the capacity below the current level.
  level = std::min(level, capacity);
  updated = std::max(updated, now);
}

absl::StatusOr<std::unique_ptr<QuotaTicket>> QuotaLimiter::Admit(const ApiKey& key,
                                                                 int64_t cost_tokens,
                                                                 absl::Time now) {
  const ApiKeyLimits& limits = key.limits;
  std::lock_guard<std::mutex> lock(mu_);
  KeyState& state = states_[key.sha256];
  const double rps = limits.requests_per_second;
  const double rps_capacity = std::max(1.0, rps);
  const double tpm = static_cast<double>(limits.tokens_per_minute);
  if (rps > 0) {
    state.requests.Refill(rps_capacity, rps, now);
    if (state.requests.level < 1.0) {
      return Exhausted(absl::StrCat("Rate limit reached for API key '", key.name, "': ", rps,
                                    " requests per second"),
                       (1.0 - state.requests.level) / rps);
    }
  }
  if (tpm > 0) {
    if (static_cast<double>(cost_tokens) > tpm) {
      return Exhausted(absl::StrCat("Request too large for API key '", key.name,
                                    "': it may use ", cost_tokens, " tokens (prompt + max_tokens)",
                                    ", more than the limit of ", limits.tokens_per_minute,
                                    " tokens per minute; lower max_tokens"),
                       std::nullopt);
    }
    state.tokens.Refill(tpm, tpm / 60.0, now);
    if (state.tokens.level < static_cast<double>(cost_tokens)) {
      return Exhausted(absl::StrCat("Rate limit reached for API key '", key.name, "': ",
                                    limits.tokens_per_minute, " tokens per minute (this request ",
                                    "may use ", cost_tokens, ")"),
                       (static_cast<double>(cost_tokens) - state.tokens.level) / (tpm / 60.0));
    }
  }
  if (limits.max_concurrent_requests > 0 &&
      state.in_flight->load() >= limits.max_concurrent_requests) {
    return Exhausted(absl::StrCat("Too many concurrent requests for API key '", key.name,
                                  "': at most ", limits.max_concurrent_requests),
                     1.0);
  }
  if (rps > 0) state.requests.level -= 1.0;
  if (tpm > 0) state.tokens.level -= static_cast<double>(cost_tokens);
  state.in_flight->fetch_add(1);
  return std::make_unique<QuotaTicket>(state.in_flight);
}

int32_t QuotaLimiter::InFlight(const std::string& sha256) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = states_.find(sha256);
  return it == states_.end() ? 0 : it->second.in_flight->load();
}

}  // namespace sluice
