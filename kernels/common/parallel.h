// ParallelFor: splits [0, n) over a small process-wide pool of CPU threads.
//
// CPU kernels use it so a step can use every core (the default pool size is
// std::thread::hardware_concurrency(), overridable with SLUICE_CPU_THREADS). The split is
// static and each index is processed by exactly one thread, so results do not depend on the
// thread count: kernels must not reduce across chunks.
#ifndef SLUICE_KERNELS_COMMON_PARALLEL_H_
#define SLUICE_KERNELS_COMMON_PARALLEL_H_

#include <cstdint>
#include <functional>

namespace sluice::kernels {

// ParallelFor calls fn(begin, end) on disjoint chunks covering [0, n). Chunks smaller than
// `min_chunk` are not split further. Blocks until all chunks are done. Not reentrant: a
// chunk must not call ParallelFor (nested calls run inline).
void ParallelFor(int64_t n, int64_t min_chunk, const std::function<void(int64_t, int64_t)>& fn);

// NumCpuThreads returns the pool size.
int NumCpuThreads();

}  // namespace sluice::kernels

#endif  // SLUICE_KERNELS_COMMON_PARALLEL_H_
