// WorkerImages: a prefill / decode worker's own vision tower (issue 26's self-encode fallback).
// When no encoder worker could encode a request's images, the router sends them to the workers
// as bytes (MultimodalInput.image); a worker serving a vision-language model encodes them, when
// its engine needs them and on a bounded pool of threads, with the same engine/vision code as
// `sluice encoder` — so the embeddings, and the greedy tokens, equal the encoder pool's —
// through an embedding cache keyed by the image's content hash.
#ifndef SLUICE_SERVICES_COMMON_WORKER_IMAGES_H_
#define SLUICE_SERVICES_COMMON_WORKER_IMAGES_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <google/protobuf/repeated_ptr_field.h>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/sched/image_encoder.h"
#include "engine/sched/request.h"
#include "engine/vision/embedding_cache.h"
#include "engine/vision/image.h"
#include "engine/vision/vision_encoder.h"
#include "services/common/embedding_fetch.h"
#include "services/common/task_pool.h"
#include "sluice/v1/worker.pb.h"

namespace sluice {

struct WorkerImagesOptions {
  int64_t cache_bytes = 0;  // embedding cache, LRU (0: none)
  // Threads encoding images (bounded: never one per request). The engine thread and the gRPC
  // handlers never encode.
  int encode_threads = 2;
  absl::Duration test_encode_delay = absl::ZeroDuration();  // test only: hold each encode
};

// The worker's ImageEncoder (engine/sched/image_encoder.h): the engine asks it for a request's
// embeddings only when it must compute the image's positions — a prefill worker for every new
// prompt, a decode worker only when it prefills or recomputes itself (no prefill worker, a
// failed or expired KV transfer, a preemption, a migrated stream), never for KV it received.
//
// Embeddings an encoder worker staged (MultimodalInput.embedding_ref, sent with the image's
// bytes) are recorded by content hash when the request arrives (NoteWireInputs) and read from
// the encoder (EmbeddingFetcher: RMA, else inline) when the engine asks; a fetch that fails
// falls back to encoding the bytes here, so the request never fails for the hand-off.
class WorkerImages final : public ImageEncoder {
 public:
  // Load returns null for a text-only model folder, else the vision tower + projector of
  // `model_dir`. Errors: those of VisionEncoder::Load.
  static absl::StatusOr<std::shared_ptr<WorkerImages>> Load(const std::string& model_dir,
                                                            const WorkerImagesOptions& options);
  ~WorkerImages() override;

  // Check: what can be told of `inputs` without decoding (cheap; for the gRPC handlers, so a
  // bad request is refused at once): InvalidArgument "mm_inputs[i]: ..." for an input with
  // neither embeddings nor an image, or a placeholder run that is not tokens_per_image long;
  // FailedPrecondition when the content hash is not this worker's hash of the bytes (a router
  // reading another model folder's preprocessor_config.json).
  absl::Status Check(const std::vector<MultimodalInput>& inputs) const;
  // EncodeMissing gives every input without embeddings the embeddings of its image bytes
  // (from the cache, else decoded and encoded) and drops the bytes; on the calling thread.
  // Thread-safe. Errors: Check's, and InvalidArgument for an image that does not decode.
  absl::Status EncodeMissing(std::vector<MultimodalInput>* inputs) const;

  // SetEmbeddingFetcher: how staged embeddings are read (before the worker serves). Replacing
  // or clearing it waits for the fetches still using the old one (an encode thread may be
  // mid-read when the worker shuts down), so the old fetcher is gone on return.
  void SetEmbeddingFetcher(std::unique_ptr<EmbeddingFetcher> fetcher);
  // AddEmbeddingRef records that `ref` holds the embeddings of content `hash` until its lease
  // ends (a ref already recorded is ignored: decode workers get it with Reserve and Decode).
  void AddEmbeddingRef(const BlockHash& hash, const v1::EmbeddingRef& ref) const;
  // CountInlineEmbeddings: `bytes` of embeddings arrived inline in a request (for /metrics).
  void CountInlineEmbeddings(int64_t bytes) const { inline_request_bytes_.fetch_add(bytes); }

  // ImageEncoder: EncodeMissing on one of the encode threads.
  void StartEncode(uint64_t ticket, std::vector<MultimodalInput> inputs) override;
  std::vector<ImageEncodeResult> PollEncodes() override;

  // Cache figures (all zero without a cache).
  vision::EmbeddingCacheStats cache_stats() const;
  int64_t num_encoded() const;
  double encode_seconds() const;  // wall time decoding and encoding those
  int64_t num_encoding() const;  // encodes started and not finished (queued or running)
  // Embedding bytes received: by RMA from encoders' staging arenas, and inline (in requests or
  // fetched inline after a failed RMA read).
  int64_t embedding_rma_bytes() const;
  int64_t embedding_inline_bytes() const;
  int64_t num_embedding_refs() const;  // recorded and not yet used or expired

 private:
  struct PendingRef {
    v1::EmbeddingRef ref;
    absl::Time expiry;
  };
  // TakeEmbeddingRef: an unexpired ref recorded for `hash`, removed (nullopt: none).
  std::optional<v1::EmbeddingRef> TakeEmbeddingRef(const BlockHash& hash) const;
  // Embeddings from a ref (the fetcher), or null when it has none or the fetch failed.
  std::shared_ptr<const std::vector<float>> FetchStaged(const BlockHash& hash) const;
  // A ref of `hash` not needed (the embeddings were cached here): its slot is freed at once.
  void ReleaseStaged(const BlockHash& hash) const;

  explicit WorkerImages(const WorkerImagesOptions& options);
  std::unique_ptr<vision::VisionEncoder> encoder_;
  std::unique_ptr<vision::EmbeddingCache> cache_;
  std::string fingerprint_;
  // The router checked the images against its own limits; these only bound what one image may
  // cost here.
  vision::ImageDecodeLimits limits_;
  absl::Duration test_encode_delay_;
  mutable std::atomic<int64_t> num_encoded_{0};
  mutable std::atomic<int64_t> encode_micros_{0};  // decoding + encoding the num_encoded_
  std::atomic<int64_t> num_encoding_{0};
  std::mutex mu_;
  std::vector<ImageEncodeResult> done_;  // guarded by mu_
  // Set before the worker serves and reset after its servers stop (before the UCX agent
  // its buffers are registered with goes).
  std::shared_ptr<EmbeddingFetcher> Fetcher() const;
  mutable std::mutex fetcher_mu_;
  std::shared_ptr<EmbeddingFetcher> fetcher_;  // guarded by fetcher_mu_; users hold a copy
  mutable std::atomic<int64_t> inline_request_bytes_{0};
  mutable std::mutex refs_mu_;
  // Staged embeddings by content hash, oldest first; guarded by refs_mu_.
  mutable absl::flat_hash_map<BlockHash, std::deque<PendingRef>> refs_;
  // (expiry, hash) of every ref recorded, in recording order (leases of equal length: expiry
  // order): the sweep of expired refs; guarded by refs_mu_.
  mutable std::deque<std::pair<absl::Time, BlockHash>> expiry_order_;
  mutable int64_t num_refs_ = 0;  // guarded by refs_mu_
  std::unique_ptr<TaskPool> pool_;  // joined first (the destructor)
};

// NoteWireInputs: what a prefill / decode handler does with a request's wire mm_inputs besides
// MmInputsFromWire: records their embedding refs and counts their inline embedding bytes
// (no-op for a worker without a vision tower).
void NoteWireInputs(const WorkerImages* images,
                    const google::protobuf::RepeatedPtrField<v1::MultimodalInput>& inputs);

// RenderWorkerImageMetrics: sluice_encoder_cache_{hits,misses,evictions}_total,
// sluice_encoder_cache_bytes (as `sluice encoder` and `sluice serve` name them),
// sluice_worker_images_encoded_total, sluice_worker_image_encode_seconds_total and
// sluice_worker_image_encodes_running, in Prometheus text
// format.
std::string RenderWorkerImageMetrics(const WorkerImages& images);

// CheckImages: images->Check(inputs), or, for a worker without a vision tower (`images` null),
// FailedPrecondition when an input has no embeddings. Inputs that pass are handed to the engine
// as they are: it encodes their images when it needs them (WorkerImages as its ImageEncoder).
absl::Status CheckImages(const WorkerImages* images, const std::vector<MultimodalInput>& inputs);

}  // namespace sluice

#endif  // SLUICE_SERVICES_COMMON_WORKER_IMAGES_H_
