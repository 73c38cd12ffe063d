#include "services/prefill/prefill_service.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "services/common/worker_wire.h"
#include "transfer/block_runs.h"
#include "transfer/block_runs_wire.h"
#include "proto/grpc_status.h"
#include "services/common/misconfigured_peer.h"

namespace sluice {
namespace {

// A push must end this long before the engine's pin timeout may free the blocks it reads.
constexpr absl::Duration kPinMargin = absl::Seconds(1);

// One Prefill call: finished by the engine thread's final output (or at once on a submit
// error); a client cancel aborts the engine request, which also frees blocks already held.
class PrefillReactor final : public grpc::ServerUnaryReactor {
 public:
  PrefillReactor(PrefillService* service, grpc::CallbackServerContext* context,
                 WorkerMetrics* metrics, std::string request_id)
      : service_(service),
        context_(context),
        metrics_(metrics),
        request_id_(std::move(request_id)) {}
  void OnCancel() override { service_->DropRequest(request_id_); }
  void OnDone() override {
    // A call that finished here but was cancelled before its answer reached the caller (the
    // client went away as the response left) leaves pinned blocks nobody will Release or pull:
    // free them now instead of at the pin timeout.
    if (context_->IsCancelled()) service_->DropRequest(request_id_);
    delete this;
  }
  // End finishes the call and counts its outcome.
  void End(const grpc::Status& status) {
    metrics_->CountOutcome(FromGrpc(status));
    Finish(status);
  }

 private:
  PrefillService* service_;
  grpc::CallbackServerContext* context_;
  WorkerMetrics* metrics_;
  std::string request_id_;
};

// LayerPushObserver: feeds the engine's per-layer completion of a request's last prompt chunk
// into its LayerwisePush (engine thread; LayerwisePush never blocks it).
class LayerPushObserver final : public KvLayerObserver {
 public:
  explicit LayerPushObserver(std::shared_ptr<transfer::LayerwisePush> push)
      : push_(std::move(push)) {}
  void OnPromptBlocks(absl::Span<const int32_t> block_ids) override {
    (void)push_->Start(block_ids);  // an error fails the push, and with it the Prefill call
  }
  void OnLayerReady(int32_t layer, std::function<absl::Status()> wait) override {
    push_->LayerReady(layer, std::move(wait));
  }

 private:
  std::shared_ptr<transfer::LayerwisePush> push_;
};

}  // namespace

PrefillService::PrefillService(AsyncEngine* engine, transfer::KvTransferAgent* agent,
                               std::vector<transfer::KvRegion> regions, std::string kv_descriptor,
                               std::string advertised_address, WorkerMetrics* metrics,
                               PrefillServiceOptions options)
    : engine_(engine),
      agent_(agent),
      regions_(std::move(regions)),
      kv_descriptor_(std::move(kv_descriptor)),
      advertised_address_(std::move(advertised_address)),
      metrics_(metrics),
      options_(options),
      pool_(options.push_threads) {
  transfer_region_indices_ = TransferRegionIndices(engine->model(), options.swa_replay_tokens);
}

PrefillService::~PrefillService() = default;

grpc::ServerUnaryReactor* PrefillService::Prefill(grpc::CallbackServerContext* context,
                                                  const v1::PrefillRequest* request,
                                                  v1::PrefillResponse* response) {
  auto* reactor = new PrefillReactor(this, context, metrics_, request->request_id());
  if (draining_.load()) {
    reactor->End(grpc::Status(grpc::StatusCode::UNAVAILABLE, "prefill worker is draining"));
    return reactor;
  }
  std::shared_ptr<transfer::LayerwisePush> layer_push;
  if (request->has_decode_reservation() && request->resumed_output_token_ids_size() > 0) {
    // The layer observer follows a prompt's last chunk; a resumed request's KV moves after it.
    reactor->End(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                              "a resumed request (resumed_output_token_ids) cannot be pushed "
                              "layer by layer: send it without decode_reservation"));
    return reactor;
  }
  if (request->has_decode_reservation()) {
    if (options_.transfer_mode != v1::KV_TRANSFER_MODE_LAYERWISE) {
      reactor->End(ToGrpcWithCause(MisconfiguredPeerError(
          "KV transfer mode mismatch: the router sent a decode reservation for a layer-by-layer "
          "push but this prefill worker does not run --kv-transfer-mode layerwise")));
      return reactor;
    }
    const absl::Time received = absl::Now();
    const absl::Duration ttl = request->decode_reservation_ttl_ms() > 0
                                   ? absl::Milliseconds(request->decode_reservation_ttl_ms())
                                   : options_.default_push_timeout;
    absl::StatusOr<std::shared_ptr<transfer::LayerwisePush>> made =
        MakeLayerwisePush(request->request_id(), request->decode_reservation(), received + ttl);
    if (!made.ok()) {
      reactor->End(ToGrpcWithCause(made.status()));  // a layout mismatch is marked
      return reactor;
    }
    layer_push = *std::move(made);
    std::lock_guard<std::mutex> lock(mu_);
    if (!layer_pushes_.emplace(request->request_id(), layer_push).second) {
      reactor->End(grpc::Status(grpc::StatusCode::ALREADY_EXISTS,
                                "a layerwise push of this request is already running"));
      return reactor;
    }
  }
  if (layer_push != nullptr) {
    // Registered first, so it runs before the answer: afterwards no push reads the blocks.
    const std::string id = request->request_id();
    layer_push->OnDone([this, id](const absl::Status&) {
      std::lock_guard<std::mutex> lock(mu_);
      layer_pushes_.erase(id);
    });
  }
  absl::StatusOr<std::shared_ptr<const grammar::CompiledGrammar>> grammar =
      RequestGrammar(options_.grammars, request->sampling());
  if (!grammar.ok()) {
    if (layer_push != nullptr) layer_push->Cancel(grammar.status());
    reactor->End(ToGrpc(grammar.status()));
    return reactor;
  }
  absl::StatusOr<std::vector<MultimodalInput>> mm_inputs = MmInputsFromWire(request->mm_inputs());
  if (mm_inputs.ok()) {
    // Images sent as bytes (no encoder worker could encode them): the engine has them encoded
    // off this thread when it reaches the request (WorkerImages); checked here.
    if (absl::Status s = CheckImages(options_.images, *mm_inputs); !s.ok()) mm_inputs = s;
  }
  // Embeddings staged on an encoder: read from it when the engine reaches the request.
  if (mm_inputs.ok()) NoteWireInputs(options_.images, request->mm_inputs());
  if (!mm_inputs.ok()) {
    if (layer_push != nullptr) layer_push->Cancel(mm_inputs.status());
    reactor->End(ToGrpc(mm_inputs.status()));
    return reactor;
  }
  EngineRequest er = EngineRequestFromWire(*request, request->request_id(), *std::move(grammar),
                                           *std::move(mm_inputs));
  er.hold_kv_blocks = true;
  if (layer_push != nullptr) er.kv_layer_observer = std::make_shared<LayerPushObserver>(layer_push);
  // The tokens this prefill computes (and pins): the prompt, and a migration's resumed outputs.
  const int64_t num_prompt = static_cast<int64_t>(er.prompt_token_ids.size() +
                                                  er.resumed_output_token_ids.size());
  queued_tokens_ += num_prompt;
  const v1::KvLayout layout = LayoutOf(engine_->kv_cache(), engine_->model().KvDtypeBytes());
  const absl::Time arrival = absl::Now();
  absl::Status s = engine_->Submit(
      std::move(er),
      [this, reactor, response, num_prompt, layout, arrival,
       layer_push](const RequestOutput& out) {
        if (!out.finished()) return;  // hold mode: the only output is the final one
        queued_tokens_ -= num_prompt;
        if (out.finish_reason == FinishReason::kError ||
            out.finish_reason == FinishReason::kAbort) {
          const grpc::Status error =
              out.finish_reason == FinishReason::kError
                  ? ToGrpc(out.status)
                  : grpc::Status(grpc::StatusCode::CANCELLED, "prefill aborted");
          if (layer_push == nullptr) {
            reactor->End(error);
            return;
          }
          // Answer only once no push of this request can still write into the reservation
          // (the router may hand it to another prefill worker).
          layer_push->Cancel(FromGrpc(error));
          layer_push->OnDone([reactor, error](const absl::Status&) { reactor->End(error); });
          return;
        }
        const absl::Time finished = absl::Now();
        const double ttft = absl::ToDoubleSeconds(finished - arrival);
        metrics_->ObserveTimeToFirstToken(ttft);
        FinishedRequest end;
        // Handed to a decode worker: this pod's part ended by length (one token).
        end.finish_reason = out.kv_held ? FinishReason::kLength : out.finish_reason;
        end.num_prompt_tokens = out.num_prompt_tokens;
        end.num_generation_tokens = static_cast<int64_t>(out.new_tokens.size());
        end.e2e_seconds = ttft;
        end.queue_seconds = out.queue_seconds;
        end.prefill_seconds = std::max(0.0, ttft - std::max(0.0, out.queue_seconds));
        metrics_->ObserveFinished(end);
        response->set_request_id(out.request_id);
        if (!out.new_tokens.empty()) {
          SampledTokenToWire(out.new_tokens.front(), response->mutable_first_token());
          for (const PromptLogprob& p : out.prompt_logprobs) {
            PromptLogprobToWire(p, response->add_prompt_logprobs());
          }
        }
        response->set_num_prompt_tokens(out.num_prompt_tokens);
        response->set_num_cached_tokens(out.num_cached_tokens);
        response->set_finish_reason(FinishReasonToWire(out.finish_reason));
        response->set_prefill_worker_address(advertised_address_);
        response->set_prefill_finished_unix_us(absl::ToUnixMicros(finished));
        if (out.queue_seconds >= 0) response->set_queue_seconds(out.queue_seconds);
        response->set_kv_transfer_mode(options_.transfer_mode);
        if (out.kv_held) {
          v1::KvBlocks* kv = response->mutable_kv();
          kv->set_kv_descriptor(kv_descriptor_);
          transfer::RunsToWire(out.held_block_ids, kv);
          *kv->mutable_layout() = layout;
          kv->set_num_tokens(static_cast<int32_t>(num_prompt));
          kv->set_swa_replay_tokens(static_cast<int32_t>(options_.swa_replay_tokens));
          // Both modes: Release answers from this record (pull) and PushKv reads it (push);
          // both must bring the token.
          kv->set_transfer_token(RememberHeld(out.request_id, out.held_block_ids));
        }
        if (layer_push == nullptr) {
          reactor->End(grpc::Status::OK);
          return;
        }
        if (!out.kv_held) {
          // The first token ended the request: the decode worker is not needed.
          layer_push->Cancel(absl::CancelledError("the request finished with its first token"));
          layer_push->OnDone([reactor](const absl::Status&) { reactor->End(grpc::Status::OK); });
          return;
        }
        // The answer waits for the last layers' pushes; the first ones ran during the forward.
        const std::string id = out.request_id;
        layer_push->OnDone([this, reactor, response, id, finished,
                            layer_push](const absl::Status& pushed) {
          metrics_->ObserveTransfer(absl::ToDoubleSeconds(absl::Now() - finished), pushed.ok());
          if (pushed.ok()) {
            response->set_kv_pushed(true);
            reactor->End(grpc::Status::OK);
            return;
          }
          // The reservation holds partial KV: fail the call and free the pinned blocks here;
          // the router cancels the reservation (or retries the prefill into it).
          {
            std::lock_guard<std::mutex> lock(mu_);
            held_.erase(id);
          }
          engine_->ReleaseHeldBlocks(id);
          reactor->End(ToGrpc(pushed));
        });
      });
  if (!s.ok()) {
    queued_tokens_ -= num_prompt;
    if (layer_push != nullptr) layer_push->Cancel(s);
    reactor->End(ToGrpc(s));
  }
  return reactor;
}

absl::StatusOr<PrefillService::Destination> PrefillService::CheckDestination(
    const std::string& request_id, const v1::KvBlocks& destination) const {
  const v1::KvLayout own = LayoutOf(engine_->kv_cache(), engine_->model().KvDtypeBytes());
  if (!SameKvLayout(destination.layout(), own)) {
    return MisconfiguredPeerError(absl::StrCat("KV layout mismatch for request '", request_id,
                                               "': decode ", DescribeKvLayout(destination.layout()),
                                               "; prefill ", DescribeKvLayout(own)));
  }
  // With SWA replay only the full-attention layers' regions (the decode worker checked that it
  // replays the rest).
  absl::StatusOr<TransferRegions> regions =
      ParseTransferRegions(destination.kv_descriptor(), regions_, transfer_region_indices_);
  if (!regions.ok()) return regions.status();
  // The runs come from a peer: checked before anything is expanded or pushed.
  absl::StatusOr<std::vector<transfer::BlockRun>> runs =
      transfer::RunsFromWire(destination, std::numeric_limits<int32_t>::max());
  if (!runs.ok()) return runs.status();
  return Destination{*std::move(regions), *std::move(runs)};
}

absl::StatusOr<std::shared_ptr<transfer::LayerwisePush>> PrefillService::MakeLayerwisePush(
    const std::string& request_id, const v1::KvBlocks& destination, absl::Time deadline) {
  const KvCacheSpec& spec = engine_->kv_cache().spec();
  // With SWA replay the other layers' groups have nothing to move (the decode worker replays
  // them).
  absl::StatusOr<Destination> checked = CheckDestination(request_id, destination);
  if (!checked.ok()) return checked.status();
  // KvRegionsOf's order: per layer its k region, then its v region when there is one.
  const int32_t per_layer = spec.v_floats_per_token > 0 ? 2 : 1;
  std::vector<int32_t> region_layers;
  for (int32_t index : transfer_region_indices_) region_layers.push_back(index / per_layer);
  transfer::LayerwisePush::Options options;
  options.num_layers = static_cast<int32_t>(spec.num_layers);
  options.layers_per_group = std::max(1, options_.layerwise_group_layers);
  // The engine may free the pinned blocks at the pin timeout: every push ends before.
  options.deadline = std::min(deadline, absl::Now() + options_.pin_timeout - kPinMargin);
  const int fail_group = options_.test_fail_layer_group;
  auto groups_posted = std::make_shared<std::atomic<int>>(0);  // pushes run one at a time
  return transfer::LayerwisePush::Create(
      [this, fail_group, groups_posted](const transfer::RemoteKvDescriptor& remote,
                                        absl::Span<const transfer::BlockRun> remote_runs,
                                        absl::Span<const transfer::KvRegion> local,
                                        absl::Span<const transfer::BlockRun> local_runs,
                                        absl::Time d) {
        if (groups_posted->fetch_add(1) == fail_group) {
          return absl::UnavailableError("test: injected failure of this layer group's push");
        }
        return PushRuns(remote, remote_runs, local, local_runs, d);
      },
      [this](std::function<void()> job) { pool_.Post(std::move(job)); },
      std::move(checked->regions.remote), std::move(checked->runs),
      std::move(checked->regions.local),
      std::move(region_layers), options);
}

void PrefillService::DropRequest(const std::string& request_id) {
  std::shared_ptr<transfer::LayerwisePush> layer_push;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = layer_pushes_.find(request_id);
    if (it != layer_pushes_.end()) layer_push = it->second;
  }
  if (layer_push != nullptr) {
    // A push may read the blocks: they are freed only once it ended (its last write then
    // carries intact KV, whoever uses the reservation next).
    layer_push->Cancel(absl::CancelledError("the Prefill call was cancelled"));
    layer_push->OnDone([this, request_id](const absl::Status&) { DropNow(request_id); });
    return;
  }
  DropNow(request_id);
}

void PrefillService::DropNow(const std::string& request_id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = held_.find(request_id);
    if (it != held_.end()) {
      if (it->second.pushing) return;  // the push job frees the blocks when its put ended
      held_.erase(it);
    }
  }
  engine_->Abort(request_id);
}

namespace {

// The grant a pin's token is issued for: the request and the moment of its pin (a retried
// prefill of the same request id pins anew and gets a new token).
std::string PinGrant(const std::string& request_id, absl::Time pinned_at) {
  return absl::StrCat("pin ", request_id, "#", absl::ToUnixNanos(pinned_at));
}

}  // namespace

absl::StatusOr<PrefillService::Held*> PrefillService::HeldFor(const std::string& request_id,
                                                             const std::string& token,
                                                             const char* call) {
  auto it = held_.find(request_id);
  if (it == held_.end()) {
    return absl::NotFoundError(absl::StrCat("no pinned KV for request '", request_id,
                                            "' (released, aborted or its pin timed out)"));
  }
  if (absl::Status s = tokens_.Check(PinGrant(request_id, it->second.pinned_at), token,
                                     absl::StrCat(call, " of request '", request_id, "'"));
      !s.ok()) {
    return s;
  }
  return &it->second;
}

std::string PrefillService::RememberHeld(const std::string& request_id,
                                         std::vector<int32_t> block_ids) {
  const absl::Time now = absl::Now();
  std::lock_guard<std::mutex> lock(mu_);
  // Entries whose pin timed out in the engine (no PushKv or Release came) are dropped here.
  for (auto it = held_.begin(); it != held_.end();) {
    if (!it->second.pushing && now - it->second.pinned_at > options_.pin_timeout) {
      it = held_.erase(it);
    } else {
      ++it;
    }
  }
  held_[request_id] = Held{std::move(block_ids), now};
  return tokens_.Issue(PinGrant(request_id, now));
}

grpc::ServerUnaryReactor* PrefillService::Release(grpc::CallbackServerContext* context,
                                                  const v1::ReleaseRequest* request,
                                                  v1::ReleaseResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  bool answered = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Only the decode worker the KV was handed to may end the pin.
    absl::StatusOr<Held*> held =
        HeldFor(request->request_id(), request->transfer_token(), "Release");
    if (absl::IsNotFound(held.status())) {
      // Nothing of it is pinned (and without the record no token can be checked, so the engine
      // is not asked to release anything).
      response->set_released(false);
      reactor->Finish(grpc::Status::OK);
      return reactor;
    }
    if (!held.ok()) {
      reactor->Finish(ToGrpc(held.status()));
      return reactor;
    }
    if ((*held)->pushing) {
      // No block is freed while a put reads it: the push job releases when it ends.
      response->set_released(true);
      reactor->Finish(grpc::Status::OK);
      return reactor;
    }
    // The pin is still in place while the engine's hold timer cannot have fired: answer now.
    // The engine applies the release only between steps; waiting for it made the ack of a
    // pull that read intact KV miss the decode worker's deadline under load, and the decode
    // worker then recomputed the prompt.
    if (absl::Now() - (*held)->pinned_at < options_.pin_timeout - kPinMargin) {
      response->set_released(true);
      reactor->Finish(grpc::Status::OK);
      answered = true;
    }
    held_.erase(request->request_id());
  }
  if (answered) {
    engine_->ReleaseHeldBlocks(request->request_id(), nullptr);
    return reactor;
  }
  // Near its pin timeout: the engine knows whether the blocks are still pinned.
  engine_->ReleaseHeldBlocks(request->request_id(), [reactor, response](absl::Status s) {
    response->set_released(s.ok());
    reactor->Finish(grpc::Status::OK);
  });
  return reactor;
}

grpc::ServerUnaryReactor* PrefillService::PushKv(grpc::CallbackServerContext* context,
                                                 const v1::PushKvRequest* request,
                                                 v1::PushKvResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  // Layerwise mode pushes through here when the Prefill came without a reservation.
  if (options_.transfer_mode != v1::KV_TRANSFER_MODE_PUSH &&
      options_.transfer_mode != v1::KV_TRANSFER_MODE_LAYERWISE) {
    reactor->Finish(ToGrpcWithCause(MisconfiguredPeerError(
        "KV transfer mode mismatch: this prefill worker runs --kv-transfer-mode pull but a decode "
        "worker asked it to push; start every worker with the same --kv-transfer-mode")));
    return reactor;
  }
  const absl::Duration timeout = request->timeout_ms() > 0
                                     ? absl::Milliseconds(request->timeout_ms())
                                     : options_.default_push_timeout;
  std::vector<int32_t> block_ids;
  absl::Time deadline = absl::Now() + timeout;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // A push sends the pinned KV wherever the destination says: only to the holder of the token.
    absl::StatusOr<Held*> held =
        HeldFor(request->request_id(), request->transfer_token(), "PushKv");
    if (!held.ok()) {
      reactor->Finish(ToGrpc(held.status()));
      return reactor;
    }
    if ((*held)->pushing) {
      reactor->Finish(grpc::Status(grpc::StatusCode::ALREADY_EXISTS,
                                   "a push of this request's KV is already running"));
      return reactor;
    }
    // The engine frees the pinned blocks at pinned_at + pin_timeout: the push ends before.
    deadline = std::min(deadline, (*held)->pinned_at + options_.pin_timeout - kPinMargin);
    (*held)->pushing = true;
    block_ids = (*held)->block_ids;
  }
  const std::string id = request->request_id();
  pool_.Post([this, reactor, request, response, id, block_ids = std::move(block_ids), deadline] {
    int64_t bytes = 0;
    const absl::Time start = absl::Now();
    absl::Status status = RunPush(id, *request, block_ids, deadline, &bytes);
    metrics_->ObserveTransfer(absl::ToDoubleSeconds(absl::Now() - start), status.ok());
    // The put is complete (or cancelled): the pinned blocks go back to the engine either way —
    // after a failed push the decode worker cannot use them.
    {
      std::lock_guard<std::mutex> lock(mu_);
      held_.erase(id);
    }
    engine_->ReleaseHeldBlocks(id);
    response->set_bytes(bytes);
    reactor->Finish(ToGrpcWithCause(status));
  });
  return reactor;
}

absl::Status PrefillService::PushRuns(const transfer::RemoteKvDescriptor& remote,
                                      absl::Span<const transfer::BlockRun> remote_runs,
                                      absl::Span<const transfer::KvRegion> local,
                                      absl::Span<const transfer::BlockRun> local_runs,
                                      absl::Time deadline) {
  if (options_.staging != nullptr) {
    absl::Status s = options_.staging->Push(remote, remote_runs, local, local_runs, deadline);
    // A device copy into a staging slot failed: like a failed RMA, a transfer failure the
    // request survives (decode recomputes after PushKv; the router prefills elsewhere after a
    // layerwise Prefill), not INTERNAL, which fails it.
    if (transfer::IsStagingCopyFailure(s)) return absl::UnavailableError(s.message());
    return s;
  }
  return agent_->Push(remote, remote_runs, local, local_runs, deadline);
}

absl::Status PrefillService::RunPush(const std::string& request_id,
                                     const v1::PushKvRequest& request,
                                     std::vector<int32_t> block_ids, absl::Time deadline,
                                     int64_t* bytes) {
  // A layout mismatch is the two workers' settings: FAILED_PRECONDITION (worker.proto PushKv).
  absl::StatusOr<Destination> checked = CheckDestination(request_id, request.destination());
  if (!checked.ok()) return checked.status();
  const TransferRegions& moved = checked->regions;
  // Only the blocks the prompt needs are expanded (the runs may cover far more).
  const int64_t reserved = transfer::TotalBlocks(checked->runs);
  if (reserved < static_cast<int64_t>(block_ids.size())) {
    return absl::InvalidArgumentError(absl::StrCat("decode reserved ", reserved,
                                                   " blocks; the prompt's KV needs ",
                                                   block_ids.size()));
  }
  std::vector<int32_t> dest_ids = transfer::FirstBlocks(checked->runs, block_ids.size());
  if (absl::Now() >= deadline) {
    return absl::DeadlineExceededError("the pinned KV is about to expire; not pushing");
  }
  absl::Status status = PushRuns(moved.remote, transfer::CoalesceBlocks(dest_ids), moved.local,
                                 transfer::CoalesceBlocks(block_ids), deadline);
  if (status.ok()) {
    for (const transfer::KvRegion& region : moved.local) {
      *bytes += region.block_bytes * static_cast<int64_t>(block_ids.size());
    }
  }
  return status;
}

}  // namespace sluice
