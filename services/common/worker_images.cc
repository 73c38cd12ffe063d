#include "services/common/worker_images.h"

#include "absl/strings/str_cat.h"
#include "engine/model/model_config.h"
#include "engine/sched/request.h"
#include "engine/vision/image.h"
#include "services/common/encoder_cache_metrics.h"

namespace sluice {

absl::StatusOr<std::unique_ptr<WorkerImages>> WorkerImages::Load(const std::string& model_dir,
                                                                 int64_t cache_bytes) {
  absl::StatusOr<ModelConfig> config = ModelConfig::Load(model_dir);
  if (!config.ok()) return config.status();
  if (config->multimodal_architecture.empty()) return nullptr;
  absl::StatusOr<std::unique_ptr<vision::VisionEncoder>> encoder =
      vision::VisionEncoder::Load(model_dir);
  if (!encoder.ok()) return encoder.status();
  std::unique_ptr<WorkerImages> images(new WorkerImages());
  images->encoder_ = *std::move(encoder);
  images->fingerprint_ = images->encoder_->processor().Fingerprint();
  if (cache_bytes > 0) images->cache_ = std::make_unique<vision::EmbeddingCache>(cache_bytes);
  // Bounded by the gRPC message size the worker accepts; the pixel bound is far above the
  // router's default (89,478,485), which refuses decompression bombs before they get here.
  images->limits_.max_bytes = int64_t{256} << 20;
  images->limits_.max_pixels = int64_t{1} << 30;
  return images;
}

absl::Status WorkerImages::EncodeMissing(std::vector<MultimodalInput>* inputs) const {
  for (size_t i = 0; i < inputs->size(); ++i) {
    MultimodalInput& mm = (*inputs)[i];
    if (mm.embeddings != nullptr) continue;
    const std::string where = absl::StrCat("mm_inputs[", i, "]");
    if (mm.image == nullptr || mm.image->empty()) {
      return absl::InvalidArgumentError(absl::StrCat(where, " has neither embeddings nor an image"));
    }
    if (mm.num_tokens != encoder_->tokens_per_image()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": the image takes ", encoder_->tokens_per_image(),
                       " placeholder tokens on this model, not ", mm.num_tokens));
    }
    // The hash keys the KV blocks and the cache: it must be the one this worker would compute.
    if (vision::ImageContentHash(*mm.image, fingerprint_) != mm.content_hash) {
      return absl::FailedPreconditionError(absl::StrCat(
          where, ": the image's content hash differs from this worker's (are the router and "
                 "this worker reading the same model folder's preprocessor_config.json?)"));
    }
    vision::EmbeddingCache::Embeddings embeddings;
    if (cache_ != nullptr) embeddings = cache_->Lookup(mm.content_hash);
    if (embeddings == nullptr) {
      absl::StatusOr<vision::RgbImage> decoded = vision::DecodeImage(*mm.image, limits_);
      if (!decoded.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": ", decoded.status().message()));
      }
      absl::StatusOr<std::vector<float>> encoded = encoder_->EncodeImage(*decoded);
      if (!encoded.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": ", encoded.status().message()));
      }
      embeddings = std::make_shared<const std::vector<float>>(*std::move(encoded));
      num_encoded_.fetch_add(1, std::memory_order_relaxed);
      if (cache_ != nullptr) cache_->Insert(mm.content_hash, embeddings);
    }
    mm.embeddings = std::move(embeddings);
    mm.image.reset();
  }
  return absl::OkStatus();
}

vision::EmbeddingCacheStats WorkerImages::cache_stats() const {
  return cache_ != nullptr ? cache_->stats() : vision::EmbeddingCacheStats{};
}

int64_t WorkerImages::num_encoded() const { return num_encoded_.load(std::memory_order_relaxed); }

std::string RenderWorkerImageMetrics(const WorkerImages& images) {
  return absl::StrCat(
      RenderEncoderCacheMetrics(images.cache_stats()),
      "# HELP sluice_worker_images_encoded_total Images this worker encoded itself (sent as "
      "bytes: no encoder worker could; cache hits not counted).\n"
      "# TYPE sluice_worker_images_encoded_total counter\n"
      "sluice_worker_images_encoded_total ", images.num_encoded(), "\n");
}

absl::Status EncodeMissingImages(const WorkerImages* images,
                                 std::vector<MultimodalInput>* inputs) {
  if (images != nullptr) return images->EncodeMissing(inputs);
  for (size_t i = 0; i < inputs->size(); ++i) {
    if ((*inputs)[i].embeddings == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "mm_inputs[", i, "] has no embeddings and this worker cannot encode images (its "
          "model has no vision tower)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace sluice
