// KvStoreService: the gRPC face of a BlockStore (proto/sluice/v1/kvstore.proto).
//
// Control rides gRPC; bytes ride UCX: PutBegin/GetBegin answer with the DRAM slots granted and,
// per arena page, a transfer::RemoteKvDescriptor (one region: the page) that the client pushes
// into or pulls from with its KvTransferAgent. The arena must be registered with `agent` (e.g.
// allocated by agent->AllocateRegion). Without an agent only the Inline calls work.
//
// Status codes follow Abseil's retry meaning: InvalidArgument for malformed requests,
// NotFound for an unknown/expired lease, FailedPrecondition for UCX calls on a store without UCX,
// PermissionDenied for a PutCommit or Release without the lease's token (the Begin response's
// lease_token; services/common/grant_tokens.h), which leaves the lease and its slots as they were.
// Thread safety: gRPC calls it from many threads; the BlockStore serializes what must be.
#ifndef SLUICE_SERVICES_KVSTORE_KVSTORE_SERVICE_H_
#define SLUICE_SERVICES_KVSTORE_KVSTORE_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "services/common/grant_tokens.h"
#include "services/kvstore/block_store.h"
#include "sluice/v1/kvstore.grpc.pb.h"
#include "transfer/kv_transfer.h"
#include "proto/grpc_status.h"

namespace sluice::kvstore {

class KvStoreService final : public sluice::v1::KvStore::Service {
 public:
  // Largest number of blocks in one call (larger: InvalidArgument).
  static constexpr int kMaxBlocksPerCall = 65536;

  // `store` and `agent` (may be null) are not owned and must outlive the service.
  KvStoreService(BlockStore* store, transfer::KvTransferAgent* agent);

  grpc::Status Exists(grpc::ServerContext*, const v1::KvExistsRequest*,
                      v1::KvExistsResponse*) override;
  grpc::Status PutBegin(grpc::ServerContext*, const v1::KvPutBeginRequest*,
                        v1::KvPutBeginResponse*) override;
  grpc::Status PutCommit(grpc::ServerContext*, const v1::KvPutCommitRequest*,
                         v1::KvPutCommitResponse*) override;
  grpc::Status GetBegin(grpc::ServerContext*, const v1::KvGetBeginRequest*,
                        v1::KvGetBeginResponse*) override;
  grpc::Status Release(grpc::ServerContext*, const v1::KvReleaseRequest*,
                       v1::KvReleaseResponse*) override;
  grpc::Status PutInline(grpc::ServerContext*, const v1::KvPutInlineRequest*,
                         v1::KvPutInlineResponse*) override;
  grpc::Status GetInline(grpc::ServerContext*, const v1::KvGetInlineRequest*,
                         v1::KvGetInlineResponse*) override;
  grpc::Status Stats(grpc::ServerContext*, const v1::KvStatsRequest*,
                     v1::KvStatsResponse*) override;
  grpc::Status Health(grpc::ServerContext*, const v1::KvHealthRequest*,
                      v1::KvHealthResponse*) override;

  // Drain (SIGTERM): new reads and writes (PutBegin, GetBegin, PutInline, GetInline) fail with
  // UNAVAILABLE — the engines' KV connectors count them as misses and compute instead — and
  // Health reports serving = false; leases already granted still commit and release, so the
  // caller can wait for BlockStore's active_leases to reach 0 before stopping.
  void set_draining(bool draining) { draining_.store(draining); }
  bool draining() const { return draining_.load(); }

  // LeaseToken: the token PutBegin/GetBegin hand out with `lease_id` (for in-process callers
  // of BlockStore's Begin* and tests).
  std::string LeaseToken(uint64_t lease_id) const;

 private:
  // PageDescriptor: the serialized RemoteKvDescriptor of arena page `p` in its current layout.
  absl::StatusOr<std::string> PageDescriptor(int32_t p);
  // AddSlot: appends `id` to `slots`, adding its page's descriptor to `pages` once per response.
  absl::Status AddSlot(SlotId id, google::protobuf::RepeatedPtrField<v1::KvPageSlot>* slots,
                       google::protobuf::RepeatedPtrField<v1::KvPage>* pages,
                       absl::flat_hash_map<int32_t, int32_t>& page_index);

  BlockStore* const store_;
  transfer::KvTransferAgent* const agent_;
  std::atomic<bool> draining_{false};
  const GrantTokens tokens_;  // lease tokens
  absl::Mutex mu_;
  // page -> (block_bytes it was described with, descriptor bytes); pages change geometry only
  // when reassigned to another layout.
  absl::flat_hash_map<int32_t, std::pair<int64_t, std::string>> descriptors_ ABSL_GUARDED_BY(mu_);
};

// ToKey / ToBlockId: proto <-> BlockKey.
BlockKey ToKey(const v1::BlockId& id);
void ToBlockId(const BlockKey& key, v1::BlockId* id);

}  // namespace sluice::kvstore

#endif  // SLUICE_SERVICES_KVSTORE_KVSTORE_SERVICE_H_
