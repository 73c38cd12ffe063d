#include "services/router/remote_backend.h"

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <future>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "services/router/wire_convert.h"
#include "services/serve/log.h"
#include "sluice/v1/worker.grpc.pb.h"

namespace sluice {
namespace {

std::chrono::system_clock::time_point DeadlineIn(absl::Duration d) {
  return std::chrono::system_clock::now() + absl::ToChronoMicroseconds(d);
}

absl::Status FromGrpc(const grpc::Status& status) {
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

// Retryable: the worker (or the way to it) failed, not the request.
bool IsWorkerFailure(grpc::StatusCode code) {
  return code == grpc::StatusCode::UNAVAILABLE || code == grpc::StatusCode::DEADLINE_EXCEEDED ||
         code == grpc::StatusCode::CANCELLED || code == grpc::StatusCode::INTERNAL ||
         code == grpc::StatusCode::UNKNOWN || code == grpc::StatusCode::ABORTED;
}

}  // namespace

// Call: one request's state, shared by its thread, Abort and worker removal.
struct RemoteBackend::Call {
  EngineRequest request;
  OutputCallback on_output;

  std::mutex mu;
  bool aborted = false;                                // guarded by mu
  std::map<grpc::ClientContext*, std::string> active;  // RPC context → worker id; guarded
  std::map<std::string, absl::Status> failed_workers;  // removed while in use; guarded
  // Written by the request thread only.
  bool finished = false;
  int32_t num_prompt_tokens = 0;
  int32_t num_cached_tokens = 0;
  int32_t num_output_tokens = 0;

  // Attach registers an RPC about to start; false when the request was aborted
  // already.
  bool Attach(grpc::ClientContext* context, const std::string& worker_id) {
    std::lock_guard<std::mutex> lock(mu);
    if (aborted) return false;
    auto failed = failed_workers.find(worker_id);
    if (failed != failed_workers.end()) return false;
    active[context] = worker_id;
    return true;
  }
  void Detach(grpc::ClientContext* context) {
    std::lock_guard<std::mutex> lock(mu);
    active.erase(context);
  }
  bool IsAborted() {
    std::lock_guard<std::mutex> lock(mu);
    return aborted;
  }
  absl::Status WorkerFailure(const std::string& worker_id) {
    std::lock_guard<std::mutex> lock(mu);
    auto it = failed_workers.find(worker_id);
    return it == failed_workers.end() ? absl::OkStatus() : it->second;
  }

  void Deliver(RequestOutput output) {
    if (finished) return;
    output.request_id = request.request_id;
    num_output_tokens += static_cast<int32_t>(output.new_tokens.size());
    output.num_prompt_tokens = num_prompt_tokens;
    output.num_cached_tokens = num_cached_tokens;
    output.num_output_tokens = num_output_tokens;
    finished = output.finished();
    on_output(output);
  }
  void Finish(FinishReason reason, absl::Status status = absl::OkStatus()) {
    RequestOutput output;
    output.finish_reason = reason;
    output.status = std::move(status);
    Deliver(std::move(output));
  }
};

RemoteBackend::RemoteBackend(WorkerRegistry* registry, RemoteBackendOptions options)
    : registry_(registry), options_(options), prober_(registry, options.probe_timeout) {
  registry_->OnRemoved([this](const WorkerSnapshot& worker, const absl::Status& why) {
    OnWorkerRemoved(worker, why);
  });
}

RemoteBackend::~RemoteBackend() {
  registry_->OnRemoved(nullptr);
  std::unique_lock<std::mutex> lock(mu_);
  shutting_down_ = true;
  for (auto& [id, call] : calls_) {
    std::lock_guard<std::mutex> call_lock(call->mu);
    call->aborted = true;
    for (auto& [context, worker] : call->active) context->TryCancel();
  }
  // Every RPC has a deadline, and cancelled ones return at once: this wait is
  // bounded.
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
  auto call = std::make_shared<Call>();
  call->request = std::move(request);
  call->on_output = std::move(on_output);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shutting_down_) return absl::UnavailableError("the router is shutting down");
    if (!calls_.emplace(call->request.request_id, call).second) {
      return absl::AlreadyExistsError(
          absl::StrCat("request id '", call->request.request_id, "' is already in flight"));
    }
  }
  std::thread([this, call] { Run(call); }).detach();
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
  std::lock_guard<std::mutex> lock(call->mu);
  call->aborted = true;
  for (auto& [context, worker] : call->active) context->TryCancel();
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
  for (auto& call : calls) {
    std::lock_guard<std::mutex> lock(call->mu);
    bool uses = false;
    for (auto& [context, worker_id] : call->active) {
      if (worker_id == worker.worker_id) {
        uses = true;
        context->TryCancel();
      }
    }
    if (uses) call->failed_workers[worker.worker_id] = why;
  }
}

std::shared_ptr<grpc::Channel> RemoteBackend::ChannelTo(const std::string& address) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& channel = channels_[address];
  if (channel == nullptr) {
    grpc::ChannelArguments args;
    // Fail fast on a dead worker rather than backing off for up to 2 minutes.
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    channel = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
  }
  return channel;
}

void RemoteBackend::Run(std::shared_ptr<Call> call) {
  Call& c = *call;
  const SamplingParams& sampling = c.request.sampling;
  const int64_t tokens_needed =
      static_cast<int64_t>(c.request.prompt_token_ids.size()) + sampling.max_tokens;
  std::set<std::string> bad_decode;
  std::set<std::string> bad_prefill;
  for (int attempt = 0; !c.finished; ++attempt) {
    if (c.IsAborted()) {
      c.Finish(FinishReason::kAbort);
      break;
    }
    std::optional<WorkerSnapshot> decode =
        attempt < options_.max_decode_attempts
            ? registry_->Pick(WorkerRole::kDecode, tokens_needed, bad_decode)
            : std::nullopt;
    if (!decode.has_value()) {
      c.Finish(FinishReason::kError,
               absl::UnavailableError(attempt == 0 ? "no decode worker is available"
                                                   : "every decode worker tried failed"));
      std::lock_guard<std::mutex> lock(mu_);
      ++counters_.num_worker_failures;
      break;
    }
    bool retry_decode = false;
    RunOnDecodeWorker(c, *decode, bad_prefill, &retry_decode);
    registry_->Release(decode->worker_id);
    if (retry_decode) {
      bad_decode.insert(decode->worker_id);
      std::lock_guard<std::mutex> lock(mu_);
      ++counters_.num_decode_retries;
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  calls_.erase(c.request.request_id);
  if (calls_.empty()) idle_cv_.notify_all();
}

bool RemoteBackend::RunOnDecodeWorker(Call& c, const WorkerSnapshot& decode,
                                      std::set<std::string>& bad_prefill, bool* retry_decode) {
  *retry_decode = false;
  const std::string& id = c.request.request_id;
  const int64_t prompt_len = static_cast<int64_t>(c.request.prompt_token_ids.size());
  auto decode_stub = v1::DecodeWorker::NewStub(ChannelTo(decode.address));
  v1::SamplingParams wire_sampling;
  ToWire(c.request.sampling, &wire_sampling);

  // Cancel drops a reservation (or a decode) on the decode worker, best effort,
  // bounded.
  auto cancel_on_decode = [&] {
    grpc::ClientContext context;
    context.set_deadline(DeadlineIn(options_.control_deadline));
    v1::CancelRequest request;
    request.set_request_id(id);
    v1::CancelResponse response;
    decode_stub->Cancel(&context, request, &response);
  };

  std::optional<v1::PrefillResponse> prefill;
  std::optional<WorkerSnapshot> prefill_worker;  // the worker that answered `prefill`
  const bool remote_prefill = prompt_len >= options_.min_remote_prefill_tokens &&
                              registry_->CountLive(WorkerRole::kPrefill) > 0 &&
                              c.num_output_tokens == 0;
  if (remote_prefill) {
    // Reserve on the decode worker while prefill runs (callback API: no extra
    // thread).
    struct Reservation {
      grpc::ClientContext context;
      v1::ReserveRequest request;
      v1::ReserveResponse response;
      std::promise<grpc::Status> done;
    };
    auto reservation = std::make_shared<Reservation>();
    reservation->context.set_deadline(DeadlineIn(options_.control_deadline));
    reservation->request.set_request_id(id);
    reservation->request.mutable_prompt_token_ids()->Add(c.request.prompt_token_ids.begin(),
                                                         c.request.prompt_token_ids.end());
    *reservation->request.mutable_sampling() = wire_sampling;
    std::future<grpc::Status> reserved = reservation->done.get_future();
    const bool reserving = c.Attach(&reservation->context, decode.worker_id);
    if (reserving) {
      decode_stub->async()->Reserve(
          &reservation->context, &reservation->request, &reservation->response,
          [reservation](grpc::Status status) { reservation->done.set_value(std::move(status)); });
    }
    absl::Status prefill_error;
    const auto prefill_until = DeadlineIn(options_.prefill_deadline);
    for (int attempt = 0; attempt < options_.max_prefill_attempts && !c.IsAborted() &&
                          std::chrono::system_clock::now() < prefill_until;
         ++attempt) {
      std::optional<WorkerSnapshot> worker =
          registry_->Pick(WorkerRole::kPrefill, prompt_len, bad_prefill);
      if (!worker.has_value()) break;
      auto prefill_stub = v1::PrefillWorker::NewStub(ChannelTo(worker->address));
      grpc::ClientContext context;
      context.set_deadline(prefill_until);
      v1::PrefillRequest request;
      request.set_request_id(id);
      request.mutable_prompt_token_ids()->Add(c.request.prompt_token_ids.begin(),
                                              c.request.prompt_token_ids.end());
      *request.mutable_sampling() = wire_sampling;
      v1::PrefillResponse response;
      grpc::Status status = grpc::Status(grpc::StatusCode::CANCELLED, "aborted");
      if (c.Attach(&context, worker->worker_id)) {
        status = prefill_stub->Prefill(&context, request, &response);
        c.Detach(&context);
      }
      registry_->Release(worker->worker_id);
      if (status.ok()) {
        prefill = std::move(response);
        prefill_worker = std::move(worker);
        break;
      }
      if (c.IsAborted()) break;
      if (!IsWorkerFailure(status.error_code())) {
        prefill_error = FromGrpc(status);
        break;
      }
      prober_.Suspect(*worker);
      bad_prefill.insert(worker->worker_id);
      std::lock_guard<std::mutex> lock(mu_);
      ++counters_.num_prefill_retries;
    }
    if (reserving) {
      reserved.wait_for(absl::ToChronoMicroseconds(options_.control_deadline + absl::Seconds(1)));
      c.Detach(&reservation->context);
    }
    if (c.IsAborted() || !prefill_error.ok()) {
      cancel_on_decode();
      if (c.IsAborted()) {
        c.Finish(FinishReason::kAbort);
      } else {
        c.Finish(FinishReason::kError, prefill_error);
      }
      return true;
    }
    if (prefill.has_value()) {
      std::lock_guard<std::mutex> lock(mu_);
      ++counters_.num_remote_prefills;
    }
    // No prefill worker answered: fall through to a local prefill on the decode
    // worker.
  }

  if (prefill.has_value()) {
    c.num_prompt_tokens = prefill->num_prompt_tokens();
    c.num_cached_tokens = prefill->num_cached_tokens();
    RequestOutput first;
    first.new_tokens.push_back(FromWire(prefill->first_token()));
    first.finish_reason = FromWire(prefill->finish_reason());
    c.Deliver(std::move(first));
    if (c.finished) {
      cancel_on_decode();
      return true;
    }
  } else {
    std::lock_guard<std::mutex> lock(mu_);
    ++counters_.num_local_prefills;
  }

  grpc::ClientContext context;
  context.set_deadline(DeadlineIn(options_.decode_deadline));
  v1::DecodeRequest request;
  request.set_request_id(id);
  request.mutable_prompt_token_ids()->Add(c.request.prompt_token_ids.begin(),
                                          c.request.prompt_token_ids.end());
  *request.mutable_sampling() = wire_sampling;
  if (prefill.has_value()) *request.mutable_prefill() = *prefill;
  if (!c.Attach(&context, decode.worker_id)) {
    absl::Status failure = c.WorkerFailure(decode.worker_id);
    if (prefill.has_value()) {
      // Decode never starts: free the prefill worker's pin now rather than at
      // its timeout.
      auto prefill_stub = v1::PrefillWorker::NewStub(ChannelTo(prefill->prefill_worker_address()));
      grpc::ClientContext release_context;
      release_context.set_deadline(DeadlineIn(options_.control_deadline));
      v1::ReleaseRequest release;
      release.set_request_id(id);
      v1::ReleaseResponse released;
      prefill_stub->Release(&release_context, release, &released);
      cancel_on_decode();
    }
    if (c.IsAborted()) {
      c.Finish(FinishReason::kAbort);
      return true;
    }
    *retry_decode = c.num_output_tokens == 0;
    if (!*retry_decode) {
      c.Finish(FinishReason::kError, failure);
      std::lock_guard<std::mutex> lock(mu_);
      ++counters_.num_worker_failures;
    }
    return !*retry_decode;
  }
  std::unique_ptr<grpc::ClientReader<v1::TokenOutput>> reader =
      decode_stub->Decode(&context, request);
  v1::TokenOutput message;
  while (!c.finished && reader->Read(&message)) {
    RequestOutput output;
    output.new_tokens.reserve(message.tokens_size());
    for (const v1::SampledToken& token : message.tokens()) {
      output.new_tokens.push_back(FromWire(token));
    }
    if (!prefill.has_value() && message.has_usage()) {
      c.num_prompt_tokens = message.usage().prompt_tokens();
      c.num_cached_tokens = message.usage().cached_tokens();
    }
    output.finish_reason = FromWire(message.finish_reason());
    if (output.finish_reason == FinishReason::kError) {
      output.status = StatusFromWire(message.error());
      // Most often the KV pull failed: check that the prefill worker still lives.
      if (prefill_worker.has_value()) prober_.Suspect(*prefill_worker);
    }
    c.Deliver(std::move(output));
  }
  if (c.finished) context.TryCancel();  // nothing more to read; end the stream promptly
  const grpc::Status status = reader->Finish();
  c.Detach(&context);
  if (c.finished) return true;
  if (c.IsAborted()) {
    c.Finish(FinishReason::kAbort);
    return true;
  }
  // The stream ended without a final message: the decode worker failed.
  if (IsWorkerFailure(status.error_code())) prober_.Suspect(decode);
  absl::Status failure = c.WorkerFailure(decode.worker_id);
  if (failure.ok()) {
    failure =
        absl::UnavailableError(absl::StrCat("decode worker ", decode.worker_id, " (",
                                            decode.address, ") failed: ", status.error_message()));
  }
  if (c.num_output_tokens == 0 && IsWorkerFailure(status.error_code())) {
    *retry_decode = true;
    return false;
  }
  c.Finish(FinishReason::kError, failure);
  std::lock_guard<std::mutex> lock(mu_);
  ++counters_.num_worker_failures;
  return true;
}

BackendStats RemoteBackend::Stats() const {
  BackendStats stats;
  for (const WorkerSnapshot& worker : registry_->List()) {
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

int64_t RemoteBackend::num_in_flight() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(calls_.size());
}

}  // namespace sluice
