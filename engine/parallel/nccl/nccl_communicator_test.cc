// NcclCommunicator on a multi-GPU host: the parent creates the ncclUniqueId and forks one
// process per GPU (rank r on device r); each checks every collective against exact expected
// values (same data pattern as tests/unit/communicator_test.cc) and exits 0 on success.
// Needs >= 2 GPUs, so it is not registered with ctest; run
//   build/bin/nccl_communicator_test [world_size]   (default: all visible GPUs)
#include "engine/parallel/nccl/nccl_communicator.h"

#include <cuda_runtime.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

namespace sluice {
namespace {

#define EXPECT_OR_FAIL(cond, ...)        \
  do {                                   \
    if (!(cond)) {                       \
      std::fprintf(stderr, __VA_ARGS__); \
      return 1;                          \
    }                                    \
  } while (0)

template <typename T>
T* ToDevice(const std::vector<T>& host) {
  T* d = nullptr;
  cudaMalloc(reinterpret_cast<void**>(&d), std::max<size_t>(host.size(), 1) * sizeof(T));
  cudaMemcpy(d, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
  return d;
}

template <typename T>
std::vector<T> ToHost(const T* d, size_t n) {
  std::vector<T> host(n);
  cudaMemcpy(host.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost);
  return host;
}

int RunRank(const std::string& id, int rank, int n) {
  auto comm = NcclCommunicator::Create(id, rank, n, rank, absl::Seconds(60));
  EXPECT_OR_FAIL(comm.ok(), "rank %d: create: %s\n", rank, comm.status().ToString().c_str());
  Communicator& c = **comm;
  // AllReduceSum f32.
  float* x = ToDevice(std::vector<float>{static_cast<float>(rank + 1), -0.5f});
  absl::Status s = c.AllReduceSum(x, 2, CommDataType::kFloat32);
  EXPECT_OR_FAIL(s.ok(), "rank %d: allreduce: %s\n", rank, s.ToString().c_str());
  auto xs = ToHost(x, 2);
  EXPECT_OR_FAIL(xs[0] == n * (n + 1) / 2 && xs[1] == -0.5f * n, "rank %d: allreduce values\n",
                 rank);
  // AllGatherV: rank r sends r + 1 values 10 r + i.
  std::vector<int32_t> mine;
  for (int i = 0; i <= rank; ++i) mine.push_back(10 * rank + i);
  std::vector<int64_t> counts;
  std::vector<int32_t> want;
  for (int r = 0; r < n; ++r) {
    counts.push_back(r + 1);
    for (int i = 0; i <= r; ++i) want.push_back(10 * r + i);
  }
  int32_t* send = ToDevice(mine);
  int32_t* recv = ToDevice(std::vector<int32_t>(want.size(), -1));
  s = c.AllGatherV(send, rank + 1, recv, counts, CommDataType::kInt32);
  EXPECT_OR_FAIL(s.ok() && ToHost(recv, want.size()) == want, "rank %d: allgatherv %s\n", rank,
                 s.ToString().c_str());
  // AllToAllV: rank s sends (s + d) % 3 values 1000 s + 100 d + i to d.
  std::vector<int64_t> send_counts;
  std::vector<float> payload, want_recv;
  for (int d = 0; d < n; ++d) {
    send_counts.push_back((rank + d) % 3);
    for (int i = 0; i < (rank + d) % 3; ++i) payload.push_back(1000.0f * rank + 100.0f * d + i);
  }
  auto recv_counts = ExchangeCounts(c, send_counts);
  EXPECT_OR_FAIL(recv_counts.ok(), "rank %d: counts %s\n", rank,
                 recv_counts.status().ToString().c_str());
  for (int src = 0; src < n; ++src) {
    EXPECT_OR_FAIL((*recv_counts)[src] == (src + rank) % 3, "rank %d: count from %d\n", rank, src);
    for (int i = 0; i < (src + rank) % 3; ++i)
      want_recv.push_back(1000.0f * src + 100.0f * rank + i);
  }
  float* a2a_send = ToDevice(payload);
  float* a2a_recv = ToDevice(std::vector<float>(want_recv.size(), -1.0f));
  s = c.AllToAllV(a2a_send, send_counts, a2a_recv, *recv_counts, CommDataType::kFloat32);
  EXPECT_OR_FAIL(s.ok() && ToHost(a2a_recv, want_recv.size()) == want_recv,
                 "rank %d: alltoallv %s\n", rank, s.ToString().c_str());
  s = c.Barrier();
  EXPECT_OR_FAIL(s.ok(), "rank %d: barrier %s\n", rank, s.ToString().c_str());
  std::printf("rank %d/%d: all NCCL collectives OK\n", rank, n);
  return 0;
}

}  // namespace
}  // namespace sluice

int main(int argc, char** argv) {
  int n = argc > 1 ? std::atoi(argv[1]) : 0;
  if (n <= 0) {
    // Count devices in a child so the parent never initializes CUDA before forking.
    int fds[2];
    if (pipe(fds) != 0) return 2;
    if (fork() == 0) {
      int count = 0;
      cudaGetDeviceCount(&count);
      (void)!write(fds[1], &count, sizeof(count));
      _exit(0);
    }
    (void)!read(fds[0], &n, sizeof(n));
    wait(nullptr);
  }
  if (n < 2) {
    std::fprintf(stderr, "nccl_communicator_test needs >= 2 GPUs (found %d)\n", n);
    return 77;
  }
  auto id = sluice::NcclCommunicator::NewUniqueId();
  if (!id.ok()) {
    std::fprintf(stderr, "%s\n", id.status().ToString().c_str());
    return 1;
  }
  std::vector<pid_t> children;
  for (int r = 0; r < n; ++r) {
    const pid_t pid = fork();
    if (pid == 0) _exit(sluice::RunRank(*id, r, n));
    children.push_back(pid);
  }
  int failures = 0;
  for (pid_t pid : children) {
    int status = 0;
    waitpid(pid, &status, 0);
    failures += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  std::printf("%s (%d ranks)\n", failures == 0 ? "PASS" : "FAIL", n);
  return failures == 0 ? 0 : 1;
}
