// QuotaLimiter: per-key admission against ApiKeyLimits — a token bucket for requests/s, one for
// tokens/min, and a count of generations in flight.
//
// Buckets (the classic token bucket, RFC 2697's single-rate form without the excess bucket):
// requests/s holds max(1, rate) requests and refills at `rate` per second; tokens/min holds
// `tokens_per_minute` tokens and refills at tokens_per_minute / 60 per second. A request is
// charged its prompt tokens plus the tokens it may generate (max_tokens × choices), as OpenAI's
// limiter does, at admission: nothing is refunded. Every limit is checked before any is
// charged, so a refused request costs nothing.
//
// State is kept per key digest and survives a key-set reload (the new limits apply to the old
// buckets). Thread-safe.
#ifndef SLUICE_SERVICES_API_AUTH_QUOTA_LIMITER_H_
#define SLUICE_SERVICES_API_AUTH_QUOTA_LIMITER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "services/api/auth/api_key_store.h"

namespace sluice {

// QuotaTicket is an admitted request's hold on its key's concurrency slot; destroying it
// releases the slot. Thread-safe; may outlive the limiter.
class QuotaTicket {
 public:
  explicit QuotaTicket(std::shared_ptr<std::atomic<int32_t>> in_flight)
      : in_flight_(std::move(in_flight)) {}
  ~QuotaTicket() { in_flight_->fetch_sub(1); }
  QuotaTicket(const QuotaTicket&) = delete;
  QuotaTicket& operator=(const QuotaTicket&) = delete;

 private:
  std::shared_ptr<std::atomic<int32_t>> in_flight_;
};

// RetryAfterSeconds returns the Retry-After (whole seconds, >= 1) carried by a
// ResourceExhausted status from Admit, or nothing when retrying cannot help (a request larger
// than the whole per-minute budget).
std::optional<int64_t> RetryAfterSeconds(const absl::Status& status);

class QuotaLimiter {
 public:
  // Admit charges `key` one request of `cost_tokens` tokens at time `now`. ResourceExhausted
  // (message names the limit; RetryAfterSeconds gives the wait) when a limit is exceeded.
  absl::StatusOr<std::unique_ptr<QuotaTicket>> Admit(const ApiKey& key, int64_t cost_tokens,
                                                     absl::Time now);
  absl::StatusOr<std::unique_ptr<QuotaTicket>> Admit(const ApiKey& key, int64_t cost_tokens) {
    return Admit(key, cost_tokens, absl::Now());
  }

  // InFlight returns the key's admitted requests still holding a ticket.
  int32_t InFlight(const std::string& sha256) const;

 private:
  struct Bucket {
    double level = 0;
    absl::Time updated = absl::InfinitePast();  // InfinitePast: full on first use
    // Refill tops the bucket up to `now` (capacity `capacity`, `rate` per second).
    void Refill(double capacity, double rate, absl::Time now);
  };
  struct KeyState {
    Bucket requests;
    Bucket tokens;
    std::shared_ptr<std::atomic<int32_t>> in_flight = std::make_shared<std::atomic<int32_t>>(0);
  };

  mutable std::mutex mu_;
  std::unordered_map<std::string, KeyState> states_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sluice

#endif  // SLUICE_SERVICES_API_AUTH_QUOTA_LIMITER_H_
