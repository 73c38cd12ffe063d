#include "services/common/worker_images.h"

#include <algorithm>
#include <chrono>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "services/serve/log.h"
#include "engine/model/model_config.h"
#include "engine/sched/request.h"
#include "engine/vision/image.h"
#include "services/common/encoder_cache_metrics.h"

namespace sluice {

WorkerImages::WorkerImages(const WorkerImagesOptions& options)
    : test_encode_delay_(options.test_encode_delay),
      pool_(std::make_unique<TaskPool>(std::max(1, options.encode_threads))) {}

// The pool runs its queued encodes, then joins, before the tower and the cache go.
WorkerImages::~WorkerImages() { pool_.reset(); }

absl::StatusOr<std::shared_ptr<WorkerImages>> WorkerImages::Load(
    const std::string& model_dir, const WorkerImagesOptions& options) {
  absl::StatusOr<ModelConfig> config = ModelConfig::Load(model_dir);
  if (!config.ok()) return config.status();
  if (config->multimodal_architecture.empty()) return nullptr;
  absl::StatusOr<std::unique_ptr<vision::VisionEncoder>> encoder =
      vision::VisionEncoder::Load(model_dir);
  if (!encoder.ok()) return encoder.status();
  std::shared_ptr<WorkerImages> images(new WorkerImages(options));
  images->encoder_ = *std::move(encoder);
  images->fingerprint_ = images->encoder_->processor().Fingerprint();
  if (options.cache_bytes > 0) {
    images->cache_ = std::make_unique<vision::EmbeddingCache>(options.cache_bytes);
  }
  // Bounded by the gRPC message size the worker accepts; the pixel bound is far above the
  // router's default (89,478,485), which refuses decompression bombs before they get here.
  images->limits_.max_bytes = int64_t{256} << 20;
  images->limits_.max_pixels = int64_t{1} << 30;
  return images;
}

absl::Status WorkerImages::Check(const std::vector<MultimodalInput>& inputs) const {
  for (size_t i = 0; i < inputs.size(); ++i) {
    const MultimodalInput& mm = inputs[i];
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
  }
  return absl::OkStatus();
}

absl::Status WorkerImages::EncodeMissing(std::vector<MultimodalInput>* inputs) const {
  if (absl::Status s = Check(*inputs); !s.ok()) return s;
  for (size_t i = 0; i < inputs->size(); ++i) {
    MultimodalInput& mm = (*inputs)[i];
    if (mm.embeddings != nullptr) continue;
    vision::EmbeddingCache::Embeddings embeddings;
    if (cache_ != nullptr) embeddings = cache_->Lookup(mm.content_hash);
    if (embeddings != nullptr) {
      ReleaseStaged(mm.content_hash);
    } else {
      embeddings = FetchStaged(mm.content_hash);
      if (embeddings != nullptr && cache_ != nullptr) cache_->Insert(mm.content_hash, embeddings);
    }
    if (embeddings == nullptr) {
      const std::string where = absl::StrCat("mm_inputs[", i, "]");
      const absl::Time start = absl::Now();
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
      encode_micros_.fetch_add(absl::ToInt64Microseconds(absl::Now() - start),
                               std::memory_order_relaxed);
      if (cache_ != nullptr) cache_->Insert(mm.content_hash, embeddings);
    }
    mm.embeddings = std::move(embeddings);
    mm.image.reset();
  }
  return absl::OkStatus();
}

void WorkerImages::StartEncode(uint64_t ticket, std::vector<MultimodalInput> inputs) {
  num_encoding_.fetch_add(1);
  pool_->Post([this, ticket, inputs = std::move(inputs)]() mutable {
    if (test_encode_delay_ > absl::ZeroDuration()) absl::SleepFor(test_encode_delay_);
    ImageEncodeResult result;
    result.ticket = ticket;
    if (absl::Status s = EncodeMissing(&inputs); s.ok()) {
      result.inputs = std::move(inputs);
    } else {
      result.inputs = std::move(s);
    }
    std::lock_guard<std::mutex> lock(mu_);
    done_.push_back(std::move(result));
    num_encoding_.fetch_sub(1);
  });
}

std::vector<ImageEncodeResult> WorkerImages::PollEncodes() {
  std::vector<ImageEncodeResult> out;
  std::lock_guard<std::mutex> lock(mu_);
  out.swap(done_);
  return out;
}

void WorkerImages::AddEmbeddingRef(const BlockHash& hash, const v1::EmbeddingRef& ref) const {
  const absl::Time now = absl::Now();
  std::lock_guard<std::mutex> lock(refs_mu_);
  // Expired refs go first, in expiry order (a decode worker records refs it never uses), so
  // the table holds only the refs of the last lease period. A record whose ref was taken
  // already finds nothing expired under its hash.
  while (!expiry_order_.empty() && expiry_order_.front().first <= now) {
    auto it = refs_.find(expiry_order_.front().second);
    expiry_order_.pop_front();
    if (it == refs_.end()) continue;
    std::deque<PendingRef>& q = it->second;
    while (!q.empty() && q.front().expiry <= now) {
      q.pop_front();
      --num_refs_;
    }
    if (q.empty()) refs_.erase(it);
  }
  std::deque<PendingRef>& q = refs_[hash];
  for (const PendingRef& p : q) {
    if (p.ref.lease_id() == ref.lease_id() && p.ref.encoder_address() == ref.encoder_address()) {
      return;
    }
  }
  const absl::Time expiry = now + absl::Milliseconds(ref.lease_ms());
  q.push_back({ref, expiry});
  expiry_order_.emplace_back(expiry, hash);
  ++num_refs_;
}

std::optional<v1::EmbeddingRef> WorkerImages::TakeEmbeddingRef(const BlockHash& hash) const {
  const absl::Time now = absl::Now();
  std::lock_guard<std::mutex> lock(refs_mu_);
  auto it = refs_.find(hash);
  if (it == refs_.end()) return std::nullopt;
  std::optional<v1::EmbeddingRef> taken;
  std::deque<PendingRef>& q = it->second;
  while (!q.empty() && !taken.has_value()) {
    if (q.back().expiry > now) taken = std::move(q.back().ref);  // the newest lives longest
    q.pop_back();
    --num_refs_;
  }
  if (q.empty()) refs_.erase(it);
  return taken;
}

void WorkerImages::SetEmbeddingFetcher(std::unique_ptr<EmbeddingFetcher> fetcher) {
  std::shared_ptr<EmbeddingFetcher> old;
  {
    std::lock_guard<std::mutex> lock(fetcher_mu_);
    old = std::exchange(fetcher_, std::move(fetcher));
  }
  // Fetches are bounded by their RMA deadline: wait them out before the buffers go.
  while (old != nullptr && old.use_count() > 1) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

std::shared_ptr<EmbeddingFetcher> WorkerImages::Fetcher() const {
  std::lock_guard<std::mutex> lock(fetcher_mu_);
  return fetcher_;
}

std::shared_ptr<const std::vector<float>> WorkerImages::FetchStaged(const BlockHash& hash) const {
  const std::shared_ptr<EmbeddingFetcher> fetcher = Fetcher();
  if (fetcher == nullptr) return nullptr;
  std::optional<v1::EmbeddingRef> ref = TakeEmbeddingRef(hash);
  if (!ref.has_value()) return nullptr;
  const int64_t floats = int64_t{encoder_->tokens_per_image()} * encoder_->embedding_dim();
  absl::StatusOr<std::shared_ptr<const std::vector<float>>> fetched = fetcher->Fetch(*ref, floats);
  if (!fetched.ok()) {
    spdlog::warn("staged embeddings of image {} unavailable ({}); encoding the image here",
                 hash.ToHex(), fetched.status().ToString());
    return nullptr;
  }
  return *std::move(fetched);
}

void WorkerImages::ReleaseStaged(const BlockHash& hash) const {
  const std::shared_ptr<EmbeddingFetcher> fetcher = Fetcher();
  if (fetcher == nullptr) return;
  std::optional<v1::EmbeddingRef> ref = TakeEmbeddingRef(hash);
  if (ref.has_value()) fetcher->Release(*ref);
}

int64_t WorkerImages::embedding_rma_bytes() const {
  const std::shared_ptr<EmbeddingFetcher> fetcher = Fetcher();
  return fetcher != nullptr ? fetcher->stats().rma_bytes : 0;
}

int64_t WorkerImages::embedding_inline_bytes() const {
  const std::shared_ptr<EmbeddingFetcher> fetcher = Fetcher();
  return inline_request_bytes_.load() + (fetcher != nullptr ? fetcher->stats().inline_bytes : 0);
}

int64_t WorkerImages::num_embedding_refs() const {
  std::lock_guard<std::mutex> lock(refs_mu_);
  return num_refs_;
}

void NoteWireInputs(const WorkerImages* images,
                    const google::protobuf::RepeatedPtrField<v1::MultimodalInput>& inputs) {
  if (images == nullptr) return;
  for (const v1::MultimodalInput& w : inputs) {
    if (!w.embeddings().empty()) images->CountInlineEmbeddings(w.embeddings().size());
    if (!w.has_embedding_ref() || w.content_hash().size() != 16) continue;
    BlockHash hash;
    for (int b = 0; b < 8; ++b) {
      hash.lo |= uint64_t{static_cast<uint8_t>(w.content_hash()[b])} << (8 * b);
      hash.hi |= uint64_t{static_cast<uint8_t>(w.content_hash()[8 + b])} << (8 * b);
    }
    images->AddEmbeddingRef(hash, w.embedding_ref());
  }
}

vision::EmbeddingCacheStats WorkerImages::cache_stats() const {
  return cache_ != nullptr ? cache_->stats() : vision::EmbeddingCacheStats{};
}

int64_t WorkerImages::num_encoded() const { return num_encoded_.load(std::memory_order_relaxed); }
double WorkerImages::encode_seconds() const {
  return encode_micros_.load(std::memory_order_relaxed) / 1e6;
}
int64_t WorkerImages::num_encoding() const { return num_encoding_.load(); }

std::string RenderWorkerImageMetrics(const WorkerImages& images) {
  return absl::StrCat(
      RenderEncoderCacheMetrics(images.cache_stats()),
      "# HELP sluice_worker_images_encoded_total Images this worker encoded itself (sent as "
      "bytes: no encoder worker could; cache hits not counted).\n"
      "# TYPE sluice_worker_images_encoded_total counter\n"
      "sluice_worker_images_encoded_total ", images.num_encoded(), "\n",
      "# HELP sluice_worker_image_encode_seconds_total Wall time this worker spent decoding and "
      "encoding those images.\n"
      "# TYPE sluice_worker_image_encode_seconds_total counter\n"
      "sluice_worker_image_encode_seconds_total ", images.encode_seconds(), "\n",
      "# HELP sluice_worker_image_encodes_running Requests whose images this worker is encoding "
      "(queued for or on its encode threads).\n"
      "# TYPE sluice_worker_image_encodes_running gauge\n"
      "sluice_worker_image_encodes_running ", images.num_encoding(), "\n",
      "# HELP sluice_worker_embedding_bytes_total Image embedding bytes received, by path: rma "
      "(read from an encoder's staging arena over UCX) or inline (in gRPC messages).\n"
      "# TYPE sluice_worker_embedding_bytes_total counter\n"
      "sluice_worker_embedding_bytes_total{path=\"rma\"} ", images.embedding_rma_bytes(), "\n",
      "sluice_worker_embedding_bytes_total{path=\"inline\"} ", images.embedding_inline_bytes(),
      "\n");
}

absl::Status CheckImages(const WorkerImages* images, const std::vector<MultimodalInput>& inputs) {
  if (images != nullptr) return images->Check(inputs);
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].embeddings == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "mm_inputs[", i, "] has no embeddings and this worker cannot encode images (its "
          "model has no vision tower)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace sluice
