#include "kernels/common/parallel.h"

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

namespace sluice::kernels {
namespace {

// A fixed pool of worker threads; the caller runs chunk 0 itself. One ParallelFor at a time
// (serialized by run_mu_) since the engine runs one step at a time.
class Pool {
 public:
  explicit Pool(int num_threads) : num_threads_(num_threads) {
    for (int i = 1; i < num_threads_; ++i) workers_.emplace_back([this, i] { Work(i); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }

  int num_threads() const { return num_threads_; }

  void Run(int64_t n, int64_t min_chunk, const std::function<void(int64_t, int64_t)>& fn) {
    thread_local bool in_parallel = false;
    int64_t max_chunks = std::max<int64_t>(1, n / std::max<int64_t>(1, min_chunk));
    int chunks = static_cast<int>(std::min<int64_t>(num_threads_, max_chunks));
    if (chunks <= 1 || in_parallel) {
      if (n > 0) fn(0, n);
      return;
    }
    std::lock_guard<std::mutex> run_lock(run_mu_);
    {
      std::lock_guard<std::mutex> lock(mu_);
      fn_ = &fn;
      n_ = n;
      chunks_ = chunks;
      pending_ = chunks - 1;
      ++generation_;
    }
    cv_.notify_all();
    in_parallel = true;
    RunChunk(0);
    in_parallel = false;
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [this] { return pending_ == 0; });
    fn_ = nullptr;
  }

 private:
  void RunChunk(int index) {
    int64_t begin = n_ * index / chunks_;
    int64_t end = n_ * (index + 1) / chunks_;
    if (begin < end) (*fn_)(begin, end);
  }

  void Work(int index) {
    uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        if (index >= chunks_) continue;
      }
      RunChunk(index);
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (--pending_ == 0) done_cv_.notify_one();
      }
    }
  }

  int num_threads_;
  std::vector<std::thread> workers_;
  std::mutex run_mu_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::condition_variable done_cv_;
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t n_ = 0;
  int chunks_ = 0;
  int pending_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
};

Pool& GlobalPool() {
  static Pool* pool = [] {
    int n = static_cast<int>(std::thread::hardware_concurrency());
    if (const char* env = std::getenv("SLUICE_CPU_THREADS"); env != nullptr && *env != '\0') {
      n = std::atoi(env);
    }
    return new Pool(std::max(1, n));
  }();
  return *pool;
}

}  // namespace

void ParallelFor(int64_t n, int64_t min_chunk, const std::function<void(int64_t, int64_t)>& fn) {
  GlobalPool().Run(n, min_chunk, fn);
}

int NumCpuThreads() { return GlobalPool().num_threads(); }

}  // namespace sluice::kernels
