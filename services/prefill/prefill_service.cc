#include "services/prefill/prefill_service.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "services/worker_common/worker_wire.h"

namespace sluice {
namespace {

grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

// One Prefill call: finished by the engine thread's final output (or at once on a submit
// error); a client cancel aborts the engine request, which also frees blocks already held.
class PrefillReactor final : public grpc::ServerUnaryReactor {
 public:
  PrefillReactor(AsyncEngine* engine, std::string request_id)
      : engine_(engine), request_id_(std::move(request_id)) {}
  void OnCancel() override { engine_->Abort(request_id_); }
  void OnDone() override { delete this; }

 private:
  AsyncEngine* engine_;
  std::string request_id_;
};

}  // namespace

PrefillService::PrefillService(AsyncEngine* engine, std::string kv_descriptor,
                               std::string advertised_address)
    : engine_(engine),
      kv_descriptor_(std::move(kv_descriptor)),
      advertised_address_(std::move(advertised_address)) {}

grpc::ServerUnaryReactor* PrefillService::Prefill(grpc::CallbackServerContext* context,
                                                  const v1::PrefillRequest* request,
                                                  v1::PrefillResponse* response) {
  auto* reactor = new PrefillReactor(engine_, request->request_id());
  if (draining_.load()) {
    reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "prefill worker is draining"));
    return reactor;
  }
  if (request->has_decode_reservation()) {
    reactor->Finish(grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                                 "push mode is not implemented by this worker; use pull"));
    return reactor;
  }
  EngineRequest er;
  er.request_id = request->request_id();
  er.prompt_token_ids.assign(request->prompt_token_ids().begin(),
                             request->prompt_token_ids().end());
  er.sampling = SamplingFromWire(request->sampling());
  er.hold_kv_blocks = true;
  const int64_t num_prompt = static_cast<int64_t>(er.prompt_token_ids.size());
  queued_tokens_ += num_prompt;
  const v1::KvLayout layout = LayoutOf(engine_->kv_cache());
  absl::Status s = engine_->Submit(
      std::move(er), [this, reactor, response, num_prompt, layout](const RequestOutput& out) {
        if (!out.finished()) return;  // hold mode: the only output is the final one
        queued_tokens_ -= num_prompt;
        if (out.finish_reason == FinishReason::kError) {
          reactor->Finish(ToGrpc(out.status));
          return;
        }
        if (out.finish_reason == FinishReason::kAbort) {
          reactor->Finish(grpc::Status(grpc::StatusCode::CANCELLED, "prefill aborted"));
          return;
        }
        response->set_request_id(out.request_id);
        if (!out.new_tokens.empty()) {
          SampledTokenToWire(out.new_tokens.front(), response->mutable_first_token());
        }
        response->set_num_prompt_tokens(out.num_prompt_tokens);
        response->set_num_cached_tokens(out.num_cached_tokens);
        response->set_finish_reason(FinishReasonToWire(out.finish_reason));
        response->set_prefill_worker_address(advertised_address_);
        if (out.kv_held) {
          v1::KvBlocks* kv = response->mutable_kv();
          kv->set_kv_descriptor(kv_descriptor_);
          RunsToWire(out.held_block_ids, kv);
          *kv->mutable_layout() = layout;
          kv->set_num_tokens(out.num_prompt_tokens);
        }
        reactor->Finish(grpc::Status::OK);
      });
  if (!s.ok()) {
    queued_tokens_ -= num_prompt;
    reactor->Finish(ToGrpc(s));
  }
  return reactor;
}

grpc::ServerUnaryReactor* PrefillService::Release(grpc::CallbackServerContext* context,
                                                  const v1::ReleaseRequest* request,
                                                  v1::ReleaseResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  engine_->ReleaseHeldBlocks(request->request_id(), [reactor, response](absl::Status s) {
    response->set_released(s.ok());
    reactor->Finish(grpc::Status::OK);
  });
  return reactor;
}

}  // namespace sluice
