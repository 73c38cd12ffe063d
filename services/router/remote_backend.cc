#include "services/router/remote_backend.h"

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <functional>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/grammar/compiled_grammar.h"
#include "services/common/misconfigured_peer.h"
#include "services/router/image_encoding.h"
#include "services/router/kv_router.h"
#include "services/router/wire_convert.h"
#include "services/serve/log.h"
#include "sluice/v1/encoder.grpc.pb.h"
#include "sluice/v1/worker.grpc.pb.h"
#include "proto/grpc_status.h"

namespace sluice {
namespace {

std::chrono::system_clock::time_point DeadlineIn(absl::Duration d) {
  return std::chrono::system_clock::now() + absl::ToChronoMicroseconds(d);
}

// Waits and retries that rely on a prefill worker's pinned KV end this long before the pin's
// timeout: the Reserve, the Decode call and the pull still have to happen.
constexpr absl::Duration kPinMargin = absl::Seconds(2);

// NoRoom: a Reserve answer meaning "this decode worker has no free blocks now" (the worker's
// wait for blocks ran out, the call's deadline passed, or it refused a request id the router
// cancelled there a moment ago): try another worker, or this one later.
bool NoRoom(grpc::StatusCode code) {
  return code == grpc::StatusCode::RESOURCE_EXHAUSTED ||
         code == grpc::StatusCode::DEADLINE_EXCEEDED || code == grpc::StatusCode::CANCELLED;
}

// Retryable: the worker (or the way to it) failed, not the request.
bool IsWorkerFailure(grpc::StatusCode code) {
  return code == grpc::StatusCode::UNAVAILABLE || code == grpc::StatusCode::DEADLINE_EXCEEDED ||
         code == grpc::StatusCode::CANCELLED || code == grpc::StatusCode::INTERNAL ||
         code == grpc::StatusCode::UNKNOWN || code == grpc::StatusCode::ABORTED;
}

// Unary: one callback-API unary RPC's buffers, kept alive (shared) until its
// callback ran. `Stub` keeps the channel alive for fire-and-forget calls.
template <typename Stub, typename Request, typename Response>
struct Unary {
  std::shared_ptr<Stub> stub;
  grpc::ClientContext context;
  Request request;
  Response response;
};

}  // namespace

// Call: one request. No thread of its own: each step starts an RPC whose
// callback runs the next step. At most one step runs at a time, except that the
// Reserve and Prefill callbacks may race; they meet in PrefillPhaseEnded, where
// exactly one of them goes on. The images' Encode runs beside them (its own state); the
// flow meets it in ImagesReady before a call that needs the embeddings. Flow state is
// guarded by `mu_`; RPCs are started and outputs delivered without it held.
class RemoteBackend::Call : public std::enable_shared_from_this<Call> {
 public:
  Call(RemoteBackend* backend, EngineRequest request, OutputCallback on_output)
      : backend_(backend),
        options_(backend->options_),
        request_(std::move(request)),
        on_output_(std::move(on_output)),
        prompt_len_(static_cast<int64_t>(request_.prompt_token_ids.size())) {
    ToWire(request_.sampling, &wire_sampling_);
    // The grammar travels as text; the workers compile it against their vocabulary.
    if (request_.grammar != nullptr) wire_sampling_.set_grammar_ebnf(request_.grammar->ebnf());
  }

  const std::string& id() const { return request_.request_id; }
  const EngineRequest& request() const { return request_; }
  void Start() {
    pending_images_ = PendingImages(request_);
    if (pending_images_.empty()) return StartWithImages();
    encode_until_ = DeadlineIn(options_.encode_deadline);
    // The images are encoded while the workers are picked and decode reserves; only the prefill
    // (or a local Decode) waits for the embeddings. The Reserve then carries the images as bytes
    // (a decode worker encodes them only if it computes the prompt itself), and the picks, seeing
    // images without embeddings, take only workers that encode images: so this needs such decode
    // workers, and prefill workers that all are (else fewer would be picked); else, encode first.
    const WorkerRegistry& registry = *backend_->registry_;
    overlap_ = registry.CountLive(WorkerRole::kEncoder) > 0 &&
               registry.CountLiveWith(WorkerRole::kDecode, kImageEncodeCapability) > 0 &&
               registry.CountLiveWith(WorkerRole::kPrefill, kImageEncodeCapability) ==
                   registry.CountLive(WorkerRole::kPrefill);
    if (!overlap_) return StartEncode();
    {
      std::lock_guard<std::mutex> lock(mu_);
      encoding_ = true;
      MmInputsToWire(request_.mm_inputs, &wire_mm_inputs_);  // bytes until EndEncode
    }
    StartEncode();
    NextDecodeAttempt();
  }

  // Abort cancels every RPC in flight but a Reserve; their callbacks end the request. A
  // Reserve is let finish (it is short: the decode worker answers within reserve_attempt_wait):
  // its answer carries the reservation's token, which the Cancel that follows must carry. A
  // cancelled Reserve whose answer was already on its way would leave the router without the
  // token and the decode worker with blocks nobody may cancel until its reservation timeout.
  void Abort() {
    std::lock_guard<std::mutex> lock(mu_);
    aborted_ = true;
    for (auto& [context, rpc] : active_) {
      if (!rpc.finish_on_abort) context->TryCancel();
    }
  }

  void OnWorkerRemoved(const std::string& worker_id, const absl::Status& why) {
    std::lock_guard<std::mutex> lock(mu_);
    bool uses = false;
    for (auto& [context, rpc] : active_) {
      if (rpc.worker == worker_id) {
        uses = true;
        context->TryCancel();
      }
    }
    if (uses) failed_workers_[worker_id] = why;
  }

  // DecodeMessage delivers one message of the Decode stream; returns false
  // once the request is finished, or once this attempt failed in a way another
  // decode worker can take over from (decode_error_ says why; DecodeEnded follows).
  bool DecodeMessage(const v1::TokenOutput& message) {
    RequestOutput output;
    output.new_tokens.reserve(message.tokens_size());
    for (const v1::SampledToken& token : message.tokens()) {
      output.new_tokens.push_back(FromWire(token));
    }
    output.prompt_logprobs = PromptLogprobsFromWire(message.prompt_logprobs());
    // A migrated attempt reports the resumed tokens as outputs: the first attempt's counts stay.
    if (!prefill_.has_value() && !resuming_ && message.has_usage()) {
      num_prompt_tokens_ = message.usage().prompt_tokens();
      num_cached_tokens_ = message.usage().cached_tokens();
    }
    output.finish_reason = FromWire(message.finish_reason());
    // Only a local prefill's queue time: after a remote prefill the first token's counts.
    if (!prefill_.has_value() && message.has_queue_seconds()) {
      output.queue_seconds = message.queue_seconds();
    }
    bool misconfigured = false;
    if (output.finish_reason == FinishReason::kError) {
      output.status = StatusFromWire(message.error());
      misconfigured = IsMisconfiguredPeer(output.status);
      // Most often the KV pull failed: check that the prefill worker still lives.
      if (prefill_worker_.has_value() && !misconfigured) {
        backend_->prober_.Suspect(*prefill_worker_);
      }
    }
    if (misconfigured) {
      // Its prefill and decode workers cannot move KV between them (settings that differ, in a
      // pool the registration check did not cover): a server error, not the client's (the
      // FAILED_PRECONDITION would read as a 400), and never retried (a retry would fail the
      // same way, or race this attempt on the decode worker). The decode worker freed its
      // reservation and acked the prefill pin.
      spdlog::error("request {}: decode worker {} ({}) and prefill worker {} are misconfigured: {}",
                    id(), decode_->worker_id, decode_->address,
                    prefill_.has_value() ? prefill_->prefill_worker_address() : "-",
                    std::string(output.status.message()));
      backend_->Count(&RemoteBackendCounters::num_worker_failures);
      output.status = absl::InternalError(absl::StrCat(
          "the KV transfer between this request's workers failed: ", output.status.message()));
    }
    // The decode worker gave up on the request though the client did not (its reservation
    // expired, it drained, a transfer failed): once the client has tokens, the request goes on
    // elsewhere instead of failing.
    const bool gave_up =
        !misconfigured &&
        ((output.finish_reason == FinishReason::kError && IsRecoverable(output.status)) ||
         (output.finish_reason == FinishReason::kAbort && !IsAborted()));
    if (gave_up && num_output_tokens_ + output.new_tokens.size() > 0) {
      decode_error_ = output.finish_reason == FinishReason::kError
                          ? output.status
                          : absl::UnavailableError("the decode worker aborted the request");
      output.finish_reason = FinishReason::kNone;
      output.status = absl::OkStatus();
      if (output.new_tokens.empty()) return false;
    } else if (gave_up) {
      // Before any token: the worker's error (or abort) is the request's end.
      backend_->Count(&RemoteBackendCounters::num_worker_failures);
    }
    if (!output.new_tokens.empty()) decode_streamed_ = true;
    Deliver(std::move(output));
    return !finished_ && decode_error_.ok();
  }

  void DecodeEnded(grpc::ClientContext* context, const grpc::Status& status) {
    Detach(context);
    if (finished_) return Done();
    if (IsAborted()) {
      // A Decode cancelled right after it started may never reach the decode worker:
      // free its reservation and the prefill pin now, not at their timeouts (both
      // calls are idempotent on the workers).
      CancelOnDecode();
      if (prefill_.has_value()) ReleaseOnPrefill(prefill_->prefill_worker_address());
      Finish(FinishReason::kAbort);
      return Done();
    }
    // The stream ended without a final message (the decode worker or the way to it failed), or
    // with one that gave up on the request (decode_error_). ALREADY_EXISTS before anything
    // streamed: the worker still holds an earlier attempt under this id (a reservation that
    // expired there is not yet forgotten), as Reserve meets it (ReserveAnswered): go on
    // elsewhere, without suspecting the worker.
    const bool stale_session = decode_error_.ok() && !decode_streamed_ &&
                               status.error_code() == grpc::StatusCode::ALREADY_EXISTS;
    const bool stream_failed =
        decode_error_.ok() && (IsWorkerFailure(status.error_code()) || stale_session);
    const bool worker_failed = stream_failed || !decode_error_.ok();
    if (stream_failed && !stale_session) backend_->prober_.Suspect(*decode_);
    // A migration's prefill whose KV decode_ could not take (it ended the request before
    // streaming: its reservation expired, the transfer failed): the handover is what fails, so
    // decode_ re-prefills itself instead (a pinned retry would hand over again).
    if (!decode_error_.ok() && !decode_streamed_ && num_resumed_ > 0 && prefill_.has_value()) {
      const std::string why(decode_error_.message());
      decode_error_ = absl::OkStatus();
      return ResumeLocally(why);
    }
    // Nothing streamed after the first token: another decode worker pulls the same pinned KV.
    if (worker_failed && !decode_streamed_ && num_output_tokens_ > 0 && CanReusePin()) {
      decode_error_ = absl::OkStatus();
      return RetryDecodeWithPinnedKv(stream_failed);
    }
    absl::Status failure = WorkerFailure(decode_->worker_id);
    if (failure.ok()) {
      failure = absl::UnavailableError(absl::StrCat(
          "decode worker ", decode_->worker_id, " (", decode_->address, ") failed: ",
          decode_error_.ok() ? status.error_message() : std::string(decode_error_.message())));
    }
    // The prefill pin is of no further use (a retry from scratch prefills again): free it now,
    // not at its timeout.
    if (prefill_.has_value()) ReleaseOnPrefill(prefill_->prefill_worker_address());
    if (num_output_tokens_ == 0 && worker_failed) return RetryDecode();
    // The client has tokens: continue on another decode worker from the tokens it has.
    if (worker_failed && num_migrations_ < options_.max_migrations) {
      const bool removed = !WorkerFailure(decode_->worker_id).ok();
      return Migrate(failure, /*exclude_worker=*/stream_failed || removed);
    }
    FailOnWorker(failure);
    Done();
  }

 private:
  using DecodeStub = v1::DecodeWorker::Stub;
  using PrefillStub = v1::PrefillWorker::Stub;

  // Attach registers an RPC about to start on `worker_id` (false: aborted or the worker was
  // removed; don't start it). `finish_on_abort`: Abort lets it run to its answer (see Abort).
  bool Attach(grpc::ClientContext* context, const std::string& worker_id,
              bool finish_on_abort = false) {
    std::lock_guard<std::mutex> lock(mu_);
    if (aborted_ || failed_workers_.count(worker_id) > 0) return false;
    active_[context] = ActiveRpc{worker_id, finish_on_abort};
    return true;
  }
  void Detach(grpc::ClientContext* context) {
    std::lock_guard<std::mutex> lock(mu_);
    active_.erase(context);
  }
  bool IsAborted() {
    std::lock_guard<std::mutex> lock(mu_);
    return aborted_;
  }
  absl::Status WorkerFailure(const std::string& worker_id) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = failed_workers_.find(worker_id);
    return it == failed_workers_.end() ? absl::OkStatus() : it->second;
  }

  void Deliver(RequestOutput output) {
    if (finished_) return;
    output.request_id = request_.request_id;
    num_output_tokens_ += static_cast<int32_t>(output.new_tokens.size());
    for (const SampledToken& token : output.new_tokens) output_token_ids_.push_back(token.token_id);
    output.num_prompt_tokens = num_prompt_tokens_;
    output.num_cached_tokens = num_cached_tokens_;
    output.num_output_tokens = num_output_tokens_;
    finished_ = output.finished();
    on_output_(output);
  }
  void Finish(FinishReason reason, absl::Status status = absl::OkStatus()) {
    RequestOutput output;
    output.finish_reason = reason;
    output.status = std::move(status);
    Deliver(std::move(output));
  }

  // Done releases the decode worker and forgets the request: the last step.
  void Done() {
    if (decode_.has_value()) backend_->ReleaseWorker(decode_->worker_id, request_.request_id);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (encoding_) {
        // The request ended while its images were still encoded: that result is of no use. The
        // Encode's end (EndEncode) forgets the request: its callback still uses the backend.
        flow_done_ = true;
        if (encode_context_ != nullptr) encode_context_->TryCancel();
        return;
      }
    }
    // Embeddings an encoder staged that no prefill answer released (aborted, failed, prefilled
    // on the decode worker): free their slots now rather than at their lease's end.
    ReleaseStagedEmbeddings();
    backend_->Forget(request_.request_id);
  }

  // ReleaseStagedEmbeddings: ends the leases of the request's staged embeddings, once (a
  // worker that read one already ended it: that answer is NOT_FOUND, ignored). Later prefills
  // of the request (retries, migrations) find them gone and encode the bytes themselves.
  void ReleaseStagedEmbeddings() {
    using Rpc = Unary<v1::Encoder::Stub, v1::ReleaseEmbeddingsRequest,
                      v1::ReleaseEmbeddingsResponse>;
    std::vector<v1::EmbeddingRef> refs;
    {
      std::lock_guard<std::mutex> lock(mu_);  // the Reserve and Prefill callbacks may race
      refs.swap(embedding_refs_);
    }
    for (const v1::EmbeddingRef& ref : refs) {
      if (ref.size() <= 0 || ref.encoder_address().empty()) continue;
      auto rpc = std::make_shared<Rpc>();
      rpc->stub = v1::Encoder::NewStub(backend_->ChannelTo(ref.encoder_address()));
      rpc->context.set_deadline(DeadlineIn(options_.control_deadline));
      rpc->request.set_lease_id(ref.lease_id());
      rpc->request.set_token(ref.token());
      rpc->stub->async()->ReleaseEmbeddings(&rpc->context, &rpc->request, &rpc->response,
                                            [rpc](grpc::Status) {});
    }
  }

  // StartEncode sends the request's images to an encoder worker (another after a failure).
  void StartEncode() {
    if (!EncodeWanted()) return EndEncode(absl::CancelledError("the request ended"));
    std::optional<WorkerSnapshot> worker;
    if (num_encode_attempts_ < options_.max_encode_attempts &&
        std::chrono::system_clock::now() < encode_until_) {
      // Cache affinity on the first image (the encoder that has it cached), within load.
      worker = PickEncoder(backend_->registry_,
                           request_.mm_inputs[pending_images_.front()].content_hash, bad_encoder_);
    }
    if (!worker.has_value() && backend_->CanSelfEncode()) {
      // No encoder worker (or none that worked): the prefill / decode workers encode the
      // images themselves from their bytes (the same vision tower, so the same embeddings).
      if (num_encode_attempts_ > 0) {
        spdlog::warn("request {}: {}; the workers encode its images themselves", id(),
                     encode_error_);
      }
      for (size_t i = 0; i < pending_images_.size(); ++i) {
        backend_->Count(&RemoteBackendCounters::num_self_encoded_images);
      }
      return EndEncode(absl::OkStatus(), request_.mm_inputs);
    }
    if (!worker.has_value()) {
      // A worker's failure: counted before the caller learns of it (FailOnWorker).
      backend_->Count(&RemoteBackendCounters::num_worker_failures);
      return EndEncode(absl::UnavailableError(
          num_encode_attempts_ == 0
              ? std::string("no encoder worker is available for this request's images")
              : absl::StrCat("every encoder worker tried failed (", num_encode_attempts_,
                             " attempts); last: ", encode_error_)));
    }
    ++num_encode_attempts_;
    using Rpc = Unary<v1::Encoder::Stub, v1::EncodeRequest, v1::EncodeResponse>;
    auto rpc = std::make_shared<Rpc>();
    rpc->stub = v1::Encoder::NewStub(backend_->ChannelTo(worker->address));
    rpc->context.set_deadline(encode_until_);
    rpc->request = EncodeRequestFor(request_, pending_images_);
    // Staged embeddings (read by the workers over UCX) only where workers can read them: those
    // that encode images (they get the bytes too, for when the read fails).
    rpc->request.set_allow_ref(backend_->CanSelfEncode());
    if (!Attach(&rpc->context, worker->worker_id)) {
      return EncodeEnded(*worker, grpc::Status(grpc::StatusCode::CANCELLED, "worker removed"),
                         nullptr);
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      encode_context_ = &rpc->context;  // Done cancels it
    }
    rpc->stub->async()->Encode(
        &rpc->context, &rpc->request, &rpc->response,
        [self = shared_from_this(), rpc, worker = *worker](grpc::Status status) {
          self->Detach(&rpc->context);
          {
            std::lock_guard<std::mutex> lock(self->mu_);
            self->encode_context_ = nullptr;
          }
          self->EncodeEnded(worker, status, &rpc->response);
        });
  }

  void EncodeEnded(const WorkerSnapshot& worker, const grpc::Status& status,
                   const v1::EncodeResponse* response) {
    backend_->registry_->Release(worker.worker_id);
    if (!EncodeWanted()) return EndEncode(absl::CancelledError("the request ended"));
    if (status.ok()) {
      // Spliced into a copy: the worker flow reads request_ meanwhile (see Start).
      EngineRequest encoded;
      encoded.mm_inputs = request_.mm_inputs;
      std::vector<v1::EmbeddingRef> refs;
      absl::Status applied =
          ApplyEncodeResponse(*response, pending_images_, &encoded, &refs, worker.address);
      if (!applied.ok()) {
        return EndEncode(absl::InternalError(absl::StrCat(
            "encoder worker ", worker.worker_id, " (", worker.address, "): ", applied.message())));
      }
      for (size_t i = 0; i < pending_images_.size(); ++i) {
        backend_->Count(&RemoteBackendCounters::num_encoded_images);
      }
      return EndEncode(absl::OkStatus(), std::move(encoded.mm_inputs), std::move(refs));
    }
    if (!IsWorkerFailure(status.error_code())) {
      // The images themselves (the API checked them already: limits set differently here).
      return EndEncode(FromGrpc(status));
    }
    encode_error_ = absl::StrCat("encoder worker ", worker.worker_id, " (", worker.address,
                                 "): ", status.error_message());
    spdlog::warn("request {}: {}; trying another encoder worker", id(), encode_error_);
    backend_->prober_.Suspect(worker);
    bad_encoder_.insert(worker.worker_id);
    backend_->Count(&RemoteBackendCounters::num_encode_retries);
    StartEncode();
  }

  // EndEncode: the images' encode ended: `images` are request_.mm_inputs with the embeddings
  // answered (`refs`: those staged on the encoder), or with their bytes alone for the workers
  // to encode (self-encode); else `status` is the request's error. Encoded first (no overlap):
  // the prefill / decode flow begins now. Else it runs already: the step waiting for the
  // images (ImagesReady) goes on, or the request, ended meanwhile, is forgotten.
  void EndEncode(absl::Status status, std::vector<MultimodalInput> images = {},
                 std::vector<v1::EmbeddingRef> refs = {}) {
    pending_images_.clear();
    if (!overlap_) {
      if (IsAborted()) {
        Finish(FinishReason::kAbort);
        return Done();
      }
      if (!status.ok()) {
        Finish(FinishReason::kError, std::move(status));
        return Done();
      }
      request_.mm_inputs = std::move(images);
      {
        std::lock_guard<std::mutex> lock(mu_);
        embedding_refs_ = std::move(refs);
      }
      return StartWithImages();
    }
    google::protobuf::RepeatedPtrField<v1::MultimodalInput> wire;
    if (status.ok()) MmInputsToWire(images, &wire, refs);
    std::function<void()> waiter;
    bool flow_done;
    {
      std::lock_guard<std::mutex> lock(mu_);
      encoding_ = false;
      images_status_ = status;
      if (status.ok()) {
        wire_mm_inputs_.Swap(&wire);
        embedding_refs_ = std::move(refs);
      }
      waiter = std::exchange(images_waiter_, nullptr);
      flow_done = flow_done_;
    }
    if (flow_done) {
      ReleaseStagedEmbeddings();
      return backend_->Forget(request_.request_id);
    }
    if (waiter) waiter();
  }
  // EncodeWanted: the request still needs its images encoded (not aborted, not ended).
  bool EncodeWanted() {
    std::lock_guard<std::mutex> lock(mu_);
    return !aborted_ && !flow_done_;
  }
  // ImagesReady: the images' encode has ended (ImagesStatus says how); else false, and `then`
  // runs when it ends (on the Encode's callback). At most one step waits: the flow is parked.
  bool ImagesReady(std::function<void()> then) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!encoding_) return true;
    images_waiter_ = std::move(then);
    return false;
  }
  absl::Status ImagesStatus() {
    std::lock_guard<std::mutex> lock(mu_);
    return images_status_;
  }
  // WireMmInputs: the images as a prefill / decode call carries them now (bytes while encoding).
  void WireMmInputs(google::protobuf::RepeatedPtrField<v1::MultimodalInput>* out) {
    std::lock_guard<std::mutex> lock(mu_);  // EndEncode sets them on the Encode's callback
    *out = wire_mm_inputs_;
  }

  // StartWithImages: every image has its embeddings; the prefill / decode flow begins.
  void StartWithImages() {
    if (!request_.mm_inputs.empty()) {
      std::lock_guard<std::mutex> lock(mu_);
      MmInputsToWire(request_.mm_inputs, &wire_mm_inputs_, embedding_refs_);
    }
    NextDecodeAttempt();
  }

  void NextDecodeAttempt() {
    if (IsAborted()) {
      Finish(FinishReason::kAbort);
      return Done();
    }
    const int64_t tokens_needed = prompt_len_ + request_.sampling.max_tokens;
    decode_ = num_decode_attempts_++ < options_.max_decode_attempts
                  ? backend_->PickWorker(WorkerRole::kDecode, request_, tokens_needed, bad_decode_)
                  : std::nullopt;
    if (!decode_.has_value()) {
      FailOnWorker(
          absl::UnavailableError(num_decode_attempts_ == 1 ? "no decode worker is available"
                                                           : "every decode worker tried failed"));
      return Done();
    }
    decode_stub_ = v1::DecodeWorker::NewStub(backend_->ChannelTo(decode_->address));
    prefill_.reset();
    prefill_worker_.reset();
    prefill_error_ = absl::OkStatus();
    const bool remote_prefill = prompt_len_ >= options_.min_remote_prefill_tokens &&
                                backend_->registry_->CountLive(WorkerRole::kPrefill) > 0 &&
                                num_output_tokens_ == 0;
    if (!remote_prefill) {
      backend_->Count(&RemoteBackendCounters::num_local_prefills);
      return StartDecode();
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      prefill_phase_ended_ = false;
      prefill_ok_ = false;
      reserving_ = false;
      reserve_started_ = false;
    }
    num_prefill_attempts_ = 0;
    prefill_until_ = DeadlineIn(options_.prefill_deadline);
    reserve_error_ = absl::OkStatus();
    reserve_full_ = false;
    full_decode_.clear();
    backoff_ = absl::ZeroDuration();
    StartPrefill();
  }

  // BeginReserve starts the phase that reserves decode blocks (once per prefill phase); false
  // when it had already begun. The reservation is made only for a prefill about to run (see
  // StartPrefill) or one that answered: blocks reserved for a request still queued behind
  // other prefills would sit idle while requests whose KV is ready wait for them.
  bool BeginReserve() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (reserve_started_) return false;
      reserve_started_ = true;
      reserving_ = true;
    }
    StartReserve();
    return true;
  }

  // StartReserve reserves blocks on decode_ while prefill runs; the worker waits at most
  // reserve_attempt_wait for free blocks.
  void StartReserve() {
    using Rpc = Unary<DecodeStub, v1::ReserveRequest, v1::ReserveResponse>;
    auto rpc = std::make_shared<Rpc>();
    const auto deadline = DeadlineIn(options_.control_deadline + options_.reserve_attempt_wait);
    rpc->context.set_deadline(deadline);
    rpc->request.set_request_id(id());
    rpc->request.mutable_prompt_token_ids()->Add(request_.prompt_token_ids.begin(),
                                                 request_.prompt_token_ids.end());
    *rpc->request.mutable_sampling() = WireSampling();
    rpc->request.set_cache_salt(request_.cache_salt);
    rpc->request.set_priority(request_.priority);
    WireMmInputs(rpc->request.mutable_mm_inputs());
    AddResumed(rpc->request.mutable_resumed_output_token_ids(), num_resumed_);
    rpc->request.set_max_wait_ms(
        static_cast<int32_t>(absl::ToInt64Milliseconds(options_.reserve_attempt_wait)));
    {
      std::lock_guard<std::mutex> lock(mu_);
      reservation_.reset();
      reservation_token_.clear();
    }
    if (!Attach(&rpc->context, decode_->worker_id, /*finish_on_abort=*/true)) {
      return ReserveEnded();
    }
    decode_stub_->async()->Reserve(
        &rpc->context, &rpc->request, &rpc->response,
        [self = shared_from_this(), rpc, deadline](grpc::Status status) {
          self->Detach(&rpc->context);
          if (status.ok()) {
            // Layerwise prefill workers write into it while they compute (StartPrefill).
            std::lock_guard<std::mutex> lock(self->mu_);
            self->reservation_ = rpc->response.kv();
            self->reservation_token_ = rpc->response.reservation_token();
            self->reservation_usable_until_ =
                absl::Now() + self->options_.decode_reserve_timeout - kPinMargin;
          }
          self->ReserveAnswered(status, deadline);
        });
  }

  // ReserveAnswered: blocks reserved (or a failure Decode will meet again: go on), or no room
  // on decode_: try the next decode worker.
  void ReserveAnswered(const grpc::Status& status,
                       std::chrono::system_clock::time_point deadline) {
    if (status.ok()) reserved_at_ = absl::Now();
    if (status.ok() || IsAborted()) return ReserveEnded();
    // ALREADY_EXISTS: the worker still holds an earlier attempt's session under this id (its
    // cancel is on the way): a Decode there would attach to that stale session. Treat the worker
    // as full for now — another one, or this one after the backoff, once the session is gone.
    const bool stale_session = status.error_code() == grpc::StatusCode::ALREADY_EXISTS;
    if (!NoRoom(status.error_code()) && !stale_session) {
      // A failed decode worker (gone, draining): try another before the first token is sent.
      // Other errors (or no attempts left) go on to Decode, which reports them.
      if (!IsWorkerFailure(status.error_code()) ||
          num_decode_attempts_ >= options_.max_decode_attempts) {
        return ReserveEnded();
      }
      backend_->prober_.Suspect(*decode_);
      bad_decode_.insert(decode_->worker_id);
      ReleaseDecode();
      ++num_decode_attempts_;
      backend_->Count(&RemoteBackendCounters::num_decode_retries);
      return NextReserve();
    }
    backend_->Count(&RemoteBackendCounters::num_reserve_full);
    // The call's own deadline passed: the worker may still reserve later; free that now.
    if (std::chrono::system_clock::now() >= deadline) CancelOnDecode();
    full_decode_.insert(decode_->worker_id);
    ReleaseDecode();
    NextReserve();
  }

  // NextReserve: Reserve on a decode worker not yet found full (nor failed); when every one
  // is full, wait (backoff) and try them all again, until the wait's end.
  void NextReserve() {
    std::set<std::string> exclude = ResumingOnly(WorkerRole::kDecode, bad_decode_);
    exclude.insert(full_decode_.begin(), full_decode_.end());
    if (num_decode_attempts_ <= options_.max_decode_attempts) {
      decode_ = backend_->PickWorker(WorkerRole::kDecode, request_, TokensNeeded(), exclude);
    }
    if (decode_.has_value()) {
      decode_stub_ = v1::DecodeWorker::NewStub(backend_->ChannelTo(decode_->address));
      return StartReserve();
    }
    if (full_decode_.empty()) {
      // No live decode worker at all (or none left to try): the phase ends without blocks.
      reserve_error_ = absl::UnavailableError(num_decode_attempts_ <= 1
                                                  ? "no decode worker is available"
                                                  : "every decode worker tried failed");
      reserve_full_ = false;
      return ReserveEnded();
    }
    backoff_ = std::min(options_.reserve_backoff_max,
                        backoff_ == absl::ZeroDuration() ? options_.reserve_backoff_initial
                                                         : backoff_ * 2);
    StartQueueWait();
    const absl::Time wake = absl::Now() + backoff_;
    if (wake >= WaitUntil()) {
      reserve_error_ = absl::UnavailableError(absl::StrCat(
          "no decode worker had free KV blocks for this request (", prompt_len_ + 1,
          " tokens) within ",
          absl::FormatDuration(absl::Trunc(WaitUntil() - WaitStart(), absl::Milliseconds(100))),
          " of waiting; the decode workers are full, retry later"));
      reserve_full_ = true;
      backend_->Count(&RemoteBackendCounters::num_decode_queue_timeouts);
      return ReserveEnded();
    }
    backend_->timers_.PostAt(wake, [self = shared_from_this()] { self->AfterBackoff(); });
  }

  void AfterBackoff() {
    bool stop;
    {
      std::lock_guard<std::mutex> lock(mu_);
      // Aborted, or prefill failed for good: nothing will use a reservation.
      stop = aborted_ || (prefill_phase_ended_ && !prefill_ok_);
    }
    if (stop) return ReserveEnded();
    full_decode_.clear();
    NextReserve();
  }

  // StartQueueWait: every decode worker was found full; the queue timeout counts from the first
  // time, not from the request's arrival (a request may queue for prefill far longer, and
  // reserves only once its prefill runs).
  void StartQueueWait() {
    std::lock_guard<std::mutex> lock(mu_);
    if (queue_until_ != absl::InfiniteFuture()) return;
    queue_wait_start_ = absl::Now();
    queue_until_ = queue_wait_start_ + options_.decode_queue_timeout;
  }
  // WaitUntil: the end of the wait for decode blocks: the queue timeout, and while prefill
  // pins the first token's KV, the pin's end.
  absl::Time WaitUntil() {
    // A migration waits from its start (the request may be older than the queue timeout).
    std::lock_guard<std::mutex> lock(mu_);
    const absl::Time until = resuming_ ? migrate_until_ : queue_until_;
    return std::min(until, pin_until_);
  }
  // WaitStart: when the wait WaitUntil ends began (a migration's, or the queue wait's).
  absl::Time WaitStart() {
    std::lock_guard<std::mutex> lock(mu_);
    return resuming_ ? migrate_until_ - options_.decode_queue_timeout : queue_wait_start_;
  }
  bool CanReusePin() {
    if (!prefill_.has_value() || num_decode_attempts_ >= options_.max_decode_attempts) {
      return false;
    }
    std::lock_guard<std::mutex> lock(mu_);
    return absl::Now() < pin_until_;
  }
  int64_t TokensNeeded() const { return prompt_len_ + request_.sampling.max_tokens; }
  void ReleaseDecode() {
    if (decode_.has_value()) backend_->ReleaseWorker(decode_->worker_id, request_.request_id);
    decode_.reset();
    std::lock_guard<std::mutex> lock(mu_);
    reservation_token_.clear();  // it opens only decode_'s reservation
  }
  // ReservationToken: the grant token of the reservation on decode_ (empty: none made).
  std::string ReservationToken() {
    std::lock_guard<std::mutex> lock(mu_);
    return reservation_token_;
  }

  void StartPrefill() {
    if (IsAborted() || num_prefill_attempts_ >= options_.max_prefill_attempts ||
        std::chrono::system_clock::now() >= prefill_until_) {
      return PrefillPhaseEnded();
    }
    std::optional<WorkerSnapshot> worker =
        backend_->PickWorker(WorkerRole::kPrefill, request_, prompt_len_ + num_resumed_,
                             ResumingOnly(WorkerRole::kPrefill, bad_prefill_));
    if (!worker.has_value()) return PrefillPhaseEnded();
    // An idle prefill worker starts on the request at once: reserve on decode in parallel, so
    // the KV transfer can begin the moment prefill answers. Behind a queue, reserve when
    // prefill answers (PrefillPhaseEnded).
    const bool idle = PrefillWorkerIdle(*worker);
    // A layerwise prefill worker pushes each layer into the decode reservation while it
    // computes: it gets the reservation, so the call waits until the Reserve phase ended
    // (ReserveEnded starts it again). Its requests reserve first even behind a queue (the
    // reservation is where the layers land); without one it falls back to push mode.
    std::optional<v1::KvBlocks> reservation;
    bool parked = false, reserve_first = false;
    // A resumed request's KV is pushed after its prefill (PushKv), not layer by layer.
    if (worker->layerwise_push && num_resumed_ == 0) {
      std::lock_guard<std::mutex> lock(mu_);
      if (reserving_) {
        parked = prefill_parked_ = true;
      } else if (reservation_.has_value()) {
        reservation = reservation_;  // its lease is checked when the call goes out
      } else if (!reserve_started_) {
        parked = prefill_parked_ = reserve_first = true;
      }
    }
    if (parked) {
      backend_->ReleaseWorker(worker->worker_id, request_.request_id);
      if (reserve_first) BeginReserve();
      return;
    }
    ++num_prefill_attempts_;
    if (idle) BeginReserve();
    // The prefill needs the images' embeddings: it waits for their encode (see Start); the
    // Reserve above does not.
    if (!ImagesReady([self = shared_from_this(), worker = *worker, reservation] {
          self->SendPrefill(worker, reservation);
        })) {
      return;
    }
    SendPrefill(*worker, std::move(reservation));
  }

  // SendPrefill: the Prefill call to `worker` (picked and counted by StartPrefill), with the
  // decode reservation a layerwise worker pushes into.
  void SendPrefill(const WorkerSnapshot& worker, std::optional<v1::KvBlocks> reservation) {
    if (absl::Status images = ImagesStatus(); !images.ok()) {
      // The images could not be encoded: the request's error (AfterPrefill frees a reservation).
      backend_->ReleaseWorker(worker.worker_id, request_.request_id);
      prefill_error_ = std::move(images);
      return PrefillPhaseEnded();
    }
    absl::Duration reservation_ttl;
    if (reservation.has_value()) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        reservation_ttl = reservation_usable_until_ - absl::Now();
      }
      if (reservation_ttl < absl::Milliseconds(1)) reservation.reset();
    }
    using Rpc = Unary<PrefillStub, v1::PrefillRequest, v1::PrefillResponse>;
    auto rpc = std::make_shared<Rpc>();
    rpc->stub = v1::PrefillWorker::NewStub(backend_->ChannelTo(worker.address));
    rpc->context.set_deadline(prefill_until_);
    rpc->request.set_request_id(id());
    rpc->request.mutable_prompt_token_ids()->Add(request_.prompt_token_ids.begin(),
                                                 request_.prompt_token_ids.end());
    *rpc->request.mutable_sampling() = WireSampling();
    rpc->request.set_cache_salt(request_.cache_salt);
    rpc->request.set_priority(request_.priority);
    WireMmInputs(rpc->request.mutable_mm_inputs());
    AddResumed(rpc->request.mutable_resumed_output_token_ids(), num_resumed_);
    if (reservation.has_value()) {
      *rpc->request.mutable_decode_reservation() = *std::move(reservation);
      rpc->request.set_decode_reservation_ttl_ms(
          static_cast<int32_t>(absl::ToInt64Milliseconds(reservation_ttl)));
    }
    if (!Attach(&rpc->context, worker.worker_id)) {
      return PrefillEnded(worker, grpc::Status(grpc::StatusCode::CANCELLED, "aborted"), nullptr);
    }
    rpc->stub->async()->Prefill(
        &rpc->context, &rpc->request, &rpc->response,
        [self = shared_from_this(), rpc, worker](grpc::Status status) {
          self->Detach(&rpc->context);
          self->PrefillEnded(worker, status, &rpc->response);
        });
  }

  void PrefillEnded(const WorkerSnapshot& worker, const grpc::Status& status,
                    v1::PrefillResponse* response) {
    backend_->ReleaseWorker(worker.worker_id, request_.request_id);
    if (status.ok()) {
      // The prompt's image positions are computed (or were cached): a staged embedding the
      // prefill worker did not need to read (a prefix-cache or embedding-cache hit) is freed.
      ReleaseStagedEmbeddings();
      prefill_ = std::move(*response);
      prefill_worker_ = worker;
      if (prefill_->kv().runs_size() > 0) {
        std::lock_guard<std::mutex> lock(mu_);
        prefill_ok_ = true;
        pin_until_ = absl::Now() + options_.prefill_pin_timeout - kPinMargin;
      } else {
        std::lock_guard<std::mutex> lock(mu_);
        prefill_ok_ = true;  // finished with its first token: nothing pinned
      }
      return PrefillPhaseEnded();
    }
    if (IsAborted()) return PrefillPhaseEnded();
    if (!IsWorkerFailure(status.error_code())) {
      prefill_error_ = FromGrpcWithCause(status);
      if (IsMisconfiguredPeer(prefill_error_)) {
        // A layerwise prefill refused the decode reservation (another transfer mode or KV
        // layout): as for a decode worker's (DecodeMessage), a server error, not retried.
        spdlog::error("request {}: prefill worker {} ({}) and its decode worker are "
                      "misconfigured: {}",
                      id(), worker.worker_id, worker.address,
                      std::string(prefill_error_.message()));
        backend_->Count(&RemoteBackendCounters::num_worker_failures);
        prefill_error_ = absl::InternalError(absl::StrCat(
            "the KV transfer between this request's workers failed: ", prefill_error_.message()));
      }
      return PrefillPhaseEnded();
    }
    backend_->prober_.Suspect(worker);
    bad_prefill_.insert(worker.worker_id);
    backend_->Count(&RemoteBackendCounters::num_prefill_retries);
    StartPrefill();
  }

  // The Reserve and the prefill phase each end once; whichever ends second
  // goes on (Decode must claim the reservation, not race it).
  void ReserveEnded() {
    bool go, parked;
    {
      std::lock_guard<std::mutex> lock(mu_);
      reserving_ = false;
      go = prefill_phase_ended_;
      parked = std::exchange(prefill_parked_, false);
    }
    if (parked) return StartPrefill();  // a layerwise prefill waited for the reservation
    if (go) AfterPrefill();
  }
  void PrefillPhaseEnded() {
    bool go;
    bool reserve = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      prefill_phase_ended_ = true;
      // Prefill pinned the prompt's KV and no reservation was made yet: make it now.
      reserve = !reserve_started_ && !aborted_ && prefill_ok_ && prefill_.has_value() &&
                prefill_->kv().runs_size() > 0;
      go = !reserving_ && !reserve;
    }
    if (reserve && BeginReserve()) return;  // ends in ReserveEnded → AfterPrefill
    if (go) AfterPrefill();
  }

  // PrefillWorkerIdle: `worker` (as just picked, this request counted) runs nothing else this
  // router sent and reported no queued request at its last heartbeat.
  static bool PrefillWorkerIdle(const WorkerSnapshot& worker) {
    return worker.num_assigned <= 1 && worker.load.num_waiting_requests == 0;
  }

  void AfterPrefill() {
    if (IsAborted() || (!prefill_error_.ok() && num_resumed_ == 0)) {
      CancelOnDecode();
      // Prefill may have answered OK just as the client left: unpin its blocks now.
      if (prefill_.has_value()) ReleaseOnPrefill(prefill_->prefill_worker_address());
      if (IsAborted()) {
        Finish(FinishReason::kAbort);
      } else {
        Finish(FinishReason::kError, prefill_error_);
      }
      return Done();
    }
    if (num_resumed_ > 0) {
      // A migration's prefill that cannot continue the request: the decode worker re-prefills.
      if (!prefill_error_.ok()) return ResumeLocally(std::string(prefill_error_.message()));
      if (!prefill_.has_value()) return ResumeLocally("no prefill worker answered");
      if (!reserve_error_.ok() && prefill_->kv().runs_size() > 0) {
        return ResumeLocally(std::string(reserve_error_.message()));
      }
    }
    if (!prefill_.has_value()) {
      // No prefill worker answered: the decode worker prefills (its engine queues the request
      // until blocks are free; no reservation needed).
      if (!decode_.has_value()) {
        decode_ = backend_->PickWorker(WorkerRole::kDecode, request_, TokensNeeded(), bad_decode_);
        if (!decode_.has_value()) return FailNoDecode(reserve_error_);
        decode_stub_ = v1::DecodeWorker::NewStub(backend_->ChannelTo(decode_->address));
      }
      backend_->Count(&RemoteBackendCounters::num_local_prefills);
      return StartDecode();
    }
    const bool finished_by_prefill = prefill_->kv().runs_size() == 0;
    if (reserve_error_.ok() && !finished_by_prefill && decode_.has_value() &&
        absl::Now() > reserved_at_ + options_.decode_reserve_timeout - kPinMargin) {
      // Prefill answered after the decode reservation (nearly) expired — a retried prefill
      // that queued: reserve again (the old one is cancelled) before the first token goes out.
      return ReserveAgain();
    }
    if (!reserve_error_.ok() && !finished_by_prefill) {
      // No decode worker could take the request in time: unpin the KV, fail (503).
      ReleaseOnPrefill(prefill_->prefill_worker_address());
      return FailNoDecode(reserve_error_);
    }
    if (num_output_tokens_ == 0) {
      backend_->Count(&RemoteBackendCounters::num_remote_prefills);
      num_prompt_tokens_ = prefill_->num_prompt_tokens();
      num_cached_tokens_ = prefill_->num_cached_tokens();
      RequestOutput first;
      first.new_tokens.push_back(FromWire(prefill_->first_token()));
      first.prompt_logprobs = PromptLogprobsFromWire(prefill_->prompt_logprobs());
      first.finish_reason = FromWire(prefill_->finish_reason());
      if (prefill_->has_queue_seconds()) first.queue_seconds = prefill_->queue_seconds();
      Deliver(std::move(first));
      if (finished_) {
        if (decode_.has_value()) CancelOnDecode();
        return Done();
      }
      if (options_.test_decode_start_delay > absl::ZeroDuration()) {
        backend_->timers_.PostAt(absl::Now() + options_.test_decode_start_delay,
                                 [self = shared_from_this()] { self->StartDecode(); });
        return;
      }
    } else if (std::exchange(resume_token_pending_, false)) {
      // A migration's prefill sampled the token after those the client has: it goes out now
      // (the usage counts stay the first attempt's; the prompt logprobs went out already).
      backend_->Count(&RemoteBackendCounters::num_migration_prefills);
      RequestOutput next;
      next.new_tokens.push_back(FromWire(prefill_->first_token()));
      next.finish_reason = FromWire(prefill_->finish_reason());
      Deliver(std::move(next));
      if (finished_) {
        if (decode_.has_value()) CancelOnDecode();
        return Done();
      }
    }
    StartDecode();
  }

  void FailNoDecode(absl::Status why) {
    if (why.ok()) {
      why = absl::UnavailableError("no decode worker is available");
    } else if (reserve_full_) {
      Finish(FinishReason::kError, std::move(why));  // full, not failed: a queue timeout
      return Done();
    }
    FailOnWorker(std::move(why));
    Done();
  }
  // FailOnWorker ends the request with `why`, an error a worker's failure caused (counted in
  // sluice_router_worker_failures_total before the caller learns of it: a client that reads
  // /metrics after its error finds it counted).
  void FailOnWorker(absl::Status why) {
    backend_->Count(&RemoteBackendCounters::num_worker_failures);
    Finish(FinishReason::kError, std::move(why));
  }

  void StartDecode();

  // Migrate: decode_ failed after the client got tokens (and the prefill pin cannot serve a
  // retry). Another decode worker (decode_ too, unless it failed as a process or connection)
  // continues: its Decode carries the prompt and the tokens delivered so far, which it
  // recomputes (prefix cache and KV store first) before streaming the next token, so the
  // client's stream goes on as if undisturbed. The wait for a decode worker is bounded by
  // decode_queue_timeout.
  void Migrate(const absl::Status& why, bool exclude_worker) {
    ++num_migrations_;
    backend_->Count(&RemoteBackendCounters::num_migrations);
    spdlog::info("request {}: {}; continuing on another decode worker after {} tokens "
                 "(migration {} of at most {})",
                 id(), std::string(why.message()), num_output_tokens_, num_migrations_,
                 options_.max_migrations);
    if (exclude_worker) {
      bad_decode_.insert(decode_->worker_id);
      CancelOnDecode();  // a worker that is in fact alive drops what it still holds
    }
    ReleaseDecode();
    prefill_.reset();
    prefill_worker_.reset();
    resuming_ = true;
    if (!resume_sampling_.has_value()) {
      // The client got the prompt logprobs with the first token: not computed again.
      resume_sampling_ = wire_sampling_;
      resume_sampling_->clear_prompt_logprobs();
    }
    num_resumed_ = 0;
    resume_token_pending_ = false;
    resume_via_prefill_ = true;
    decode_error_ = absl::OkStatus();
    migration_error_ = why;
    migrate_until_ = absl::Now() + options_.decode_queue_timeout;
    MigrateToNextWorker();
  }
  void MigrateToNextWorker() {
    if (IsAborted()) {
      Finish(FinishReason::kAbort);
      return Done();
    }
    decode_ = backend_->PickWorker(WorkerRole::kDecode, request_, TokensNeeded(), bad_decode_);
    if (!decode_.has_value()) {
      const absl::Time wake = absl::Now() + absl::Milliseconds(250);
      if (wake < migrate_until_) {
        // Every decode worker is busy restarting, draining or failed: wait for one.
        backend_->timers_.PostAt(wake,
                                 [self = shared_from_this()] { self->MigrateToNextWorker(); });
        return;
      }
      FailOnWorker(absl::UnavailableError(absl::StrCat(
          migration_error_.message(), "; no other decode worker could continue it")));
      return Done();
    }
    decode_stub_ = v1::DecodeWorker::NewStub(backend_->ChannelTo(decode_->address));
    if (resume_via_prefill_ && CanResumeThroughPrefill()) return StartResumePrefill();
    StartDecode();
  }

  // CanResumeThroughPrefill: the migration may go through a prefill worker: one that can is
  // live, decode_ can take its KV, and the prompt with the tokens so far is not short.
  bool CanResumeThroughPrefill() {
    return decode_->Has(kResumeCapability) &&
           prompt_len_ + num_output_tokens_ >= options_.min_remote_prefill_tokens &&
           backend_->registry_->CountLiveWith(WorkerRole::kPrefill, kResumeCapability) > 0;
  }

  // StartResumePrefill: a prefill phase as for a new request (NextDecodeAttempt), for the
  // prompt plus the tokens delivered so far: the prefill worker samples the next token and pins
  // their KV, decode_ (or another decode worker) reserves for them and pulls it; AfterPrefill
  // delivers that token and streams on. Whatever fails on the way ends in ResumeLocally.
  void StartResumePrefill() {
    num_resumed_ = num_output_tokens_;
    resume_token_pending_ = true;
    prefill_error_ = absl::OkStatus();
    {
      std::lock_guard<std::mutex> lock(mu_);
      prefill_phase_ended_ = false;
      prefill_ok_ = false;
      reserving_ = false;
      reserve_started_ = false;
      pin_until_ = absl::InfiniteFuture();
    }
    reserved_at_ = absl::InfiniteFuture();
    num_decode_attempts_ = 1;  // decode_; a retry on the pinned KV may take one more
    num_prefill_attempts_ = 0;
    prefill_until_ = DeadlineIn(options_.prefill_deadline);
    reserve_error_ = absl::OkStatus();
    reserve_full_ = false;
    full_decode_.clear();
    backoff_ = absl::ZeroDuration();
    StartPrefill();
  }

  // ResumeLocally: a migration's prefill could not continue the request (no prefill worker
  // answered, it failed, or no decode worker had blocks for its KV): the new decode worker
  // re-prefills the prompt and every delivered token itself.
  void ResumeLocally(const std::string& why) {
    spdlog::warn("request {}: the migration's prefill on a prefill worker did not continue it "
                 "({}); its decode worker re-prefills",
                 id(), why);
    if (prefill_.has_value() && prefill_->kv().runs_size() > 0) {
      ReleaseOnPrefill(prefill_->prefill_worker_address());
    }
    prefill_.reset();
    prefill_worker_.reset();
    prefill_error_ = absl::OkStatus();
    num_resumed_ = 0;
    resume_token_pending_ = false;
    resume_via_prefill_ = false;
    if (decode_.has_value()) return StartDecode();  // its reservation (if any) is dropped there
    MigrateToNextWorker();
  }

  // WireSampling: the sampling every worker call of this attempt carries (a migrated request's:
  // made by Migrate).
  const v1::SamplingParams& WireSampling() const {
    return resuming_ ? *resume_sampling_ : wire_sampling_;
  }
  // ResumingOnly: `exclude`, and while a migration's prefill phase runs (num_resumed_ > 0) every
  // worker of `role` without kResumeCapability: one from before the field would prefill, or
  // reserve for, the prompt alone.
  std::set<std::string> ResumingOnly(WorkerRole role, std::set<std::string> exclude) const {
    if (num_resumed_ == 0) return exclude;
    for (const WorkerSnapshot& w : backend_->registry_->List()) {
      if (w.role == role && !w.Has(kResumeCapability)) exclude.insert(w.worker_id);
    }
    return exclude;
  }
  // AddResumed: the first `n` delivered tokens, as a resumed_output_token_ids field.
  void AddResumed(google::protobuf::RepeatedField<int32_t>* out, int32_t n) const {
    out->Add(output_token_ids_.begin(), output_token_ids_.begin() + n);
  }

  void RetryDecode() {
    bad_decode_.insert(decode_->worker_id);
    ReleaseDecode();
    backend_->Count(&RemoteBackendCounters::num_decode_retries);
    NextDecodeAttempt();
  }

  // RetryDecodeWithPinnedKv: decode_ failed after the first token was sent but before it
  // streamed anything. The prefill worker still pins the KV (decode_ never acked it, or died
  // before it could matter): another decode worker reserves blocks and decodes the same
  // prefill response; the caller's stream goes on from the second token. Known gap: a decode
  // worker that pulled, acked (Release) and died before its first output leaves the pin
  // freed; the next worker's pull then reads blocks prefill may reuse — the decode side must
  // check ReleaseResponse.released after its pull to catch that.
  // `worker_failed`: decode_ failed as a process or connection (excluded from now on); else it
  // ended the request itself (its reservation expired, a transfer failed) and may take it again.
  void RetryDecodeWithPinnedKv(bool worker_failed = true) {
    // A layerwise push landed in the old reservation: the next decode worker asks for a push.
    if (prefill_.has_value()) prefill_->set_kv_pushed(false);
    if (worker_failed) {
      CancelOnDecode();  // a failed-but-alive worker drops its reservation
      bad_decode_.insert(decode_->worker_id);
    }
    ReleaseDecode();
    backend_->Count(&RemoteBackendCounters::num_decode_retries);
    backend_->Count(&RemoteBackendCounters::num_decode_retries_pinned_kv);
    ++num_decode_attempts_;
    {
      std::lock_guard<std::mutex> lock(mu_);
      reserving_ = true;
      reserve_started_ = true;
      prefill_phase_ended_ = true;
    }
    reserve_error_ = absl::OkStatus();
    reserve_full_ = false;
    full_decode_.clear();
    backoff_ = absl::ZeroDuration();
    NextReserve();  // ends in AfterPrefill, which goes on to StartDecode
  }

  // ReserveAgain: the reservation on decode_ ran out while prefill ran; drop it and reserve
  // anew (any decode worker, with the usual waits), ending in AfterPrefill again.
  // The decode worker keys Reserve, Decode and Cancel by request id, and NextReserve may pick
  // the same worker again: the new Reserve is sent only once the Cancel has been answered, so
  // the Cancel cannot overtake it and cancel the new reservation (or the decode that follows:
  // a 503 "aborted" under load in test_decode_failover's re-reservation test).
  void ReserveAgain() {
    if (prefill_.has_value()) prefill_->set_kv_pushed(false);  // it landed in the old one
    std::shared_ptr<DecodeStub> old_stub = decode_stub_;
    const std::string old_token = ReservationToken();
    ReleaseDecode();
    backend_->Count(&RemoteBackendCounters::num_decode_rereserves);
    {
      std::lock_guard<std::mutex> lock(mu_);
      reserving_ = true;
      reserve_started_ = true;
      prefill_phase_ended_ = true;
    }
    reserve_error_ = absl::OkStatus();
    reserve_full_ = false;
    full_decode_.clear();
    backoff_ = absl::ZeroDuration();
    if (old_stub == nullptr) return NextReserve();
    CancelOnDecode(old_stub, old_token, [self = shared_from_this()] { self->NextReserve(); });
  }

  // Fire-and-forget control calls, bounded by control_deadline.
  void CancelOnDecode() { CancelOnDecode(decode_stub_, ReservationToken(), nullptr); }
  // Cancel on `stub`'s worker, with the reservation's grant `token` (the worker refuses a
  // Cancel of a reserved request without it); `then` (may be empty) runs when the call ends,
  // however it ends (bounded by control_deadline).
  void CancelOnDecode(const std::shared_ptr<DecodeStub>& stub, const std::string& token,
                      std::function<void()> then) {
    if (stub == nullptr) {
      if (then) then();
      return;
    }
    using Rpc = Unary<DecodeStub, v1::CancelRequest, v1::CancelResponse>;
    auto rpc = std::make_shared<Rpc>();
    rpc->stub = stub;
    rpc->context.set_deadline(DeadlineIn(options_.control_deadline));
    rpc->request.set_request_id(id());
    rpc->request.set_reservation_token(token);
    rpc->stub->async()->Cancel(&rpc->context, &rpc->request, &rpc->response,
                               [rpc, then = std::move(then)](grpc::Status) {
                                 if (then) then();
                               });
  }
  void ReleaseOnPrefill(const std::string& address) {
    using Rpc = Unary<PrefillStub, v1::ReleaseRequest, v1::ReleaseResponse>;
    auto rpc = std::make_shared<Rpc>();
    rpc->stub = v1::PrefillWorker::NewStub(backend_->ChannelTo(address));
    rpc->context.set_deadline(DeadlineIn(options_.control_deadline));
    rpc->request.set_request_id(id());
    // The pin's transfer token: the prefill worker refuses a Release without it.
    if (prefill_.has_value()) rpc->request.set_transfer_token(prefill_->kv().transfer_token());
    rpc->stub->async()->Release(&rpc->context, &rpc->request, &rpc->response,
                                [rpc](grpc::Status) {});
  }

  // IsRecoverable: an error a decode worker ended a request with that another decode worker
  // can continue from (not the request's fault).
  static bool IsRecoverable(const absl::Status& status) {
    return absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status) ||
           absl::IsCancelled(status) || absl::IsAborted(status) || absl::IsInternal(status) ||
           absl::IsUnknown(status) || absl::IsResourceExhausted(status) ||
           absl::IsNotFound(status);
  }

  RemoteBackend* const backend_;
  const RemoteBackendOptions& options_;
  EngineRequest request_;
  OutputCallback on_output_;
  const int64_t prompt_len_;
  v1::SamplingParams wire_sampling_;

  std::mutex mu_;
  bool aborted_ = false;                                // guarded by mu_
  struct ActiveRpc {
    std::string worker;            // its worker's id
    bool finish_on_abort = false;  // a Reserve: Abort lets it answer
  };
  std::map<grpc::ClientContext*, ActiveRpc> active_;  // RPCs in flight; guarded by mu_
  std::map<std::string, absl::Status> failed_workers_;  // removed while in use; guarded by mu_
  bool reserving_ = false;                              // guarded by mu_
  bool reserve_started_ = false;  // this prefill phase's reservation began; guarded by mu_
  bool prefill_phase_ended_ = false;                    // guarded by mu_
  bool prefill_ok_ = false;  // a prefill worker answered the first token; guarded by mu_
  // The end of the wait for decode blocks (set by StartQueueWait; guarded by mu_).
  absl::Time queue_until_ = absl::InfiniteFuture();
  absl::Time queue_wait_start_;
  absl::Time pin_until_ = absl::InfiniteFuture();       // pinned KV usable until; guarded by mu_
  absl::Time reserved_at_ = absl::InfiniteFuture();     // last Reserve OK on decode_
  // The last Reserve's blocks and until when a push into them may run; guarded by mu_.
  std::optional<v1::KvBlocks> reservation_;
  std::string reservation_token_;  // its grant token (ReserveResponse.reservation_token)
  absl::Time reservation_usable_until_ = absl::InfinitePast();
  bool prefill_parked_ = false;  // a layerwise prefill waits for the Reserve; guarded by mu_

  // Flow state: touched by one step at a time (see the class comment).
  std::optional<WorkerSnapshot> decode_;  // the decode worker of this attempt (assigned)
  std::shared_ptr<DecodeStub> decode_stub_;
  int32_t num_decode_attempts_ = 0;
  std::set<std::string> bad_decode_;
  std::set<std::string> full_decode_;  // answered Reserve without free blocks this round
  absl::Duration backoff_;             // the last wait between rounds over the decode workers
  absl::Status reserve_error_;         // the wait for decode blocks ended without any
  // reserve_error_ says the decode workers were full until the wait's end (capacity: counted
  // as a decode queue timeout, not as a worker failure).
  bool reserve_full_ = false;
  bool decode_streamed_ = false;       // this attempt's Decode stream delivered a message
  std::set<std::string> bad_prefill_;
  int32_t num_prefill_attempts_ = 0;
  std::chrono::system_clock::time_point prefill_until_;
  std::optional<v1::PrefillResponse> prefill_;
  std::optional<WorkerSnapshot> prefill_worker_;  // the worker that answered `prefill_`
  // Images: request_.mm_inputs still without embeddings, the encoder attempts, and the images
  // as every prefill / decode request carries them (built once encoded).
  std::vector<size_t> pending_images_;
  int32_t num_encode_attempts_ = 0;
  std::set<std::string> bad_encoder_;
  std::string encode_error_;
  std::chrono::system_clock::time_point encode_until_;
  // Per input, the reference of embeddings an encoder staged (empty: none); guarded by mu_
  // once the Reserve and Prefill calls are out.
  std::vector<v1::EmbeddingRef> embedding_refs_;
  // Guarded by mu_ (EndEncode sets them while the Reserve may read them).
  google::protobuf::RepeatedPtrField<v1::MultimodalInput> wire_mm_inputs_;
  // The encode overlaps the worker picks and the Reserve (Start); its state, guarded by mu_:
  // in flight, how it ended, the step waiting for it (ImagesReady), whether the request ended
  // meanwhile (Done), and the Encode call to cancel then.
  bool overlap_ = false;  // set by Start
  bool encoding_ = false;
  absl::Status images_status_;
  std::function<void()> images_waiter_;
  bool flow_done_ = false;
  grpc::ClientContext* encode_context_ = nullptr;
  absl::Status prefill_error_;
  bool finished_ = false;
  int32_t num_prompt_tokens_ = 0;
  int32_t num_cached_tokens_ = 0;
  int32_t num_output_tokens_ = 0;
  std::vector<int32_t> output_token_ids_;  // delivered to the caller, in order
  // Migration: the running attempt resumes from output_token_ids_: re-prefilled by decode_
  // itself (no prefill response), or by a prefill worker from the first num_resumed_ of them
  // (its token not delivered yet while resume_token_pending_). resume_via_prefill_: the next
  // worker pick may try a prefill worker.
  bool resuming_ = false;
  int32_t num_resumed_ = 0;
  bool resume_token_pending_ = false;
  bool resume_via_prefill_ = false;
  std::optional<v1::SamplingParams> resume_sampling_;  // WireSampling's, once resuming_
  int32_t num_migrations_ = 0;
  absl::Status decode_error_;     // this attempt's worker gave up on the request (see above)
  absl::Status migration_error_;  // why the last migration began
  absl::Time migrate_until_;      // the end of the wait for a decode worker to migrate to
};

// DecodeReader: the Decode stream of one attempt. Deletes itself when done.
class RemoteBackend::DecodeReader final : public grpc::ClientReadReactor<v1::TokenOutput> {
 public:
  explicit DecodeReader(std::shared_ptr<Call> call) : call_(std::move(call)) {}

  grpc::ClientContext context;
  v1::DecodeRequest request;

  void Begin() {
    StartRead(&message_);
    StartCall();
  }
  void OnReadDone(bool ok) override {
    if (!ok) return;  // the stream ended: OnDone follows
    if (call_->DecodeMessage(message_)) {
      StartRead(&message_);
    } else {
      context.TryCancel();  // finished: end the stream promptly
    }
  }
  void OnDone(const grpc::Status& status) override {
    call_->DecodeEnded(&context, status);
    delete this;
  }

 private:
  std::shared_ptr<Call> call_;
  v1::TokenOutput message_;
};

void RemoteBackend::Call::StartDecode() {
  decode_streamed_ = false;
  if (!decode_.has_value()) {
    if (prefill_.has_value()) ReleaseOnPrefill(prefill_->prefill_worker_address());
    return FailNoDecode(reserve_error_);
  }
  // A local prefill needs the images' embeddings: wait for their encode (see Start).
  if (!ImagesReady([self = shared_from_this()] { self->StartDecode(); })) return;
  if (absl::Status images = ImagesStatus(); !images.ok()) {
    CancelOnDecode();  // a reservation made while the images were encoded
    if (IsAborted()) {
      Finish(FinishReason::kAbort);
    } else {
      Finish(FinishReason::kError, std::move(images));
    }
    return Done();
  }
  auto* reader = new DecodeReader(shared_from_this());
  reader->context.set_deadline(DeadlineIn(options_.decode_deadline));
  reader->request.set_request_id(id());
  // The reservation's grant token: the decode worker refuses a Decode of a reserved request
  // without it (empty when no Reserve was answered: the call reserves itself).
  reader->request.set_reservation_token(ReservationToken());
  reader->request.mutable_prompt_token_ids()->Add(request_.prompt_token_ids.begin(),
                                                  request_.prompt_token_ids.end());
  *reader->request.mutable_sampling() = WireSampling();
  reader->request.set_cache_salt(request_.cache_salt);
  reader->request.set_priority(request_.priority);
  // Needed unless a Reserve made the session (local prefill, migration, a failed Reserve) —
  // and also then: a reservation that expired on decode_ before this call arrives is made
  // again from this call, whose images must key its KV blocks (so they are always sent).
  WireMmInputs(reader->request.mutable_mm_inputs());
  if (prefill_.has_value()) {
    *reader->request.mutable_prefill() = *prefill_;
    // A migration's prefill: the tokens it prefilled (as the Reserve's; the prefill's token,
    // delivered since, is its first_token).
    AddResumed(reader->request.mutable_resumed_output_token_ids(), num_resumed_);
  } else if (resuming_) {
    AddResumed(reader->request.mutable_resumed_output_token_ids(), num_output_tokens_);
  }
  if (!Attach(&reader->context, decode_->worker_id)) {
    delete reader;
    const absl::Status failure = WorkerFailure(decode_->worker_id);
    if (!IsAborted() && num_output_tokens_ > 0 && CanReusePin()) {
      return RetryDecodeWithPinnedKv();  // decode_ was removed before Decode started
    }
    if (!IsAborted() && num_output_tokens_ > 0 && num_migrations_ < options_.max_migrations) {
      if (prefill_.has_value()) ReleaseOnPrefill(prefill_->prefill_worker_address());
      return Migrate(failure, /*exclude_worker=*/true);
    }
    if (prefill_.has_value()) {
      // Decode never starts: free the prefill worker's pin now rather than at
      // its timeout.
      ReleaseOnPrefill(prefill_->prefill_worker_address());
      CancelOnDecode();
    }
    if (IsAborted()) {
      Finish(FinishReason::kAbort);
      return Done();
    }
    if (num_output_tokens_ == 0) return RetryDecode();
    FailOnWorker(failure);
    return Done();
  }
  decode_stub_->async()->Decode(&reader->context, &reader->request, reader);
  reader->Begin();
}

RemoteBackend::RemoteBackend(WorkerRegistry* registry, RemoteBackendOptions options)
    : registry_(registry),
      options_(options),
      prober_(registry, options.probe_timeout, options.channel_credentials) {
  registry_->OnRemoved([this](const WorkerSnapshot& worker, const absl::Status& why) {
    OnWorkerRemoved(worker, why);
  });
  // A lapsed lease alone cancels nothing: the worker is probed, and removed (its calls
  // cancelled) only when its connection fails.
  registry_->OnLeaseLapsed([this](const WorkerSnapshot& worker) {
    spdlog::warn("{} worker {} ({}) missed its lease: suspect, probing its connection",
                 WorkerRoleName(worker.role), worker.worker_id, worker.address);
    prober_.Suspect(worker);
  });
}

RemoteBackend::~RemoteBackend() {
  registry_->OnRemoved(nullptr);
  registry_->OnLeaseLapsed(nullptr);
  std::vector<std::shared_ptr<Call>> calls;
  {
    std::lock_guard<std::mutex> lock(mu_);
    shutting_down_ = true;
    for (auto& [id, call] : calls_) calls.push_back(call);
  }
  for (auto& call : calls) call->Abort();
  // Every RPC has a deadline, and cancelled ones end at once: this wait is
  // bounded.
  std::unique_lock<std::mutex> lock(mu_);
  idle_cv_.wait(lock, [this] { return calls_.empty(); });
}

absl::Status RemoteBackend::Submit(EngineRequest request, OutputCallback on_output) {
  const int64_t prompt_len = static_cast<int64_t>(request.prompt_token_ids.size());
  if (prompt_len == 0) return absl::InvalidArgumentError("the prompt is empty");
  if (prompt_len >= options_.max_model_len) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the prompt has ", prompt_len, " tokens; this model's maximum context length is ",
        options_.max_model_len, " tokens"));
  }
  if (registry_->CountLive(WorkerRole::kDecode) == 0) {
    return absl::UnavailableError("no decode worker is registered with the router");
  }
  if (!PendingImages(request).empty() && registry_->CountLive(WorkerRole::kEncoder) == 0 &&
      !CanSelfEncode()) {
    return absl::UnavailableError(
        "no encoder worker is registered with the router and no decode worker can encode "
        "images itself: images need one (start `sluice encoder --model DIR --router "
        "HOST:PORT`)");
  }
  // A worker without the capability would drop the grammar and answer unconstrained.
  if (request.grammar != nullptr &&
      registry_->CountLiveWith(WorkerRole::kDecode, kGrammarCapability) == 0) {
    return absl::UnavailableError(
        "no decode worker registered with the router can enforce structured outputs or "
        "tool_choice \"required\"/named (none advertises the 'grammar' capability: upgrade "
        "the workers to this router's version)");
  }
  auto call = std::make_shared<Call>(this, std::move(request), std::move(on_output));
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shutting_down_) return absl::UnavailableError("the router is shutting down");
    if (draining_) {
      return absl::UnavailableError("the router is draining (shutting down); retry on another");
    }
    if (!calls_.emplace(call->id(), call).second) {
      return absl::AlreadyExistsError(
          absl::StrCat("request id '", call->id(), "' is already in flight"));
    }
  }
  if (options_.on_image_request) {
    const size_t num_images = PendingImages(call->request()).size();
    if (num_images > 0) options_.on_image_request(static_cast<int64_t>(num_images));
  }
  call->Start();
  return absl::OkStatus();
}

void RemoteBackend::Abort(const std::string& request_id) {
  std::shared_ptr<Call> call;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = calls_.find(request_id);
    if (it == calls_.end()) return;
    call = it->second;
  }
  call->Abort();
}

std::optional<WorkerSnapshot> PickWorkerFor(WorkerRegistry& registry, KvRouter* kv_router,
                                            WorkerRole role, const EngineRequest& request,
                                            int64_t tokens_needed,
                                            const std::set<std::string>& exclude) {
  // A constrained request goes only to workers that enforce grammars (prefill samples the
  // first token, decode the rest; encoders sample nothing).
  std::set<std::string> excluded;
  const std::set<std::string>* skip = &exclude;
  // Images sent as bytes (self-encode fallback) go only to workers that encode them.
  const bool needs_grammar = request.grammar != nullptr;
  const bool needs_encode = !PendingImages(request).empty();
  if ((needs_grammar || needs_encode) && role != WorkerRole::kEncoder) {
    excluded = exclude;
    for (const WorkerSnapshot& w : registry.List()) {
      if (w.role == role && ((needs_grammar && !w.Has(kGrammarCapability)) ||
                             (needs_encode && !w.Has(kImageEncodeCapability)))) {
        excluded.insert(w.worker_id);
      }
    }
    skip = &excluded;
  }
  if (kv_router == nullptr) return registry.Pick(role, tokens_needed, *skip);
  std::vector<BlockExtraKeySpan> image_keys;
  for (const MultimodalInput& mm : request.mm_inputs) {
    image_keys.push_back({mm.offset, int64_t{mm.offset} + mm.num_tokens, mm.content_hash});
  }
  return kv_router->Pick(role, request.request_id, request.prompt_token_ids, request.cache_salt,
                         tokens_needed, *skip, image_keys);
}

std::optional<WorkerSnapshot> RemoteBackend::PickWorker(WorkerRole role,
                                                        const EngineRequest& request,
                                                        int64_t tokens_needed,
                                                        const std::set<std::string>& exclude) {
  return PickWorkerFor(*registry_, options_.kv_router, role, request, tokens_needed, exclude);
}

bool RemoteBackend::CanSelfEncode() const {
  return options_.self_encode_fallback &&
         registry_->CountLiveWith(WorkerRole::kDecode, kImageEncodeCapability) > 0;
}

void RemoteBackend::ReleaseWorker(const std::string& worker_id, const std::string& request_id) {
  if (options_.kv_router == nullptr) return registry_->Release(worker_id);
  options_.kv_router->Release(worker_id, request_id);
}

void RemoteBackend::Forget(const std::string& request_id) {
  std::lock_guard<std::mutex> lock(mu_);
  calls_.erase(request_id);
  if (calls_.empty()) idle_cv_.notify_all();
}

void RemoteBackend::Count(int64_t RemoteBackendCounters::*counter) {
  std::lock_guard<std::mutex> lock(mu_);
  ++(counters_.*counter);
}

void RemoteBackend::OnWorkerRemoved(const WorkerSnapshot& worker, const absl::Status& why) {
  spdlog::warn("{} worker {} ({}) removed: {}", WorkerRoleName(worker.role), worker.worker_id,
               worker.address, std::string(why.message()));
  std::vector<std::shared_ptr<Call>> calls;
  {
    std::lock_guard<std::mutex> lock(mu_);
    channels_.erase(worker.address);
    for (auto& [id, call] : calls_) calls.push_back(call);
  }
  for (auto& call : calls) call->OnWorkerRemoved(worker.worker_id, why);
}

std::shared_ptr<grpc::Channel> RemoteBackend::ChannelTo(const std::string& address) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& channel = channels_[address];
  if (channel == nullptr) {
    grpc::ChannelArguments args;
    // Fail fast on a dead worker rather than backing off for up to 2 minutes.
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    // Encode replies carry image embeddings inline (LLaVA-1.5: 576 x 4096 floats, 9 MiB each).
    args.SetMaxReceiveMessageSize(256 << 20);
        channel = grpc::CreateCustomChannel(address,
                                        options_.channel_credentials != nullptr
                                            ? options_.channel_credentials
                                            : grpc::InsecureChannelCredentials(),
                                        args);
  }
  return channel;
}

BackendStats RemoteBackend::Stats() const {
  BackendStats stats;
  for (const WorkerSnapshot& worker : registry_->List()) {
    if (worker.role == WorkerRole::kEncoder) continue;  // images, not requests; no KV
    stats.num_waiting_requests += worker.load.num_waiting_requests;
    stats.num_running_requests += worker.load.num_running_requests;
    stats.num_total_blocks += worker.load.num_total_blocks;
    stats.num_free_blocks += worker.load.num_free_blocks;
    if (stats.block_size == 0) stats.block_size = worker.load.block_size;
  }
  return stats;
}

RemoteBackendCounters RemoteBackend::counters() const {
  RemoteBackendCounters counters;
  {
    std::lock_guard<std::mutex> lock(mu_);
    counters = counters_;
  }
  counters.num_workers_dropped = prober_.num_removed();
  return counters;
}

void RemoteBackend::StartDrain() {
  std::lock_guard<std::mutex> lock(mu_);
  draining_ = true;
}

bool RemoteBackend::draining() const {
  std::lock_guard<std::mutex> lock(mu_);
  return draining_;
}

int64_t RemoteBackend::num_in_flight() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(calls_.size());
}

}  // namespace sluice
