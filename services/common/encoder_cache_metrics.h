// The vision embedding cache's figures in Prometheus text format, shared by `sluice serve`, the
// encoder service and workers that encode images themselves.
#ifndef SLUICE_SERVICES_COMMON_ENCODER_CACHE_METRICS_H_
#define SLUICE_SERVICES_COMMON_ENCODER_CACHE_METRICS_H_

#include <string>

#include "engine/vision/embedding_cache.h"

namespace sluice {

// RenderEncoderCacheMetrics: sluice_encoder_cache_{hits,misses,evictions}_total and
// sluice_encoder_cache_bytes.
std::string RenderEncoderCacheMetrics(const vision::EmbeddingCacheStats& stats);

}  // namespace sluice

#endif  // SLUICE_SERVICES_COMMON_ENCODER_CACHE_METRICS_H_
