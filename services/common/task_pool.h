// TaskPool: a few threads running blocking jobs (KV transfers, the Release ack) off the gRPC and
// engine threads. Bounded thread count (not one per request); each job bounds its own waits.
// PostAt delays a job without holding a thread (e.g. freeing blocks only once no transfer into
// them can still run).
#ifndef SLUICE_SERVICES_COMMON_TASK_POOL_H_
#define SLUICE_SERVICES_COMMON_TASK_POOL_H_

#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace sluice {

class TaskPool {
 public:
  explicit TaskPool(int num_threads) {
    for (int i = 0; i < num_threads; ++i) threads_.emplace_back([this] { Loop(); });
  }
  // Runs the queued jobs and the delayed ones (without waiting for their time), then joins.
  ~TaskPool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : threads_) t.join();
  }
  void Post(std::function<void()> job) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      jobs_.push_back(std::move(job));
    }
    cv_.notify_one();
  }
  // PostAt runs `job` at `when` or later (at once when `when` has passed).
  void PostAt(absl::Time when, std::function<void()> job) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      delayed_.emplace(when, std::move(job));
    }
    cv_.notify_all();
  }

 private:
  void Loop() {
    for (;;) {
      std::function<void()> job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        for (;;) {
          if (!delayed_.empty() && (stop_ || delayed_.begin()->first <= absl::Now())) {
            job = std::move(delayed_.begin()->second);
            delayed_.erase(delayed_.begin());
            break;
          }
          if (!jobs_.empty()) {
            job = std::move(jobs_.front());
            jobs_.pop_front();
            break;
          }
          if (stop_) return;
          if (delayed_.empty()) {
            cv_.wait(lock);
          } else {
            cv_.wait_until(lock, absl::ToChronoTime(delayed_.begin()->first));
          }
        }
      }
      job();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;                    // guarded by mu_
  std::multimap<absl::Time, std::function<void()>> delayed_;  // guarded by mu_
  bool stop_ = false;                                         // guarded by mu_
  std::vector<std::thread> threads_;
};

}  // namespace sluice

#endif  // SLUICE_SERVICES_COMMON_TASK_POOL_H_
