#include "services/kvstore/kvstore_connector.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace sluice::kvstore {
namespace {

class KvStoreBlockBackend final : public KvBlockStoreBackend {
 public:
  explicit KvStoreBlockBackend(std::unique_ptr<KvStoreClient> client)
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
        client_->Get(Keys(hashes), Region(out.data(), hashes.size()), Ids(hashes.size()),
                     deadline);
    if (!r.ok()) return r.status();
    return FoundOrError(std::move(r->found), r->error);
  }

  absl::StatusOr<PutCounts> Put(absl::Span<const BlockHash> hashes,
                                absl::Span<const uint8_t> bytes, absl::Time deadline) override {
    // The client only reads the region on Put.
    absl::StatusOr<KvPutResult> r =
        client_->Put(Keys(hashes), Region(const_cast<uint8_t*>(bytes.data()), hashes.size()),
                     Ids(hashes.size()), deadline);
    if (!r.ok()) return r.status();
    return PutCounts{r->num_stored, r->num_present, r->num_failed, r->error};
  }

 private:
  // The client reports a failed shard as misses plus `error`. Nothing found and an error: the
  // store is down or unreachable, which the connector must see (it backs off); a partial answer
  // is still worth using.
  static absl::StatusOr<std::vector<bool>> FoundOrError(std::vector<bool> found,
                                                        const absl::Status& error) {
    if (!error.ok() && std::find(found.begin(), found.end(), true) == found.end()) return error;
    return found;
  }

  std::vector<BlockKey> Keys(absl::Span<const BlockHash> hashes) const {
    std::vector<BlockKey> keys;
    keys.reserve(hashes.size());
    for (const BlockHash& h : hashes) keys.push_back(KvStoreKey(*hasher_, h));
    return keys;
  }
  transfer::KvRegion Region(uint8_t* base, size_t n) const {
    return transfer::KvRegion{base, static_cast<int64_t>(n), block_bytes_};
  }
  static std::vector<int32_t> Ids(size_t n) {
    std::vector<int32_t> ids(n);
    std::iota(ids.begin(), ids.end(), 0);
    return ids;
  }

  std::unique_ptr<KvStoreClient> client_;
  std::unique_ptr<BlockHasher> hasher_;
  int64_t block_bytes_ = 0;
};

}  // namespace

std::unique_ptr<KvBlockStoreBackend> NewKvStoreBlockBackend(
    std::unique_ptr<KvStoreClient> client) {
  return std::make_unique<KvStoreBlockBackend>(std::move(client));
}

absl::StatusOr<std::shared_ptr<KvConnector>> CreateKvStoreConnector(
    const std::vector<std::string>& shards, const AsyncKvConnectorOptions& options,
    std::shared_ptr<grpc::ChannelCredentials> credentials) {
  KvStoreClientOptions client_options;
  client_options.shards = shards;
  client_options.credentials = std::move(credentials);
  client_options.rpc_timeout = options.load_timeout;
  absl::StatusOr<std::unique_ptr<KvStoreClient>> client = CreateKvStoreClient(client_options);
  if (!client.ok()) return client.status();
  return std::shared_ptr<KvConnector>(
      std::make_shared<AsyncKvConnector>(NewKvStoreBlockBackend(*std::move(client)), options));
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
