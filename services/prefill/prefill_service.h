// PrefillService: the PrefillWorker gRPC service (proto/sluice/v1/worker.proto) around an
// AsyncEngine in prefill mode: Prefill runs the prompt with hold_kv_blocks, answers the first
// token and the pinned blocks' descriptor; Release frees them. Callback (reactor) API: no thread
// is held per request; the engine thread finishes each call.
#ifndef SLUICE_SERVICES_PREFILL_PREFILL_SERVICE_H_
#define SLUICE_SERVICES_PREFILL_PREFILL_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <string>
#include <utility>

#include "engine/sched/async_engine.h"
#include "sluice/v1/worker.grpc.pb.h"

namespace sluice {

class PrefillService final : public v1::PrefillWorker::CallbackService {
 public:
  // `engine` must outlive the service. `kv_descriptor`: RemoteKvDescriptor::Serialize() of the
  // engine's registered KV regions. `advertised_address`: host:port decode workers call Release on.
  PrefillService(AsyncEngine* engine, std::string kv_descriptor, std::string advertised_address);

  grpc::ServerUnaryReactor* Prefill(grpc::CallbackServerContext* context,
                                    const v1::PrefillRequest* request,
                                    v1::PrefillResponse* response) override;
  grpc::ServerUnaryReactor* Release(grpc::CallbackServerContext* context,
                                    const v1::ReleaseRequest* request,
                                    v1::ReleaseResponse* response) override;

  // Prompt tokens admitted and not yet answered (for heartbeats).
  int64_t num_queued_prefill_tokens() const { return queued_tokens_.load(); }
  void set_draining(bool draining) { draining_.store(draining); }
  // set_advertised_address: call before the first Prefill (once the port is bound).
  void set_advertised_address(std::string address) { advertised_address_ = std::move(address); }

 private:
  AsyncEngine* engine_;
  std::string kv_descriptor_;
  std::string advertised_address_;
  std::atomic<int64_t> queued_tokens_{0};
  std::atomic<bool> draining_{false};
};

}  // namespace sluice

#endif  // SLUICE_SERVICES_PREFILL_PREFILL_SERVICE_H_
