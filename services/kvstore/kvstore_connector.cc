#include "services/kvstore/kvstore_connector.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "services/serve/log.h"

namespace sluice::kvstore {
namespace {

// The client reports a failed shard as misses plus `error`. Nothing found and an error: the
// store is down or unreachable, which the connector must see (it backs off); a partial answer
// is still worth using.
absl::StatusOr<std::vector<bool>> FoundOrError(std::vector<bool> found,
                                               const absl::Status& error) {
  if (!error.ok() && std::find(found.begin(), found.end(), true) == found.end()) return error;
  return found;
}

std::vector<int32_t> Iota(size_t n) {
  std::vector<int32_t> ids(n);
  std::iota(ids.begin(), ids.end(), 0);
  return ids;
}

// ClientBackend: a backend over one given client (bytes move as that client moves them).
class ClientBackend final : public KvBlockStoreBackend {
 public:
  explicit ClientBackend(std::unique_ptr<KvStoreClient> client)
      : client_(std::move(client)) {}

  absl::Status Bind(const KvConnectorLayout& layout) override {
    hasher_ = std::make_unique<BlockHasher>(layout.kv_identity, layout.block_size);
    block_bytes_ = layout.block_bytes;
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<bool>> Exists(absl::Span<const BlockHash> hashes,
                                           absl::Time deadline) override {
    absl::StatusOr<KvExistsResult> r = client_->Exists(Keys(hashes), deadline);
    if (!r.ok()) return r.status();
    return FoundOrError(std::move(r->found), r->error);
  }

  absl::StatusOr<std::vector<bool>> Get(absl::Span<const BlockHash> hashes,
                                        absl::Span<uint8_t> out, absl::Time deadline) override {
    absl::StatusOr<KvGetResult> r =
        client_->Get(Keys(hashes), Region(out.data(), hashes.size()), Iota(hashes.size()),
                     deadline);
    if (!r.ok()) return r.status();
    return FoundOrError(std::move(r->found), r->error);
  }

  absl::StatusOr<PutCounts> Put(absl::Span<const BlockHash> hashes,
                                absl::Span<const uint8_t> bytes, absl::Time deadline) override {
    // The client only reads the region on Put.
    absl::StatusOr<KvPutResult> r =
        client_->Put(Keys(hashes), Region(const_cast<uint8_t*>(bytes.data()), hashes.size()),
                     Iota(hashes.size()), deadline);
    if (!r.ok()) return r.status();
    return PutCounts{r->num_stored, r->num_present, r->num_failed, r->error};
  }

 private:
  std::vector<BlockKey> Keys(absl::Span<const BlockHash> hashes) const {
    std::vector<BlockKey> keys;
    keys.reserve(hashes.size());
    for (const BlockHash& h : hashes) keys.push_back(KvStoreKey(*hasher_, h));
    return keys;
  }
  transfer::KvRegion Region(uint8_t* base, size_t n) const {
    return transfer::KvRegion{base, static_cast<int64_t>(n), block_bytes_};
  }

  std::unique_ptr<KvStoreClient> client_;
  std::unique_ptr<BlockHasher> hasher_;
  int64_t block_bytes_ = 0;
};

}  // namespace

std::unique_ptr<KvBlockStoreBackend> NewKvStoreBlockBackend(
    std::unique_ptr<KvStoreClient> client) {
  return std::make_unique<ClientBackend>(std::move(client));
}

absl::StatusOr<std::unique_ptr<KvStoreBlockBackend>> KvStoreBlockBackend::Create(
    KvStoreClientOptions client_options, const KvStoreTransportOptions& transport) {
  std::unique_ptr<KvStoreBlockBackend> backend(new KvStoreBlockBackend());
  client_options.agent = nullptr;
  absl::StatusOr<std::unique_ptr<KvStoreClient>> inline_client =
      CreateKvStoreClient(client_options);
  if (!inline_client.ok()) return inline_client.status();
  backend->inline_client_ = *std::move(inline_client);
  backend->inline_only_ = true;
  if (!transport.ucx) return backend;
  transfer::KvTransferOptions t;
  t.transports = transport.ucx_transports;
  absl::StatusOr<std::unique_ptr<transfer::KvTransferAgent>> agent =
      transfer::KvTransferAgent::Create(t);
  if (!agent.ok()) {
    spdlog::warn("kvstore connector: UCX does not start ({}); block bytes ride gRPC",
                 agent.status().ToString());
    return backend;
  }
  absl::StatusOr<std::unique_ptr<KvStoreBufferPool>> pool =
      KvStoreBufferPool::Create(agent->get(), transport.buffer_bytes);
  if (!pool.ok()) {
    spdlog::warn("kvstore connector: no registered buffer of {} bytes ({}); block bytes ride "
                 "gRPC", transport.buffer_bytes, pool.status().ToString());
    return backend;
  }
  client_options.agent = agent->get();
  absl::StatusOr<std::unique_ptr<KvStoreClient>> rma_client = CreateKvStoreClient(client_options);
  if (!rma_client.ok()) return rma_client.status();
  backend->agent_ = *std::move(agent);
  backend->pool_ = *std::move(pool);
  backend->rma_client_ = *std::move(rma_client);
  backend->inline_only_ = false;
  return backend;
}

KvStoreBlockBackend::~KvStoreBlockBackend() {
  rma_client_.reset();
  inline_client_.reset();
  pool_.reset();
  agent_.reset();
}

absl::Status KvStoreBlockBackend::Bind(const KvConnectorLayout& layout) {
  hasher_ = std::make_unique<BlockHasher>(layout.kv_identity, layout.block_size);
  block_bytes_ = layout.block_bytes;
  return absl::OkStatus();
}

std::vector<BlockKey> KvStoreBlockBackend::Keys(absl::Span<const BlockHash> hashes) const {
  std::vector<BlockKey> keys;
  keys.reserve(hashes.size());
  for (const BlockHash& h : hashes) keys.push_back(KvStoreKey(*hasher_, h));
  return keys;
}

bool KvStoreBlockBackend::Rma(const void* data, size_t bytes) const {
  return !inline_only_.load() && pool_ != nullptr && pool_->Contains(data, bytes);
}

bool KvStoreBlockBackend::FallBack(const absl::Status& error) {
  // The store's PutBegin/GetBegin answer FailedPrecondition when it runs without UCX.
  if (error.code() != absl::StatusCode::kFailedPrecondition) return false;
  if (!inline_only_.exchange(true)) {
    spdlog::warn("kvstore connector: {}; block bytes ride gRPC from now on", error.ToString());
  }
  return true;
}

absl::StatusOr<std::vector<bool>> KvStoreBlockBackend::Exists(absl::Span<const BlockHash> hashes,
                                                              absl::Time deadline) {
  absl::StatusOr<KvExistsResult> r = inline_client_->Exists(Keys(hashes), deadline);
  if (!r.ok()) return r.status();
  return FoundOrError(std::move(r->found), r->error);
}

absl::StatusOr<std::vector<bool>> KvStoreBlockBackend::Get(absl::Span<const BlockHash> hashes,
                                                           absl::Span<uint8_t> out,
                                                           absl::Time deadline) {
  const std::vector<BlockKey> keys = Keys(hashes);
  const std::vector<int32_t> ids = Iota(hashes.size());
  if (Rma(out.data(), out.size())) {
    absl::StatusOr<KvGetResult> r =
        rma_client_->Get(keys, Region(out.data(), hashes.size()), ids, deadline);
    if (!r.ok()) return r.status();
    if (!FallBack(r->error)) {
      std::lock_guard<std::mutex> lock(mu_);
      ++stats_.num_rma_gets;
      stats_.rma_bytes +=
          block_bytes_ * static_cast<int64_t>(std::count(r->found.begin(), r->found.end(), true));
      return FoundOrError(std::move(r->found), r->error);
    }
  }
  absl::StatusOr<KvGetResult> r =
      inline_client_->Get(keys, Region(out.data(), hashes.size()), ids, deadline);
  if (!r.ok()) return r.status();
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.num_inline_gets;
    stats_.inline_bytes +=
        block_bytes_ * static_cast<int64_t>(std::count(r->found.begin(), r->found.end(), true));
  }
  return FoundOrError(std::move(r->found), r->error);
}

absl::StatusOr<KvBlockStoreBackend::PutCounts> KvStoreBlockBackend::Put(
    absl::Span<const BlockHash> hashes, absl::Span<const uint8_t> bytes, absl::Time deadline) {
  const std::vector<BlockKey> keys = Keys(hashes);
  const std::vector<int32_t> ids = Iota(hashes.size());
  // The client only reads the region on Put.
  uint8_t* const base = const_cast<uint8_t*>(bytes.data());
  if (Rma(bytes.data(), bytes.size())) {
    absl::StatusOr<KvPutResult> r =
        rma_client_->Put(keys, Region(base, hashes.size()), ids, deadline);
    if (!r.ok()) return r.status();
    if (!FallBack(r->error)) {
      std::lock_guard<std::mutex> lock(mu_);
      ++stats_.num_rma_puts;
      stats_.rma_bytes += block_bytes_ * r->num_stored;
      return PutCounts{r->num_stored, r->num_present, r->num_failed, r->error};
    }
  }
  absl::StatusOr<KvPutResult> r =
      inline_client_->Put(keys, Region(base, hashes.size()), ids, deadline);
  if (!r.ok()) return r.status();
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.num_inline_puts;
    stats_.inline_bytes += block_bytes_ * r->num_stored;
  }
  return PutCounts{r->num_stored, r->num_present, r->num_failed, r->error};
}

KvBlockBuffer KvStoreBlockBackend::AllocateBuffer(size_t bytes) {
  if (pool_ == nullptr || inline_only_.load()) return KvBlockBuffer(bytes);
  return pool_->Allocate(bytes);
}

KvBlockStoreBackend::TransferBytes KvStoreBlockBackend::transfer_bytes() const {
  // Not the agent's counters: reading them waits for a transfer in flight, and the engine
  // thread asks for these.
  std::lock_guard<std::mutex> lock(mu_);
  return TransferBytes{stats_.rma_bytes, stats_.inline_bytes};
}

KvStoreBackendStats KvStoreBlockBackend::stats() const {
  KvStoreBackendStats out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    out = stats_;
  }
  out.inline_only = inline_only_.load();
  if (pool_ != nullptr) out.pool = pool_->stats();
  if (agent_ != nullptr) out.transfer = agent_->stats();
  return out;
}

absl::StatusOr<std::shared_ptr<KvConnector>> CreateKvStoreConnector(
    const std::vector<std::string>& shards, const AsyncKvConnectorOptions& options,
    std::shared_ptr<grpc::ChannelCredentials> credentials,
    const KvStoreTransportOptions& transport) {
  KvStoreClientOptions client_options;
  client_options.shards = shards;
  client_options.credentials = std::move(credentials);
  client_options.rpc_timeout = options.load_timeout;
  absl::StatusOr<std::unique_ptr<KvStoreBlockBackend>> backend =
      KvStoreBlockBackend::Create(client_options, transport);
  if (!backend.ok()) return backend.status();
  return std::shared_ptr<KvConnector>(
      std::make_shared<AsyncKvConnector>(*std::move(backend), options));
}

absl::StatusOr<std::vector<std::string>> ParseKvStoreShards(const std::string& list) {
  std::vector<std::string> shards;
  for (absl::string_view part : absl::StrSplit(list, ',', absl::SkipWhitespace())) {
    part = absl::StripAsciiWhitespace(part);
    const size_t colon = part.rfind(':');
    if (colon == absl::string_view::npos || colon == 0 || colon + 1 == part.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("kvstore shard '", part, "' is not host:port"));
    }
    shards.emplace_back(part);
  }
  if (shards.empty()) return absl::InvalidArgumentError("no kvstore shard given");
  return shards;
}

}  // namespace sluice::kvstore
