// RemoteBackend's mid-stream migration against scripted prefill and decode workers (gRPC on
// loopback). The undisturbed run of every request is the output tokens kBase + i (i = 0, 1,
// ...): the fakes answer from the position the router's wire messages give them, so a token
// delivered twice, skipped, or resumed from the wrong count shows in the exact token list.
// The first Decode stream of the test fails after streaming kFailAfter tokens (a decode worker
// killed mid-stream); the request then moves:
//   - through the prefill worker (both sides advertise "resume"): Prefill and Reserve carry
//     the delivered tokens as resumed_output_token_ids, the prefill's first_token is the next
//     output, and the new decode worker decodes on from the pulled KV;
//   - else, or when that prefill fails, to the new decode worker's own re-prefill (a Decode
//     without prefill, with every delivered token resumed).
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "services/common/misconfigured_peer.h"
#include "services/router/remote_backend.h"
#include "services/router/worker_registry.h"
#include "sluice/v1/worker.grpc.pb.h"

namespace sluice {
namespace {

constexpr int32_t kBase = 100;     // output i of the undisturbed run is kBase + i
constexpr int32_t kMaxTokens = 10;
constexpr int32_t kFailAfter = 3;  // the failing stream delivers this many tokens

std::vector<int32_t> Ids(const google::protobuf::RepeatedField<int32_t>& ids) {
  return std::vector<int32_t>(ids.begin(), ids.end());
}
// The undisturbed run's outputs [from, to).
std::vector<int32_t> Undisturbed(int32_t from, int32_t to) {
  std::vector<int32_t> out;
  for (int32_t i = from; i < to; ++i) out.push_back(kBase + i);
  return out;
}

// What one fake worker saw.
struct PrefillCall {
  std::vector<int32_t> resumed;
  bool prompt_logprobs = false;
};
struct DecodeCall {
  std::string worker;
  bool with_prefill = false;
  int32_t prefill_first_token = -1;
  std::vector<int32_t> resumed;
  bool prompt_logprobs = false;
};

// Script: shared by the fakes. The first Decode stream (of any worker) fails after
// kFailAfter tokens; with fail_second_decode the next one fails after 2 too.
struct Script {
  std::atomic<int> decodes{0};
  bool fail_second_decode = false;
  bool fail_resumed_prefill = false;  // Prefill with resumed tokens: INVALID_ARGUMENT
  // A Decode of a migration's prefill ends the request at once with DEADLINE_EXCEEDED (its
  // reservation expired under the transfer).
  bool expire_resumed_transfer = false;
  // Every Decode of a prefill ends the request at once with this error (a transfer that failed,
  // e.g. between misconfigured workers).
  std::optional<v1::Error> transfer_error;
  std::optional<grpc::Status> prefill_error;  // every Prefill answers it
  std::mutex mu;
  std::vector<PrefillCall> prefills;
  std::map<std::string, std::vector<int32_t>> reserves;  // worker -> resumed of its Reserve
  std::vector<DecodeCall> decode_calls;
};

class FakePrefill final : public v1::PrefillWorker::CallbackService {
 public:
  explicit FakePrefill(Script* script) : script_(script) {}
  std::string address;

  grpc::ServerUnaryReactor* Prefill(grpc::CallbackServerContext* context,
                                    const v1::PrefillRequest* request,
                                    v1::PrefillResponse* response) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    const int32_t resumed = request->resumed_output_token_ids_size();
    {
      std::lock_guard<std::mutex> lock(script_->mu);
      script_->prefills.push_back(
          {Ids(request->resumed_output_token_ids()), request->sampling().has_prompt_logprobs()});
    }
    if (script_->prefill_error.has_value()) {
      reactor->Finish(*script_->prefill_error);
      return reactor;
    }
    if (resumed > 0 && script_->fail_resumed_prefill) {
      reactor->Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "test: refused"));
      return reactor;
    }
    response->set_request_id(request->request_id());
    response->mutable_first_token()->set_token_id(kBase + resumed);
    response->set_num_prompt_tokens(request->prompt_token_ids_size());
    response->set_prefill_worker_address(address);
    if (resumed + 1 >= request->sampling().max_tokens()) {
      response->set_finish_reason(v1::FINISH_REASON_LENGTH);  // nothing pinned
    } else {
      v1::BlockRun* run = response->mutable_kv()->add_runs();
      run->set_num_blocks(1);
      response->mutable_kv()->set_num_tokens(request->prompt_token_ids_size() + resumed);
    }
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  grpc::ServerUnaryReactor* Release(grpc::CallbackServerContext* context,
                                    const v1::ReleaseRequest*, v1::ReleaseResponse* r) override {
    r->set_released(true);
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

 private:
  Script* script_;
};

class FakeDecode final : public v1::DecodeWorker::CallbackService {
 public:
  FakeDecode(Script* script, std::string name) : script_(script), name_(std::move(name)) {}

  grpc::ServerUnaryReactor* Reserve(grpc::CallbackServerContext* context,
                                    const v1::ReserveRequest* request,
                                    v1::ReserveResponse* response) override {
    {
      std::lock_guard<std::mutex> lock(script_->mu);
      script_->reserves[name_] = Ids(request->resumed_output_token_ids());
      reserved_[request->request_id()] = request->resumed_output_token_ids_size();
    }
    response->mutable_kv()->add_runs()->set_num_blocks(2);
    response->set_reservation_token("token-" + request->request_id());
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  grpc::ServerUnaryReactor* Cancel(grpc::CallbackServerContext* context,
                                   const v1::CancelRequest* request,
                                   v1::CancelResponse*) override {
    {
      std::lock_guard<std::mutex> lock(script_->mu);
      reserved_.erase(request->request_id());
    }
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  grpc::ServerWriteReactor<v1::TokenOutput>* Decode(grpc::CallbackServerContext*,
                                                    const v1::DecodeRequest* request) override {
    DecodeCall call;
    call.worker = name_;
    call.with_prefill = request->has_prefill();
    call.resumed = Ids(request->resumed_output_token_ids());
    call.prompt_logprobs = request->sampling().has_prompt_logprobs();
    int32_t from;
    {
      std::lock_guard<std::mutex> lock(script_->mu);
      if (call.with_prefill) {
        call.prefill_first_token = request->prefill().first_token().token_id();
        // The reservation's resumed count, else (none made) the call's; the prefill's token
        // is output `resumed`: streaming starts after it.
        auto it = reserved_.find(request->request_id());
        const int32_t resumed = it != reserved_.end() ? it->second
                                                      : request->resumed_output_token_ids_size();
        from = resumed + 1;
      } else {
        from = request->resumed_output_token_ids_size();  // re-prefilled here
      }
      reserved_.erase(request->request_id());
      script_->decode_calls.push_back(call);
    }
    const int n = script_->decodes.fetch_add(1);
    const int32_t fail_after =
        n == 0 ? kFailAfter : (n == 1 && script_->fail_second_decode ? 2 : -1);
    std::optional<v1::Error> end_with;
    if (script_->expire_resumed_transfer && call.with_prefill && from > 1) {
      // What a decode worker sends when the reservation expired under the transfer.
      end_with.emplace();
      end_with->set_code(static_cast<int32_t>(absl::StatusCode::kDeadlineExceeded));
      end_with->set_message("test: the KV reservation expired");
    } else if (script_->transfer_error.has_value() && call.with_prefill) {
      end_with = script_->transfer_error;
    }
    return new Stream(request->request_id(), from, request->sampling().max_tokens(), fail_after,
                      end_with);
  }

 private:
  // Stream writes outputs [from, max_tokens) one message each, or fails with UNAVAILABLE after
  // `fail_after` of them (a killed worker), or (end_with) ends the request at once with an error.
  class Stream final : public grpc::ServerWriteReactor<v1::TokenOutput> {
   public:
    Stream(std::string id, int32_t from, int32_t max_tokens, int32_t fail_after,
           const std::optional<v1::Error>& end_with)
        : id_(std::move(id)), from_(from), max_tokens_(max_tokens), fail_after_(fail_after) {
      if (!end_with.has_value()) {
        Next();
        return;
      }
      out_.set_request_id(id_);
      out_.set_finish_reason(v1::FINISH_REASON_ERROR);
      *out_.mutable_error() = *end_with;
      from_ = max_tokens_;  // the stream ends after this message
      StartWrite(&out_);
    }
    void OnWriteDone(bool ok) override {
      if (!ok) return Finish(grpc::Status(grpc::StatusCode::CANCELLED, "write failed"));
      Next();
    }
    void OnDone() override { delete this; }

   private:
    void Next() {
      if (written_ == fail_after_) {
        return Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "test: decode worker killed"));
      }
      const int32_t index = from_ + written_;
      if (index >= max_tokens_) return Finish(grpc::Status::OK);
      ++written_;
      out_.Clear();
      out_.set_request_id(id_);
      out_.add_tokens()->set_token_id(kBase + index);
      if (index + 1 == max_tokens_) out_.set_finish_reason(v1::FINISH_REASON_LENGTH);
      StartWrite(&out_);
    }
    std::string id_;
    int32_t from_, max_tokens_, fail_after_;
    int32_t written_ = 0;
    v1::TokenOutput out_;
  };

  Script* script_;
  std::string name_;
  std::map<std::string, int32_t> reserved_;  // request id -> resumed count; guarded by mu
};

std::unique_ptr<grpc::Server> Serve(grpc::Service* service, std::string* address) {
  grpc::ServerBuilder builder;
  builder.RegisterService(service);
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  *address = absl::StrCat("127.0.0.1:", port);
  return server;
}

struct Outcome {
  std::vector<int32_t> tokens;
  FinishReason reason = FinishReason::kNone;
  absl::Status status;
  int32_t num_output_tokens = 0;  // the last output's count (usage)
  int32_t num_prompt_tokens = 0;
  bool done = false;
};

class Collector {
 public:
  OutputCallback Callback() {
    return [this](const RequestOutput& out) {
      std::lock_guard<std::mutex> lock(mu_);
      for (const SampledToken& t : out.new_tokens) outcome_.tokens.push_back(t.token_id);
      outcome_.num_output_tokens = out.num_output_tokens;
      outcome_.num_prompt_tokens = out.num_prompt_tokens;
      if (out.finished()) {
        outcome_.reason = out.finish_reason;
        outcome_.status = out.status;
        outcome_.done = true;
        cv_.notify_all();
      }
    };
  }
  Outcome Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::seconds(20), [&] { return outcome_.done; });
    return outcome_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  Outcome outcome_;
};

// One cluster: a prefill worker and two decode workers on loopback, one request through it.
struct Cluster {
  explicit Cluster(bool prefill_resumes = true, bool decode_resumes = true)
      : prefill(&script), decode_a(&script, "a"), decode_b(&script, "b") {
    prefill_server = Serve(&prefill, &prefill.address);
    decode_a_server = Serve(&decode_a, &decode_a_address);
    decode_b_server = Serve(&decode_b, &decode_b_address);
    const std::vector<std::string> resume = {kResumeCapability};
    EXPECT_TRUE(registry
                    .Register(WorkerRole::kPrefill, prefill.address, WorkerLoad{},
                              prefill_resumes ? resume : std::vector<std::string>{})
                    .ok());
    for (const std::string* address : {&decode_a_address, &decode_b_address}) {
      EXPECT_TRUE(registry
                      .Register(WorkerRole::kDecode, *address, WorkerLoad{},
                                decode_resumes ? resume : std::vector<std::string>{})
                      .ok());
    }
    options.reserve_attempt_wait = absl::Milliseconds(200);
  }
  ~Cluster() {
    prefill_server->Shutdown();
    decode_a_server->Shutdown();
    decode_b_server->Shutdown();
  }

  // Runs one request (4 prompt tokens, max_tokens, prompt logprobs asked) to its end.
  Outcome RunOne(int32_t max_tokens = kMaxTokens) {
    RemoteBackend backend(&registry, options);
    EngineRequest r;
    r.request_id = "r";
    r.prompt_token_ids = {5, 6, 7, 8};
    r.sampling.max_tokens = max_tokens;
    r.sampling.prompt_logprobs = 0;
    Collector collector;
    OutputCallback collect = collector.Callback();
    // The counters as the caller's final output finds them (a client reading /metrics after
    // its answer): every outcome is counted before it is delivered.
    auto on_output = [&](const RequestOutput& out) {
      if (out.finished()) counters = backend.counters();
      collect(out);
    };
    EXPECT_TRUE(backend.Submit(std::move(r), on_output).ok());
    Outcome outcome = collector.Wait();
    EXPECT_TRUE(outcome.done);
    return outcome;
  }

  Script script;
  FakePrefill prefill;
  FakeDecode decode_a, decode_b;
  std::string decode_a_address, decode_b_address;
  std::unique_ptr<grpc::Server> prefill_server, decode_a_server, decode_b_server;
  WorkerRegistry registry;
  RemoteBackendOptions options;
  RemoteBackendCounters counters;  // as they were when the request's final output came
};

TEST(RemoteBackendMigration, ContinuesThroughThePrefillWorker) {
  Cluster c;
  const Outcome o = c.RunOne();
  ASSERT_TRUE(o.status.ok()) << o.status;
  EXPECT_EQ(o.reason, FinishReason::kLength);
  // One uninterrupted stream: the undisturbed run, each token once.
  EXPECT_EQ(o.tokens, Undisturbed(0, kMaxTokens));
  EXPECT_EQ(o.num_output_tokens, kMaxTokens);
  EXPECT_EQ(o.num_prompt_tokens, 4);
  // The failed stream delivered prefill's token and kFailAfter more: those are resumed.
  const std::vector<int32_t> resumed = Undisturbed(0, 1 + kFailAfter);
  ASSERT_EQ(c.script.prefills.size(), 2u);
  EXPECT_TRUE(c.script.prefills[0].resumed.empty());
  EXPECT_TRUE(c.script.prefills[0].prompt_logprobs);
  EXPECT_EQ(c.script.prefills[1].resumed, resumed);
  EXPECT_FALSE(c.script.prefills[1].prompt_logprobs);  // the client has them already
  ASSERT_EQ(c.script.decode_calls.size(), 2u);
  const DecodeCall& first = c.script.decode_calls[0];
  const DecodeCall& moved = c.script.decode_calls[1];
  EXPECT_TRUE(first.with_prefill);
  EXPECT_TRUE(first.resumed.empty());
  EXPECT_NE(moved.worker, first.worker);  // the failed worker is not tried again
  EXPECT_TRUE(moved.with_prefill);
  EXPECT_EQ(moved.prefill_first_token, kBase + 1 + kFailAfter);
  EXPECT_EQ(moved.resumed, resumed);
  EXPECT_FALSE(moved.prompt_logprobs);
  EXPECT_EQ(c.script.reserves.at(moved.worker), resumed);
  EXPECT_EQ(c.counters.num_migrations, 1);
  EXPECT_EQ(c.counters.num_migration_prefills, 1);
  EXPECT_EQ(c.counters.num_remote_prefills, 1);
  EXPECT_EQ(c.counters.num_worker_failures, 0);
}

// The prefill's token is the last one max_tokens allows: the request ends with it, no Decode.
TEST(RemoteBackendMigration, PrefillTokenThatEndsTheRequest) {
  Cluster c;
  const int32_t max_tokens = kFailAfter + 2;
  const Outcome o = c.RunOne(max_tokens);
  ASSERT_TRUE(o.status.ok()) << o.status;
  EXPECT_EQ(o.reason, FinishReason::kLength);
  EXPECT_EQ(o.tokens, Undisturbed(0, max_tokens));
  EXPECT_EQ(o.num_output_tokens, max_tokens);
  ASSERT_EQ(c.script.prefills.size(), 2u);
  EXPECT_EQ(c.script.prefills[1].resumed, Undisturbed(0, kFailAfter + 1));
  EXPECT_EQ(c.script.decode_calls.size(), 1u);
  EXPECT_EQ(c.counters.num_migration_prefills, 1);
}

// No prefill worker that can resume (one from before the field would prefill the prompt
// alone): the new decode worker re-prefills prompt + every delivered token itself.
TEST(RemoteBackendMigration, WithoutAResumingPrefillWorkerTheDecodeWorkerReprefills) {
  for (bool prefill_resumes : {false, true}) {
    SCOPED_TRACE(prefill_resumes);
    Cluster c(prefill_resumes, /*decode_resumes=*/!prefill_resumes);
    const Outcome o = c.RunOne();
    ASSERT_TRUE(o.status.ok()) << o.status;
    EXPECT_EQ(o.tokens, Undisturbed(0, kMaxTokens));
    EXPECT_EQ(o.num_output_tokens, kMaxTokens);
    EXPECT_EQ(c.script.prefills.size(), 1u);  // the fresh request's only
    ASSERT_EQ(c.script.decode_calls.size(), 2u);
    const DecodeCall& moved = c.script.decode_calls[1];
    EXPECT_FALSE(moved.with_prefill);
    EXPECT_EQ(moved.resumed, Undisturbed(0, 1 + kFailAfter));
    EXPECT_FALSE(moved.prompt_logprobs);
    EXPECT_EQ(c.counters.num_migrations, 1);
    EXPECT_EQ(c.counters.num_migration_prefills, 0);
  }
}

// The migration's prefill fails (here: refused): the decode worker that reserved for it
// re-prefills itself, and the stream still goes on exactly.
TEST(RemoteBackendMigration, FailedPrefillFallsBackToTheDecodeWorker) {
  Cluster c;
  c.script.fail_resumed_prefill = true;
  const Outcome o = c.RunOne();
  ASSERT_TRUE(o.status.ok()) << o.status;
  EXPECT_EQ(o.tokens, Undisturbed(0, kMaxTokens));
  ASSERT_EQ(c.script.prefills.size(), 2u);
  EXPECT_EQ(c.script.prefills[1].resumed, Undisturbed(0, 1 + kFailAfter));
  ASSERT_EQ(c.script.decode_calls.size(), 2u);
  const DecodeCall& moved = c.script.decode_calls[1];
  EXPECT_FALSE(moved.with_prefill);
  EXPECT_EQ(moved.resumed, Undisturbed(0, 1 + kFailAfter));
  EXPECT_EQ(c.counters.num_migrations, 1);
  EXPECT_EQ(c.counters.num_migration_prefills, 0);
  EXPECT_EQ(c.counters.num_worker_failures, 0);
}

// The migration's prefill answered, but the new decode worker could not take its KV (the
// reservation expired under the transfer): that decode worker re-prefills prompt + every
// delivered token (the prefill's token included) itself; no token is lost or repeated.
TEST(RemoteBackendMigration, FailedHandoverFallsBackToTheDecodeWorker) {
  Cluster c;
  c.script.expire_resumed_transfer = true;
  const Outcome o = c.RunOne();
  ASSERT_TRUE(o.status.ok()) << o.status;
  EXPECT_EQ(o.tokens, Undisturbed(0, kMaxTokens));
  EXPECT_EQ(o.num_output_tokens, kMaxTokens);
  ASSERT_EQ(c.script.prefills.size(), 2u);
  ASSERT_EQ(c.script.decode_calls.size(), 3u);
  const DecodeCall& handover = c.script.decode_calls[1];
  const DecodeCall& local = c.script.decode_calls[2];
  EXPECT_TRUE(handover.with_prefill);
  EXPECT_EQ(local.worker, handover.worker);
  EXPECT_FALSE(local.with_prefill);
  EXPECT_EQ(local.resumed, Undisturbed(0, kFailAfter + 2));  // with the prefill's token
  EXPECT_EQ(c.counters.num_migrations, 1);
  EXPECT_EQ(c.counters.num_migration_prefills, 1);
  EXPECT_EQ(c.counters.num_worker_failures, 0);
}

// --max-migrations bounds the moves through prefill too: with 1, a second failure ends the
// request with an error after every token it got (none twice). That error is the one the
// decode worker failures caused: sluice_router_worker_failures_total counts it (once, before
// the caller gets it); the first failure, which the migration hid, is not counted.
TEST(RemoteBackendMigration, MaxMigrationsBoundsTheMoves) {
  Cluster c;
  c.script.fail_second_decode = true;
  c.options.max_migrations = 1;
  const Outcome o = c.RunOne();
  EXPECT_EQ(o.reason, FinishReason::kError);
  EXPECT_EQ(o.status.code(), absl::StatusCode::kUnavailable) << o.status;
  // First stream: prefill's token + 3; the migration: prefill's token + 2 more.
  EXPECT_EQ(o.tokens, Undisturbed(0, 1 + kFailAfter + 1 + 2));
  EXPECT_EQ(c.counters.num_migrations, 1);
  EXPECT_EQ(c.counters.num_migration_prefills, 1);
  EXPECT_EQ(c.counters.num_worker_failures, 1);
}

// A decode worker that ended the request for misconfigured peers (FAILED_PRECONDITION marked
// ERROR_CAUSE_WORKER_MISCONFIGURED): the client gets a server error (INTERNAL: HTTP 500) naming
// the mismatch, not the 400 the code alone would give, and no other decode worker is tried
// (one retry raced the first attempt: a 503 "already in flight").
TEST(RemoteBackendMisconfiguredPeers, ServerErrorWithoutRetry) {
  Cluster c;
  v1::Error error;
  error.set_code(static_cast<int32_t>(absl::StatusCode::kFailedPrecondition));
  error.set_message("KV transfer mode mismatch: decode worker runs --kv-transfer-mode pull, "
                    "prefill worker 127.0.0.1:1 runs push");
  error.set_cause(v1::ERROR_CAUSE_WORKER_MISCONFIGURED);
  c.script.transfer_error = error;
  Outcome o = c.RunOne();
  EXPECT_EQ(o.reason, FinishReason::kError);
  EXPECT_EQ(o.status.code(), absl::StatusCode::kInternal) << o.status;
  EXPECT_EQ(o.status.message(),
            "the KV transfer between this request's workers failed: KV transfer mode mismatch: "
            "decode worker runs --kv-transfer-mode pull, prefill worker 127.0.0.1:1 runs push");
  EXPECT_EQ(c.script.decode_calls.size(), 1u);
  EXPECT_EQ(c.counters.num_decode_retries, 0);
  EXPECT_EQ(c.counters.num_migrations, 0);
  EXPECT_EQ(c.counters.num_worker_failures, 1);
}

// A prefill worker that refused the request for misconfigured peers (a layerwise prefill whose
// decode reservation has another KV layout), the mark in the gRPC status details: the same
// server error, and no other prefill worker is tried.
TEST(RemoteBackendMisconfiguredPeers, MarkedPrefillRefusalIsAServerError) {
  Cluster c;
  c.script.prefill_error = ToGrpcWithCause(MisconfiguredPeerError(
      "KV layout mismatch for request 'r': decode block_size 32; prefill block_size 16"));
  Outcome o = c.RunOne();
  EXPECT_EQ(o.reason, FinishReason::kError);
  EXPECT_EQ(o.status.code(), absl::StatusCode::kInternal) << o.status;
  EXPECT_EQ(o.status.message(),
            "the KV transfer between this request's workers failed: KV layout mismatch for "
            "request 'r': decode block_size 32; prefill block_size 16");
  EXPECT_EQ(c.script.prefills.size(), 1u);
  EXPECT_TRUE(c.script.decode_calls.empty());
  EXPECT_EQ(c.counters.num_prefill_retries, 0);
  EXPECT_EQ(c.counters.num_worker_failures, 1);
  // Unmarked, the refusal keeps its code (a prefill worker from before the mark).
  Cluster old;
  old.script.prefill_error = grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "KV layout");
  EXPECT_EQ(old.RunOne().status.code(), absl::StatusCode::kFailedPrecondition);
}

// The same error without the mark (a decode worker from before it) keeps its code: the
// router's answer to such workers is unchanged.
TEST(RemoteBackendMisconfiguredPeers, UnmarkedErrorKeepsItsCode) {
  Cluster c;
  v1::Error error;
  error.set_code(static_cast<int32_t>(absl::StatusCode::kFailedPrecondition));
  error.set_message("KV transfer mode mismatch");
  c.script.transfer_error = error;
  Outcome o = c.RunOne();
  EXPECT_EQ(o.status.code(), absl::StatusCode::kFailedPrecondition) << o.status;
  EXPECT_EQ(c.script.decode_calls.size(), 1u);
}

}  // namespace
}  // namespace sluice
