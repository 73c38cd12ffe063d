// Work budget of one Jinja render. A chat template may come from the client (`chat_template`),
// and even the model's own template runs on client data (`chat_template_kwargs`, messages), so
// a render must end in bounded time and memory whatever the template does. Counting loop
// iterations alone does not bound it (each iteration may build a megabyte string), so the budget
// counts the work itself: operations (statements run, expressions evaluated, macro calls) and
// bytes (strings and lists built, copied, compared or scanned by builtins).
#ifndef SLUICE_ENGINE_TOKENIZER_JINJA_BUDGET_H_
#define SLUICE_ENGINE_TOKENIZER_JINJA_BUDGET_H_

#include <atomic>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "engine/tokenizer/jinja/value.h"

namespace sluice::jinja {

// RenderLimits are the limits of one render, chosen by the caller per render. Every limit
// exceeded is InvalidArgument whose message names the limit's field (e.g. "max_operations").
// The defaults leave real chat templates on the largest conversations a server accepts (8 MiB
// bodies) far below every limit while stopping a hostile template within about a second.
struct RenderLimits {
  // Statements executed + expressions evaluated + macro calls + loop iterations.
  int64_t max_operations = 10'000'000;
  // Bytes of values built, copied, compared or scanned (a list element counts
  // kElementBytes); the rendered output counts too.
  int64_t max_work_bytes = int64_t{512} << 20;
  int64_t max_loop_iterations = 1'000'000;
  int max_call_depth = 64;            // nested macro calls
  int64_t max_output_bytes = kMaxValueBytes;
  // Polled every few thousand operations: once *cancelled is true the render stops with
  // Cancelled; once `deadline` has passed, with DeadlineExceeded.
  const std::atomic<bool>* cancelled = nullptr;
  absl::Time deadline = absl::InfiniteFuture();
};

// WorkBudget counts one render's work against its RenderLimits. Not thread-safe (one render).
class WorkBudget {
 public:
  explicit WorkBudget(const RenderLimits& limits) : limits_(limits) {}

  // ChargeOperations counts `n` operations; it also polls cancellation and the deadline.
  absl::Status ChargeOperations(int64_t n);
  // ChargeBytes counts `n` bytes of work.
  absl::Status ChargeBytes(int64_t n);
  // ChargeIterations counts `n` loop iterations (each also one operation).
  absl::Status ChargeIterations(int64_t n);
  // EnterCall / ExitCall bracket a macro call (EnterCall fails beyond max_call_depth).
  absl::Status EnterCall();
  void ExitCall() { --call_depth_; }
  // CheckOutput fails when the rendered output would grow to `size` bytes beyond the limit.
  absl::Status CheckOutput(int64_t size) const;

  int64_t operations() const { return operations_; }
  int64_t work_bytes() const { return work_bytes_; }
  const RenderLimits& limits() const { return limits_; }

 private:
  absl::Status Poll();

  RenderLimits limits_;
  int64_t operations_ = 0;
  int64_t work_bytes_ = 0;
  int64_t iterations_ = 0;
  int call_depth_ = 0;
  int64_t next_poll_ = 0;
};

}  // namespace sluice::jinja

#endif  // SLUICE_ENGINE_TOKENIZER_JINJA_BUDGET_H_
