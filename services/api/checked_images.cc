#include "services/api/checked_images.h"

#include "absl/strings/str_cat.h"

namespace sluice {

bool CheckedImages::Contains(const BlockHash& hash) {
  absl::MutexLock lock(&mu_);
  auto it = index_.find(hash);
  if (it == index_.end()) {
    ++stats_.misses;
    return false;
  }
  lru_.splice(lru_.begin(), lru_, it->second);
  ++stats_.hits;
  return true;
}

void CheckedImages::Insert(const BlockHash& hash) {
  if (capacity_ <= 0) return;
  absl::MutexLock lock(&mu_);
  if (auto it = index_.find(hash); it != index_.end()) {
    lru_.splice(lru_.begin(), lru_, it->second);
    return;
  }
  lru_.push_front(hash);
  index_.emplace(hash, lru_.begin());
  while (static_cast<int64_t>(lru_.size()) > capacity_) {
    index_.erase(lru_.back());
    lru_.pop_back();
  }
}

CheckedImagesStats CheckedImages::stats() const {
  absl::MutexLock lock(&mu_);
  CheckedImagesStats s = stats_;
  s.entries = static_cast<int64_t>(lru_.size());
  return s;
}

std::string RenderCheckedImagesMetrics(const CheckedImagesStats& s) {
  return absl::StrCat(
      "# HELP sluice_router_image_checks_cached_total Images found already checked by content "
      "hash (not decoded again).\n"
      "# TYPE sluice_router_image_checks_cached_total counter\n"
      "sluice_router_image_checks_cached_total ", s.hits, "\n",
      "# HELP sluice_router_image_checks_decoded_total Images decoded to check them.\n"
      "# TYPE sluice_router_image_checks_decoded_total counter\n"
      "sluice_router_image_checks_decoded_total ", s.misses, "\n",
      "# HELP sluice_router_image_checks_cached Content hashes of checked images kept.\n"
      "# TYPE sluice_router_image_checks_cached gauge\n"
      "sluice_router_image_checks_cached ", s.entries, "\n");
}

}  // namespace sluice
