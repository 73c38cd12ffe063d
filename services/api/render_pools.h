// RenderPools: the threads that parse generation requests (chat template render, tokenization,
// grammar compile) off the transports' I/O threads, shared by the HTTP and the gRPC API. A
// costly render cannot stall other connections; requests that bring their own
// `chat_template` get a pool of their own so they cannot delay the others; a full queue is
// refused (503 / UNAVAILABLE). Every render runs under the same work budget
// (jinja::RenderLimits), stops when its caller cancels it (client gone), at its deadline
// (time waiting counts), and when the server shuts down.
#ifndef SLUICE_SERVICES_API_RENDER_POOLS_H_
#define SLUICE_SERVICES_API_RENDER_POOLS_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "engine/tokenizer/jinja/budget.h"
#include "services/common/task_pool.h"

namespace sluice {

struct RenderPoolOptions {
  int threads = 2;                  // requests with the model's chat template; > 0
  int custom_template_threads = 1;  // requests with their own `chat_template`; 0: share
  int max_queued = 256;             // requests waiting for a thread of one pool before refusal
  // Each render's budget; its `cancelled` and `deadline` are set per job.
  jinja::RenderLimits limits;
  // Waiting plus rendering, from Post to the end of the render.
  std::chrono::milliseconds timeout{30'000};
};

// RenderCancel is one job's cancellation flag: the caller sets it when its client goes away,
// the pools when they stop. The render reads it at its budget polls.
using RenderCancel = std::shared_ptr<std::atomic<bool>>;

class RenderPools {
 public:
  // A job runs on a pool thread with the limits its render must use (budget, the job's
  // cancellation flag and deadline). It must check *cancelled before answering: a job of a
  // stopped pool still runs (so its caller is answered) but starts cancelled.
  using Job = std::function<void(const jinja::RenderLimits& limits)>;

  explicit RenderPools(RenderPoolOptions options);
  ~RenderPools();  // Stop()

  // Post queues `job` on the custom-template pool (custom_template, when there is one) or the
  // other. Its deadline is Post + timeout, or `deadline` when earlier (a gRPC call's own).
  // Unavailable, naming max_queued, when that pool has max_queued jobs waiting; the job is
  // then dropped.
  absl::Status Post(bool custom_template, RenderCancel cancelled, absl::Time deadline, Job job);

  // Stop cancels every queued and running render (each stops at its next budget poll, within
  // milliseconds), runs the queued jobs cancelled and joins the threads; later Posts are
  // refused (Unavailable). Idempotent.
  void Stop();

  const RenderPoolOptions& options() const { return options_; }

  // num_queued: jobs waiting for a thread, both pools (0 after Stop).
  int64_t num_queued();

 private:
  struct Pool {
    explicit Pool(int threads) : tasks(threads) {}
    std::atomic<int64_t> queued{0};
    TaskPool tasks;
  };

  const RenderPoolOptions options_;
  std::mutex mu_;
  bool stopping_ = false;                                  // guarded by mu_
  absl::flat_hash_set<std::atomic<bool>*> live_;           // queued or running; guarded by mu_
  std::unique_ptr<Pool> pool_;
  std::unique_ptr<Pool> custom_pool_;  // null: pool_ serves custom templates too
};

}  // namespace sluice

#endif  // SLUICE_SERVICES_API_RENDER_POOLS_H_
