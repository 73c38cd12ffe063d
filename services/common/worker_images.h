// WorkerImages: a prefill / decode worker's own vision tower (issue 26's self-encode fallback).
// When no encoder worker could encode a request's images, the router sends them to the workers
// as bytes (MultimodalInput.image); a worker serving a vision-language model encodes them with
// the same engine/vision code as `sluice encoder` — so the embeddings, and the greedy tokens,
// equal the encoder pool's — through an embedding cache keyed by the image's content hash.
#ifndef SLUICE_SERVICES_COMMON_WORKER_IMAGES_H_
#define SLUICE_SERVICES_COMMON_WORKER_IMAGES_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/sched/request.h"
#include "engine/vision/embedding_cache.h"
#include "engine/vision/image.h"
#include "engine/vision/vision_encoder.h"

namespace sluice {

class WorkerImages {
 public:
  // Load returns null for a text-only model folder, else the vision tower + projector of
  // `model_dir` and an embedding cache of `cache_bytes` (0: none). Errors: those of
  // VisionEncoder::Load.
  static absl::StatusOr<std::unique_ptr<WorkerImages>> Load(const std::string& model_dir,
                                                            int64_t cache_bytes);

  // EncodeMissing gives every input without embeddings the embeddings of its image bytes
  // (from the cache, else decoded and encoded) and drops the bytes. Thread-safe. Errors:
  // InvalidArgument "mm_inputs[i]: ..." for an input with neither, a placeholder run that is
  // not tokens_per_image long, or an image that does not decode; FailedPrecondition when the
  // content hash is not this worker's hash of the bytes (a router reading another model
  // folder's preprocessor_config.json).
  absl::Status EncodeMissing(std::vector<MultimodalInput>* inputs) const;

  // Cache figures (all zero without a cache).
  vision::EmbeddingCacheStats cache_stats() const;
  int64_t num_encoded() const;

 private:
  WorkerImages() = default;
  std::unique_ptr<vision::VisionEncoder> encoder_;
  std::unique_ptr<vision::EmbeddingCache> cache_;
  std::string fingerprint_;
  // The router checked the images against its own limits; these only bound what one image may
  // cost here.
  vision::ImageDecodeLimits limits_;
  mutable std::atomic<int64_t> num_encoded_{0};
};

// RenderWorkerImageMetrics: sluice_encoder_cache_{hits,misses,evictions}_total,
// sluice_encoder_cache_bytes (as `sluice encoder` and `sluice serve` name them) and
// sluice_worker_images_encoded_total, in Prometheus text format.
std::string RenderWorkerImageMetrics(const WorkerImages& images);

// EncodeMissingImages: images->EncodeMissing(inputs), or, for a worker without a vision tower
// (`images` null), FailedPrecondition when an input has no embeddings.
absl::Status EncodeMissingImages(const WorkerImages* images, std::vector<MultimodalInput>* inputs);

}  // namespace sluice

#endif  // SLUICE_SERVICES_COMMON_WORKER_IMAGES_H_
