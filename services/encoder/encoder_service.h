// EncoderService: the `sluice.v1.Encoder` gRPC service over an in-process VisionEncoder and an
// EmbeddingCache (engine/vision). Thin: decoding, preprocessing, the tower and the cache key
// are engine/vision's; this maps them to the wire and counts for /metrics.
#ifndef SLUICE_SERVICES_ENCODER_ENCODER_SERVICE_H_
#define SLUICE_SERVICES_ENCODER_ENCODER_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>

#include "engine/sched/step_totals.h"
#include "engine/vision/embedding_cache.h"
#include "engine/vision/image.h"
#include "engine/vision/vision_encoder.h"
#include "services/encoder/embedding_staging.h"
#include "sluice/v1/encoder.grpc.pb.h"

namespace sluice {

struct EncoderServiceOptions {
  vision::ImageDecodeLimits decode_limits;
  int32_t max_images_per_call = 64;
  // Staged hand-off (borrowed; null: every embedding inline): embeddings over
  // `inline_max_bytes` are answered as an EmbeddingRef to callers that allow it.
  EmbeddingStaging* staging = nullptr;
  int64_t inline_max_bytes = 64 << 10;
  // Test only (fault tests): each Encode call waits this long first, a window to kill the
  // encoder in while a request is on it.
  int32_t test_encode_delay_ms = 0;
};

class EncoderService final : public v1::Encoder::CallbackService {
 public:
  // Pointers are borrowed; `cache` may be null (every image encoded).
  EncoderService(const vision::VisionEncoder* encoder, vision::EmbeddingCache* cache,
                 EncoderServiceOptions options)
      : encoder_(encoder), cache_(cache), options_(options) {}

  grpc::ServerUnaryReactor* Encode(grpc::CallbackServerContext* context,
                                   const v1::EncodeRequest* request,
                                   v1::EncodeResponse* response) override;
  grpc::ServerUnaryReactor* ReleaseEmbeddings(grpc::CallbackServerContext* context,
                                              const v1::ReleaseEmbeddingsRequest* request,
                                              v1::ReleaseEmbeddingsResponse* response) override;

  // Prometheus text: sluice_encoder_images_total, _errors_total, _encode_seconds_total, the
  // cache's sluice_encoder_cache_* figures, the embedding bytes answered by path
  // (sluice_encoder_embedding_bytes_total{path="staged"|"inline"}) and the staging arena's
  // figures. Thread-safe.
  std::string RenderMetrics() const;
  // Encode calls running now (the load the encoder reports to the router).
  int64_t num_in_flight() const { return in_flight_.load(); }
  // Cumulative Encode calls answered (num_steps), images the tower encoded in them (num_tokens;
  // cache hits excluded) and their seconds: the per-image cost the router's planner fits.
  StepTotals encode_totals() const;
  // Images answered, encoded or from the cache (with encode_totals: the cache hit rate).
  int64_t num_images() const { return num_images_.load(); }
  // Draining: new Encode calls get UNAVAILABLE (the router tries another encoder worker).
  void set_draining(bool draining) { draining_.store(draining); }
  bool draining() const { return draining_.load(); }

 private:
  const vision::VisionEncoder* encoder_;
  vision::EmbeddingCache* cache_;
  EncoderServiceOptions options_;
  std::atomic<int64_t> num_images_{0};
  std::atomic<int64_t> num_errors_{0};
  std::atomic<int64_t> encode_micros_{0};
  std::atomic<int64_t> in_flight_{0};
  std::atomic<int64_t> staged_bytes_{0};  // answered as refs
  std::atomic<int64_t> inline_bytes_{0};  // answered as values
  std::atomic<bool> draining_{false};
  mutable std::mutex totals_mu_;
  StepTotals totals_;  // guarded by totals_mu_
};

}  // namespace sluice

#endif  // SLUICE_SERVICES_ENCODER_ENCODER_SERVICE_H_
