// EmbeddingStaging: the encoder's bounded arena of projected embeddings waiting for the worker
// that needs them to RMA-read them (issue 26: embeddings handed to prefill over UCX from
// registered memory). A KvStoreBufferPool (a host arena registered with the encoder's UCX agent)
// lends one slot per staged image; the slot is a lease, the way a prefill worker's pinned KV
// blocks are: its reference (address, remote key, size, checksum) and a grant token ride the
// gRPC answer, and the slot is freed when the reader releases it (ReleaseEmbeddings, after its
// read), when the lease expires (a reader that never came), or when the Encode call that staged
// it is cancelled. Readers check after the read: a release that finds the lease gone means the
// slot may have been reused, and the bytes read are discarded.
//
// Thread safety: every method may be called from any thread.
#ifndef SLUICE_SERVICES_ENCODER_EMBEDDING_STAGING_H_
#define SLUICE_SERVICES_ENCODER_EMBEDDING_STAGING_H_

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "engine/kv/kv_block_buffer.h"
#include "services/common/grant_tokens.h"
#include "services/kvstore/kvstore_buffer_pool.h"
#include "sluice/v1/encoder.pb.h"
#include "transfer/kv_transfer.h"

namespace sluice {

struct EmbeddingStagingOptions {
  int64_t arena_bytes = int64_t{256} << 20;  // registered staging memory
  absl::Duration lease = absl::Seconds(30);  // a slot nobody released is freed after this
};

struct EmbeddingStagingStats {
  int64_t arena_bytes = 0;
  int64_t staged_bytes = 0;       // held now
  int64_t num_staged_leases = 0;  // held now
  int64_t bytes_staged_total = 0;
  int64_t num_released = 0;   // leases ended by the reader's release
  int64_t num_expired = 0;    // leases ended by expiry
  int64_t num_cancelled = 0;  // leases ended by their Encode call's cancellation
  int64_t num_full = 0;       // Stage calls refused: the arena had no room (answered inline)
};

class EmbeddingStaging {
 public:
  // Create: an arena of options.arena_bytes registered with `agent` (borrowed; outlives this).
  // Errors: KvStoreBufferPool::Create's.
  static absl::StatusOr<std::unique_ptr<EmbeddingStaging>> Create(
      transfer::KvTransferAgent* agent, const EmbeddingStagingOptions& options);

  // Stage copies `bytes` into a slot and answers its reference (everything but
  // encoder_address). ResourceExhausted when the arena has no room (the caller answers inline).
  // Expired leases are swept first.
  absl::StatusOr<v1::EmbeddingRef> Stage(absl::Span<const uint8_t> bytes, absl::Time now);

  // Release ends lease `lease_id` and frees its slot; with `return_values`, answers its bytes
  // (else an empty string). Errors: PermissionDenied for a token that is not the lease's
  // (nothing freed); NotFound for a lease that ended already.
  absl::StatusOr<std::string> Release(uint64_t lease_id, absl::string_view token,
                                      bool return_values, absl::Time now);

  // Cancel ends `lease_id` without a token (its Encode call was cancelled: nobody has the ref).
  void Cancel(uint64_t lease_id);

  // Sweep frees every lease whose expiry is at or before `now`; returns how many.
  int64_t Sweep(absl::Time now);

  EmbeddingStagingStats stats() const;
  const transfer::KvTransferAgent& agent() const { return *agent_; }

 private:
  struct Lease {
    KvBlockBuffer slot;
    absl::Time expiry;
  };
  EmbeddingStaging(transfer::KvTransferAgent* agent,
                   std::unique_ptr<kvstore::KvStoreBufferPool> pool,
                   const EmbeddingStagingOptions& options);
  int64_t SweepLocked(absl::Time now);

  transfer::KvTransferAgent* const agent_;
  std::unique_ptr<kvstore::KvStoreBufferPool> pool_;
  const EmbeddingStagingOptions options_;
  const GrantTokens tokens_;
  mutable std::mutex mu_;
  uint64_t next_lease_id_ = 1;        // guarded by mu_
  std::map<uint64_t, Lease> leases_;  // guarded by mu_
  EmbeddingStagingStats stats_;       // guarded by mu_
};

}  // namespace sluice

#endif  // SLUICE_SERVICES_ENCODER_EMBEDDING_STAGING_H_
