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
namespace {

// EncodeReactor: the Encode call's reactor. A call that fails (a later image was bad) or is
// cancelled (the caller gone, its deadline passed) frees the slots it staged: nobody got the
// refs.
class EncodeReactor final : public grpc::ServerUnaryReactor {
 public:
  explicit EncodeReactor(EmbeddingStaging* staging) : staging_(staging) {}
  void Stage(uint64_t lease_id) { leases_.push_back(lease_id); }
  void FinishOk() {
    ok_ = true;
    Finish(grpc::Status::OK);
  }
  void OnCancel() override { cancelled_.store(true); }
  void OnDone() override {
    if ((!ok_ || cancelled_.load()) && staging_ != nullptr) {
      for (uint64_t id : leases_) staging_->Cancel(id);
    }
    delete this;
  }

 private:
  EmbeddingStaging* const staging_;
  std::vector<uint64_t> leases_;  // written before Finish, read in OnDone
  bool ok_ = false;               // likewise
  std::atomic<bool> cancelled_{false};
};

}  // namespace

grpc::ServerUnaryReactor* EncoderService::ReleaseEmbeddings(
    grpc::CallbackServerContext* context, const v1::ReleaseEmbeddingsRequest* request,
    v1::ReleaseEmbeddingsResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (options_.staging == nullptr) {
    reactor->Finish(grpc::Status(grpc::StatusCode::NOT_FOUND,
                                 "this encoder stages no embeddings (started with --no-ucx)"));
    return reactor;
  }
  absl::StatusOr<std::string> values = options_.staging->Release(
      request->lease_id(), request->token(), request->return_values(), absl::Now());
  if (!values.ok()) {
    reactor->Finish(grpc::Status(static_cast<grpc::StatusCode>(values.status().code()),
                                 std::string(values.status().message())));
    return reactor;
  }
  if (request->return_values()) {
    // Fetched inline after all: count the bytes on the inline path, not the staged one.
    staged_bytes_.fetch_sub(static_cast<int64_t>(values->size()));
    inline_bytes_.fetch_add(static_cast<int64_t>(values->size()));
    response->set_values(*std::move(values));
  }
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* EncoderService::Encode(grpc::CallbackServerContext* context,
                                                 const v1::EncodeRequest* request,
                                                 v1::EncodeResponse* response) {
  (void)context;
  auto* reactor = new EncodeReactor(options_.staging);
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
  int64_t staged_bytes = 0, inline_bytes = 0;
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
    const absl::Span<const uint8_t> values(reinterpret_cast<const uint8_t*>(embeddings->data()),
                                           embeddings->size() * sizeof(float));
    bool staged = false;
    if (request->allow_ref() && options_.staging != nullptr &&
        static_cast<int64_t>(values.size()) > options_.inline_max_bytes) {
      // A full arena answers inline: slower, never a failure.
      absl::StatusOr<v1::EmbeddingRef> ref = options_.staging->Stage(values, absl::Now());
      if (ref.ok()) {
        reactor->Stage(ref->lease_id());
        *out->mutable_ref() = *std::move(ref);
        staged_bytes += static_cast<int64_t>(values.size());
        staged = true;
      }
    }
    if (!staged) {
      out->set_values(reinterpret_cast<const char*>(values.data()), values.size());
      inline_bytes += static_cast<int64_t>(values.size());
    }
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
  staged_bytes_.fetch_add(staged_bytes);
  inline_bytes_.fetch_add(inline_bytes);
  reactor->FinishOk();
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
  absl::StrAppend(
      &text,
      "# HELP sluice_encoder_embedding_bytes_total Embedding bytes answered, by path: staged "
      "(read by the worker over UCX from the staging arena) or inline (in the gRPC answer).\n"
      "# TYPE sluice_encoder_embedding_bytes_total counter\n"
      "sluice_encoder_embedding_bytes_total{path=\"staged\"} ", staged_bytes_.load(), "\n",
      "sluice_encoder_embedding_bytes_total{path=\"inline\"} ", inline_bytes_.load(), "\n");
  if (options_.staging != nullptr) {
    options_.staging->Sweep(absl::Now());
    const EmbeddingStagingStats st = options_.staging->stats();
    absl::StrAppend(
        &text,
        "# HELP sluice_encoder_staging_bytes Embedding bytes held in the staging arena now.\n"
        "# TYPE sluice_encoder_staging_bytes gauge\n"
        "sluice_encoder_staging_bytes ", st.staged_bytes, "\n",
        "# HELP sluice_encoder_staging_arena_bytes Size of the registered staging arena.\n"
        "# TYPE sluice_encoder_staging_arena_bytes gauge\n"
        "sluice_encoder_staging_arena_bytes ", st.arena_bytes, "\n",
        "# HELP sluice_encoder_staging_leases Staged embeddings waiting for their reader.\n"
        "# TYPE sluice_encoder_staging_leases gauge\n"
        "sluice_encoder_staging_leases ", st.num_staged_leases, "\n",
        "# HELP sluice_encoder_staging_leases_ended_total Staging leases ended, by how.\n"
        "# TYPE sluice_encoder_staging_leases_ended_total counter\n"
        "sluice_encoder_staging_leases_ended_total{end=\"released\"} ", st.num_released, "\n",
        "sluice_encoder_staging_leases_ended_total{end=\"expired\"} ", st.num_expired, "\n",
        "sluice_encoder_staging_leases_ended_total{end=\"cancelled\"} ", st.num_cancelled, "\n",
        "# HELP sluice_encoder_staging_full_total Embeddings answered inline because the "
        "staging arena was full.\n"
        "# TYPE sluice_encoder_staging_full_total counter\n"
        "sluice_encoder_staging_full_total ", st.num_full, "\n");
  }
  if (cache_ != nullptr) absl::StrAppend(&text, RenderEncoderCacheMetrics(cache_->stats()));
  return text;
}

}  // namespace sluice
