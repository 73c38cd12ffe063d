// EmbeddingFetcher: a prefill / decode worker's side of the staged embedding hand-off (issue 26).
// An encoder worker answers large embeddings as an EmbeddingRef (encoder.proto): they wait in
// its UCX-registered staging arena. The worker reads them by one-sided RMA into a buffer of its
// own registered pool (KvStoreBufferPool, as the kvstore connector's), checks their XXH3, and
// acks with ReleaseEmbeddings, which frees the encoder's slot; only an ack that finds the lease
// still held makes the bytes usable (a lease that ended may have had its slot reused). When the
// RMA path is unavailable (no UCX agent, the pool full, a transfer error, a checksum mismatch)
// it asks for the bytes inline instead (ReleaseEmbeddings with return_values). Either way the
// caller (WorkerImages) falls back to encoding the image itself if this fails.
//
// Thread safety: Fetch may be called from several threads at once.
#ifndef SLUICE_SERVICES_COMMON_EMBEDDING_FETCH_H_
#define SLUICE_SERVICES_COMMON_EMBEDDING_FETCH_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "services/kvstore/kvstore_buffer_pool.h"
#include "sluice/v1/encoder.grpc.pb.h"
#include "transfer/kv_transfer.h"

namespace sluice {

struct EmbeddingFetchOptions {
  // The worker's UCX agent (borrowed; outlives the fetcher). Null: every fetch inline.
  transfer::KvTransferAgent* agent = nullptr;
  int64_t buffer_bytes = int64_t{32} << 20;  // registered landing buffers (full: inline)
  std::shared_ptr<grpc::ChannelCredentials> credentials;  // null: insecure
  absl::Duration timeout = absl::Seconds(10);  // each RMA read and each gRPC call
};

struct EmbeddingFetchStats {
  int64_t rma_bytes = 0;     // embedding bytes read from encoders by RMA
  int64_t inline_bytes = 0;  // embedding bytes received inline (fallback fetches)
  int64_t num_rma_failures = 0;  // RMA reads that failed or read bad bytes (then inline)
  int64_t num_failures = 0;      // fetches that failed both ways
};

class EmbeddingFetcher {
 public:
  // Create: with an agent, registers options.buffer_bytes with it. Errors: the pool's.
  static absl::StatusOr<std::unique_ptr<EmbeddingFetcher>> Create(
      const EmbeddingFetchOptions& options);

  // Fetch: the `expected_floats` floats of `ref`, read by RMA (or inline) and released at the
  // encoder. Errors: InvalidArgument for a ref whose size is not expected_floats * 4, or with no
  // encoder address; the inline call's status when both paths failed (NotFound: the lease
  // ended; Unavailable: the encoder is gone); DataLoss for bytes that fail the checksum.
  absl::StatusOr<std::shared_ptr<const std::vector<float>>> Fetch(const v1::EmbeddingRef& ref,
                                                                  int64_t expected_floats);

  // Release: ends `ref`'s lease unread (the embeddings were found elsewhere), so the encoder
  // frees its slot now rather than at the lease's end. Errors are only logged.
  void Release(const v1::EmbeddingRef& ref);

  EmbeddingFetchStats stats() const;

 private:
  explicit EmbeddingFetcher(const EmbeddingFetchOptions& options) : options_(options) {}
  // The RMA path: read, verify, ack. Errors mean "try inline".
  absl::Status FetchByRma(const v1::EmbeddingRef& ref, std::vector<float>* out);
  // The inline path: ReleaseEmbeddings with return_values.
  absl::Status FetchInline(const v1::EmbeddingRef& ref, std::vector<float>* out);
  v1::Encoder::Stub* Stub(const std::string& address);

  const EmbeddingFetchOptions options_;
  std::unique_ptr<kvstore::KvStoreBufferPool> pool_;
  std::mutex mu_;
  std::map<std::string, std::unique_ptr<v1::Encoder::Stub>> stubs_;  // guarded by mu_
  std::atomic<int64_t> rma_bytes_{0};
  std::atomic<int64_t> inline_bytes_{0};
  std::atomic<int64_t> num_rma_failures_{0};
  std::atomic<int64_t> num_failures_{0};
};

}  // namespace sluice

#endif  // SLUICE_SERVICES_COMMON_EMBEDDING_FETCH_H_
