#include "services/router/heartbeat_lease.h"

#include <algorithm>
#include <cmath>

namespace sluice {

HeartbeatLease::HeartbeatLease(HeartbeatLeaseOptions options) : options_(options) {
  options_.window = std::max<size_t>(1, options_.window);
  options_.k = std::max(0.0, options_.k);
}

void HeartbeatLease::Observe(absl::Time now) {
  if (seen_) {
    const double gap = std::max(0.0, absl::ToDoubleSeconds(now - last_));
    if (gaps_.size() < options_.window) {
      gaps_.push_back(gap);
    } else {
      gaps_[next_] = gap;
      next_ = (next_ + 1) % options_.window;
    }
  }
  seen_ = true;
  last_ = now;
}

absl::Duration HeartbeatLease::Lease() const {
  const absl::Duration floor = options_.floor;
  const absl::Duration cap = std::max(options_.cap, floor);
  if (options_.k == 0 || gaps_.empty() || gaps_.size() < options_.min_samples) return floor;
  double mean = 0;
  for (double g : gaps_) mean += g;
  mean /= static_cast<double>(gaps_.size());
  double var = 0;
  for (double g : gaps_) var += (g - mean) * (g - mean);
  var /= static_cast<double>(gaps_.size());
  const absl::Duration tuned = absl::Seconds(mean + options_.k * std::sqrt(var));
  return std::clamp(tuned, floor, cap);
}

}  // namespace sluice
