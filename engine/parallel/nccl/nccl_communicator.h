// NcclCommunicator: a Communicator over NCCL, one process per GPU (issue 4).
//
// Built only with the CUDA backend when nccl.h and libnccl are found (nccl.cmake); this header
// includes no CUDA or NCCL header, so code above it compiles without them. Buffers passed to
// the collectives are DEVICE pointers of this rank's GPU.
//
// Bootstrap: rank 0 calls NewUniqueId() and the caller hands the 128 bytes to every rank
// (deploy/local passes it through the environment; a k8s StatefulSet through the worker
// registry); then every rank calls Create with its rank and GPU.
//
// Waits: communicator creation and every collective run non-blocking (NCCL's
// ncclConfig_t.blocking = 0); the host polls ncclCommGetAsyncError and the stream until done or
// the timeout, then aborts the communicator (ncclCommAbort) and returns DeadlineExceeded; later
// calls return FailedPrecondition. Unlike CpuCommunicator, NCCL cannot check that ranks agree
// on counts: a mismatch shows up as that timeout (or corrupt data), so callers use
// ExchangeCounts before AllToAllV. Summation order is NCCL's (ring/tree), reproducible for a
// fixed world size and topology but not rank-ordered.
#ifndef SLUICE_ENGINE_PARALLEL_NCCL_NCCL_COMMUNICATOR_H_
#define SLUICE_ENGINE_PARALLEL_NCCL_NCCL_COMMUNICATOR_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/parallel/communicator.h"

namespace sluice {

class NcclCommunicator : public Communicator {
 public:
  using Communicator::AllReduceSum;

  // NewUniqueId returns a fresh ncclUniqueId as bytes (rank 0 only). Errors: Internal with
  // NCCL's message.
  static absl::StatusOr<std::string> NewUniqueId();

  // Create joins the group `unique_id` as `rank` of `world_size` on CUDA device `device`, with
  // its own non-blocking stream. Each collective (and creation) waits at most `timeout`.
  // Errors: InvalidArgument for a malformed id or rank; Internal for CUDA/NCCL failures;
  // DeadlineExceeded when the peers do not join in time.
  static absl::StatusOr<std::unique_ptr<NcclCommunicator>> Create(
      const std::string& unique_id, int rank, int world_size, int device,
      absl::Duration timeout = absl::Seconds(120));
  ~NcclCommunicator() override;

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  absl::Status AllReduceSum(void* data, int64_t count, CommDataType dtype) override;
  absl::Status AllGatherV(const void* send, int64_t send_count, void* recv,
                          absl::Span<const int64_t> recv_counts, CommDataType dtype) override;
  absl::Status AllToAllV(const void* send, absl::Span<const int64_t> send_counts, void* recv,
                         absl::Span<const int64_t> recv_counts, CommDataType dtype) override;
  absl::Status Barrier() override;
  absl::Status ExchangeHostCounts(const int64_t* send, int64_t* recv) override;

  // EnqueueAllReduceSum is AllReduceSum (f32 or bf16, in place) enqueued on the caller's CUDA
  // stream `stream` (a cudaStream_t of this rank's device) WITHOUT waiting for the result, so
  // that it orders with the caller's kernels and can be captured in a CUDA graph (NCCL >= 2.9).
  // It waits (at most the timeout) only for NCCL to accept the call, which a non-blocking
  // communicator may finish asynchronously (ncclInProgress, e.g. while connecting to peers).
  // Errors: those of AllReduceSum; a peer that never joins shows up later, as a stream that
  // does not complete.
  absl::Status EnqueueAllReduceSum(void* data, int64_t count, CommDataType dtype, void* stream);

  // The CUDA stream the collectives run on (a cudaStream_t), for callers that order their
  // kernels with it.
  void* stream() const { return stream_; }

 private:
  struct Impl;
  NcclCommunicator(int rank, int world_size, absl::Duration timeout, std::unique_ptr<Impl> impl);
  // Wait polls until the enqueued work is done or the timeout passes (then aborts).
  absl::Status Wait(const char* what);
  absl::Status Check(int nccl_result, const char* what);

  int rank_;
  int world_size_;
  absl::Duration timeout_;
  std::unique_ptr<Impl> impl_;
  void* stream_ = nullptr;
  bool aborted_ = false;
};

}  // namespace sluice

#endif  // SLUICE_ENGINE_PARALLEL_NCCL_NCCL_COMMUNICATOR_H_
