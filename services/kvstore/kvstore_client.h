// KvStoreClient: what a worker uses to look up, fetch and store KV blocks in the kvstore, over
// any number of kvstore shards.
//
// Sharding: each block goes to the shard its key picks by rendezvous hashing (rendezvous.h), so
// every client agrees on the owner from the shard list alone and adding a shard moves ~1/N of the
// blocks. One batch RPC per shard per call; shards are called in parallel.
//
// Data path: blocks live in the caller's memory as one transfer::KvRegion (block b at
// base + b * block_bytes; e.g. a pinned bounce buffer or the KV cache itself), registered with
// the caller's KvTransferAgent. Put: PutBegin (slots granted) -> UCX push into the store's DRAM
// slots -> PutCommit with XXH3-64 checksums of the source blocks (the store refuses bytes that do
// not match). Get: GetBegin (slots leased, SSD blocks promoted) -> UCX pull -> each block checked
// against the store's checksum (a mismatch is a miss) -> Release. Without an agent, the Inline
// RPCs carry the bytes (fallback for small payloads/tests).
//
// A cache never fails a request: a shard that is down, slow (deadline) or answers garbage makes
// its blocks misses (Get/Exists) or not stored (Put); the first such error is reported in the
// result's `error` so callers can count and log it. Errors returned as a failed StatusOr are the
// caller's own: mismatched sizes, a region not registered.
//
// Thread safety: every method may be called concurrently.
#ifndef SLUICE_SERVICES_KVSTORE_KVSTORE_CLIENT_H_
#define SLUICE_SERVICES_KVSTORE_KVSTORE_CLIENT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/security/credentials.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "engine/kv/block_hash.h"
#include "services/kvstore/block_key.h"
#include "transfer/kv_transfer.h"

namespace sluice::kvstore {

// KvStoreKey: the kvstore address of a block the engine hashed with `hasher` (the one block-hash
// scheme, engine/kv/block_hash.h): layout id = hasher.seed(), the XXH3-64 of its model/layout
// identity, so every worker serving the same model with the same KV layout agrees on it, and
// two layouts never share a key.
inline BlockKey KvStoreKey(const BlockHasher& hasher, const BlockHash& hash) {
  return BlockKey{hasher.seed(), hash.hi, hash.lo};
}

struct KvStoreClientOptions {
  // host:port of every kvstore shard. The string is also the shard's rendezvous identity: use
  // stable names (StatefulSet DNS names), in any order.
  std::vector<std::string> shards;
  // The caller's UCX agent (not owned; must outlive the client). Null: inline gRPC transfers.
  transfer::KvTransferAgent* agent = nullptr;
  absl::Duration rpc_timeout = absl::Seconds(2);       // per control RPC
  absl::Duration transfer_timeout = absl::Seconds(5);  // per UCX transfer
  absl::Duration lease = absl::Seconds(30);            // slots leased by the store per call
  // Channel credentials (mTLS with the shards: services/common/peer_tls.h); nullptr: plaintext.
  std::shared_ptr<grpc::ChannelCredentials> credentials;
};

struct KvExistsResult {
  std::vector<bool> found;  // per key
  absl::Status error;       // first shard failure (its keys read as absent)
};

struct KvGetResult {
  std::vector<bool> found;  // per key: its bytes are now in the local block, verified
  int64_t num_corrupt = 0;  // blocks whose pulled bytes failed the checksum (misses)
  absl::Status error;       // first shard or transfer failure (its keys are misses)
};

struct KvPutResult {
  int64_t num_stored = 0;   // written now
  int64_t num_present = 0;  // already stored (nothing sent)
  int64_t num_failed = 0;   // not stored (no space, transfer or checksum failure, shard down)
  absl::Status error;       // first failure
};

class KvStoreClient {
 public:
  virtual ~KvStoreClient() = default;

  // Exists: which keys some shard holds (DRAM or SSD). Everything waits at most until `deadline`.
  virtual absl::StatusOr<KvExistsResult> Exists(absl::Span<const BlockKey> keys,
                                                absl::Time deadline) = 0;
  // Put: stores key i's bytes from local block `block_ids[i]` of `local` (every block is
  // local.block_bytes). Errors: InvalidArgument (sizes differ, ids out of range, duplicate keys).
  virtual absl::StatusOr<KvPutResult> Put(absl::Span<const BlockKey> keys,
                                          const transfer::KvRegion& local,
                                          absl::Span<const int32_t> block_ids,
                                          absl::Time deadline) = 0;
  // Get: fetches every key found into local block `block_ids[i]`; other local blocks are left
  // unspecified (a failed pull may have partly written them). Errors: as Put.
  virtual absl::StatusOr<KvGetResult> Get(absl::Span<const BlockKey> keys,
                                          const transfer::KvRegion& local,
                                          absl::Span<const int32_t> block_ids,
                                          absl::Time deadline) = 0;
};

// CreateKvStoreClient: a client over gRPC channels to `options.shards` (connected lazily).
// Errors: InvalidArgument (no shards, duplicate shard names, non-positive timeouts).
absl::StatusOr<std::unique_ptr<KvStoreClient>> CreateKvStoreClient(
    const KvStoreClientOptions& options);

}  // namespace sluice::kvstore

#endif  // SLUICE_SERVICES_KVSTORE_KVSTORE_CLIENT_H_
