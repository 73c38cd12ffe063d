#include "services/kvstore/kvstore_service.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "proto/grpc_status.h"

namespace sluice::kvstore {
namespace {

template <typename Blocks>
absl::StatusOr<std::vector<BlockKey>> Keys(const Blocks& blocks) {
  if (blocks.size() > KvStoreService::kMaxBlocksPerCall) {
    return absl::InvalidArgumentError(absl::StrCat(blocks.size(), " blocks in one call (max ",
                                                   KvStoreService::kMaxBlocksPerCall, ")"));
  }
  std::vector<BlockKey> keys;
  keys.reserve(blocks.size());
  for (const v1::BlockId& b : blocks) keys.push_back(ToKey(b));
  return keys;
}

v1::KvPutOutcome ToProto(PutOutcome o) { return static_cast<v1::KvPutOutcome>(o); }

absl::Duration Lease(int64_t ms) { return absl::Milliseconds(ms); }  // <= 0: the store's max

// The grant id a lease's token is issued for (lease ids are unique within the process).
std::string LeaseGrant(uint64_t lease_id) { return absl::StrCat("kvstore lease ", lease_id); }

// FinishGrant: the end of PutBegin/GetBegin: on a failure to describe the slots, give the lease
// back at once (the client will not use it); else report how long the lease lasts.
template <typename Resp>
grpc::Status FinishGrant(BlockStore& store, const absl::Status& status, uint64_t lease_id,
                         absl::Time expiry, Resp* resp) {
  if (!status.ok()) {
    if (lease_id != 0) (void)store.Release(lease_id);
    return ToGrpc(status);
  }
  if (lease_id != 0) resp->set_lease_ms(absl::ToInt64Milliseconds(expiry - absl::Now()));
  return grpc::Status::OK;
}

}  // namespace

BlockKey ToKey(const v1::BlockId& id) { return BlockKey{id.layout_id(), id.hash_hi(), id.hash_lo()}; }

void ToBlockId(const BlockKey& key, v1::BlockId* id) {
  id->set_layout_id(key.layout_id);
  id->set_hash_hi(key.hash_hi);
  id->set_hash_lo(key.hash_lo);
}

KvStoreService::KvStoreService(BlockStore* store, transfer::KvTransferAgent* agent)
    : store_(store), agent_(agent) {}

std::string KvStoreService::LeaseToken(uint64_t lease_id) const {
  return tokens_.Issue(LeaseGrant(lease_id));
}

absl::StatusOr<std::string> KvStoreService::PageDescriptor(int32_t p) {
  const DramTier::Page page = store_->page(p);
  absl::MutexLock lock(&mu_);
  auto it = descriptors_.find(p);
  if (it != descriptors_.end() && it->second.first == page.block_bytes) return it->second.second;
  const transfer::KvRegion region{page.base, page.num_slots, page.block_bytes};
  absl::StatusOr<transfer::RemoteKvDescriptor> d = agent_->Describe({&region, 1});
  if (!d.ok()) return d.status();
  std::string bytes = d->Serialize();
  descriptors_[p] = {page.block_bytes, bytes};
  return bytes;
}

absl::Status KvStoreService::AddSlot(SlotId id,
                                     google::protobuf::RepeatedPtrField<v1::KvPageSlot>* slots,
                                     google::protobuf::RepeatedPtrField<v1::KvPage>* pages,
                                     absl::flat_hash_map<int32_t, int32_t>& page_index) {
  auto [it, inserted] = page_index.try_emplace(id.page, pages->size());
  if (inserted) {
    absl::StatusOr<std::string> d = PageDescriptor(id.page);
    if (!d.ok()) return d.status();
    pages->Add()->set_kv_descriptor(std::move(*d));
  }
  v1::KvPageSlot* s = slots->Add();
  s->set_page(it->second);
  s->set_slot(id.index);
  return absl::OkStatus();
}

grpc::Status KvStoreService::Exists(grpc::ServerContext*, const v1::KvExistsRequest* req,
                                    v1::KvExistsResponse* resp) {
  absl::StatusOr<std::vector<BlockKey>> keys = Keys(req->blocks());
  if (!keys.ok()) return ToGrpc(keys.status());
  for (Tier t : store_->Exists(*keys)) resp->add_tiers(static_cast<v1::BlockTier>(t));
  return grpc::Status::OK;
}

grpc::Status KvStoreService::PutBegin(grpc::ServerContext*, const v1::KvPutBeginRequest* req,
                                      v1::KvPutBeginResponse* resp) {
  if (draining_.load()) return ToGrpc(absl::UnavailableError("kvstore is draining"));
  if (agent_ == nullptr) {
    return ToGrpc(absl::FailedPreconditionError("this kvstore runs without UCX; use PutInline"));
  }
  absl::StatusOr<std::vector<BlockKey>> keys = Keys(req->blocks());
  if (!keys.ok()) return ToGrpc(keys.status());
  absl::StatusOr<PutGrant> grant =
      store_->BeginPut(*keys, req->block_bytes(), Lease(req->lease_ms()));
  if (!grant.ok()) return ToGrpc(grant.status());
  resp->set_lease_id(grant->lease_id);
  if (grant->lease_id != 0) resp->set_lease_token(LeaseToken(grant->lease_id));
  absl::flat_hash_map<int32_t, int32_t> page_index;
  absl::Status status;
  for (size_t i = 0; i < keys->size() && status.ok(); ++i) {
    resp->add_outcomes(ToProto(grant->outcomes[i]));
    if (grant->outcomes[i] == PutOutcome::kStored) {
      status = AddSlot(grant->slots[i], resp->mutable_slots(), resp->mutable_pages(), page_index);
    } else {
      resp->add_slots();
    }
  }
  return FinishGrant(*store_, status, grant->lease_id, grant->expiry, resp);
}

grpc::Status KvStoreService::PutCommit(grpc::ServerContext*, const v1::KvPutCommitRequest* req,
                                       v1::KvPutCommitResponse* resp) {
  // Only the holder of the lease commits it: a forged commit could store bytes under keys
  // the lease's writer chose, or end its lease.
  if (absl::Status token = tokens_.Check(LeaseGrant(req->lease_id()), req->lease_token(),
                                         absl::StrCat("PutCommit of lease ", req->lease_id()));
      !token.ok()) {
    return ToGrpc(token);
  }
  const std::vector<uint64_t> checksums(req->checksums().begin(), req->checksums().end());
  absl::StatusOr<std::vector<PutOutcome>> out = store_->CommitPut(req->lease_id(), checksums);
  if (!out.ok()) return ToGrpc(out.status());
  for (PutOutcome o : *out) resp->add_outcomes(ToProto(o));
  return grpc::Status::OK;
}

grpc::Status KvStoreService::GetBegin(grpc::ServerContext*, const v1::KvGetBeginRequest* req,
                                      v1::KvGetBeginResponse* resp) {
  if (draining_.load()) return ToGrpc(absl::UnavailableError("kvstore is draining"));
  if (agent_ == nullptr) {
    return ToGrpc(absl::FailedPreconditionError("this kvstore runs without UCX; use GetInline"));
  }
  absl::StatusOr<std::vector<BlockKey>> keys = Keys(req->blocks());
  if (!keys.ok()) return ToGrpc(keys.status());
  absl::StatusOr<GetGrant> grant = store_->BeginGet(*keys, Lease(req->lease_ms()));
  if (!grant.ok()) return ToGrpc(grant.status());
  resp->set_lease_id(grant->lease_id);
  if (grant->lease_id != 0) resp->set_lease_token(LeaseToken(grant->lease_id));
  absl::flat_hash_map<int32_t, int32_t> page_index;
  absl::Status status;
  for (size_t i = 0; i < keys->size() && status.ok(); ++i) {
    const std::optional<SlotRef>& b = grant->blocks[i];
    resp->add_found(b.has_value());
    resp->add_busy(grant->busy[i]);
    resp->add_checksums(b ? b->checksum : 0);
    resp->add_block_bytes(b ? store_->page(b->slot.page).block_bytes : 0);
    if (b) {
      status = AddSlot(b->slot, resp->mutable_slots(), resp->mutable_pages(), page_index);
    } else {
      resp->add_slots();
    }
  }
  return FinishGrant(*store_, status, grant->lease_id, grant->expiry, resp);
}

grpc::Status KvStoreService::Release(grpc::ServerContext*, const v1::KvReleaseRequest* req,
                                     v1::KvReleaseResponse*) {
  // A forged release would free slots another client is still reading or writing.
  if (absl::Status token = tokens_.Check(LeaseGrant(req->lease_id()), req->lease_token(),
                                         absl::StrCat("Release of lease ", req->lease_id()));
      !token.ok()) {
    return ToGrpc(token);
  }
  return ToGrpc(store_->Release(req->lease_id()));
}

grpc::Status KvStoreService::PutInline(grpc::ServerContext*, const v1::KvPutInlineRequest* req,
                                       v1::KvPutInlineResponse* resp) {
  if (draining_.load()) return ToGrpc(absl::UnavailableError("kvstore is draining"));
  absl::StatusOr<std::vector<BlockKey>> keys = Keys(req->blocks());
  if (!keys.ok()) return ToGrpc(keys.status());
  std::vector<std::string_view> payloads(req->payloads().begin(), req->payloads().end());
  absl::StatusOr<std::vector<PutOutcome>> out = store_->Put(*keys, payloads);
  if (!out.ok()) return ToGrpc(out.status());
  for (PutOutcome o : *out) resp->add_outcomes(ToProto(o));
  return grpc::Status::OK;
}

grpc::Status KvStoreService::GetInline(grpc::ServerContext*, const v1::KvGetInlineRequest* req,
                                       v1::KvGetInlineResponse* resp) {
  if (draining_.load()) return ToGrpc(absl::UnavailableError("kvstore is draining"));
  absl::StatusOr<std::vector<BlockKey>> keys = Keys(req->blocks());
  if (!keys.ok()) return ToGrpc(keys.status());
  absl::StatusOr<std::vector<std::optional<std::string>>> out = store_->Get(*keys);
  if (!out.ok()) return ToGrpc(out.status());
  for (std::optional<std::string>& p : *out) {
    resp->add_found(p.has_value());
    resp->add_payloads(p ? std::move(*p) : std::string());
  }
  return grpc::Status::OK;
}

grpc::Status KvStoreService::Stats(grpc::ServerContext*, const v1::KvStatsRequest*,
                                   v1::KvStatsResponse* resp) {
  const BlockStoreStats s = store_->stats();
  resp->set_dram_blocks(s.dram_blocks);
  resp->set_dram_bytes(s.dram_bytes);
  resp->set_dram_capacity_bytes(s.dram_capacity_bytes);
  resp->set_ssd_blocks(s.ssd_blocks);
  resp->set_ssd_bytes(s.ssd_bytes);
  resp->set_ssd_capacity_bytes(s.ssd_capacity_bytes);
  resp->set_hits_dram(s.hits_dram);
  resp->set_hits_ssd(s.hits_ssd);
  resp->set_misses(s.misses);
  resp->set_evictions_dram(s.evictions_dram);
  resp->set_evictions_ssd(s.evictions_ssd);
  resp->set_expired(s.expired);
  resp->set_corrupt_blocks(s.corrupt_blocks);
  resp->set_blocks_stored(s.blocks_stored);
  resp->set_put_checksum_mismatches(s.put_checksum_mismatches);
  resp->set_active_leases(s.active_leases);
  return grpc::Status::OK;
}

grpc::Status KvStoreService::Health(grpc::ServerContext*, const v1::KvHealthRequest*,
                                    v1::KvHealthResponse* resp) {
  resp->set_serving(!draining_.load());
  if (agent_ != nullptr) resp->set_ucx_worker_address(agent_->worker_address());
  return grpc::Status::OK;
}

}  // namespace sluice::kvstore
