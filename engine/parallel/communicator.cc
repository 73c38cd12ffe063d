#include "engine/parallel/communicator.h"

#include "absl/strings/str_cat.h"

namespace sluice {

size_t CommDataTypeSize(CommDataType dtype) {
  switch (dtype) {
    case CommDataType::kFloat32:
    case CommDataType::kInt32:
      return 4;
    case CommDataType::kBFloat16:
      return 2;
    case CommDataType::kInt64:
      return 8;
  }
  return 0;
}

const char* CommDataTypeName(CommDataType dtype) {
  switch (dtype) {
    case CommDataType::kFloat32:
      return "f32";
    case CommDataType::kBFloat16:
      return "bf16";
    case CommDataType::kInt32:
      return "i32";
    case CommDataType::kInt64:
      return "i64";
  }
  return "?";
}

absl::Status Communicator::AllGather(const void* send, int64_t count, void* recv,
                                     CommDataType dtype) {
  const std::vector<int64_t> counts(static_cast<size_t>(world_size()), count);
  return AllGatherV(send, count, recv, counts, dtype);
}

absl::Status Communicator::ExchangeHostCounts(const int64_t* send, int64_t* recv) {
  const std::vector<int64_t> ones(static_cast<size_t>(world_size()), 1);
  return AllToAllV(send, ones, recv, ones, CommDataType::kInt64);
}

absl::StatusOr<std::vector<int64_t>> ExchangeCounts(Communicator& comm,
                                                    absl::Span<const int64_t> send_counts) {
  const size_t n = static_cast<size_t>(comm.world_size());
  if (send_counts.size() != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("ExchangeCounts: ", send_counts.size(), " send counts for a world of ", n));
  }
  for (int64_t c : send_counts) {
    if (c < 0) return absl::InvalidArgumentError(absl::StrCat("ExchangeCounts: count ", c));
  }
  std::vector<int64_t> recv_counts(n, 0);
  if (absl::Status s = comm.ExchangeHostCounts(send_counts.data(), recv_counts.data()); !s.ok()) {
    return s;
  }
  return recv_counts;
}

}  // namespace sluice
