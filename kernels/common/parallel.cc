#include "kernels/common/parallel.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
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
// (serialized by run_mu_): the engine runs one step at a time. Workers spin briefly on the
// generation counter before sleeping, because a decode step issues hundreds of short
// ParallelFor calls and a condition-variable wake-up (~20 µs) would dominate them; after
// kSpinIterations idle pauses (a few ms) they sleep so an idle server burns no CPU.
class Pool {
 public:
  explicit Pool(int num_threads) : num_threads_(num_threads) {
    for (int i = 1; i < num_threads_; ++i) workers_.emplace_back([this, i] { Work(i); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_.store(true);
      generation_.fetch_add(1);
    }
    cv_.notify_all();
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
    {
      // Publishing under mu_ pairs with the sleepers' predicate check: no lost wake-up.
      std::lock_guard<std::mutex> lock(mu_);
      generation_.fetch_add(1, std::memory_order_seq_cst);
    }
    if (sleepers_.load(std::memory_order_seq_cst) > 0) cv_.notify_all();
    tl_in_parallel = true;
    RunChunk(0);
    tl_in_parallel = false;
    while (pending_.load(std::memory_order_acquire) != 0) CpuRelax();
    fn_ = nullptr;
  }

 private:
  static constexpr int kSpinIterations = 100000;

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
      for (int spins = 0; g == seen && spins < kSpinIterations; ++spins) {
        CpuRelax();
        g = generation_.load(std::memory_order_acquire);
      }
      if (g == seen) {
        std::unique_lock<std::mutex> lock(mu_);
        sleepers_.fetch_add(1, std::memory_order_seq_cst);
        cv_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != seen; });
        sleepers_.fetch_sub(1, std::memory_order_seq_cst);
        g = generation_.load(std::memory_order_acquire);
      }
      if (stop_.load()) return;
      seen = g;
      if (index < chunks_) {
        RunChunk(index);
        pending_.fetch_sub(1, std::memory_order_acq_rel);
      }
    }
  }

  int num_threads_;
  std::vector<std::thread> workers_;
  std::mutex run_mu_;
  std::mutex mu_;
  std::condition_variable cv_;
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t n_ = 0;
  int chunks_ = 0;
  std::atomic<int> pending_{0};
  std::atomic<int> sleepers_{0};
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
