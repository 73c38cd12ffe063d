#include "services/common/encoder_cache_metrics.h"

#include "absl/strings/str_cat.h"

namespace sluice {

std::string RenderEncoderCacheMetrics(const vision::EmbeddingCacheStats& s) {
  return absl::StrCat(
      "# HELP sluice_encoder_cache_hits_total Images whose embeddings came from the cache.\n"
      "# TYPE sluice_encoder_cache_hits_total counter\n"
      "sluice_encoder_cache_hits_total ", s.hits, "\n",
      "# HELP sluice_encoder_cache_misses_total Images encoded (not found in the cache).\n"
      "# TYPE sluice_encoder_cache_misses_total counter\n"
      "sluice_encoder_cache_misses_total ", s.misses, "\n",
      "# HELP sluice_encoder_cache_evictions_total Cached embeddings evicted (LRU).\n"
      "# TYPE sluice_encoder_cache_evictions_total counter\n"
      "sluice_encoder_cache_evictions_total ", s.evictions, "\n",
      "# HELP sluice_encoder_cache_bytes Bytes of cached embeddings.\n"
      "# TYPE sluice_encoder_cache_bytes gauge\n"
      "sluice_encoder_cache_bytes ", s.bytes, "\n");
}

}  // namespace sluice
