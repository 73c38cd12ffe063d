// TaskPool: a few threads running blocking jobs (KV pulls, the Release ack) off the gRPC and
// engine threads. Bounded thread count (not one per request); each job bounds its own waits.
#ifndef SLUICE_SERVICES_WORKER_COMMON_TASK_POOL_H_
#define SLUICE_SERVICES_WORKER_COMMON_TASK_POOL_H_

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace sluice {

class TaskPool {
 public:
  explicit TaskPool(int num_threads) {
    for (int i = 0; i < num_threads; ++i) threads_.emplace_back([this] { Loop(); });
  }
  // Runs the queued jobs, then joins.
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

 private:
  void Loop() {
    for (;;) {
      std::function<void()> job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
        if (jobs_.empty()) return;
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      job();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace sluice

#endif  // SLUICE_SERVICES_WORKER_COMMON_TASK_POOL_H_
