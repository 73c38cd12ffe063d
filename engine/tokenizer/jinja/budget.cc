#include "engine/tokenizer/jinja/budget.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace sluice::jinja {
namespace {

// Cancellation and the clock are checked this often (in operations): rarely enough to cost
// nothing, often enough to stop within milliseconds.
constexpr int64_t kPollInterval = 4096;

absl::Status Exceeded(const char* what, int64_t limit, const char* field) {
  return absl::InvalidArgumentError(absl::StrCat("template exceeds its render budget of ", limit,
                                                 " ", what, " (", field, ")"));
}

}  // namespace

absl::Status WorkBudget::Poll() {
  next_poll_ = operations_ + kPollInterval;
  if (limits_.cancelled != nullptr && limits_.cancelled->load(std::memory_order_relaxed)) {
    return absl::CancelledError("template render cancelled");
  }
  if (limits_.deadline != absl::InfiniteFuture() && absl::Now() > limits_.deadline) {
    return absl::DeadlineExceededError("template render passed its deadline");
  }
  return absl::OkStatus();
}

absl::Status WorkBudget::ChargeOperations(int64_t n) {
  operations_ += n;
  if (operations_ > limits_.max_operations) {
    return Exceeded("operations", limits_.max_operations, "max_operations");
  }
  if (operations_ >= next_poll_) return Poll();
  return absl::OkStatus();
}

absl::Status WorkBudget::ChargeBytes(int64_t n) {
  // Saturating: a shared sub-list counted once per reference can make weights huge.
  work_bytes_ = n > limits_.max_work_bytes - work_bytes_ ? limits_.max_work_bytes + 1
                                                         : work_bytes_ + n;
  if (work_bytes_ > limits_.max_work_bytes) {
    return Exceeded("bytes of work", limits_.max_work_bytes, "max_work_bytes");
  }
  return absl::OkStatus();
}

absl::Status WorkBudget::ChargeIterations(int64_t n) {
  iterations_ += n;
  if (iterations_ > limits_.max_loop_iterations) {
    return Exceeded("loop iterations", limits_.max_loop_iterations, "max_loop_iterations");
  }
  return ChargeOperations(n);
}

absl::Status WorkBudget::EnterCall() {
  if (call_depth_ >= limits_.max_call_depth) {
    return absl::InvalidArgumentError(
        absl::StrCat("maximum recursion depth exceeded in macro call (max_call_depth ",
                     limits_.max_call_depth, ")"));
  }
  ++call_depth_;
  return absl::OkStatus();
}

absl::Status WorkBudget::CheckOutput(int64_t size) const {
  if (size > limits_.max_output_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("rendered output exceeds the limit of ",
                                                   limits_.max_output_bytes,
                                                   " bytes (max_output_bytes)"));
  }
  return absl::OkStatus();
}

}  // namespace sluice::jinja
