// CheckedImages: the content hashes (ImageContentHash: XXH3-128 of the bytes and the
// preprocessing config) of images this process already decoded and found valid under its
// limits, most recently used kept, bounded in entries. A router that checks images but leaves
// encoding to encoder workers (MultimodalContext::checked) decodes a repeated image — the same
// picture in every turn of a multi-turn chat — only once. The limits are the process's own and
// do not change, so a hash that passed passes again. Thread-safe.
#ifndef SLUICE_SERVICES_API_CHECKED_IMAGES_H_
#define SLUICE_SERVICES_API_CHECKED_IMAGES_H_

#include <cstdint>
#include <list>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "engine/kv/block_hash.h"

namespace sluice {

struct CheckedImagesStats {
  int64_t hits = 0;    // images found checked (not decoded again)
  int64_t misses = 0;  // images decoded to check them
  int64_t entries = 0;
};

class CheckedImages {
 public:
  // capacity: hashes kept at most (0: nothing is kept, every image is decoded).
  explicit CheckedImages(int64_t capacity) : capacity_(capacity) {}

  // Contains: whether `hash` passed the check before (marks it recently used; counts a hit or
  // a miss).
  bool Contains(const BlockHash& hash);
  // Insert records an image that decoded within the limits.
  void Insert(const BlockHash& hash);
  CheckedImagesStats stats() const;

 private:
  const int64_t capacity_;
  mutable absl::Mutex mu_;
  std::list<BlockHash> lru_ ABSL_GUARDED_BY(mu_);  // most recently used first
  absl::flat_hash_map<BlockHash, std::list<BlockHash>::iterator> index_ ABSL_GUARDED_BY(mu_);
  CheckedImagesStats stats_ ABSL_GUARDED_BY(mu_);
};

// RenderCheckedImagesMetrics: sluice_router_image_checks_cached_total (hits),
// sluice_router_image_checks_decoded_total (misses) and sluice_router_image_checks_cached
// (entries), Prometheus text format.
std::string RenderCheckedImagesMetrics(const CheckedImagesStats& stats);

}  // namespace sluice

#endif  // SLUICE_SERVICES_API_CHECKED_IMAGES_H_
