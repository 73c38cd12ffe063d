// KvStoreConnector: the engine's KV connector (engine/kv/kv_connector.h) over the kvstore
// (KvStoreClient, any number of shards): at admission the engine loads the prompt's blocks the
// store holds past its local prefix hit, and writes its new full blocks through, off the
// request's critical path. Keys are KvStoreKey(BlockHasher(engine identity), block hash), so every
// worker serving the same model and KV layout shares blocks and no other layout ever does.
//
// Data path: the connector lends the engine buffers from a host arena registered with its own
// UCX agent (KvStoreBufferPool); the engine gathers blocks into them (a GPU worker: device ->
// pinned staging slots -> buffer, engine/kv/staged_kv_blocks.h) and the client moves them by
// one-sided RMA into the store's DRAM slots (Put) and back (Get): gRPC carries control only and
// the store never sees device memory. The inline gRPC calls carry the bytes only when a buffer
// is not in the arena (it was full: heap memory), when UCX is off or cannot start, and after a
// store answered that it runs without UCX (`sluice kvstore --no-ucx`; sticky).
#ifndef SLUICE_SERVICES_KVSTORE_KVSTORE_CONNECTOR_H_
#define SLUICE_SERVICES_KVSTORE_KVSTORE_CONNECTOR_H_

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/kv/kv_connector.h"
#include "services/kvstore/kvstore_buffer_pool.h"
#include "services/kvstore/kvstore_client.h"

namespace sluice::kvstore {

struct KvStoreTransportOptions {
  // Move block bytes by UCX RMA from a registered buffer pool; false: inline gRPC only.
  bool ucx = true;
  std::string ucx_transports;  // KvTransferOptions::transports ("": UCX_TLS, else UCX's choice)
  // The registered arena lent to the engine: blocks of write-through and loads in flight.
  int64_t buffer_bytes = 64LL << 20;
};

struct KvStoreBackendStats {
  int64_t num_rma_puts = 0, num_rma_gets = 0;        // calls whose bytes moved by UCX
  int64_t num_inline_puts = 0, num_inline_gets = 0;  // calls whose bytes rode gRPC
  int64_t inline_bytes = 0;  // block bytes stored or fetched by those calls
  int64_t rma_bytes = 0;     // block bytes stored or fetched (verified) by the RMA calls
  bool inline_only = false;  // UCX off, failed to start, or a store without UCX answered
  KvStoreBufferPoolStats pool;
  transfer::KvTransferStats transfer;  // of the backend's UCX agent (zero without one)
};

// KvStoreBlockBackend: KvBlockStoreBackend over the kvstore client (see the data path above).
class KvStoreBlockBackend final : public KvBlockStoreBackend {
 public:
  // Create: clients to `client_options.shards` (its `agent` is ignored: the backend makes its
  // own when transport.ucx). UCX or the arena failing to start is logged and leaves the inline
  // path. Errors: those of CreateKvStoreClient.
  static absl::StatusOr<std::unique_ptr<KvStoreBlockBackend>> Create(
      KvStoreClientOptions client_options, const KvStoreTransportOptions& transport);
  ~KvStoreBlockBackend() override;

  absl::Status Bind(const KvConnectorLayout& layout) override;
  absl::StatusOr<std::vector<bool>> Exists(absl::Span<const BlockHash> hashes,
                                           absl::Time deadline) override;
  absl::StatusOr<std::vector<bool>> Get(absl::Span<const BlockHash> hashes,
                                        absl::Span<uint8_t> out, absl::Time deadline) override;
  absl::StatusOr<PutCounts> Put(absl::Span<const BlockHash> hashes,
                                absl::Span<const uint8_t> bytes, absl::Time deadline) override;
  KvBlockBuffer AllocateBuffer(size_t bytes) override;
  // KvStoreBackendStats::rma_bytes and inline_bytes; never waits for a transfer.
  TransferBytes transfer_bytes() const override;

  // stats: also the agent's counters, which wait for a transfer in flight (tests, tools).
  KvStoreBackendStats stats() const;

 private:
  KvStoreBlockBackend() = default;
  // Rma: whether a call on [data, data + bytes) goes by UCX.
  bool Rma(const void* data, size_t bytes) const;
  // FallBack: after a UCX call answered `error`, whether the store runs without UCX (then
  // every later call is inline, and this one is redone inline).
  bool FallBack(const absl::Status& error);
  std::vector<BlockKey> Keys(absl::Span<const BlockHash> hashes) const;
  transfer::KvRegion Region(uint8_t* base, size_t n) const {
    return transfer::KvRegion{base, static_cast<int64_t>(n), block_bytes_};
  }

  // Destroyed in reverse: the clients first, then the arena, then the agent.
  std::unique_ptr<transfer::KvTransferAgent> agent_;
  std::unique_ptr<KvStoreBufferPool> pool_;
  std::unique_ptr<KvStoreClient> rma_client_;     // with agent_ (null without UCX)
  std::unique_ptr<KvStoreClient> inline_client_;
  std::unique_ptr<BlockHasher> hasher_;
  int64_t block_bytes_ = 0;
  std::atomic<bool> inline_only_{false};
  mutable std::mutex mu_;
  KvStoreBackendStats stats_;  // call counts (under mu_)
};

// NewKvStoreBlockBackend: KvBlockStoreBackend over a KvStoreClient (owned), which moves the
// bytes as that client does.
std::unique_ptr<KvBlockStoreBackend> NewKvStoreBlockBackend(std::unique_ptr<KvStoreClient> client);

// CreateKvStoreConnector: an AsyncKvConnector over a KvStoreBlockBackend to `shards`
// ("host:port", the rendezvous identities; see KvStoreClientOptions). Errors: those of
// CreateKvStoreClient. `credentials`: those of the channels to the shards (mTLS); nullptr:
// plaintext.
absl::StatusOr<std::shared_ptr<KvConnector>> CreateKvStoreConnector(
    const std::vector<std::string>& shards, const AsyncKvConnectorOptions& options = {},
    std::shared_ptr<grpc::ChannelCredentials> credentials = nullptr,
    const KvStoreTransportOptions& transport = {});

// ParseKvStoreShards splits "host:port[,host:port...]" (spaces ignored). Errors: InvalidArgument
// for an empty list or an entry without a port.
absl::StatusOr<std::vector<std::string>> ParseKvStoreShards(const std::string& list);

}  // namespace sluice::kvstore

#endif  // SLUICE_SERVICES_KVSTORE_KVSTORE_CONNECTOR_H_
