// KvStoreConnector: the engine's KV connector (engine/kv/kv_connector.h) over the kvstore
// (KvStoreClient, any number of shards): at admission the engine loads the prompt's blocks the
// store holds past its local prefix hit, and writes its new full blocks through, off the
// request's critical path. Keys are KvStoreKey(BlockHasher(engine identity), block hash), so every
// worker serving the same model and KV layout shares blocks and no other layout ever does.
//
// Data path (this slice): the client's inline gRPC calls carry the serialized blocks (no UCX
// agent); a pinned bounce buffer registered with the worker's UCX agent is the next step
// (services/kvstore/README.md, "Engine integration").
#ifndef SLUICE_SERVICES_KVSTORE_KVSTORE_CONNECTOR_H_
#define SLUICE_SERVICES_KVSTORE_KVSTORE_CONNECTOR_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/kv/kv_connector.h"
#include "services/kvstore/kvstore_client.h"

namespace sluice::kvstore {

// KvStoreBlockBackend: KvBlockStoreBackend over a KvStoreClient (owned).
std::unique_ptr<KvBlockStoreBackend> NewKvStoreBlockBackend(std::unique_ptr<KvStoreClient> client);

// CreateKvStoreConnector: an AsyncKvConnector over a client to `shards` ("host:port", the
// rendezvous identities; see KvStoreClientOptions). Errors: those of CreateKvStoreClient.
// `credentials`: those of the channels to the shards (mTLS); nullptr: plaintext.
absl::StatusOr<std::shared_ptr<KvConnector>> CreateKvStoreConnector(
    const std::vector<std::string>& shards, const AsyncKvConnectorOptions& options = {},
    std::shared_ptr<grpc::ChannelCredentials> credentials = nullptr);

// ParseKvStoreShards splits "host:port[,host:port...]" (spaces ignored). Errors: InvalidArgument
// for an empty list or an entry without a port.
absl::StatusOr<std::vector<std::string>> ParseKvStoreShards(const std::string& list);

}  // namespace sluice::kvstore

#endif  // SLUICE_SERVICES_KVSTORE_KVSTORE_CONNECTOR_H_
