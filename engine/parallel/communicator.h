// Communicator: the collective operations that tensor and expert parallelism need between the ranks
// of one model replica (engine/parallel/README.md; issue 4).
//
// Two implementations:
//   CpuCommunicator   (cpu_communicator.h) ranks are threads of one process, data moves over
//                     shared memory; deterministic (rank 0..N-1 summation order). Used by the
//                     CPU tensor/expert-parallel runner and the tests.
//   NcclCommunicator  (nccl/nccl_communicator.h) one process per GPU over NCCL; built only with
//                     the CUDA backend when nccl.h and libnccl are found.
//
// Every operation is collective: all ranks of the group call it, in the same order, with consistent
// arguments. Buffers are host pointers for CpuCommunicator and device pointers for
// NcclCommunicator. Each call waits at most the communicator's timeout; on a timeout the group is
// aborted and every later call fails with FailedPrecondition (a peer died or diverged: retrying the
// call cannot help; the replica must be rebuilt).
#ifndef SLUICE_ENGINE_PARALLEL_COMMUNICATOR_H_
#define SLUICE_ENGINE_PARALLEL_COMMUNICATOR_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace sluice {

// CommDataType is the element type of a collective's buffers. kBFloat16 elements are the upper 16
// bits of an IEEE float32 (stored as uint16_t).
enum class CommDataType { kFloat32, kBFloat16, kInt32, kInt64 };

// CommDataTypeSize returns bytes per element (4, 2, 4, 8).
size_t CommDataTypeSize(CommDataType dtype);
// CommDataTypeName returns "f32", "bf16", "i32" or "i64".
const char* CommDataTypeName(CommDataType dtype);

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;

  // AllReduceSum replaces data[0..count) on every rank with the elementwise sum over ranks.
  // kFloat32 and kBFloat16 only (bf16 is summed in float32 and rounded once, to nearest even).
  // Errors: InvalidArgument when the ranks disagree on count or dtype, or for an integer dtype
  // (every rank gets the same error); DeadlineExceeded / FailedPrecondition as above.
  virtual absl::Status AllReduceSum(void* data, int64_t count, CommDataType dtype) = 0;

  // AllGatherV concatenates every rank's send[0..send_count) in rank order into recv on every rank.
  // recv_counts [world_size] lists each rank's send_count (the caller knows them, as NCCL
  // requires); recv holds their sum. recv must not overlap send. Errors: InvalidArgument when a
  // rank's send_count differs from the others' recv_counts entry, recv_counts has the wrong length,
  // or dtypes differ.
  virtual absl::Status AllGatherV(const void* send, int64_t send_count, void* recv,
                                  absl::Span<const int64_t> recv_counts, CommDataType dtype) = 0;

  // AllToAllV: rank r sends send[send_offset(r→d) .. + send_counts[d]) to every rank d (offsets are
  // the prefix sums of send_counts) and receives recv_counts[s] elements from every rank s, stored
  // in source order. send_counts/recv_counts have world_size entries; recv_counts[s] on rank r must
  // equal send_counts[r] on rank s (use ExchangeCounts to learn them). This is the dispatch (tokens
  // → expert owners) and combine (expert outputs → token owners) step of expert parallelism. recv
  // must not overlap send. Errors: InvalidArgument for inconsistent counts or dtypes (reported on
  // every rank).
  virtual absl::Status AllToAllV(const void* send, absl::Span<const int64_t> send_counts,
                                 void* recv, absl::Span<const int64_t> recv_counts,
                                 CommDataType dtype) = 0;

  // Barrier returns once every rank has entered it.
  virtual absl::Status Barrier() = 0;

  // Typed conveniences (implementations add `using Communicator::AllReduceSum;`).
  absl::Status AllReduceSum(absl::Span<float> data) {
    return AllReduceSum(data.data(), static_cast<int64_t>(data.size()), CommDataType::kFloat32);
  }
  // AllGather is AllGatherV with the same count on every rank: recv [world_size
  // * count].
  absl::Status AllGather(const void* send, int64_t count, void* recv, CommDataType dtype);

  // ExchangeHostCounts is the collective behind ExchangeCounts: send/recv are HOST arrays of
  // world_size int64 (element d of send goes to rank d). The default runs AllToAllV on them, which
  // is right for host-memory communicators; device communicators stage through device memory.
  virtual absl::Status ExchangeHostCounts(const int64_t* send, int64_t* recv);
};

// ExchangeCounts is the count step before an AllToAllV: rank r passes send_counts [world_size]
// (elements it will send to each rank) and gets back recv_counts [world_size] (elements each rank
// will send to it). Collective. Errors: InvalidArgument for a wrong length or a negative count
// (checked locally, so the other ranks then fail on their next collective with DeadlineExceeded),
// plus those of AllToAllV.
absl::StatusOr<std::vector<int64_t>> ExchangeCounts(Communicator& comm,
                                                    absl::Span<const int64_t> send_counts);

}  // namespace sluice

#endif  // SLUICE_ENGINE_PARALLEL_COMMUNICATOR_H_
