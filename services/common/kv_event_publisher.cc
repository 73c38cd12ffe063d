#include "services/common/kv_event_publisher.h"

#include <algorithm>
#include <utility>

#include "engine/sched/async_engine.h"

namespace sluice {
namespace {

void HashToWire(const BlockHash& in, v1::KvBlockHash* out) {
  out->set_lo(in.lo);
  out->set_hi(in.hi);
}

v1::KvEventType TypeToWire(KvEventType type) {
  switch (type) {
    case KvEventType::kStored:
      return v1::KV_EVENT_TYPE_STORED;
    case KvEventType::kRemoved:
      return v1::KV_EVENT_TYPE_REMOVED;
    case KvEventType::kAllCleared:
      return v1::KV_EVENT_TYPE_ALL_CLEARED;
  }
  return v1::KV_EVENT_TYPE_UNSPECIFIED;
}

}  // namespace

void KvEventBatchToWire(const KvEventBatch& in, v1::ReadKvEventsResponse* out) {
  out->set_log_id(in.log_id);
  out->set_fell_behind(in.fell_behind);
  out->set_last_seq(in.last_seq);
  for (const KvEvent& event : in.events) {
    v1::KvEventProto* e = out->add_events();
    e->set_seq(event.seq);
    e->set_type(TypeToWire(event.type));
    for (const BlockHash& hash : event.block_hashes) HashToWire(hash, e->add_block_hashes());
    if (event.parent_hash) HashToWire(*event.parent_hash, e->mutable_parent_hash());
  }
}

void KvSnapshotToWire(const KvSnapshot& in, v1::GetKvSnapshotResponse* out) {
  out->set_log_id(in.log_id);
  out->set_seq(in.seq);
  for (const BlockHash& hash : in.block_hashes) HashToWire(hash, out->add_block_hashes());
}

KvEventPublisher::KvEventPublisher(Reader read, Snapshotter snapshot, std::string kv_identity,
                                   int64_t block_size)
    : read_(std::move(read)),
      snapshot_(std::move(snapshot)),
      kv_identity_(std::move(kv_identity)),
      block_size_(block_size) {}

KvEventPublisher::KvEventPublisher(const AsyncEngine* engine)
    : KvEventPublisher(
          [engine](uint64_t after_seq, size_t max_events) {
            return engine->ReadKvEvents(after_seq, max_events);
          },
          [engine] { return engine->KvCacheSnapshot(); }, engine->kv_identity(),
          engine->block_size()) {}

void KvEventPublisher::SetIdentity(v1::KvCacheIdentity* out) const {
  out->set_kv_identity(kv_identity_);
  out->set_block_size(block_size_);
}

grpc::ServerUnaryReactor* KvEventPublisher::ReadKvEvents(grpc::CallbackServerContext* context,
                                                         const v1::ReadKvEventsRequest* request,
                                                         v1::ReadKvEventsResponse* response) {
  // Bounded both ways: a reader cannot ask for an unbounded answer.
  const size_t max_events =
      request->max_events() == 0
          ? kDefaultMaxEvents
          : std::min<size_t>(request->max_events(), 16 * kDefaultMaxEvents);
  KvEventBatchToWire(read_(request->after_seq(), max_events), response);
  SetIdentity(response->mutable_identity());
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* KvEventPublisher::GetKvSnapshot(grpc::CallbackServerContext* context,
                                                          const v1::GetKvSnapshotRequest*,
                                                          v1::GetKvSnapshotResponse* response) {
  KvSnapshotToWire(snapshot_(), response);
  SetIdentity(response->mutable_identity());
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace sluice
