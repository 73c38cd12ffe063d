// KvEventPublisher: serves a worker engine's KV event log (engine/kv/kv_events.h) to routers as
// sluice.v1.KvEventSource (proto/sluice/v1/kv_events.proto explains why routers pull). Every
// answer carries the engine's block-hash identity so the router hashes prompts exactly as this
// worker does.
#ifndef SLUICE_SERVICES_COMMON_KV_EVENT_PUBLISHER_H_
#define SLUICE_SERVICES_COMMON_KV_EVENT_PUBLISHER_H_

#include <cstdint>
#include <functional>
#include <string>

#include "engine/kv/kv_events.h"
#include "sluice/v1/kv_events.grpc.pb.h"

namespace sluice {

class AsyncEngine;

// KvEventBatchToWire / KvSnapshotToWire: engine types to messages (identity not set).
void KvEventBatchToWire(const KvEventBatch& in, v1::ReadKvEventsResponse* out);
void KvSnapshotToWire(const KvSnapshot& in, v1::GetKvSnapshotResponse* out);

class KvEventPublisher final : public v1::KvEventSource::CallbackService {
 public:
  using Reader = std::function<KvEventBatch(uint64_t after_seq, size_t max_events)>;
  using Snapshotter = std::function<KvSnapshot()>;

  // `read` / `snapshot` must be thread-safe and must not block on an engine step (AsyncEngine's
  // ReadKvEvents / KvCacheSnapshot are). `kv_identity`, `block_size`: the engine's BlockHasher.
  KvEventPublisher(Reader read, Snapshotter snapshot, std::string kv_identity,
                   int64_t block_size);
  // Serves `engine` (borrowed; must outlive the publisher).
  explicit KvEventPublisher(const AsyncEngine* engine);

  grpc::ServerUnaryReactor* ReadKvEvents(grpc::CallbackServerContext* context,
                                         const v1::ReadKvEventsRequest* request,
                                         v1::ReadKvEventsResponse* response) override;
  grpc::ServerUnaryReactor* GetKvSnapshot(grpc::CallbackServerContext* context,
                                          const v1::GetKvSnapshotRequest* request,
                                          v1::GetKvSnapshotResponse* response) override;

 private:
  static constexpr size_t kDefaultMaxEvents = 1024;
  void SetIdentity(v1::KvCacheIdentity* out) const;

  Reader read_;
  Snapshotter snapshot_;
  std::string kv_identity_;
  int64_t block_size_;
};

}  // namespace sluice

#endif  // SLUICE_SERVICES_COMMON_KV_EVENT_PUBLISHER_H_
