#include "transfer/device_copier.h"

#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace sluice::transfer {

HostMemcpyCopier::HostMemcpyCopier(int num_lanes) : pending_(num_lanes > 0 ? num_lanes : 1) {}

absl::StatusOr<void*> HostMemcpyCopier::AllocateStaging(int64_t bytes) {
  if (bytes <= 0) return absl::InvalidArgumentError("AllocateStaging needs bytes > 0");
  void* p = std::malloc(static_cast<size_t>(bytes));
  if (p == nullptr) return absl::ResourceExhaustedError("cannot allocate staging memory");
  return p;
}

void HostMemcpyCopier::FreeStaging(void* staging) { std::free(staging); }

absl::Status HostMemcpyCopier::CopyAsync(int lane, void* dst, const void* src, int64_t bytes,
                                         CopyDirection /*direction*/) {
  if (lane < 0 || lane >= num_lanes()) {
    return absl::InvalidArgumentError(absl::StrCat("copy lane ", lane, " of ", num_lanes()));
  }
  if (bytes < 0) return absl::InvalidArgumentError("copy of a negative size");
  pending_[lane].push_back({dst, src, bytes});
  return absl::OkStatus();
}

absl::Status HostMemcpyCopier::Wait(int lane) {
  if (lane < 0 || lane >= num_lanes()) {
    return absl::InvalidArgumentError(absl::StrCat("copy lane ", lane, " of ", num_lanes()));
  }
  for (const Copy& c : pending_[lane]) {
    std::memcpy(c.dst, c.src, static_cast<size_t>(c.bytes));
    ++num_copies_;
  }
  pending_[lane].clear();
  return absl::OkStatus();
}

}  // namespace sluice::transfer
