#include "engine/parallel/cpu_communicator.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/float16.h"

namespace sluice {

absl::StatusOr<std::unique_ptr<CpuCommunicatorGroup>> CpuCommunicatorGroup::Create(
    int world_size, absl::Duration timeout) {
  if (world_size < 1 || world_size > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("CpuCommunicatorGroup: world size ", world_size, " outside [1, 1024]"));
  }
  if (timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("CpuCommunicatorGroup: timeout must be positive");
  }
  return std::unique_ptr<CpuCommunicatorGroup>(new CpuCommunicatorGroup(world_size, timeout));
}

CpuCommunicatorGroup::CpuCommunicatorGroup(int world_size, absl::Duration timeout)
    : world_size_(world_size), timeout_(timeout), posts_(static_cast<size_t>(world_size)) {
  for (int r = 0; r < world_size; ++r) {
    comms_.push_back(std::unique_ptr<CpuCommunicator>(new CpuCommunicator(this, r)));
  }
}

void CpuCommunicatorGroup::Abort() {
  absl::MutexLock lock(&mu_);
  aborted_ = true;
}

absl::Status CpuCommunicatorGroup::AbortedError() const {
  return absl::FailedPreconditionError(
      "CpuCommunicatorGroup aborted (a rank timed out or gave up); rebuild the "
      "group");
}

absl::Status CpuCommunicatorGroup::Rendezvous(int rank) {
  absl::MutexLock lock(&mu_);
  if (aborted_) return AbortedError();
  const uint64_t generation = generation_;
  if (++arrived_ == world_size_) {
    arrived_ = 0;
    ++generation_;
    return absl::OkStatus();
  }
  auto done = [this, generation]() { return generation_ != generation || aborted_; };
  if (!mu_.AwaitWithDeadline(absl::Condition(&done), absl::Now() + timeout_)) {
    aborted_ = true;  // the others must not keep waiting for a rendezvous that
                      // cannot complete
    return absl::DeadlineExceededError(absl::StrCat("CpuCommunicator rank ", rank,
                                                    ": peers did not arrive within ",
                                                    absl::FormatDuration(timeout_)));
  }
  if (generation_ == generation) return AbortedError();
  return absl::OkStatus();
}

absl::Status CpuCommunicatorGroup::Validate() const {
  const Post& first = posts_[0];
  for (int r = 1; r < world_size_; ++r) {
    if (posts_[r].op != first.op) {
      return absl::InvalidArgumentError(absl::StrCat("collective mismatch: rank ", r,
                                                     " called a different operation than rank 0"));
    }
    if (posts_[r].dtype != first.dtype) {
      return absl::InvalidArgumentError(absl::StrCat("collective dtype mismatch: rank 0 ",
                                                     CommDataTypeName(first.dtype), ", rank ", r,
                                                     " ", CommDataTypeName(posts_[r].dtype)));
    }
  }
  const size_t n = static_cast<size_t>(world_size_);
  switch (first.op) {
    case Op::kAllReduce:
      if (first.dtype != CommDataType::kFloat32 && first.dtype != CommDataType::kBFloat16) {
        return absl::InvalidArgumentError(absl::StrCat(
            "AllReduceSum: dtype ", CommDataTypeName(first.dtype), " is not f32 or bf16"));
      }
      for (int r = 0; r < world_size_; ++r) {
        if (posts_[r].count != first.count || posts_[r].count < 0) {
          return absl::InvalidArgumentError(absl::StrCat("AllReduceSum: rank 0 has ", first.count,
                                                         " elements, rank ", r, " has ",
                                                         posts_[r].count));
        }
      }
      return absl::OkStatus();
    case Op::kAllGather:
      for (int r = 0; r < world_size_; ++r) {
        if (posts_[r].recv_counts.size() != n) {
          return absl::InvalidArgumentError(absl::StrCat("AllGatherV: rank ", r, " passed ",
                                                         posts_[r].recv_counts.size(),
                                                         " recv counts for a world of ", n));
        }
      }
      for (int r = 0; r < world_size_; ++r) {
        for (int q = 0; q < world_size_; ++q) {
          if (posts_[q].recv_counts[r] != posts_[r].count || posts_[r].count < 0) {
            return absl::InvalidArgumentError(
                absl::StrCat("AllGatherV: rank ", r, " sends ", posts_[r].count,
                             " elements but rank ", q, " expects ", posts_[q].recv_counts[r]));
          }
        }
      }
      return absl::OkStatus();
    case Op::kAllToAll:
      for (int r = 0; r < world_size_; ++r) {
        if (posts_[r].send_counts.size() != n || posts_[r].recv_counts.size() != n) {
          return absl::InvalidArgumentError(absl::StrCat(
              "AllToAllV: rank ", r, " passed ", posts_[r].send_counts.size(), " send and ",
              posts_[r].recv_counts.size(), " recv counts for a world of ", n));
        }
      }
      for (int r = 0; r < world_size_; ++r) {
        for (int s = 0; s < world_size_; ++s) {
          if (posts_[r].recv_counts[s] != posts_[s].send_counts[r] ||
              posts_[s].send_counts[r] < 0) {
            return absl::InvalidArgumentError(absl::StrCat(
                "AllToAllV: rank ", s, " sends ", posts_[s].send_counts[r], " elements to rank ", r,
                ", which expects ", posts_[r].recv_counts[s]));
          }
        }
      }
      return absl::OkStatus();
    case Op::kBarrier:
    case Op::kNone:
      return absl::OkStatus();
  }
  return absl::OkStatus();
}

template <typename MoveFn>
absl::Status CpuCommunicatorGroup::Run(int rank, const Post& post, MoveFn move) {
  posts_[rank] = post;
  if (absl::Status s = Rendezvous(rank); !s.ok()) return s;
  absl::Status verdict = Validate();
  if (verdict.ok()) move();
  // Second rendezvous even on a validation error: every rank reached the same verdict, and the
  // posts must stay valid until all ranks are done reading them.
  if (absl::Status s = Rendezvous(rank); !s.ok()) return s;
  return verdict;
}

int CpuCommunicator::world_size() const { return group_->world_size(); }

absl::Status CpuCommunicator::AllReduceSum(void* data, int64_t count, CommDataType dtype) {
  const CpuCommunicatorGroup::Post post{
      .op = CpuCommunicatorGroup::Op::kAllReduce, .dtype = dtype, .send = data, .count = count};
  const int n = world_size();
  absl::Status s = group_->Run(rank_, post, [&] {
    // Every rank sums all inputs itself in rank order: identical bits on every rank.
    scratch_.assign(static_cast<size_t>(count), 0.0f);
    float* sum = scratch_.data();
    for (int r = 0; r < n; ++r) {
      const void* in = group_->posts_[r].send;
      if (dtype == CommDataType::kFloat32) {
        const float* x = static_cast<const float*>(in);
        for (int64_t i = 0; i < count; ++i) sum[i] += x[i];
      } else {
        const uint16_t* x = static_cast<const uint16_t*>(in);
        for (int64_t i = 0; i < count; ++i) sum[i] += Bf16ToFloat(x[i]);
      }
    }
  });
  if (!s.ok()) return s;
  // Inputs may be overwritten only now: after the second rendezvous no rank reads them.
  if (dtype == CommDataType::kFloat32) {
    std::memcpy(data, scratch_.data(), static_cast<size_t>(count) * sizeof(float));
  } else {
    uint16_t* out = static_cast<uint16_t*>(data);
    for (int64_t i = 0; i < count; ++i) out[i] = FloatToBf16(scratch_[i]);
  }
  return absl::OkStatus();
}

absl::Status CpuCommunicator::AllGatherV(const void* send, int64_t send_count, void* recv,
                                         absl::Span<const int64_t> recv_counts,
                                         CommDataType dtype) {
  const CpuCommunicatorGroup::Post post{.op = CpuCommunicatorGroup::Op::kAllGather,
                                        .dtype = dtype,
                                        .send = send,
                                        .recv = recv,
                                        .count = send_count,
                                        .recv_counts = recv_counts};
  const size_t elem = CommDataTypeSize(dtype);
  return group_->Run(rank_, post, [&] {
    uint8_t* out = static_cast<uint8_t*>(recv);
    for (int r = 0; r < world_size(); ++r) {
      const size_t bytes = static_cast<size_t>(recv_counts[r]) * elem;
      if (bytes > 0) std::memcpy(out, group_->posts_[r].send, bytes);
      out += bytes;
    }
  });
}

absl::Status CpuCommunicator::AllToAllV(const void* send, absl::Span<const int64_t> send_counts,
                                        void* recv, absl::Span<const int64_t> recv_counts,
                                        CommDataType dtype) {
  const CpuCommunicatorGroup::Post post{.op = CpuCommunicatorGroup::Op::kAllToAll,
                                        .dtype = dtype,
                                        .send = send,
                                        .recv = recv,
                                        .send_counts = send_counts,
                                        .recv_counts = recv_counts};
  const size_t elem = CommDataTypeSize(dtype);
  return group_->Run(rank_, post, [&] {
    // Pull model: this rank copies its part of every source's send buffer into its own recv.
    uint8_t* out = static_cast<uint8_t*>(recv);
    for (int s = 0; s < world_size(); ++s) {
      const CpuCommunicatorGroup::Post& src = group_->posts_[s];
      int64_t offset = 0;
      for (int d = 0; d < rank_; ++d) offset += src.send_counts[d];
      const size_t bytes = static_cast<size_t>(recv_counts[s]) * elem;
      if (bytes > 0) {
        std::memcpy(out, static_cast<const uint8_t*>(src.send) + offset * elem, bytes);
      }
      out += bytes;
    }
  });
}

absl::Status CpuCommunicator::Barrier() {
  return group_->Run(rank_, {.op = CpuCommunicatorGroup::Op::kBarrier}, [] {});
}

}  // namespace sluice
