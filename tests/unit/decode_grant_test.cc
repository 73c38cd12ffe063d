// The decode worker's reservations are grants (worker.proto, docs/security.md): Reserve answers
// a token; a Decode or Cancel that finds the request reserved or decoding must carry it, else
// it is PERMISSION_DENIED and the reservation, its blocks and its decode stay as they were. A
// token of an earlier reservation of the same request id opens nothing. DecodeService runs here
// on loopback gRPC around an AsyncEngine with the fake ChecksumModel (no KV transfer is made:
// the remote-prefill case holds its transfer back with test_transfer_delay). Also: a Reserve
// answer that never reached its caller frees its blocks, and a KV transfer a misconfigured peer
// refused ends the request marked as a misconfiguration (services/common/misconfigured_peer.h).
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "engine/sched/async_engine.h"
#include "engine/sched/llm_engine.h"
#include "gtest/gtest.h"
#include "services/decode/decode_service.h"
#include "services/common/worker_metrics.h"
#include "services/serve/log.h"
#include "sluice/v1/worker.grpc.pb.h"
#include "spdlog/sinks/base_sink.h"
#include "tests/util/fake_models.h"

namespace sluice {
namespace {

constexpr int64_t kBlocks = 32;
constexpr int64_t kBlockSize = 4;

std::unique_ptr<LLMEngine> MakeEngine() {
  EngineOptions options;
  options.block_size = kBlockSize;
  options.num_kv_blocks = kBlocks;
  options.max_model_len = 64;
  options.kv_reserve_timeout_ms = 120000;
  options.enable_prefix_caching = false;  // block counts below are exact
  auto engine = LLMEngine::Create(std::make_unique<testing::ChecksumModel>(), options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return std::move(engine).value();
}

// Worker: an engine, a DecodeService and its gRPC server on loopback.
class Worker {
 public:
  explicit Worker(absl::Duration reserve_timeout = absl::Seconds(30),
                  absl::Duration reserve_answer_delay = absl::ZeroDuration(),
                  v1::KvTransferMode transfer_mode = v1::KV_TRANSFER_MODE_PULL,
                  absl::Duration transfer_delay = absl::Seconds(60))
      : engine_(MakeEngine()), metrics_("decode", "checksum") {
    DecodeServiceOptions options;
    options.reserve_timeout = reserve_timeout;
    options.test_reserve_answer_delay = reserve_answer_delay;
    options.transfer_mode = transfer_mode;
    options.release_timeout = absl::Milliseconds(200);
    // A remote prefill's transfer waits this long: the session stays reserved and claimed.
    options.test_transfer_delay = transfer_delay;
    service_ = std::make_unique<DecodeService>(&engine_, /*agent=*/nullptr,
                                               std::vector<transfer::KvRegion>{}, "descriptor",
                                               &metrics_, options);
    grpc::ServerBuilder builder;
    builder.RegisterService(service_.get());
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    server_ = builder.BuildAndStart();
    stub_ = v1::DecodeWorker::NewStub(grpc::CreateChannel(absl::StrCat("127.0.0.1:", port),
                                                          grpc::InsecureChannelCredentials()));
  }
  // The engine stops before the service goes, as in the decode worker (worker_command.cc):
  // AsyncEngine::Shutdown delivers the aborted final outputs of what is still reserved to
  // sessions that point at the service (TSan: heap-use-after-free in DecodeService::Forget
  // when the service went first).
  ~Worker() {
    server_->Shutdown();
    engine_.Shutdown();
    service_.reset();
  }

  v1::DecodeWorker::Stub* stub() { return stub_.get(); }
  AsyncEngineStats stats() { return engine_.Stats(); }
  // Waits (up to 10 s) until the service holds no session (the last ones' final outputs came).
  bool WaitNoSessions() {
    for (int i = 0; i < 1000 && service_->num_sessions() > 0; ++i) {
      absl::SleepFor(absl::Milliseconds(10));
    }
    return service_->num_sessions() == 0;
  }
  // Waits (up to 10 s) until `pred` holds of the engine's stats.
  template <typename Pred>
  bool WaitStats(Pred pred) {
    for (int i = 0; i < 1000; ++i) {
      if (pred(engine_.Stats())) return true;
      absl::SleepFor(absl::Milliseconds(10));
    }
    return false;
  }

 private:
  AsyncEngine engine_;
  WorkerMetrics metrics_;
  std::unique_ptr<DecodeService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::DecodeWorker::Stub> stub_;
};

std::vector<int32_t> Prompt() { return {3, 4, 5, 6, 7, 8, 9, 10, 11, 12}; }  // 3 blocks + 1

v1::SamplingParams Greedy(int max_tokens) {
  v1::SamplingParams s;
  s.set_temperature(0);
  s.set_max_tokens(max_tokens);
  return s;
}

grpc::Status Reserve(Worker& w, const std::string& id, std::string* token) {
  v1::ReserveRequest request;
  request.set_request_id(id);
  for (int32_t t : Prompt()) request.add_prompt_token_ids(t);
  *request.mutable_sampling() = Greedy(4);
  v1::ReserveResponse response;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::Status status = w.stub()->Reserve(&context, request, &response);
  *token = response.reservation_token();
  return status;
}

grpc::Status Cancel(Worker& w, const std::string& id, const std::string& token,
                    bool* found = nullptr) {
  v1::CancelRequest request;
  request.set_request_id(id);
  request.set_reservation_token(token);
  v1::CancelResponse response;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::Status status = w.stub()->Cancel(&context, request, &response);
  if (found != nullptr) *found = response.found();
  return status;
}

// DecodeCall: a Decode stream read to its end; `tokens` the streamed token ids.
struct DecodeResult {
  grpc::Status status;
  std::vector<int32_t> tokens;
  v1::FinishReason finish = v1::FINISH_REASON_UNSPECIFIED;
  v1::Error error;  // the final message's, when it ended with an error
};
DecodeResult Decode(Worker& w, const v1::DecodeRequest& request) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  auto reader = w.stub()->Decode(&context, request);
  DecodeResult result;
  v1::TokenOutput message;
  while (reader->Read(&message)) {
    for (const v1::SampledToken& t : message.tokens()) result.tokens.push_back(t.token_id());
    if (message.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
      result.finish = message.finish_reason();
      result.error = message.error();
    }
  }
  result.status = reader->Finish();
  return result;
}

v1::DecodeRequest LocalDecode(const std::string& id, const std::string& token, int max_tokens) {
  v1::DecodeRequest request;
  request.set_request_id(id);
  for (int32_t t : Prompt()) request.add_prompt_token_ids(t);
  *request.mutable_sampling() = Greedy(max_tokens);
  request.set_reservation_token(token);
  return request;
}

// A remote prefill's result: KV pinned at 127.0.0.1:1 (nothing listens), first token 5.
v1::DecodeRequest RemoteDecode(const std::string& id, const std::string& token) {
  v1::DecodeRequest request = LocalDecode(id, token, 4);
  v1::PrefillResponse* prefill = request.mutable_prefill();
  prefill->set_request_id(id);
  prefill->mutable_first_token()->set_token_id(5);
  prefill->set_num_prompt_tokens(static_cast<int32_t>(Prompt().size()));
  v1::BlockRun* run = prefill->mutable_kv()->add_runs();
  run->set_first_block(0);
  run->set_num_blocks(3);
  prefill->mutable_kv()->set_num_tokens(static_cast<int32_t>(Prompt().size()));
  prefill->set_prefill_worker_address("127.0.0.1:1");
  return request;
}

std::string Forged(std::string token) {
  if (!token.empty()) token[0] = static_cast<char>(token[0] ^ 1);
  return token;
}

TEST(DecodeGrantTest, ReservationNeedsItsTokenForCancelAndDecode) {
  Worker w;
  std::string token;
  ASSERT_TRUE(Reserve(w, "r1", &token).ok());
  ASSERT_EQ(token.size(), 16u);
  ASSERT_TRUE(w.WaitStats([](const AsyncEngineStats& s) { return s.num_reserved == 1; }));
  const int64_t free_reserved = w.stats().num_free_blocks;
  EXPECT_EQ(free_reserved, kBlocks - 3);  // 10 prompt tokens + 1: 3 blocks of 4

  for (const std::string& bad : {std::string(), Forged(token), std::string(16, 'x')}) {
    grpc::Status cancel = Cancel(w, "r1", bad);
    EXPECT_EQ(cancel.error_code(), grpc::StatusCode::PERMISSION_DENIED) << cancel.error_message();
    EXPECT_NE(cancel.error_message().find("Cancel of request 'r1' refused"), std::string::npos)
        << cancel.error_message();
    // Each of the Decode paths that would cancel, claim or replace the reservation.
    v1::DecodeRequest finished_by_prefill = LocalDecode("r1", bad, 4);
    finished_by_prefill.mutable_prefill()->set_finish_reason(v1::FINISH_REASON_STOP);
    v1::DecodeRequest bad_images = LocalDecode("r1", bad, 4);
    bad_images.add_mm_inputs()->set_content_hash("short");
    for (const v1::DecodeRequest& request :
         {LocalDecode("r1", bad, 4), RemoteDecode("r1", bad), finished_by_prefill, bad_images}) {
      DecodeResult d = Decode(w, request);
      EXPECT_EQ(d.status.error_code(), grpc::StatusCode::PERMISSION_DENIED)
          << d.status.error_message();
      EXPECT_NE(d.status.error_message().find("Decode of request 'r1' refused"),
                std::string::npos)
          << d.status.error_message();
      EXPECT_TRUE(d.tokens.empty());
    }
  }
  // Nothing was freed or claimed.
  EXPECT_EQ(w.stats().num_reserved, 1);
  EXPECT_EQ(w.stats().num_free_blocks, free_reserved);

  // The token claims it: a local decode replaces the reservation and streams every token.
  DecodeResult d = Decode(w, LocalDecode("r1", token, 4));
  EXPECT_TRUE(d.status.ok()) << d.status.error_message();
  EXPECT_EQ(d.tokens.size(), 4u);
  EXPECT_EQ(d.finish, v1::FINISH_REASON_LENGTH);
  EXPECT_TRUE(w.WaitStats([](const AsyncEngineStats& s) {
    return s.num_reserved == 0 && s.num_free_blocks == kBlocks;
  }));

  // Another reservation: the right token cancels it and frees its blocks.
  ASSERT_TRUE(Reserve(w, "r2", &token).ok());
  ASSERT_TRUE(w.WaitStats([](const AsyncEngineStats& s) { return s.num_reserved == 1; }));
  bool found = false;
  ASSERT_TRUE(Cancel(w, "r2", token, &found).ok());
  EXPECT_TRUE(found);
  EXPECT_TRUE(w.WaitStats([](const AsyncEngineStats& s) {
    return s.num_reserved == 0 && s.num_free_blocks == kBlocks;
  }));
  // Unknown ids answer OK (nothing to protect).
  ASSERT_TRUE(Cancel(w, "never-seen", "", &found).ok());
  EXPECT_FALSE(found);
}

TEST(DecodeGrantTest, TokenOfAnExpiredReservationOpensNotTheNextOne) {
  Worker w(/*reserve_timeout=*/absl::Milliseconds(300));
  std::string old_token;
  ASSERT_TRUE(Reserve(w, "r1", &old_token).ok());
  // Not claimed within the reservation timeout: freed.
  ASSERT_TRUE(w.WaitStats([](const AsyncEngineStats& s) {
    return s.num_reserved == 0 && s.num_free_blocks == kBlocks;
  }));
  ASSERT_TRUE(w.WaitNoSessions());
  std::string token;
  ASSERT_TRUE(Reserve(w, "r1", &token).ok());
  ASSERT_NE(token, old_token);
  ASSERT_TRUE(w.WaitStats([](const AsyncEngineStats& s) { return s.num_reserved == 1; }));
  EXPECT_EQ(Cancel(w, "r1", old_token).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(Decode(w, LocalDecode("r1", old_token, 4)).status.error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(w.stats().num_reserved, 1);
  EXPECT_TRUE(Cancel(w, "r1", token).ok());
  ASSERT_TRUE(w.WaitStats([](const AsyncEngineStats& s) {
    return s.num_reserved == 0 && s.num_free_blocks == kBlocks;
  }));
  ASSERT_TRUE(w.WaitNoSessions());
  // With no session under the id, a stale token is ignored: the call reserves anew (the
  // router's Decode after its reservation expired).
  DecodeResult d = Decode(w, LocalDecode("r1", old_token, 3));
  EXPECT_TRUE(d.status.ok()) << d.status.error_message();
  EXPECT_EQ(d.tokens.size(), 3u);
}

TEST(DecodeGrantTest, DecodeStartedWithoutReservationEndsOnlyWithItsCall) {
  Worker w;
  // A remote prefill's KV, no Reserve: the call reserves, then holds its (delayed) transfer.
  grpc::ClientContext context;
  auto reader = w.stub()->Decode(&context, RemoteDecode("d1", ""));
  ASSERT_TRUE(w.WaitStats([](const AsyncEngineStats& s) { return s.num_reserved == 1; }));
  const int64_t free_reserved = w.stats().num_free_blocks;
  for (const std::string& token : {std::string(), std::string(16, 'x')}) {
    grpc::Status cancel = Cancel(w, "d1", token);
    EXPECT_EQ(cancel.error_code(), grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_NE(cancel.error_message().find("started by a Decode call"), std::string::npos)
        << cancel.error_message();
    EXPECT_EQ(Decode(w, LocalDecode("d1", token, 4)).status.error_code(),
              grpc::StatusCode::PERMISSION_DENIED);
  }
  EXPECT_EQ(w.stats().num_reserved, 1);
  EXPECT_EQ(w.stats().num_free_blocks, free_reserved);
  // Cancelling the call itself frees the blocks.
  context.TryCancel();
  v1::TokenOutput message;
  while (reader->Read(&message)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(w.WaitStats([](const AsyncEngineStats& s) {
    return s.num_reserved == 0 && s.num_free_blocks == kBlocks;
  }));
}

TEST(DecodeGrantTest, ReserveCallCancelledBeforeItsAnswerFreesTheBlocks) {
  Worker w;
  // Fill the cache: 8 reservations of 3 blocks leave 8 blocks; a ninth and tenth fit, the
  // eleventh waits for blocks.
  std::vector<std::string> tokens(10);
  for (int i = 0; i < 10; ++i) {
    ASSERT_TRUE(Reserve(w, absl::StrCat("fill-", i), &tokens[i]).ok()) << i;
  }
  ASSERT_TRUE(w.WaitStats([](const AsyncEngineStats& s) { return s.num_free_blocks == 2; }));
  // A Reserve whose caller gives up (deadline) while it waits for blocks.
  {
    v1::ReserveRequest request;
    request.set_request_id("late");
    for (int32_t t : Prompt()) request.add_prompt_token_ids(t);
    *request.mutable_sampling() = Greedy(4);
    v1::ReserveResponse response;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(300));
    EXPECT_EQ(w.stub()->Reserve(&context, request, &response).error_code(),
              grpc::StatusCode::DEADLINE_EXCEEDED);
  }
  // Blocks free up: the late reservation gets them, and gives them back at once, since nobody
  // holds its token.
  ASSERT_TRUE(Cancel(w, "fill-0", tokens[0]).ok());
  EXPECT_TRUE(w.WaitStats([](const AsyncEngineStats& s) {
    return s.num_reserved == 9 && s.num_free_blocks == 5;
  })) << w.stats().num_reserved << " reserved, " << w.stats().num_free_blocks << " free";
  // Gone for good (a session still waiting or holding blocks would make this ALREADY_EXISTS).
  std::string token;
  grpc::Status again;
  for (int i = 0; i < 100; ++i) {
    again = Reserve(w, "late", &token);
    if (again.error_code() != grpc::StatusCode::ALREADY_EXISTS) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_TRUE(again.ok()) << again.error_message();
  EXPECT_TRUE(w.WaitStats([](const AsyncEngineStats& s) { return s.num_free_blocks == 2; }));
}

// The reservation was made and its token issued, but the answer never reached the caller (its
// deadline passed while the answer was held back, as when a router gives up on a Reserve whose
// answer is on its way): nobody holds the token, so the worker frees the blocks when the call
// ends, not at the reservation timeout (30 s here).
TEST(DecodeGrantTest, ReserveAnswerThatNeverReachedItsCallerFreesTheBlocks) {
  Worker w(/*reserve_timeout=*/absl::Seconds(30),
           /*reserve_answer_delay=*/absl::Milliseconds(600));
  v1::ReserveRequest request;
  request.set_request_id("lost");
  for (int32_t t : Prompt()) request.add_prompt_token_ids(t);
  *request.mutable_sampling() = Greedy(4);
  v1::ReserveResponse response;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
  EXPECT_EQ(w.stub()->Reserve(&context, request, &response).error_code(),
            grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_TRUE(response.reservation_token().empty());
  // Reserved while the answer is held back.
  EXPECT_EQ(w.stats().num_reserved, 1);
  EXPECT_TRUE(w.WaitStats([](const AsyncEngineStats& s) {
    return s.num_reserved == 0 && s.num_free_blocks == kBlocks;
  })) << w.stats().num_reserved << " reserved, " << w.stats().num_free_blocks << " free";
  ASSERT_TRUE(w.WaitNoSessions());
  // An answer that arrives is kept: its token claims the reservation as usual.
  std::string token;
  ASSERT_TRUE(Reserve(w, "kept", &token).ok());
  absl::SleepFor(absl::Milliseconds(200));  // past the answer's delivery
  EXPECT_EQ(w.stats().num_reserved, 1);
  EXPECT_TRUE(Cancel(w, "kept", token).ok());
  EXPECT_TRUE(w.WaitStats([](const AsyncEngineStats& s) {
    return s.num_reserved == 0 && s.num_free_blocks == kBlocks;
  }));
}

// A prefill worker that refuses every PushKv with FAILED_PRECONDITION (as one running
// --kv-transfer-mode pull does) and acks every Release.
class RefusingPrefill final : public v1::PrefillWorker::CallbackService {
 public:
  grpc::ServerUnaryReactor* PushKv(grpc::CallbackServerContext* context,
                                   const v1::PushKvRequest*, v1::PushKvResponse*) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                                 "KV transfer mode mismatch: this prefill worker runs "
                                 "--kv-transfer-mode pull"));
    return reactor;
  }
  grpc::ServerUnaryReactor* Release(grpc::CallbackServerContext* context,
                                    const v1::ReleaseRequest*,
                                    v1::ReleaseResponse* response) override {
    ++num_releases_;
    response->set_released(true);
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  int num_releases() const { return num_releases_.load(); }

 private:
  std::atomic<int> num_releases_{0};
};

// A KV transfer refused by the peer for a worker misconfiguration (here PushKv's
// FAILED_PRECONDITION) ends the request FAILED_PRECONDITION marked
// ERROR_CAUSE_WORKER_MISCONFIGURED, which the router answers as a server error without a retry.
// The blocks come back.
TEST(DecodeTransferErrorTest, PushRefusedByAMisconfiguredPeerIsMarked) {
  RefusingPrefill prefill;
  grpc::ServerBuilder builder;
  builder.RegisterService(&prefill);
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  std::unique_ptr<grpc::Server> prefill_server = builder.BuildAndStart();
  ASSERT_NE(prefill_server, nullptr);
  Worker w(absl::Seconds(30), absl::ZeroDuration(), v1::KV_TRANSFER_MODE_PUSH,
           /*transfer_delay=*/absl::ZeroDuration());
  v1::DecodeRequest request = RemoteDecode("p1", "");
  request.mutable_prefill()->set_kv_transfer_mode(v1::KV_TRANSFER_MODE_PUSH);
  request.mutable_prefill()->set_prefill_worker_address(absl::StrCat("127.0.0.1:", port));
  DecodeResult d = Decode(w, request);
  EXPECT_TRUE(d.status.ok()) << d.status.error_message();  // the error is the final message's
  EXPECT_EQ(d.finish, v1::FINISH_REASON_ERROR);
  EXPECT_EQ(d.error.code(), static_cast<int32_t>(absl::StatusCode::kFailedPrecondition));
  EXPECT_EQ(d.error.cause(), v1::ERROR_CAUSE_WORKER_MISCONFIGURED);
  EXPECT_EQ(d.error.message(),
            absl::StrCat("KV push from prefill worker 127.0.0.1:", port,
                         " failed: KV transfer mode mismatch: this prefill worker runs "
                         "--kv-transfer-mode pull"));
  EXPECT_TRUE(d.tokens.empty());
  EXPECT_TRUE(w.WaitStats([](const AsyncEngineStats& s) {
    return s.num_reserved == 0 && s.num_free_blocks == kBlocks;
  }));
  prefill_server->Shutdown();
}

// The decode worker finds the mismatch itself (the prefill answer says push, it pulls): the
// request ends marked, the prefill pin is acked, and the blocks come back.
TEST(DecodeTransferErrorTest, ModeMismatchIsMarkedAndAckedThePin) {
  RefusingPrefill prefill;
  grpc::ServerBuilder builder;
  builder.RegisterService(&prefill);
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  std::unique_ptr<grpc::Server> prefill_server = builder.BuildAndStart();
  ASSERT_NE(prefill_server, nullptr);
  Worker w(absl::Seconds(30), absl::ZeroDuration(), v1::KV_TRANSFER_MODE_PULL,
           /*transfer_delay=*/absl::ZeroDuration());
  v1::DecodeRequest request = RemoteDecode("p2", "");
  request.mutable_prefill()->set_kv_transfer_mode(v1::KV_TRANSFER_MODE_PUSH);
  request.mutable_prefill()->set_prefill_worker_address(absl::StrCat("127.0.0.1:", port));
  DecodeResult d = Decode(w, request);
  EXPECT_TRUE(d.status.ok()) << d.status.error_message();
  EXPECT_EQ(d.finish, v1::FINISH_REASON_ERROR);
  EXPECT_EQ(d.error.code(), static_cast<int32_t>(absl::StatusCode::kFailedPrecondition));
  EXPECT_EQ(d.error.cause(), v1::ERROR_CAUSE_WORKER_MISCONFIGURED);
  EXPECT_EQ(d.error.message(),
            absl::StrCat("KV transfer mode mismatch: decode worker runs --kv-transfer-mode pull, "
                         "prefill worker 127.0.0.1:", port, " runs push; start every worker with "
                         "the same --kv-transfer-mode"));
  EXPECT_EQ(prefill.num_releases(), 1);  // the pin is freed now, not at its timeout
  EXPECT_TRUE(w.WaitStats([](const AsyncEngineStats& s) {
    return s.num_reserved == 0 && s.num_free_blocks == kBlocks;
  }));
  prefill_server->Shutdown();
}

// CaptureLog: the default logger's lines while it lives (then the previous logger again).
class CaptureLog {
 public:
  CaptureLog() : previous_(spdlog::default_logger()), sink_(std::make_shared<Sink>()) {
    spdlog::set_default_logger(std::make_shared<spdlog::logger>("capture", sink_));
  }
  ~CaptureLog() { spdlog::set_default_logger(previous_); }
  std::string text() { return sink_->text(); }

 private:
  class Sink final : public spdlog::sinks::base_sink<std::mutex> {
   public:
    std::string text() {
      std::lock_guard<std::mutex> lock(mutex_);
      return text_;
    }

   protected:
    void sink_it_(const spdlog::details::log_msg& msg) override {
      text_.append(msg.payload.data(), msg.payload.size());
      text_ += '\n';
    }
    void flush_() override {}

   private:
    std::string text_;
  };
  std::shared_ptr<spdlog::logger> previous_;
  std::shared_ptr<Sink> sink_;
};

// A Decode cancelled before its (delayed) transfer began acks the prefill pin at once (its
// blocks are of no use), and says so when that ack fails: the blocks then stay pinned until the
// prefill worker's pin timeout. Layerwise mode: the cancelled reservation is freed only at its
// timeout (a layer push may still write into it), so the transfer job finds it cancelled.
TEST(DecodeTransferErrorTest, CancelBeforeTheTransferAcksThePin) {
  RefusingPrefill prefill;  // acks every Release
  grpc::ServerBuilder builder;
  builder.RegisterService(&prefill);
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  std::unique_ptr<grpc::Server> prefill_server = builder.BuildAndStart();
  ASSERT_NE(prefill_server, nullptr);
  CaptureLog log;
  Worker w(/*reserve_timeout=*/absl::Seconds(1), absl::ZeroDuration(),
           v1::KV_TRANSFER_MODE_LAYERWISE, /*transfer_delay=*/absl::Milliseconds(300));
  const std::pair<std::string, std::string> cases[] = {
      {"live", absl::StrCat("127.0.0.1:", port)}, {"gone", "127.0.0.1:1"}};
  for (const auto& [id, address] : cases) {
    v1::DecodeRequest request = RemoteDecode(id, "");
    request.mutable_prefill()->set_prefill_worker_address(address);
    grpc::ClientContext context;
    auto reader = w.stub()->Decode(&context, request);
    ASSERT_TRUE(w.WaitStats([](const AsyncEngineStats& s) { return s.num_reserved == 1; }));
    context.TryCancel();
    v1::TokenOutput message;
    while (reader->Read(&message)) {
    }
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
    EXPECT_TRUE(w.WaitStats([](const AsyncEngineStats& s) {
      return s.num_reserved == 0 && s.num_free_blocks == kBlocks;
    }));
  }
  const std::string failed = "request gone: cancelled before its KV transfer, but the ack to "
                             "prefill worker 127.0.0.1:1 failed (UNAVAILABLE";
  const absl::Time until = absl::Now() + absl::Seconds(10);
  while (log.text().find(failed) == std::string::npos && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(prefill.num_releases(), 1);  // the live worker's pin, acked after the cancel
  EXPECT_NE(log.text().find(failed), std::string::npos) << log.text();
  // The acked one logs nothing about its ack.
  EXPECT_EQ(log.text().find("request live: cancelled before"), std::string::npos) << log.text();
  prefill_server->Shutdown();
}

}  // namespace
}  // namespace sluice
