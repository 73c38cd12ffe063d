#include "services/decode/decode_service.h"

#include <chrono>
#include <deque>
#include <optional>
#include <utility>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "services/worker_common/worker_wire.h"

namespace sluice {
namespace {

grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

std::chrono::system_clock::time_point DeadlineAfter(absl::Duration d) {
  return std::chrono::system_clock::now() + absl::ToChronoMicroseconds(d);
}

}  // namespace

// DecodeWriter: the Decode call's stream. One write in flight; queued messages follow in order;
// Finish after the final message (or with an error status).
class DecodeWriter final : public grpc::ServerWriteReactor<v1::TokenOutput> {
 public:
  explicit DecodeWriter(std::shared_ptr<DecodeSession> session) : session_(std::move(session)) {}

  void Push(v1::TokenOutput message, bool final) {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(message));
    if (final) end_ = grpc::Status::OK;
    MaybeWriteLocked();
  }
  void End(grpc::Status status) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!end_.has_value()) end_ = std::move(status);
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
};

// DecodeSession: one request's state across Reserve, the KV pull and the Decode stream.
class DecodeSession : public std::enable_shared_from_this<DecodeSession> {
 public:
  enum class State { kReserving, kReserved, kTransferring, kRunning, kFailed };

  DecodeSession(DecodeService* service, std::string id, std::string engine_id)
      : service_(service), id_(std::move(id)), engine_id_(std::move(engine_id)) {}
  const std::string& id() const { return id_; }
  const std::string& engine_id() const { return engine_id_; }

  // Engine thread: a reservation result.
  void OnReserved(absl::StatusOr<std::vector<int32_t>> blocks) {
    std::function<void(const absl::StatusOr<std::vector<int32_t>>&)> reply;
    bool start = false;
    DecodeWriter* writer = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      reply = std::move(reserve_reply_);
      if (blocks.ok()) {
        blocks_ = *blocks;
        state_ = State::kReserved;
        start = prefill_.has_value() && !cancelled_;
      } else {
        state_ = State::kFailed;
        writer = writer_;
      }
    }
    if (reply) reply(blocks);
    if (!blocks.ok()) {
      if (writer != nullptr) EndWriter(ToGrpc(blocks.status()));
      service_->Forget(id_, this);
    }
    if (start) Transfer();
  }

  // Engine thread: outputs of the request.
  void OnOutput(const RequestOutput& out) {
    v1::TokenOutput message;
    OutputToWire(out, &message);
    message.set_request_id(id_);
    const bool final = out.finished();
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (writer_ != nullptr) {
        writer_->Push(std::move(message), final);
      } else {
        buffered_.push_back(std::move(message));
        buffered_final_ = buffered_final_ || final;
      }
      if (final) state_ = State::kFailed;  // done: no more transitions
    }
    if (final) service_->Forget(id_, this);
  }

  // Decode call attached: replay buffered outputs. Returns false if another writer exists.
  bool Attach(DecodeWriter* writer, std::optional<v1::PrefillResponse> prefill,
              absl::Duration transfer_timeout) {
    bool start = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (writer_ != nullptr || attached_once_) return false;
      attached_once_ = true;
      writer_ = writer;
      prefill_ = std::move(prefill);
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
    bool abort = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      cancelled_ = true;
      abort = state_ != State::kTransferring;
    }
    if (abort) service_->engine()->Abort(engine_id_);
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
  };
  std::optional<TransferJob> BeginTransfer() {
    std::lock_guard<std::mutex> lock(mu_);
    if (state_ != State::kReserved || !prefill_.has_value()) return std::nullopt;
    state_ = State::kTransferring;
    return TransferJob{*prefill_, blocks_, transfer_timeout_};
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
  std::mutex mu_;
  State state_ = State::kReserving;
  std::vector<int32_t> blocks_;
  std::optional<v1::PrefillResponse> prefill_;
  absl::Duration transfer_timeout_;
  bool cancelled_ = false;
  bool attached_once_ = false;
  DecodeWriter* writer_ = nullptr;
  std::vector<v1::TokenOutput> buffered_;
  bool buffered_final_ = false;
  std::function<void(const absl::StatusOr<std::vector<int32_t>>&)> reserve_reply_;
};

void DecodeWriter::OnCancel() { session_->Cancel(); }
void DecodeWriter::OnDone() {
  session_->DetachWriter(this);
  delete this;
}

DecodeService::DecodeService(AsyncEngine* engine, transfer::KvTransferAgent* agent,
                             std::vector<transfer::KvRegion> regions, std::string kv_descriptor,
                             DecodeServiceOptions options)
    : engine_(engine),
      agent_(agent),
      regions_(std::move(regions)),
      kv_descriptor_(std::move(kv_descriptor)),
      options_(options),
      pool_(options.transfer_threads) {}

DecodeService::~DecodeService() = default;

int64_t DecodeService::num_sessions() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(sessions_.size());
}

void DecodeService::Forget(const std::string& request_id, const DecodeSession* session) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sessions_.find(request_id);
  if (it != sessions_.end() && it->second.get() == session) sessions_.erase(it);
}

std::shared_ptr<DecodeSession> DecodeService::NewSession(const std::string& request_id,
                                                         std::vector<int32_t> prompt,
                                                         const v1::SamplingParams& sampling,
                                                         absl::Status* error) {
  auto session = std::make_shared<DecodeSession>(this, request_id, request_id);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!sessions_.emplace(request_id, session).second) {
      *error = absl::AlreadyExistsError(absl::StrCat("request '", request_id, "' exists"));
      return nullptr;
    }
  }
  EngineRequest er;
  er.request_id = request_id;
  er.prompt_token_ids = std::move(prompt);
  er.sampling = SamplingFromWire(sampling);
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
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (draining_.load()) {
    reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "decode worker is draining"));
    return reactor;
  }
  absl::Status error;
  // The reply is set before reserving could complete: NewSession's engine op runs later.
  auto session = std::make_shared<DecodeSession>(this, request->request_id(),
                                                 request->request_id());
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!sessions_.emplace(request->request_id(), session).second) {
      reactor->Finish(grpc::Status(grpc::StatusCode::ALREADY_EXISTS, "request exists"));
      return reactor;
    }
  }
  const v1::KvLayout layout = LayoutOf(engine_->kv_cache());
  const int32_t num_tokens = request->prompt_token_ids_size();
  session->set_reserve_reply([this, reactor, response, layout, num_tokens](
                                 const absl::StatusOr<std::vector<int32_t>>& blocks) {
    if (!blocks.ok()) {
      reactor->Finish(ToGrpc(blocks.status()));
      return;
    }
    v1::KvBlocks* kv = response->mutable_kv();
    kv->set_kv_descriptor(kv_descriptor_);
    RunsToWire(*blocks, kv);
    *kv->mutable_layout() = layout;
    kv->set_num_tokens(num_tokens);
    reactor->Finish(grpc::Status::OK);
  });
  EngineRequest er;
  er.request_id = request->request_id();
  er.prompt_token_ids.assign(request->prompt_token_ids().begin(),
                             request->prompt_token_ids().end());
  er.sampling = SamplingFromWire(request->sampling());
  engine_->ReserveForTransfer(
      std::move(er), std::nullopt, absl::Now() + options_.reserve_timeout,
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
    if (it != sessions_.end()) session = it->second;
  }
  response->set_found(session != nullptr);
  if (session != nullptr) session->Cancel();
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
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
  const bool remote = request->has_prefill() && request->prefill().kv().runs_size() > 0;
  if (request->has_prefill() && !remote) {
    // Prefill already finished the request with its first token: nothing to decode.
    if (existing != nullptr) existing->Cancel();
    auto* writer = new DecodeWriter(std::make_shared<DecodeSession>(this, id, id));
    v1::TokenOutput done;
    done.set_request_id(id);
    done.set_finish_reason(request->prefill().finish_reason());
    writer->Push(std::move(done), /*final=*/true);
    return writer;
  }
  if (draining_.load() && existing == nullptr) {
    auto* writer = new DecodeWriter(std::make_shared<DecodeSession>(this, id, id));
    writer->End(grpc::Status(grpc::StatusCode::UNAVAILABLE, "decode worker is draining"));
    return writer;
  }
  const absl::Duration transfer_timeout =
      request->transfer_timeout_ms() > 0 ? absl::Milliseconds(request->transfer_timeout_ms())
                                         : options_.transfer_timeout;
  if (remote) {
    absl::Status error;
    std::shared_ptr<DecodeSession> session = existing;
    if (session == nullptr) {
      session = NewSession(id,
                           std::vector<int32_t>(request->prompt_token_ids().begin(),
                                                request->prompt_token_ids().end()),
                           request->sampling(), &error);
    }
    if (session == nullptr) {
      auto* writer = new DecodeWriter(std::make_shared<DecodeSession>(this, id, id));
      writer->End(ToGrpc(error));
      return writer;
    }
    auto* writer = new DecodeWriter(session);
    if (!session->Attach(writer, request->prefill(), transfer_timeout)) {
      writer->End(grpc::Status(grpc::StatusCode::ALREADY_EXISTS, "request is being decoded"));
    }
    return writer;
  }
  // Local: prefill and decode here (all tokens streamed). A stale reservation under the same id
  // (remote prefill failed) is dropped; the local run uses its own engine id.
  if (existing != nullptr) existing->Cancel();
  const std::string engine_id = existing != nullptr ? absl::StrCat(id, "#local") : id;
  auto session = std::make_shared<DecodeSession>(this, id, engine_id);
  auto* writer = new DecodeWriter(session);
  session->Attach(writer, std::nullopt, transfer_timeout);
  {
    std::lock_guard<std::mutex> lock(mu_);
    sessions_[id] = session;
  }
  EngineRequest er;
  er.request_id = engine_id;
  er.prompt_token_ids.assign(request->prompt_token_ids().begin(),
                             request->prompt_token_ids().end());
  er.sampling = SamplingFromWire(request->sampling());
  absl::Status s = engine_->Submit(std::move(er),
                                   [session](const RequestOutput& out) { session->OnOutput(out); });
  if (!s.ok()) {
    Forget(id, session.get());
    writer->End(ToGrpc(s));
  }
  return writer;
}

v1::PrefillWorker::Stub* DecodeService::PrefillStub(const std::string& address) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& stub = stubs_[address];
  if (stub == nullptr) {
    stub = v1::PrefillWorker::NewStub(
        grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  }
  return stub.get();
}

void DecodeService::StartTransfer(std::shared_ptr<DecodeSession> session) {
  pool_.Post([this, session] {
    std::optional<DecodeSession::TransferJob> job = session->BeginTransfer();
    if (!job.has_value()) return;
    const v1::KvBlocks& kv = job->prefill.kv();
    absl::Status status;
    if (kv.layout().block_size() != engine_->block_size() ||
        kv.layout().dtype_bytes() != 4) {
      status = absl::FailedPreconditionError(absl::StrCat(
          "KV layout mismatch: prefill block_size ", kv.layout().block_size(), ", decode ",
          engine_->block_size()));
    }
    absl::StatusOr<transfer::RemoteKvDescriptor> remote =
        transfer::RemoteKvDescriptor::Parse(kv.kv_descriptor());
    if (status.ok() && !remote.ok()) status = remote.status();
    if (status.ok()) {
      const std::vector<transfer::BlockRun> remote_runs = RunsFromWire(kv);
      const int64_t n = transfer::TotalBlocks(remote_runs);
      if (n > static_cast<int64_t>(job->blocks.size())) {
        status = absl::InvalidArgumentError("prefill sent more blocks than were reserved");
      } else {
        std::vector<int32_t> local(job->blocks.begin(), job->blocks.begin() + n);
        status = agent_->Pull(*remote, remote_runs, regions_, transfer::CoalesceBlocks(local),
                              absl::Now() + job->timeout);
      }
    }
    // The ack: the prefill worker may free its pinned blocks (also after a failed pull).
    {
      grpc::ClientContext context;
      context.set_deadline(DeadlineAfter(options_.release_timeout));
      v1::ReleaseRequest release;
      release.set_request_id(session->id());
      v1::ReleaseResponse released;
      PrefillStub(job->prefill.prefill_worker_address())->Release(&context, release, &released);
    }
    if (session->EndTransfer() && status.ok()) {
      status = absl::CancelledError("client cancelled during the KV transfer");
    }
    std::optional<SampledToken> first;
    if (job->prefill.has_first_token()) {
      first = SampledToken{job->prefill.first_token().token_id(),
                           job->prefill.first_token().logprob(),
                           {}};
    }
    engine_->CompleteTransfer(session->engine_id(), status, first);
  });
}

}  // namespace sluice
