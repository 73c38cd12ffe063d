#include "services/decode/decode_service.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <optional>
#include <utility>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "services/serve/log.h"
#include "services/common/misconfigured_peer.h"
#include "services/common/recompute_log.h"
#include "services/common/worker_wire.h"
#include "transfer/block_runs.h"
#include "transfer/block_runs_wire.h"
#include "proto/grpc_status.h"

namespace sluice {
namespace {

std::chrono::system_clock::time_point DeadlineAfter(absl::Duration d) {
  return std::chrono::system_clock::now() + absl::ToChronoMicroseconds(d);
}

const char* ModeName(v1::KvTransferMode mode) {
  switch (mode) {
    case v1::KV_TRANSFER_MODE_PUSH:
      return "push";
    case v1::KV_TRANSFER_MODE_LAYERWISE:
      return "layerwise";
    default:
      return "pull";
  }
}

// OutcomeOf: a final stream message as a request outcome (sluice_worker_requests_total).
absl::Status OutcomeOf(const v1::TokenOutput& message) {
  switch (message.finish_reason()) {
    case v1::FINISH_REASON_ABORT:
      return absl::CancelledError("aborted");
    case v1::FINISH_REASON_ERROR:
      return absl::Status(static_cast<absl::StatusCode>(message.error().code()),
                          message.error().message());
    default:
      return absl::OkStatus();
  }
}

}  // namespace

const char* RecomputeReasonName(RecomputeReason reason) {
  switch (reason) {
    case RecomputeReason::kPinGone:
      return "pin_gone";
    case RecomputeReason::kAckFailed:
      return "ack_failed";
    case RecomputeReason::kTransferTimeout:
      return "transfer_timeout";
    case RecomputeReason::kReservationExpired:
      return "reservation_expired";
    case RecomputeReason::kTransferFailed:
      return "transfer_failed";
    case RecomputeReason::kStagingCopyFailed:
      return "staging_copy_failed";
  }
  return "transfer_failed";
}

// DecodeWriter: the Decode call's stream. One write in flight; queued messages follow in order;
// Finish after the final message (or with an error status).
class DecodeWriter final : public grpc::ServerWriteReactor<v1::TokenOutput> {
 public:
  explicit DecodeWriter(std::shared_ptr<DecodeSession> session) : session_(std::move(session)) {}

  void Push(v1::TokenOutput message, bool final) {
    std::lock_guard<std::mutex> lock(mu_);
    if (final) {
      end_ = grpc::Status::OK;
      if (!outcome_.has_value()) outcome_ = OutcomeOf(message);
    }
    queue_.push_back(std::move(message));
    MaybeWriteLocked();
  }
  void End(grpc::Status status) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!end_.has_value()) {
      if (!outcome_.has_value()) outcome_ = FromGrpc(status);
      end_ = std::move(status);
    }
    MaybeWriteLocked();
  }

  void OnWriteDone(bool ok) override {
    std::lock_guard<std::mutex> lock(mu_);
    writing_ = false;
    if (!ok) {
      queue_.clear();
      end_ = grpc::Status(grpc::StatusCode::CANCELLED, "stream broken");
    }
    MaybeWriteLocked();
  }
  void OnCancel() override;
  void OnDone() override;

 private:
  void MaybeWriteLocked() {
    if (writing_ || finished_) return;
    if (!queue_.empty()) {
      current_ = std::move(queue_.front());
      queue_.pop_front();
      writing_ = true;
      StartWrite(&current_);
    } else if (end_.has_value()) {
      finished_ = true;
      Finish(*end_);
    }
  }

  std::shared_ptr<DecodeSession> session_;
  std::mutex mu_;
  std::deque<v1::TokenOutput> queue_;
  v1::TokenOutput current_;
  bool writing_ = false;
  bool finished_ = false;
  std::optional<grpc::Status> end_;
  std::optional<absl::Status> outcome_;  // the request's outcome, once known
};

// DecodeSession: one request's state across Reserve, the KV pull and the Decode stream.
class DecodeSession : public std::enable_shared_from_this<DecodeSession> {
 public:
  enum class State { kReserving, kReserved, kTransferring, kRunning, kFailed };

  // `grant`: the reservation's grant id (Reserve), empty for a session a Decode call started.
  // An empty `engine_id` makes a session that only carries an error or a final message to its
  // call: it never aborts an engine request.
  DecodeSession(DecodeService* service, std::string id, std::string engine_id,
                std::string grant = "")
      : service_(service), id_(std::move(id)), engine_id_(std::move(engine_id)),
        grant_(std::move(grant)) {}
  const std::string& id() const { return id_; }
  const std::string& engine_id() const { return engine_id_; }
  const std::string& grant() const { return grant_; }
  DecodeService* service() const { return service_; }
  // Finished: failed, or its final output went out (it holds no blocks any more).
  bool Finished() {
    std::lock_guard<std::mutex> lock(mu_);
    return state_ == State::kFailed;
  }

  // Engine thread: a reservation result.
  void OnReserved(absl::StatusOr<std::vector<int32_t>> blocks) {
    std::function<void(const absl::StatusOr<std::vector<int32_t>>&)> reply;
    bool start = false;
    bool expire = false;
    DecodeWriter* writer = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      reply = std::move(reserve_reply_);
      if (blocks.ok()) {
        blocks_ = *blocks;
        reserved_at_ = absl::Now();
        state_ = State::kReserved;
        start = prefill_.has_value() && !cancelled_;
        expire = !attached_once_;
      } else {
        state_ = State::kFailed;
        writer = writer_;
      }
    }
    // A failed reservation leaves the service before its calls learn of it (see OnOutput).
    if (!blocks.ok()) service_->Forget(id_, this);
    if (reply) reply(blocks);
    if (!blocks.ok() && writer != nullptr) EndWriter(ToGrpc(blocks.status()));
    if (expire) service_->ExpireUnclaimed(shared_from_this());
    if (start) Transfer();
  }

  // The reservation timeout ran out: free the blocks unless a Decode claimed them.
  void ExpireIfUnclaimed() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (attached_once_ || state_ != State::kReserved) return;
    }
    spdlog::warn("reservation of request {} not claimed by a Decode in time: freed", id_);
    Cancel();
  }

  // Engine thread: outputs of the request.
  void OnOutput(const RequestOutput& out) {
    v1::TokenOutput message;
    OutputToWire(out, &message);
    message.set_request_id(id_);
    const bool final = out.finished();
    const absl::Time now = absl::Now();
    // Before the final message goes out: once the call ends, its owner may destroy the service
    // (TSan saw ~DecodeService race this Forget).
    if (final) service_->Forget(id_, this);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (out.queue_seconds >= 0) queue_seconds_ = out.queue_seconds;
      num_generated_ += static_cast<int64_t>(out.new_tokens.size());
      if (out.finish_reason != FinishReason::kAbort &&
          out.finish_reason != FinishReason::kError && !out.new_tokens.empty()) {
        ObserveStepLocked(now);
      }
      if (final) ObserveEndLocked(out, now);
      if (writer_ != nullptr) {
        writer_->Push(std::move(message), final);
      } else {
        buffered_.push_back(std::move(message));
        buffered_final_ = buffered_final_ || final;
      }
      if (final) state_ = State::kFailed;  // done: no more transitions
    }
  }

  // ObserveStepLocked: the first output after a remote prefill ends the handover; later ones are
  // inter-token latencies.
  void ObserveStepLocked(absl::Time now) {
    WorkerMetrics* metrics = service_->metrics();
    if (last_output_ != absl::InfinitePast()) {
      metrics->ObserveInterTokenLatency(absl::ToDoubleSeconds(now - last_output_));
    } else {
      if (prefill_finished_ != absl::InfinitePast()) {
        metrics->ObserveHandover(absl::ToDoubleSeconds(now - prefill_finished_));
      }
      first_output_ = now;
      if (attached_at_ != absl::InfinitePast()) {
        metrics->ObserveTimeToFirstToken(absl::ToDoubleSeconds(now - attached_at_));
      }
    }
    last_output_ = now;
  }

  // ObserveEndLocked: the vllm: view of this worker's part of the request. Its arrival is the
  // Decode call; queue = Decode call -> first scheduled (the KV transfer wait included): the
  // engine counts from the reservation, which may precede the call.
  void ObserveEndLocked(const RequestOutput& out, absl::Time now) {
    if (attached_at_ == absl::InfinitePast()) return;  // never claimed: no request here
    FinishedRequest end;
    end.finish_reason = out.finish_reason;
    end.num_prompt_tokens = out.num_prompt_tokens;
    end.num_generation_tokens = num_generated_;
    end.e2e_seconds = absl::ToDoubleSeconds(now - attached_at_);
    if (queue_seconds_ >= 0) {
      const double before_call = reserved_at_ != absl::InfinitePast() && reserved_at_ < attached_at_
                                     ? absl::ToDoubleSeconds(attached_at_ - reserved_at_)
                                     : 0.0;
      end.queue_seconds = std::max(0.0, queue_seconds_ - before_call);
    }
    if (first_output_ != absl::InfinitePast()) {
      end.prefill_seconds = std::max(0.0, absl::ToDoubleSeconds(first_output_ - attached_at_) -
                                              std::max(0.0, end.queue_seconds));
      end.decode_seconds = absl::ToDoubleSeconds(last_output_ - first_output_);
    }
    service_->metrics()->ObserveFinished(end);
  }

  // Decode call attached: replay buffered outputs. Returns false if another writer exists.
  bool Attach(DecodeWriter* writer, std::optional<v1::PrefillResponse> prefill,
              absl::Duration transfer_timeout) {
    bool start = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (writer_ != nullptr || attached_once_) return false;
      attached_once_ = true;
      attached_at_ = absl::Now();
      writer_ = writer;
      prefill_ = std::move(prefill);
      if (prefill_.has_value() && prefill_->prefill_finished_unix_us() > 0) {
        prefill_finished_ = absl::FromUnixMicros(prefill_->prefill_finished_unix_us());
      }
      transfer_timeout_ = transfer_timeout;
      for (size_t i = 0; i < buffered_.size(); ++i) {
        writer->Push(std::move(buffered_[i]), buffered_final_ && i + 1 == buffered_.size());
      }
      buffered_.clear();
      start = state_ == State::kReserved && prefill_.has_value();
    }
    if (start) Transfer();
    return true;
  }

  void DetachWriter(DecodeWriter* writer) {
    std::lock_guard<std::mutex> lock(mu_);
    if (writer_ == writer) writer_ = nullptr;
  }

  // Client went away (stream cancel or Cancel RPC): abort unless a pull is running (then the
  // pull's completion reports Cancelled to the engine, which frees the blocks).
  void Cancel() {
    if (engine_id_.empty()) return;  // an error-only session: nothing in the engine
    bool abort = false;
    // A reservation whose KV a prefill worker may still be pushing layer by layer (layerwise
    // mode, no answer that the push ended): freed only once no push can write into it.
    absl::Time reserved_at = absl::InfinitePast();
    {
      std::lock_guard<std::mutex> lock(mu_);
      // Its engine request already ended (final output, failed reservation): an abort now
      // would hit whatever request reuses the engine id since, e.g. the local re-prefill the
      // router starts here right after this request's reservation expired, when the old
      // stream's cancel arrives late.
      if (state_ == State::kFailed) return;
      cancelled_ = true;
      abort = state_ != State::kTransferring;
      const bool pushed = prefill_.has_value() && prefill_->kv_pushed();
      if (state_ == State::kReserved && !pushed) reserved_at = reserved_at_;
    }
    if (!abort) return;
    if (reserved_at != absl::InfinitePast()) {
      service_->AbortReservation(shared_from_this(), reserved_at);
    } else {
      service_->engine()->Abort(engine_id_);
    }
  }

  void set_reserve_reply(std::function<void(const absl::StatusOr<std::vector<int32_t>>&)> reply) {
    std::lock_guard<std::mutex> lock(mu_);
    reserve_reply_ = std::move(reply);
  }

  // Transfer job state accessors (pool thread).
  struct TransferJob {
    v1::PrefillResponse prefill;
    std::vector<int32_t> blocks;
    absl::Duration timeout;
    // The Decode claimed the reservation (or the blocks came, if later): the transfer's time
    // counts from here.
    absl::Time claimed_at;
    // The client cancelled before the transfer began: Cancel() already aborted the reservation
    // (its blocks are being freed), so nothing may be written into them; only ack the prefill.
    bool cancelled = false;
  };
  std::optional<TransferJob> BeginTransfer() {
    std::lock_guard<std::mutex> lock(mu_);
    if (state_ != State::kReserved || !prefill_.has_value()) return std::nullopt;
    if (!cancelled_) state_ = State::kTransferring;
    return TransferJob{*prefill_, blocks_, transfer_timeout_,
                       std::max(attached_at_, reserved_at_), cancelled_};
  }
  // After the pull: whether the client cancelled meanwhile.
  bool EndTransfer() {
    std::lock_guard<std::mutex> lock(mu_);
    state_ = State::kRunning;
    return cancelled_;
  }

 private:
  void Transfer() { service_->StartTransfer(shared_from_this()); }
  void EndWriter(grpc::Status status) {
    std::lock_guard<std::mutex> lock(mu_);
    if (writer_ != nullptr) writer_->End(std::move(status));
  }

  DecodeService* service_;
  const std::string id_;
  const std::string engine_id_;
  const std::string grant_;
  std::mutex mu_;
  State state_ = State::kReserving;
  std::vector<int32_t> blocks_;
  absl::Time reserved_at_ = absl::InfinitePast();
  absl::Time attached_at_ = absl::InfinitePast();  // the Decode call claimed the session
  absl::Time prefill_finished_ = absl::InfinitePast();  // remote prefill's first token
  absl::Time last_output_ = absl::InfinitePast();       // last output with a step's result
  absl::Time first_output_ = absl::InfinitePast();      // first output with a step's result
  double queue_seconds_ = -1;                           // the engine's (from the reservation)
  int64_t num_generated_ = 0;                           // tokens this worker streamed
  std::optional<v1::PrefillResponse> prefill_;
  absl::Duration transfer_timeout_;
  bool cancelled_ = false;
  bool attached_once_ = false;
  DecodeWriter* writer_ = nullptr;
  std::vector<v1::TokenOutput> buffered_;
  bool buffered_final_ = false;
  std::function<void(const absl::StatusOr<std::vector<int32_t>>&)> reserve_reply_;
};

// ReserveReactor: the Reserve call. Its answer carries the reservation's token, the only key
// that claims or cancels the blocks: when the call ends without its status reaching the caller
// (the caller cancelled, its deadline passed or the connection broke after the token was
// issued), nobody holds the token, so the reservation is freed at once rather than at
// reserve_timeout. gRPC reports this to the server (IsCancelled in OnDone), so the caller needs
// no token for it and the token check stays as strict.
class ReserveReactor final : public grpc::ServerUnaryReactor {
 public:
  explicit ReserveReactor(grpc::CallbackServerContext* context) : context_(context) {}

  // The session whose token this call's answer carries (set just before Finish(OK)).
  void set_granted(std::weak_ptr<DecodeSession> session) {
    std::lock_guard<std::mutex> lock(mu_);
    granted_ = std::move(session);
  }
  void OnDone() override;

 private:
  grpc::CallbackServerContext* const context_;
  std::mutex mu_;
  std::weak_ptr<DecodeSession> granted_;
};

void ReserveReactor::OnDone() {
  std::shared_ptr<DecodeSession> session;
  {
    std::lock_guard<std::mutex> lock(mu_);
    session = granted_.lock();
  }
  if (session != nullptr && context_->IsCancelled()) {
    spdlog::warn("request {}: the Reserve's answer (and its token) did not reach the caller: "
                 "reservation freed",
                 session->id());
    session->Cancel();
  }
  delete this;
}

void DecodeWriter::OnCancel() { session_->Cancel(); }
void DecodeWriter::OnDone() {
  session_->DetachWriter(this);
  session_->service()->metrics()->CountOutcome(
      outcome_.value_or(absl::CancelledError("stream ended early")));
  delete this;
}

DecodeService::DecodeService(AsyncEngine* engine, transfer::KvTransferAgent* agent,
                             std::vector<transfer::KvRegion> regions, std::string kv_descriptor,
                             WorkerMetrics* metrics, DecodeServiceOptions options)
    : engine_(engine),
      agent_(agent),
      regions_(std::move(regions)),
      kv_descriptor_(std::move(kv_descriptor)),
      metrics_(metrics),
      options_(options),
      pool_(options.transfer_threads) {
  transfer_region_indices_ = TransferRegionIndices(engine->model(), options.swa_replay_tokens);
}

DecodeService::~DecodeService() = default;

int64_t DecodeService::num_sessions() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(sessions_.size());
}

bool DecodeService::WasCancelled(const std::string& request_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = cancelled_.find(request_id);
  return it != cancelled_.end() && it->second >= absl::Now();
}

void DecodeService::Forget(const std::string& request_id, const DecodeSession* session) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sessions_.find(request_id);
  if (it != sessions_.end() && it->second.get() == session) sessions_.erase(it);
}

std::shared_ptr<DecodeSession> DecodeService::NewSession(const v1::DecodeRequest& request,
                                                         std::vector<MultimodalInput> mm_inputs,
                                                         absl::Status* error) {
  const std::string& request_id = request.request_id();
  absl::StatusOr<std::shared_ptr<const grammar::CompiledGrammar>> grammar =
      RequestGrammar(options_.grammars, request.sampling());
  if (!grammar.ok()) {
    *error = grammar.status();
    return nullptr;
  }
  auto session = std::make_shared<DecodeSession>(this, request_id, request_id);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!sessions_.emplace(request_id, session).second) {
      *error = absl::AlreadyExistsError(absl::StrCat("request '", request_id, "' exists"));
      return nullptr;
    }
  }
  EngineRequest er =
      EngineRequestFromWire(request, request_id, *std::move(grammar), std::move(mm_inputs));
  engine_->ReserveForTransfer(
      std::move(er), std::nullopt, absl::Now() + options_.reserve_timeout,
      [session](absl::StatusOr<std::vector<int32_t>> blocks) {
        session->OnReserved(std::move(blocks));
      },
      [session](const RequestOutput& out) { session->OnOutput(out); });
  return session;
}

grpc::ServerUnaryReactor* DecodeService::Reserve(grpc::CallbackServerContext* context,
                                                 const v1::ReserveRequest* request,
                                                 v1::ReserveResponse* response) {
  auto* reactor = new ReserveReactor(context);  // deletes itself in OnDone
  if (draining_.load()) {
    reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "decode worker is draining"));
    return reactor;
  }
  if (context->IsCancelled() || WasCancelled(request->request_id())) {
    // The caller gave up (and sent Cancel, which may have overtaken this call): reserving now
    // would hold blocks nobody claims until the reservation timeout.
    reactor->Finish(grpc::Status(grpc::StatusCode::CANCELLED, "request was cancelled"));
    return reactor;
  }
  absl::StatusOr<std::shared_ptr<const grammar::CompiledGrammar>> grammar =
      RequestGrammar(options_.grammars, request->sampling());
  if (!grammar.ok()) {
    reactor->Finish(ToGrpc(grammar.status()));
    return reactor;
  }
  absl::StatusOr<std::vector<MultimodalInput>> mm_inputs = MmInputsFromWire(request->mm_inputs());
  if (mm_inputs.ok()) {
    // Images sent as bytes (self-encode fallback): kept as bytes. The prefill worker encodes
    // them; the engine here encodes them only if it computes their positions itself (a failed
    // or expired transfer, a preemption), off this thread.
    if (absl::Status s = CheckImages(options_.images, *mm_inputs); !s.ok()) mm_inputs = s;
  }
  if (mm_inputs.ok()) NoteWireInputs(options_.images, request->mm_inputs());
  if (!mm_inputs.ok()) {
    reactor->Finish(ToGrpc(mm_inputs.status()));
    return reactor;
  }
  // The reply is set before reserving could complete: NewSession's engine op runs later.
  // The grant: a new serial per reservation, so a re-reservation of the same request id gets a
  // new token and the old one (of an expired or cancelled reservation) opens nothing.
  const std::string grant =
      absl::StrCat("reservation ", request->request_id(), "#", next_grant_.fetch_add(1));
  auto session = std::make_shared<DecodeSession>(this, request->request_id(),
                                                 request->request_id(), grant);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!sessions_.emplace(request->request_id(), session).second) {
      reactor->Finish(grpc::Status(grpc::StatusCode::ALREADY_EXISTS, "request exists"));
      return reactor;
    }
  }
  const v1::KvLayout layout = LayoutOf(engine_->kv_cache(), engine_->model().KvDtypeBytes());
  // The KV the transfer brings: the prompt, and a migration's resumed outputs.
  const int32_t num_tokens =
      request->prompt_token_ids_size() + request->resumed_output_token_ids_size();
  std::weak_ptr<DecodeSession> weak = session;
  session->set_reserve_reply([this, context, reactor, response, layout, num_tokens, grant, weak](
                                 const absl::StatusOr<std::vector<int32_t>>& blocks) {
    if (!blocks.ok()) {
      reactor->Finish(ToGrpc(blocks.status()));
      return;
    }
    if (context->IsCancelled()) {
      // The caller gave up (or its deadline passed) while the blocks were awaited: nobody
      // learns the token, so nobody could claim or cancel them; free them now.
      if (std::shared_ptr<DecodeSession> s = weak.lock()) s->Cancel();
      reactor->Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the Reserve call was cancelled"));
      return;
    }
    response->set_reservation_token(tokens_.Issue(grant));
    v1::KvBlocks* kv = response->mutable_kv();
    kv->set_kv_descriptor(kv_descriptor_);
    transfer::RunsToWire(*blocks, kv);
    *kv->mutable_layout() = layout;
    kv->set_num_tokens(num_tokens);
    reactor->set_granted(weak);
    if (options_.test_reserve_answer_delay > absl::ZeroDuration()) {
      pool_.PostAt(absl::Now() + options_.test_reserve_answer_delay,
                   [reactor] { reactor->Finish(grpc::Status::OK); });
      return;
    }
    reactor->Finish(grpc::Status::OK);
  });
  EngineRequest er = EngineRequestFromWire(*request, request->request_id(), *std::move(grammar),
                                           *std::move(mm_inputs));
  // The caller may bound the wait for free blocks (it has other decode workers to try).
  const absl::Duration wait =
      request->max_wait_ms() > 0
          ? std::min(absl::Milliseconds(request->max_wait_ms()), options_.reserve_timeout)
          : options_.reserve_timeout;
  engine_->ReserveForTransfer(
      std::move(er), std::nullopt, absl::Now() + wait,
      [session](absl::StatusOr<std::vector<int32_t>> blocks) {
        session->OnReserved(std::move(blocks));
      },
      [session](const RequestOutput& out) { session->OnOutput(out); });
  return reactor;
}

grpc::ServerUnaryReactor* DecodeService::Cancel(grpc::CallbackServerContext* context,
                                                const v1::CancelRequest* request,
                                                v1::CancelResponse* response) {
  std::shared_ptr<DecodeSession> session;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = sessions_.find(request->request_id());
    if (it != sessions_.end()) {
      session = it->second;
    } else {
      // Unknown: the Reserve or Decode it cancels may still be on its way; refuse it then.
      const absl::Time now = absl::Now();
      for (auto c = cancelled_.begin(); c != cancelled_.end();) {
        c = c->second < now ? cancelled_.erase(c) : std::next(c);
      }
      cancelled_[request->request_id()] = now + options_.cancel_memory;
    }
  }
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (session != nullptr && !session->Finished()) {
    absl::Status granted = CheckGrant(*session, request->reservation_token(), "Cancel");
    if (!granted.ok()) {
      reactor->Finish(ToGrpc(granted));
      return reactor;
    }
  }
  response->set_found(session != nullptr);
  if (session != nullptr) session->Cancel();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerWriteReactor<v1::TokenOutput>* DecodeService::Decode(
    grpc::CallbackServerContext* context, const v1::DecodeRequest* request) {
  const std::string id = request->request_id();
  std::shared_ptr<DecodeSession> existing;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = sessions_.find(id);
    if (it != sessions_.end()) existing = it->second;
  }
  // A session under this id (reserved, or decoding) is touched only with its grant's token:
  // refused before any of the paths below cancels, claims or replaces it.
  if (existing != nullptr && !existing->Finished()) {
    absl::Status granted = CheckGrant(*existing, request->reservation_token(), "Decode");
    if (!granted.ok()) return EndCall(id, ToGrpc(granted));
  }
  const bool remote = request->has_prefill() && request->prefill().kv().runs_size() > 0;
  if (request->has_prefill() && !remote) {
    // Prefill already finished the request with its first token: nothing to decode.
    if (existing != nullptr) existing->Cancel();
    auto* writer = new DecodeWriter(std::make_shared<DecodeSession>(this, id, ""));
    v1::TokenOutput done;
    done.set_request_id(id);
    done.set_finish_reason(request->prefill().finish_reason());
    writer->Push(std::move(done), /*final=*/true);
    return writer;
  }
  if (existing == nullptr && WasCancelled(id)) {
    return EndCall(id, grpc::Status(grpc::StatusCode::CANCELLED, "request was cancelled"));
  }
  if (draining_.load() && existing == nullptr) {
    return EndCall(id, grpc::Status(grpc::StatusCode::UNAVAILABLE, "decode worker is draining"));
  }
  const absl::Duration transfer_timeout =
      request->transfer_timeout_ms() > 0 ? absl::Milliseconds(request->transfer_timeout_ms())
                                         : options_.transfer_timeout;
  absl::StatusOr<std::vector<MultimodalInput>> mm_inputs = MmInputsFromWire(request->mm_inputs());
  // A Decode that claims a reservation uses the Reserve's inputs. Images as bytes are encoded
  // by the engine only if it prefills them here (a local run, a recompute).
  if (mm_inputs.ok() && !(remote && existing != nullptr)) {
    if (absl::Status s = CheckImages(options_.images, *mm_inputs); !s.ok()) mm_inputs = s;
    if (mm_inputs.ok()) NoteWireInputs(options_.images, request->mm_inputs());
  }
  if (!mm_inputs.ok()) {
    if (existing != nullptr) existing->Cancel();
    return EndCall(id, ToGrpc(mm_inputs.status()));
  }
  if (remote) {
    absl::Status error;
    std::shared_ptr<DecodeSession> session = existing;
    if (session == nullptr) {
      session = NewSession(*request, *std::move(mm_inputs), &error);
    }
    if (session == nullptr) return EndCall(id, ToGrpc(error));
    auto* writer = new DecodeWriter(session);
    if (!session->Attach(writer, request->prefill(), transfer_timeout)) {
      writer->End(grpc::Status(grpc::StatusCode::ALREADY_EXISTS, "request is being decoded"));
    } else if (context->IsCancelled()) {
      session->Cancel();  // cancelled before this handler ran: free the reservation now
    }
    return writer;
  }
  // Local: prefill and decode here (all tokens streamed). A stale reservation under the same id
  // (remote prefill failed) is dropped; the local run uses its own engine id.
  absl::StatusOr<std::shared_ptr<const grammar::CompiledGrammar>> grammar =
      RequestGrammar(options_.grammars, request->sampling());
  if (!grammar.ok()) {
    if (existing != nullptr) existing->Cancel();
    return EndCall(id, ToGrpc(grammar.status()));
  }
  if (existing != nullptr) existing->Cancel();
  const std::string engine_id = existing != nullptr ? absl::StrCat(id, "#local") : id;
  auto session = std::make_shared<DecodeSession>(this, id, engine_id);
  auto* writer = new DecodeWriter(session);
  session->Attach(writer, std::nullopt, transfer_timeout);
  {
    std::lock_guard<std::mutex> lock(mu_);
    sessions_[id] = session;
  }
  EngineRequest er =
      EngineRequestFromWire(*request, engine_id, *std::move(grammar), *std::move(mm_inputs));
  absl::Status s = engine_->Submit(std::move(er),
                                   [session](const RequestOutput& out) { session->OnOutput(out); });
  if (!s.ok()) {
    Forget(id, session.get());
    writer->End(ToGrpc(s));
  }
  return writer;
}

grpc::ServerWriteReactor<v1::TokenOutput>* DecodeService::EndCall(const std::string& request_id,
                                                                 grpc::Status status) {
  // No engine id: cancelling this call must not abort the request's real session.
  auto* writer = new DecodeWriter(std::make_shared<DecodeSession>(this, request_id, ""));
  writer->End(std::move(status));
  return writer;
}

absl::Status DecodeService::CheckGrant(const DecodeSession& session, const std::string& token,
                                       const char* call) const {
  if (session.grant().empty()) {
    return absl::PermissionDeniedError(absl::StrCat(
        call, " of request '", session.id(),
        "' refused: its decode was started by a Decode call without a reservation, and only "
        "cancelling that call ends it"));
  }
  return tokens_.Check(session.grant(), token,
                       absl::StrCat(call, " of request '", session.id(), "'"));
}

v1::PrefillWorker::Stub* DecodeService::PrefillStub(const std::string& address) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& stub = stubs_[address];
  if (stub == nullptr) {
    stub = v1::PrefillWorker::NewStub(
        grpc::CreateChannel(address, options_.channel_credentials != nullptr
                                         ? options_.channel_credentials
                                         : grpc::InsecureChannelCredentials()));
  }
  return stub.get();
}

absl::Status DecodeService::SendRelease(const std::string& request_id,
                                        const v1::PrefillResponse& prefill) {
  const std::string& prefill_address = prefill.prefill_worker_address();
  grpc::ClientContext context;
  context.set_deadline(DeadlineAfter(options_.release_timeout));
  v1::ReleaseRequest release;
  release.set_request_id(request_id);
  release.set_transfer_token(prefill.kv().transfer_token());
  v1::ReleaseResponse released;
  const grpc::Status status = PrefillStub(prefill_address)->Release(&context, release, &released);
  if (!status.ok()) return FromGrpc(status);
  if (!released.released()) {
    return absl::NotFoundError(absl::StrCat("prefill worker ", prefill_address,
                                            " held no KV blocks for request ", request_id));
  }
  return absl::OkStatus();
}

absl::Status DecodeService::PullKv(const v1::PrefillResponse& prefill,
                                   const std::vector<int32_t>& blocks, absl::Time deadline) {
  const v1::KvBlocks& kv = prefill.kv();
  // The dtype too: a bf16 device cache (CUDA runner) never pairs with a float32 host one.
  const v1::KvLayout own = LayoutOf(engine_->kv_cache(), engine_->model().KvDtypeBytes());
  if (!SameKvLayout(kv.layout(), own)) {
    return MisconfiguredPeerError(absl::StrCat(
        "KV layout mismatch: prefill worker ", prefill.prefill_worker_address(), " has ",
        DescribeKvLayout(kv.layout()), "; this decode worker ", DescribeKvLayout(own)));
  }
  // With SWA replay only the full-attention layers' regions (the engine replays the rest).
  absl::StatusOr<TransferRegions> moved =
      ParseTransferRegions(kv.kv_descriptor(), regions_, transfer_region_indices_);
  if (!moved.ok()) return moved.status();
  // The runs come from the prefill worker: checked (ids in range, at most the reservation).
  absl::StatusOr<std::vector<transfer::BlockRun>> remote_runs =
      transfer::RunsFromWire(kv, static_cast<int64_t>(blocks.size()));
  if (!remote_runs.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("prefill sent bad KV blocks: ",
                                                   remote_runs.status().message()));
  }
  const int64_t n = transfer::TotalBlocks(*remote_runs);
  std::vector<int32_t> local(blocks.begin(), blocks.begin() + n);
  const std::vector<transfer::BlockRun> local_runs = transfer::CoalesceBlocks(local);
  if (options_.staging != nullptr) {
    return options_.staging->Pull(moved->remote, *remote_runs, moved->local, local_runs, deadline);
  }
  return agent_->Pull(moved->remote, *remote_runs, moved->local, local_runs, deadline);
}

absl::Status DecodeService::RequestPush(const std::string& request_id,
                                        const v1::PrefillResponse& prefill,
                                        const std::vector<int32_t>& blocks, absl::Time deadline,
                                        absl::Time* safe_at) {
  absl::StatusOr<std::vector<transfer::BlockRun>> pinned =
      transfer::RunsFromWire(prefill.kv(), static_cast<int64_t>(blocks.size()));
  if (!pinned.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("prefill pinned bad KV blocks: ",
                                                   pinned.status().message()));
  }
  const int64_t n = transfer::TotalBlocks(*pinned);
  const absl::Time sent = absl::Now();
  const absl::Duration timeout = deadline - options_.push_grace - sent;
  if (timeout < absl::Milliseconds(1)) {
    return absl::DeadlineExceededError("no time left to push the KV before the reservation ends");
  }
  v1::PushKvRequest request;
  request.set_request_id(request_id);
  request.set_transfer_token(prefill.kv().transfer_token());
  v1::KvBlocks* destination = request.mutable_destination();
  destination->set_kv_descriptor(kv_descriptor_);
  transfer::RunsToWire(absl::MakeConstSpan(blocks).first(static_cast<size_t>(n)), destination);
  *destination->mutable_layout() = LayoutOf(engine_->kv_cache(), engine_->model().KvDtypeBytes());
  destination->set_num_tokens(prefill.kv().num_tokens());
  request.set_timeout_ms(static_cast<int32_t>(absl::ToInt64Milliseconds(timeout)));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(deadline));
  v1::PushKvResponse response;
  const grpc::Status status =
      PrefillStub(prefill.prefill_worker_address())->PushKv(&context, request, &response);
  if (status.ok()) return absl::OkStatus();
  const absl::Status failed(static_cast<absl::StatusCode>(status.error_code()),
                            absl::StrCat("KV push from prefill worker ",
                                         prefill.prefill_worker_address(),
                                         " failed: ", status.error_message()));
  // PushKv refuses with FAILED_PRECONDITION only for settings the two workers do not share
  // (its --kv-transfer-mode, the KV layout): the deployment's fault.
  if (status.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
    return AsMisconfiguredPeer(failed);
  }
  switch (status.error_code()) {
    case grpc::StatusCode::FAILED_PRECONDITION:
    case grpc::StatusCode::NOT_FOUND:
    case grpc::StatusCode::INVALID_ARGUMENT:
      break;  // refused before any put was posted
    default:
      // No proof the put ended (the call may have failed in transport while the push runs): it
      // is cancelled by timeout after the prefill worker received the call; the grace covers
      // the delivery delay.
      *safe_at = sent + timeout + options_.push_grace;
  }
  return failed;
}

void DecodeService::ExpireUnclaimed(const std::shared_ptr<DecodeSession>& session) {
  std::weak_ptr<DecodeSession> weak = session;
  pool_.PostAt(absl::Now() + options_.reserve_timeout, [weak] {
    if (std::shared_ptr<DecodeSession> s = weak.lock()) s->ExpireIfUnclaimed();
  });
}

void DecodeService::AbortReservation(const std::shared_ptr<DecodeSession>& session,
                                     absl::Time reserved_at) {
  const absl::Time safe_at = reserved_at + options_.reserve_timeout;
  if (options_.transfer_mode != v1::KV_TRANSFER_MODE_LAYERWISE || safe_at <= absl::Now()) {
    engine_->Abort(session->engine_id());
    return;
  }
  std::weak_ptr<DecodeSession> weak = session;
  pool_.PostAt(safe_at, [this, weak] {
    std::shared_ptr<DecodeSession> s = weak.lock();
    if (s != nullptr && !s->Finished()) engine_->Abort(s->engine_id());
  });
}

void DecodeService::StartTransfer(std::shared_ptr<DecodeSession> session) {
  if (options_.test_transfer_delay > absl::ZeroDuration()) {
    pool_.PostAt(absl::Now() + options_.test_transfer_delay,
                 [this, session] { RunTransfer(session); });
    return;
  }
  pool_.Post([this, session] { RunTransfer(session); });
}

void DecodeService::RunTransfer(const std::shared_ptr<DecodeSession>& session) {
  {
    std::optional<DecodeSession::TransferJob> job = session->BeginTransfer();
    if (!job.has_value()) return;
    const v1::PrefillResponse& prefill = job->prefill;
    if (job->cancelled) {
      // The client left before the transfer: the pin is of no use. NotFound is the usual
      // answer (the router releases the pin itself when it aborts a request); any other
      // failure leaves the prefill worker's blocks pinned until its --kv-pin-timeout-s.
      absl::Status released = SendRelease(session->id(), prefill);
      if (!released.ok() && !absl::IsNotFound(released)) {
        spdlog::warn("request {}: cancelled before its KV transfer, but the ack to prefill "
                     "worker {} failed ({}): its pinned blocks stay until its "
                     "--kv-pin-timeout-s",
                     session->id(), prefill.prefill_worker_address(), released.ToString());
      }
      return;
    }
    const v1::KvTransferMode theirs =
        prefill.kv_transfer_mode() == v1::KV_TRANSFER_MODE_PUSH ||
                prefill.kv_transfer_mode() == v1::KV_TRANSFER_MODE_LAYERWISE
            ? prefill.kv_transfer_mode()
            : v1::KV_TRANSFER_MODE_PULL;
    // Layerwise mode falls back to a push (PushKv) when the KV did not land during the prefill.
    const bool push = options_.transfer_mode == v1::KV_TRANSFER_MODE_PUSH ||
                      options_.transfer_mode == v1::KV_TRANSFER_MODE_LAYERWISE;
    // Layerwise mode: every layer landed in this reservation before prefill answered.
    const bool landed = theirs == v1::KV_TRANSFER_MODE_LAYERWISE && prefill.kv_pushed();
    const absl::Time start = absl::Now();
    // A claimed reservation lives through its transfer: the transfer has its timeout from the
    // claim (the engine's backstop timeout is longer than reserve_timeout + transfer_timeout,
    // and a claim comes within reserve_timeout, so the blocks are never freed under a pull).
    const absl::Time deadline = std::min(start, job->claimed_at) + job->timeout;
    absl::Status status;
    // Why the prompt is recomputed if this transfer's KV is not used (RecomputeReason).
    RecomputeReason reason = RecomputeReason::kTransferFailed;
    absl::Time safe_at = absl::InfinitePast();
    if (theirs != options_.transfer_mode) {
      status = MisconfiguredPeerError(absl::StrCat(
          "KV transfer mode mismatch: decode worker runs --kv-transfer-mode ",
          ModeName(options_.transfer_mode), ", prefill worker ", prefill.prefill_worker_address(),
          " runs ", ModeName(theirs), "; start every worker with the same --kv-transfer-mode"));
    } else if ((prefill.kv().swa_replay_tokens() > 0) != (options_.swa_replay_tokens > 0)) {
      status = MisconfiguredPeerError(absl::StrCat(
          "SWA replay mismatch: prefill worker ", prefill.prefill_worker_address(),
          " runs --swa-replay-tokens ", prefill.kv().swa_replay_tokens(),
          (prefill.kv().swa_replay_tokens() > 0 ? " (moves only full-attention layers)"
                                                : " (moves every layer)"),
          " but this decode worker runs --swa-replay-tokens ", options_.swa_replay_tokens,
          "; start every worker with the same --swa-replay-tokens"));
    } else if (deadline <= start) {
      status = absl::DeadlineExceededError("the KV reservation expired before the transfer");
      reason = RecomputeReason::kReservationExpired;
    } else if (!landed) {
      status = push ? RequestPush(session->id(), prefill, job->blocks, deadline, &safe_at)
                    : PullKv(prefill, job->blocks, deadline);
      metrics_->ObserveTransfer(absl::ToDoubleSeconds(absl::Now() - start), status.ok());
      if (transfer::IsStagingCopyFailure(status)) {
        // A device copy out of a staging slot failed (the RMA may have worked): the reserved
        // blocks hold part of the prompt's KV at best. Like a failed RMA it is no reason to
        // fail the request: Unavailable makes the engine drop the blocks and recompute.
        reason = RecomputeReason::kStagingCopyFailed;
        status = absl::UnavailableError(status.message());
      } else if (absl::IsDeadlineExceeded(status)) {
        reason = RecomputeReason::kTransferTimeout;
      }
    }
    // Not the request's fault and no attempt elsewhere would help: the operator must see it.
    if (IsMisconfiguredPeer(status)) {
      spdlog::error("request {}: {} (a worker configuration error; the request fails)",
                    session->id(), std::string(status.message()));
    }
    // The ack: the prefill worker may free its pinned blocks (also after a failed pull, and
    // after a layerwise push landed). After a successful PushKv it freed them itself.
    if (!push || !status.ok() || landed) {
      absl::Status released = SendRelease(session->id(), prefill);
      // A pull reads whatever the prefill worker's blocks hold: it is only known to have read
      // the pinned prompt KV if the pin was still there when acked. Otherwise (released by an
      // earlier decode attempt, expired, or the worker unreachable) the blocks may have been
      // reused, so the pulled KV is not trusted: Unavailable makes the engine recompute it.
      if (status.ok() && !push && !released.ok()) {
        reason = absl::IsNotFound(released) ? RecomputeReason::kPinGone
                                            : RecomputeReason::kAckFailed;
        status = absl::UnavailableError(absl::StrCat(
            "the prefill worker's pin on the pulled KV could not be confirmed (",
            released.message(), "); recomputing the prompt"));
      }
    }
    std::optional<SampledToken> first;
    if (prefill.has_first_token()) {
      first = SampledToken{prefill.first_token().token_id(), prefill.first_token().logprob(), {}};
    }
    // For the recompute's log line (services/common/recompute_log.h).
    RecomputeLogEntry entry;
    entry.request_id = session->id();
    entry.cause = RecomputeReasonName(reason);
    entry.blocks_freed = static_cast<int64_t>(job->blocks.size());
    entry.tokens_to_recompute = prefill.num_prompt_tokens();
    entry.source = prefill.prefill_worker_address();
    auto complete = [this, session, status, first, reason, entry]() mutable {
      // Cancelled meanwhile: whatever the transfer's outcome (the router's abort may also have
      // released the pin, failing the ack), the request ends — a failed transfer must not
      // turn into a recompute of a request nobody waits for.
      if (session->EndTransfer()) {
        status = absl::CancelledError("client cancelled during the KV transfer");
      }
      // The engine recomputes the prompt after an Unavailable or DeadlineExceeded transfer
      // when it has the first token (LLMEngine::CompleteTransfer); other errors fail the request.
      if (first.has_value() && (absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status))) {
        metrics_->CountRecompute(RecomputeReasonName(reason));
        entry.detail = std::string(status.message());
        LogRecompute(entry);
      }
      engine_->CompleteTransfer(session->engine_id(), status, first);
    };
    safe_at = std::max(safe_at, absl::Now() + options_.test_post_transfer_delay);
    if (safe_at > absl::Now()) {
      pool_.PostAt(safe_at, std::move(complete));  // blocks stay reserved until no put can run
    } else {
      complete();
    }
  }
}

}  // namespace sluice
