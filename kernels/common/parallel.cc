#include "kernels/common/parallel.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace sluice::kernels {
namespace {

inline void CpuRelax() {
#if defined(__x86_64__)
  _mm_pause();
#endif
}

// Set on the caller while it runs its chunk and on every worker thread, so that a nested
// ParallelFor runs inline instead of waiting on the pool it is part of.
thread_local bool tl_in_parallel = false;

// A fixed pool of worker threads; the caller runs chunk 0 itself. One ParallelFor at a time
// (serialized by run_mu_): the engine runs one step at a time. A decode step issues hundreds
// of short ParallelFor calls, so both sides spin briefly (kSpinIterations pauses, ~0.1 ms)
// before blocking in a futex wait (C++20 atomic wait): a condition-variable wake-up (~20 µs)
// would dominate short kernels, while unbounded spinning starves the other threads when the
// machine is oversubscribed.
class Pool {
 public:
  explicit Pool(int num_threads) : num_threads_(num_threads) {
    for (int i = 1; i < num_threads_; ++i) workers_.emplace_back([this, i] { Work(i); });
  }
  ~Pool() {
    stop_.store(true);
    generation_.fetch_add(1);
    generation_.notify_all();
    for (auto& t : workers_) t.join();
  }

  int num_threads() const { return num_threads_; }

  void Run(int64_t n, int64_t min_chunk, const std::function<void(int64_t, int64_t)>& fn) {
    const int64_t max_chunks = std::max<int64_t>(1, n / std::max<int64_t>(1, min_chunk));
    const int chunks = static_cast<int>(std::min<int64_t>(num_threads_, max_chunks));
    if (chunks <= 1 || tl_in_parallel) {
      if (n > 0) fn(0, n);
      return;
    }
    std::lock_guard<std::mutex> run_lock(run_mu_);
    fn_ = &fn;
    n_ = n;
    chunks_ = chunks;
    pending_.store(chunks - 1, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
    generation_.notify_all();
    tl_in_parallel = true;
    RunChunk(0);
    tl_in_parallel = false;
    for (int spins = 0;; ++spins) {
      const int left = pending_.load(std::memory_order_acquire);
      if (left == 0) break;
      if (spins < kSpinIterations) {
        CpuRelax();
      } else {
        pending_.wait(left, std::memory_order_acquire);
      }
    }
    fn_ = nullptr;
  }

 private:
  static constexpr int kSpinIterations = 4000;

  void RunChunk(int index) {
    const int64_t begin = n_ * index / chunks_;
    const int64_t end = n_ * (index + 1) / chunks_;
    if (begin < end) (*fn_)(begin, end);
  }

  void Work(int index) {
    tl_in_parallel = true;
    uint64_t seen = 0;
    for (;;) {
      uint64_t g = generation_.load(std::memory_order_acquire);
      for (int spins = 0; g == seen; ++spins) {
        if (spins < kSpinIterations) {
          CpuRelax();
        } else {
          generation_.wait(seen, std::memory_order_acquire);
        }
        g = generation_.load(std::memory_order_acquire);
      }
      if (stop_.load()) return;
      seen = g;
      if (index < chunks_) {
        RunChunk(index);
        if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) pending_.notify_one();
      }
    }
  }

  int num_threads_;
  std::vector<std::thread> workers_;
  std::mutex run_mu_;
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t n_ = 0;
  int chunks_ = 0;
  std::atomic<int> pending_{0};
  std::atomic<uint64_t> generation_{0};
  std::atomic<bool> stop_{false};
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
