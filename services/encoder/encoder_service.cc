#include "services/encoder/encoder_service.h"

#include <chrono>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "services/api/multimodal_input.h"
#include "services/common/encoder_cache_metrics.h"

namespace sluice {

grpc::ServerUnaryReactor* EncoderService::Encode(grpc::CallbackServerContext* context,
                                                 const v1::EncodeRequest* request,
                                                 v1::EncodeResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (draining_.load()) {
    reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "encoder worker is draining"));
    return reactor;
  }
  in_flight_.fetch_add(1);
  struct Leave {
    std::atomic<int64_t>* n;
    ~Leave() { n->fetch_sub(1); }
  } leave{&in_flight_};
  if (request->images_size() > options_.max_images_per_call) {
    reactor->Finish(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                                 absl::StrCat("at most ", options_.max_images_per_call,
                                              " images per call, got ", request->images_size())));
    return reactor;
  }
  if (options_.test_encode_delay_ms > 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(options_.test_encode_delay_ms));
  }
  const std::string fingerprint = encoder_->processor().Fingerprint();
  const auto start = std::chrono::steady_clock::now();
  int64_t num_encoded = 0;  // cache misses: images the tower ran on
  for (int i = 0; i < request->images_size(); ++i) {
    const std::string& bytes = request->images(i);
    const BlockHash hash = vision::ImageContentHash(bytes, fingerprint);
    vision::EmbeddingCache::Embeddings embeddings =
        cache_ != nullptr ? cache_->Lookup(hash) : nullptr;
    const bool hit = embeddings != nullptr;
    if (!hit) {
      absl::StatusOr<vision::RgbImage> image = vision::DecodeImage(bytes, options_.decode_limits);
      absl::StatusOr<std::vector<float>> values =
          image.ok() ? encoder_->EncodeImage(*image) : image.status();
      if (!values.ok()) {
        num_errors_.fetch_add(1);
        reactor->Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                     absl::StrCat("image ", i, ": ", values.status().message())));
        return reactor;
      }
      ++num_encoded;
      embeddings = std::make_shared<const std::vector<float>>(*std::move(values));
      if (cache_ != nullptr) cache_->Insert(hash, embeddings);
    }
    v1::ImageEmbedding* out = response->add_embeddings();
    std::string key(16, '\0');
    for (int b = 0; b < 8; ++b) {
      key[b] = static_cast<char>(hash.lo >> (8 * b));
      key[8 + b] = static_cast<char>(hash.hi >> (8 * b));
    }
    out->set_content_hash(std::move(key));
    out->set_num_tokens(static_cast<int32_t>(encoder_->tokens_per_image()));
    out->set_hidden_size(static_cast<int32_t>(encoder_->embedding_dim()));
    // float32 little-endian: the host order on every platform Sluice builds for (x86-64, arm64).
    out->set_values(reinterpret_cast<const char*>(embeddings->data()),
                    embeddings->size() * sizeof(float));
    out->set_cache_hit(hit);
    num_images_.fetch_add(1);
  }
  const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
  encode_micros_.fetch_add(static_cast<int64_t>(elapsed.count() * 1e6));
  {
    std::lock_guard<std::mutex> lock(totals_mu_);
    ++totals_.num_steps;
    totals_.num_tokens += num_encoded;
    totals_.seconds += elapsed.count();
  }
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

StepTotals EncoderService::encode_totals() const {
  std::lock_guard<std::mutex> lock(totals_mu_);
  return totals_;
}

std::string EncoderService::RenderMetrics() const {
  std::string text = absl::StrCat(
      "# HELP sluice_encoder_images_total Images answered (encoded or from the cache).\n"
      "# TYPE sluice_encoder_images_total counter\n"
      "sluice_encoder_images_total ", num_images_.load(), "\n",
      "# HELP sluice_encoder_errors_total Images refused (bad image, over a limit).\n"
      "# TYPE sluice_encoder_errors_total counter\n"
      "sluice_encoder_errors_total ", num_errors_.load(), "\n",
      "# HELP sluice_encoder_encode_seconds_total Time spent in Encode calls.\n"
      "# TYPE sluice_encoder_encode_seconds_total counter\n"
      "sluice_encoder_encode_seconds_total ", encode_micros_.load() / 1e6, "\n",
      "# HELP sluice_encoder_requests_running Encode calls in progress.\n"
      "# TYPE sluice_encoder_requests_running gauge\n"
      "sluice_encoder_requests_running ", in_flight_.load(), "\n");
  if (cache_ != nullptr) absl::StrAppend(&text, RenderEncoderCacheMetrics(cache_->stats()));
  return text;
}

}  // namespace sluice
