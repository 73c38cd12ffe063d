#include "engine/parallel/nccl/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"

namespace sluice {
namespace {

ncclDataType_t ToNccl(CommDataType dtype) {
  switch (dtype) {
    case CommDataType::kFloat32:
      return ncclFloat32;
    case CommDataType::kBFloat16:
      return ncclBfloat16;
    case CommDataType::kInt32:
      return ncclInt32;
    case CommDataType::kInt64:
      return ncclInt64;
  }
  return ncclFloat32;
}

absl::Status CudaStatus(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(e)));
}

}  // namespace

struct NcclCommunicator::Impl {
  ncclComm_t comm = nullptr;
  int64_t* counts = nullptr;  // device scratch [2 * world_size] for ExchangeHostCounts
  float* one = nullptr;       // device scratch [1] for Barrier
};

absl::StatusOr<std::string> NcclCommunicator::NewUniqueId() {
  ncclUniqueId id;
  if (ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess) {
    return absl::InternalError(absl::StrCat("ncclGetUniqueId: ", ncclGetErrorString(r)));
  }
  return std::string(id.internal, sizeof(id.internal));
}

NcclCommunicator::NcclCommunicator(int rank, int world_size, absl::Duration timeout,
                                   std::unique_ptr<Impl> impl)
    : rank_(rank), world_size_(world_size), timeout_(timeout), impl_(std::move(impl)) {}

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Create(
    const std::string& unique_id, int rank, int world_size, int device, absl::Duration timeout) {
  if (unique_id.size() != NCCL_UNIQUE_ID_BYTES) {
    return absl::InvalidArgumentError(absl::StrCat("NCCL unique id has ", unique_id.size(),
                                                   " bytes, expected ", NCCL_UNIQUE_ID_BYTES));
  }
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " outside a world of ", world_size));
  }
  if (absl::Status s = CudaStatus(cudaSetDevice(device), "cudaSetDevice"); !s.ok()) return s;
  auto impl = std::make_unique<Impl>();
  std::unique_ptr<NcclCommunicator> c(
      new NcclCommunicator(rank, world_size, timeout, std::move(impl)));
  cudaStream_t stream = nullptr;
  if (absl::Status s = CudaStatus(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
                                  "cudaStreamCreateWithFlags");
      !s.ok()) {
    return s;
  }
  c->stream_ = stream;
  if (absl::Status s = CudaStatus(
          cudaMalloc(reinterpret_cast<void**>(&c->impl_->counts), 2 * world_size * sizeof(int64_t)),
          "cudaMalloc");
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CudaStatus(
          cudaMalloc(reinterpret_cast<void**>(&c->impl_->one), sizeof(float)), "cudaMalloc");
      !s.ok()) {
    return s;
  }
  ncclUniqueId id;
  std::memcpy(id.internal, unique_id.data(), NCCL_UNIQUE_ID_BYTES);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // so that creation and collectives can be bounded by a deadline
  if (absl::Status s =
          c->Check(ncclCommInitRankConfig(&c->impl_->comm, world_size, id, rank, &config),
                   "ncclCommInitRankConfig");
      !s.ok()) {
    return s;
  }
  if (absl::Status s = c->Wait("ncclCommInitRankConfig"); !s.ok()) return s;
  return c;
}

NcclCommunicator::~NcclCommunicator() {
  if (impl_->comm != nullptr) {
    // Abort does not wait for peers (Destroy could block on a dead one).
    if (aborted_) {
      ncclCommAbort(impl_->comm);
    } else {
      ncclCommDestroy(impl_->comm);
    }
  }
  if (impl_->counts != nullptr) cudaFree(impl_->counts);
  if (impl_->one != nullptr) cudaFree(impl_->one);
  if (stream_ != nullptr) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
}

absl::Status NcclCommunicator::Check(int result, const char* what) {
  const ncclResult_t r = static_cast<ncclResult_t>(result);
  if (r == ncclSuccess || r == ncclInProgress) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", ncclGetErrorString(r)));
}

absl::Status NcclCommunicator::Wait(const char* what) {
  const absl::Time deadline = absl::Now() + timeout_;
  for (int spins = 0;; ++spins) {
    ncclResult_t async = ncclSuccess;
    if (impl_->comm != nullptr) ncclCommGetAsyncError(impl_->comm, &async);
    if (async != ncclSuccess && async != ncclInProgress) {
      aborted_ = true;
      return absl::InternalError(absl::StrCat(what, ": ", ncclGetErrorString(async)));
    }
    if (async == ncclSuccess) {
      const cudaError_t q = cudaStreamQuery(static_cast<cudaStream_t>(stream_));
      if (q == cudaSuccess) return absl::OkStatus();
      if (q != cudaErrorNotReady) return CudaStatus(q, what);
    }
    if (absl::Now() > deadline) {
      aborted_ = true;
      ncclCommAbort(impl_->comm);
      impl_->comm = nullptr;
      return absl::DeadlineExceededError(
          absl::StrCat(what, ": peers did not complete within ", absl::FormatDuration(timeout_)));
    }
    if (spins > 1000) std::this_thread::yield();
  }
}

absl::Status NcclCommunicator::AllReduceSum(void* data, int64_t count, CommDataType dtype) {
  if (aborted_) return absl::FailedPreconditionError("NCCL communicator aborted; rebuild it");
  if (dtype != CommDataType::kFloat32 && dtype != CommDataType::kBFloat16) {
    return absl::InvalidArgumentError(
        absl::StrCat("AllReduceSum: dtype ", CommDataTypeName(dtype), " is not f32 or bf16"));
  }
  if (count < 0) return absl::InvalidArgumentError("AllReduceSum: negative count");
  if (absl::Status s =
          Check(ncclAllReduce(data, data, static_cast<size_t>(count), ToNccl(dtype), ncclSum,
                              impl_->comm, static_cast<cudaStream_t>(stream_)),
                "ncclAllReduce");
      !s.ok()) {
    return s;
  }
  return Wait("ncclAllReduce");
}

absl::Status NcclCommunicator::EnqueueAllReduceSum(void* data, int64_t count, CommDataType dtype,
                                                   void* stream) {
  if (aborted_) return absl::FailedPreconditionError("NCCL communicator aborted; rebuild it");
  if (dtype != CommDataType::kFloat32 && dtype != CommDataType::kBFloat16) {
    return absl::InvalidArgumentError(absl::StrCat("EnqueueAllReduceSum: dtype ",
                                                   CommDataTypeName(dtype), " is not f32 or bf16"));
  }
  if (count < 0) return absl::InvalidArgumentError("EnqueueAllReduceSum: negative count");
  const ncclResult_t r = ncclAllReduce(data, data, static_cast<size_t>(count), ToNccl(dtype),
                                       ncclSum, impl_->comm, static_cast<cudaStream_t>(stream));
  if (absl::Status s = Check(r, "ncclAllReduce"); !s.ok()) return s;
  // Non-blocking communicator: the call may still be in progress on the host.
  const absl::Time deadline = absl::Now() + timeout_;
  for (ncclResult_t async = r; async == ncclInProgress;) {
    if (absl::Now() > deadline) {
      aborted_ = true;
      return absl::DeadlineExceededError("ncclAllReduce: not accepted within the timeout");
    }
    std::this_thread::yield();
    ncclCommGetAsyncError(impl_->comm, &async);
    if (async != ncclSuccess && async != ncclInProgress) {
      aborted_ = true;
      return absl::InternalError(absl::StrCat("ncclAllReduce: ", ncclGetErrorString(async)));
    }
  }
  return absl::OkStatus();
}

// Variable counts: one broadcast per root, fused into one NCCL group.
absl::Status NcclCommunicator::AllGatherV(const void* send, int64_t send_count, void* recv,
                                          absl::Span<const int64_t> recv_counts,
                                          CommDataType dtype) {
  if (aborted_) return absl::FailedPreconditionError("NCCL communicator aborted; rebuild it");
  if (static_cast<int>(recv_counts.size()) != world_size_ || recv_counts[rank_] != send_count) {
    return absl::InvalidArgumentError("AllGatherV: recv_counts must list every rank's count");
  }
  const size_t elem = CommDataTypeSize(dtype);
  auto* out = static_cast<uint8_t*>(recv);
  ncclGroupStart();
  for (int root = 0; root < world_size_; ++root) {
    ncclBroadcast(send, out, static_cast<size_t>(recv_counts[root]), ToNccl(dtype), root,
                  impl_->comm, static_cast<cudaStream_t>(stream_));
    out += recv_counts[root] * elem;
  }
  if (absl::Status s = Check(ncclGroupEnd(), "ncclGroupEnd (AllGatherV)"); !s.ok()) return s;
  return Wait("AllGatherV");
}

// Point-to-point sends/receives with every peer in one NCCL group.
absl::Status NcclCommunicator::AllToAllV(const void* send, absl::Span<const int64_t> send_counts,
                                         void* recv, absl::Span<const int64_t> recv_counts,
                                         CommDataType dtype) {
  if (aborted_) return absl::FailedPreconditionError("NCCL communicator aborted; rebuild it");
  if (static_cast<int>(send_counts.size()) != world_size_ ||
      static_cast<int>(recv_counts.size()) != world_size_) {
    return absl::InvalidArgumentError("AllToAllV: counts must have world_size entries");
  }
  const size_t elem = CommDataTypeSize(dtype);
  const auto* in = static_cast<const uint8_t*>(send);
  auto* out = static_cast<uint8_t*>(recv);
  ncclGroupStart();
  for (int peer = 0; peer < world_size_; ++peer) {
    if (send_counts[peer] > 0) {
      ncclSend(in, static_cast<size_t>(send_counts[peer]), ToNccl(dtype), peer, impl_->comm,
               static_cast<cudaStream_t>(stream_));
    }
    if (recv_counts[peer] > 0) {
      ncclRecv(out, static_cast<size_t>(recv_counts[peer]), ToNccl(dtype), peer, impl_->comm,
               static_cast<cudaStream_t>(stream_));
    }
    in += send_counts[peer] * elem;
    out += recv_counts[peer] * elem;
  }
  if (absl::Status s = Check(ncclGroupEnd(), "ncclGroupEnd (AllToAllV)"); !s.ok()) return s;
  return Wait("AllToAllV");
}

absl::Status NcclCommunicator::Barrier() {
  return AllReduceSum(impl_->one, 1, CommDataType::kFloat32);
}

absl::Status NcclCommunicator::ExchangeHostCounts(const int64_t* send, int64_t* recv) {
  const size_t bytes = static_cast<size_t>(world_size_) * sizeof(int64_t);
  auto stream = static_cast<cudaStream_t>(stream_);
  if (absl::Status s = CudaStatus(
          cudaMemcpyAsync(impl_->counts, send, bytes, cudaMemcpyHostToDevice, stream), "counts");
      !s.ok()) {
    return s;
  }
  const std::vector<int64_t> ones(static_cast<size_t>(world_size_), 1);
  if (absl::Status s =
          AllToAllV(impl_->counts, ones, impl_->counts + world_size_, ones, CommDataType::kInt64);
      !s.ok()) {
    return s;
  }
  return CudaStatus(cudaMemcpy(recv, impl_->counts + world_size_, bytes, cudaMemcpyDeviceToHost),
                    "counts");
}

}  // namespace sluice
