// CpuCommunicator: a Communicator whose ranks are threads of one process (shared memory).
//
// A CpuCommunicatorGroup owns the shared state of N ranks and hands out one communicator per rank;
// each rank's thread calls the collectives on its own communicator. Every collective is two
// rendezvous: (1) all ranks post their buffer descriptors and wait for each other, then each
// validates the posted descriptors (all ranks see the same ones, so all reach the same verdict) and
// moves data; (2) all ranks wait until everyone has finished reading, so buffers may be reused as
// soon as the call returns.
//
// Determinism: AllReduceSum adds rank 0's value, then rank 1's, ..., rank N-1's, for every element,
// and every rank receives the same bits. Results are therefore reproducible run to run and
// identical on all ranks (tensor-parallel replicas never drift apart).
#ifndef SLUICE_ENGINE_PARALLEL_CPU_COMMUNICATOR_H_
#define SLUICE_ENGINE_PARALLEL_CPU_COMMUNICATOR_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "engine/parallel/communicator.h"

namespace sluice {

class CpuCommunicatorGroup;

// CpuCommunicator is rank `rank()` of a CpuCommunicatorGroup. Each instance must be used by one
// thread at a time; the group must outlive it.
class CpuCommunicator : public Communicator {
 public:
  using Communicator::AllReduceSum;

  int rank() const override { return rank_; }
  int world_size() const override;
  absl::Status AllReduceSum(void* data, int64_t count, CommDataType dtype) override;
  absl::Status AllGatherV(const void* send, int64_t send_count, void* recv,
                          absl::Span<const int64_t> recv_counts, CommDataType dtype) override;
  absl::Status AllToAllV(const void* send, absl::Span<const int64_t> send_counts, void* recv,
                         absl::Span<const int64_t> recv_counts, CommDataType dtype) override;
  absl::Status Barrier() override;

 private:
  friend class CpuCommunicatorGroup;
  CpuCommunicator(CpuCommunicatorGroup* group, int rank) : group_(group), rank_(rank) {}
  CpuCommunicatorGroup* group_;
  int rank_;
  std::vector<float> scratch_;  // AllReduceSum: this rank's copy of the sum
};

// CpuCommunicatorGroup: the shared state of `world_size` CpuCommunicators.
class CpuCommunicatorGroup {
 public:
  // Create makes a group of `world_size` ranks (1..1024) whose collectives each wait at most
  // `timeout` for the other ranks. Errors: InvalidArgument for a world size out of range or a
  // non-positive timeout.
  static absl::StatusOr<std::unique_ptr<CpuCommunicatorGroup>> Create(
      int world_size, absl::Duration timeout = absl::Seconds(60));

  int world_size() const { return world_size_; }
  // communicator(r) is rank r's communicator (0 <= r < world_size), owned by the group.
  CpuCommunicator* communicator(int rank) { return comms_[rank].get(); }
  // Abort fails every pending and future collective with FailedPrecondition (used when a rank's
  // thread gives up, so the others do not wait out their timeout).
  void Abort();

 private:
  friend class CpuCommunicator;
  enum class Op { kNone, kAllReduce, kAllGather, kAllToAll, kBarrier };
  // What one rank posted for the current collective.
  struct Post {
    Op op = Op::kNone;
    CommDataType dtype = CommDataType::kFloat32;
    const void* send = nullptr;
    void* recv = nullptr;
    int64_t count = 0;                      // AllReduce: elements; AllGather: send_count
    absl::Span<const int64_t> send_counts;  // AllToAll
    absl::Span<const int64_t> recv_counts;  // AllGather, AllToAll
  };

  CpuCommunicatorGroup(int world_size, absl::Duration timeout);
  // Rendezvous blocks until all ranks have arrived (then returns OK) or the deadline passes (then
  // aborts the group and returns DeadlineExceeded).
  absl::Status Rendezvous(int rank);
  // Run executes one collective for `rank`: post, rendezvous, validate, `move` the data,
  // rendezvous. `move` runs only when validation passed on every rank.
  template <typename MoveFn>
  absl::Status Run(int rank, const Post& post, MoveFn move);
  // Validate checks that all posts agree; returns the same verdict on every rank.
  absl::Status Validate() const;
  absl::Status AbortedError() const;

  const int world_size_;
  const absl::Duration timeout_;
  std::vector<std::unique_ptr<CpuCommunicator>> comms_;
  // posts_[r] is written by rank r before the first rendezvous of a collective and read by all
  // ranks between the two rendezvous; the rendezvous order the accesses (no lock needed).
  std::vector<Post> posts_;

  absl::Mutex mu_;
  int arrived_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  bool aborted_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace sluice

#endif  // SLUICE_ENGINE_PARALLEL_CPU_COMMUNICATOR_H_
