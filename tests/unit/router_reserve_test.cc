// RemoteBackend's decode reservations against fake prefill and decode workers (gRPC on
// loopback): blocks are reserved on decode only for a prefill that is running (its worker was
// idle when picked) or has answered, never for a request still queued behind other prefills.
// The old behaviour reserved at arrival: requests waiting for prefill held every decode block
// while a request whose prefill had answered failed with 503 "the decode workers are full" on
// a decode worker holding no KV at all.
//
// Requests with images: the encode runs while decode reserves (RemoteBackendEncodeOverlap);
// only the prefill waits for the embeddings.
#include <grpcpp/grpcpp.h>

#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "services/router/image_encoding.h"
#include "services/router/remote_backend.h"
#include "services/router/worker_registry.h"
#include "sluice/v1/encoder.grpc.pb.h"
#include "sluice/v1/worker.grpc.pb.h"

namespace sluice {
namespace {

constexpr int32_t kLong = 1;   // prompts starting with this token wait in the fake prefill queue
constexpr int32_t kShort = 2;  // these are answered at once
constexpr int32_t kFirstToken = 7;
constexpr int32_t kSecondToken = 8;

// FakePrefill answers short prompts at once and holds long ones until ReleaseQueued, as a
// prefill worker busy with other prompts would. Every answer pins one block run.
class FakePrefill final : public v1::PrefillWorker::CallbackService {
 public:
  std::string address;

  grpc::ServerUnaryReactor* Prefill(grpc::CallbackServerContext* context,
                                    const v1::PrefillRequest* request,
                                    v1::PrefillResponse* response) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    response->set_request_id(request->request_id());
    response->mutable_first_token()->set_token_id(kFirstToken);
    response->set_num_prompt_tokens(request->prompt_token_ids_size());
    v1::BlockRun* run = response->mutable_kv()->add_runs();
    run->set_first_block(0);
    run->set_num_blocks(1);
    response->mutable_kv()->set_num_tokens(request->prompt_token_ids_size());
    response->set_prefill_worker_address(address);
    std::lock_guard<std::mutex> lock(mu_);
    calls_.push_back(request->request_id());
    for (const v1::MultimodalInput& mm : request->mm_inputs()) {
      image_embedding_bytes_.push_back(static_cast<int64_t>(mm.embeddings().size()));
    }
    if (request->prompt_token_ids(0) == kLong) {
      queued_.push_back(reactor);
      cv_.notify_all();
    } else {
      reactor->Finish(grpc::Status::OK);
    }
    return reactor;
  }
  grpc::ServerUnaryReactor* Release(grpc::CallbackServerContext* context,
                                    const v1::ReleaseRequest*, v1::ReleaseResponse*) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

  bool WaitQueued(size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(20), [&] { return queued_.size() >= n; });
  }
  void ReleaseQueued() {
    std::lock_guard<std::mutex> lock(mu_);
    for (grpc::ServerUnaryReactor* reactor : queued_) reactor->Finish(grpc::Status::OK);
    queued_.clear();
  }
  std::vector<std::string> calls() {
    std::lock_guard<std::mutex> lock(mu_);
    return calls_;
  }
  // Per image of every Prefill, the bytes of embeddings it carried (0: bytes only).
  std::vector<int64_t> image_embedding_bytes() {
    std::lock_guard<std::mutex> lock(mu_);
    return image_embedding_bytes_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<grpc::ServerUnaryReactor*> queued_;
  std::vector<std::string> calls_;  // request ids, in arrival order
  std::vector<int64_t> image_embedding_bytes_;
};

// FakeDecode has room for `capacity` reservations (one per request, whatever its length):
// Reserve beyond it answers RESOURCE_EXHAUSTED. Decode streams one token and frees the
// request's reservation; Cancel frees it too, given the reservation's token (without it, it is
// PERMISSION_DENIED, as on a decode worker). Each reservation's token is "token-<id>"; the
// tokens Decode and Cancel calls carry are recorded. HoldReserveAnswers keeps each Reserve's
// answer back (the reservation made, the answer on its way) until ReleaseReserveAnswers.
class FakeDecode final : public v1::DecodeWorker::CallbackService {
 public:
  explicit FakeDecode(size_t capacity) : capacity_(capacity) {}

  grpc::ServerUnaryReactor* Reserve(grpc::CallbackServerContext* context,
                                    const v1::ReserveRequest* request,
                                    v1::ReserveResponse* response) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    std::lock_guard<std::mutex> lock(mu_);
    if (held_.size() >= capacity_) {
      ++num_full_;
      reactor->Finish(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "no free blocks"));
      return reactor;
    }
    held_.insert(request->request_id());
    reserved_.push_back(request->request_id());
    for (const v1::MultimodalInput& mm : request->mm_inputs()) {
      reserve_images_.push_back(mm.image());
    }
    cv_.notify_all();
    response->mutable_kv()->add_runs()->set_num_blocks(1);
    response->set_reservation_token("token-" + request->request_id());
    if (hold_answers_) {
      held_answers_.push_back(reactor);
      cv_.notify_all();
    } else {
      reactor->Finish(grpc::Status::OK);
    }
    return reactor;
  }
  void HoldReserveAnswers() {
    std::lock_guard<std::mutex> lock(mu_);
    hold_answers_ = true;
  }
  bool WaitHeldReserveAnswer() {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(20), [&] { return !held_answers_.empty(); });
  }
  void ReleaseReserveAnswers() {
    std::lock_guard<std::mutex> lock(mu_);
    hold_answers_ = false;
    for (grpc::ServerUnaryReactor* reactor : held_answers_) reactor->Finish(grpc::Status::OK);
    held_answers_.clear();
  }
  grpc::ServerUnaryReactor* Cancel(grpc::CallbackServerContext* context,
                                   const v1::CancelRequest* request,
                                   v1::CancelResponse* response) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    std::lock_guard<std::mutex> lock(mu_);
    const std::string& id = request->request_id();
    if (!cancel_tokens_.count(id)) cancel_tokens_[id] = request->reservation_token();
    cv_.notify_all();
    if (held_.count(id) > 0 && request->reservation_token() != "token-" + id) {
      reactor->Finish(grpc::Status(grpc::StatusCode::PERMISSION_DENIED, "no token"));
      return reactor;
    }
    response->set_found(held_.erase(id) > 0);
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  grpc::ServerWriteReactor<v1::TokenOutput>* Decode(grpc::CallbackServerContext*,
                                                    const v1::DecodeRequest* request) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      held_.erase(request->request_id());
      decode_tokens_[request->request_id()] = request->reservation_token();
    }
    return new OneToken(request->request_id());
  }

  std::map<std::string, std::string> decode_tokens() {
    std::lock_guard<std::mutex> lock(mu_);
    return decode_tokens_;
  }
  // The token of the first Cancel of `id` (waits up to 20 s for it); nullopt: none came.
  std::optional<std::string> WaitCancel(const std::string& id) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, std::chrono::seconds(20), [&] { return cancel_tokens_.count(id); })) {
      return std::nullopt;
    }
    return cancel_tokens_[id];
  }

  std::vector<std::string> reserved() {
    std::lock_guard<std::mutex> lock(mu_);
    return reserved_;
  }
  bool WaitReserved(size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(20), [&] { return reserved_.size() >= n; });
  }
  // The image bytes every Reserve carried, per image ("" where it carried embeddings).
  std::vector<std::string> reserve_images() {
    std::lock_guard<std::mutex> lock(mu_);
    return reserve_images_;
  }
  std::set<std::string> held() {
    std::lock_guard<std::mutex> lock(mu_);
    return held_;
  }
  int64_t num_full() {
    std::lock_guard<std::mutex> lock(mu_);
    return num_full_;
  }

 private:
  class OneToken final : public grpc::ServerWriteReactor<v1::TokenOutput> {
   public:
    explicit OneToken(const std::string& id) {
      out_.set_request_id(id);
      out_.add_tokens()->set_token_id(kSecondToken);
      out_.set_finish_reason(v1::FINISH_REASON_LENGTH);
      StartWrite(&out_);
    }
    void OnWriteDone(bool) override { Finish(grpc::Status::OK); }
    void OnDone() override { delete this; }

   private:
    v1::TokenOutput out_;
  };

  const size_t capacity_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> decode_tokens_;  // request id -> token its Decode carried
  std::map<std::string, std::string> cancel_tokens_;  // request id -> token its Cancel carried
  std::set<std::string> held_;
  std::vector<std::string> reserved_;  // request ids, in the order they got blocks
  std::vector<std::string> reserve_images_;
  int64_t num_full_ = 0;
  bool hold_answers_ = false;
  std::vector<grpc::ServerUnaryReactor*> held_answers_;
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

// Outcome: what a request delivered to its caller.
struct Outcome {
  std::vector<int32_t> tokens;
  FinishReason reason = FinishReason::kNone;
  absl::Status status;
  bool done = false;
};

class Outcomes {
 public:
  OutputCallback For(const std::string& id) {
    return [this, id](const RequestOutput& out) {
      std::lock_guard<std::mutex> lock(mu_);
      Outcome& o = outcomes_[id];
      for (const SampledToken& t : out.new_tokens) o.tokens.push_back(t.token_id);
      if (out.finished()) {
        o.reason = out.finish_reason;
        o.status = out.status;
        o.done = true;
        cv_.notify_all();
      }
    };
  }
  Outcome Wait(const std::string& id) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::seconds(20), [&] { return outcomes_[id].done; });
    return outcomes_[id];
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, Outcome> outcomes_;
};

EngineRequest Request(const std::string& id, int32_t kind) {
  EngineRequest r;
  r.request_id = id;
  r.prompt_token_ids = {kind, 100, 101, 102};
  r.sampling.max_tokens = 2;
  return r;
}

TEST(RemoteBackendReserve, RequestsQueuedForPrefillHoldNoDecodeBlocks) {
  FakePrefill prefill;
  FakeDecode decode(/*capacity=*/2);
  std::string decode_address;
  std::unique_ptr<grpc::Server> prefill_server = Serve(&prefill, &prefill.address);
  std::unique_ptr<grpc::Server> decode_server = Serve(&decode, &decode_address);
  ASSERT_NE(prefill_server, nullptr);
  ASSERT_NE(decode_server, nullptr);

  WorkerRegistry registry;
  ASSERT_TRUE(registry.Register(WorkerRole::kPrefill, prefill.address, WorkerLoad{}).ok());
  ASSERT_TRUE(registry.Register(WorkerRole::kDecode, decode_address, WorkerLoad{}).ok());
  RemoteBackendOptions options;
  options.reserve_attempt_wait = absl::Milliseconds(50);
  // Short enough that the old behaviour fails the test quickly, not by its 20 s waits.
  options.decode_queue_timeout = absl::Seconds(2);
  Outcomes outcomes;
  {
    RemoteBackend backend(&registry, options);
    // "long-1" finds the prefill worker idle: it starts at once, so it reserves in parallel.
    ASSERT_TRUE(backend.Submit(Request("long-1", kLong), outcomes.For("long-1")).ok());
    ASSERT_TRUE(prefill.WaitQueued(1));
    // "long-2" queues behind it: no reservation until its prefill answers.
    ASSERT_TRUE(backend.Submit(Request("long-2", kLong), outcomes.For("long-2")).ok());
    ASSERT_TRUE(prefill.WaitQueued(2));
    // "short" is prefilled at once and takes the decode worker's second slot (before the fix
    // "long-2" held it, and "short" failed with UNAVAILABLE after decode_queue_timeout).
    ASSERT_TRUE(backend.Submit(Request("short", kShort), outcomes.For("short")).ok());
    const Outcome s = outcomes.Wait("short");
    ASSERT_TRUE(s.done);
    EXPECT_TRUE(s.status.ok()) << s.status;
    EXPECT_EQ(s.reason, FinishReason::kLength);
    EXPECT_EQ(s.tokens, (std::vector<int32_t>{kFirstToken, kSecondToken}));
    EXPECT_EQ(decode.reserved(), (std::vector<std::string>{"long-1", "short"}));
    EXPECT_EQ(decode.held(), (std::set<std::string>{"long-1"}));
    EXPECT_EQ(decode.num_full(), 0);

    prefill.ReleaseQueued();
    for (const char* id : {"long-1", "long-2"}) {
      const Outcome o = outcomes.Wait(id);
      ASSERT_TRUE(o.done) << id;
      EXPECT_TRUE(o.status.ok()) << id << ": " << o.status;
      EXPECT_EQ(o.tokens, (std::vector<int32_t>{kFirstToken, kSecondToken})) << id;
    }
    EXPECT_EQ(decode.reserved(), (std::vector<std::string>{"long-1", "short", "long-2"}));
    EXPECT_EQ(decode.held(), std::set<std::string>{});
    const RemoteBackendCounters c = backend.counters();
    EXPECT_EQ(c.num_remote_prefills, 3);
    EXPECT_EQ(c.num_decode_queue_timeouts, 0);
    EXPECT_EQ(c.num_worker_failures, 0);
  }
  prefill_server->Shutdown();
  decode_server->Shutdown();
}

// A request that must wait for decode blocks after its prefill answered still gets them as
// soon as another request's decode frees them (the queue), and fails with a clean UNAVAILABLE
// naming the wait only when none free up before decode_queue_timeout.
TEST(RemoteBackendReserve, AfterPrefillWaitsForBlocksThenFailsCleanly) {
  FakePrefill prefill;
  FakeDecode decode(/*capacity=*/1);
  std::string decode_address;
  std::unique_ptr<grpc::Server> prefill_server = Serve(&prefill, &prefill.address);
  std::unique_ptr<grpc::Server> decode_server = Serve(&decode, &decode_address);
  WorkerRegistry registry;
  ASSERT_TRUE(registry.Register(WorkerRole::kPrefill, prefill.address, WorkerLoad{}).ok());
  ASSERT_TRUE(registry.Register(WorkerRole::kDecode, decode_address, WorkerLoad{}).ok());
  RemoteBackendOptions options;
  options.reserve_attempt_wait = absl::Milliseconds(50);
  options.reserve_backoff_max = absl::Milliseconds(100);
  options.decode_queue_timeout = absl::Seconds(1);
  Outcomes outcomes;
  {
    RemoteBackend backend(&registry, options);
    ASSERT_TRUE(backend.Submit(Request("long-1", kLong), outcomes.For("long-1")).ok());
    ASSERT_TRUE(prefill.WaitQueued(1));  // reserved in parallel: the decode worker is full
    ASSERT_TRUE(backend.Submit(Request("short", kShort), outcomes.For("short")).ok());
    const Outcome s = outcomes.Wait("short");
    ASSERT_TRUE(s.done);
    EXPECT_EQ(s.reason, FinishReason::kError);
    EXPECT_EQ(s.status.code(), absl::StatusCode::kUnavailable);
    EXPECT_NE(std::string(s.status.message()).find("the decode workers are full"),
              std::string::npos)
        << s.status;
    EXPECT_TRUE(s.tokens.empty());  // no first token before decode blocks: a clean 503
    EXPECT_GT(decode.num_full(), 0);
    prefill.ReleaseQueued();
    const Outcome l = outcomes.Wait("long-1");
    EXPECT_TRUE(l.status.ok()) << l.status;
    EXPECT_EQ(decode.reserved(), (std::vector<std::string>{"long-1"}));
    EXPECT_EQ(backend.counters().num_decode_queue_timeouts, 1);
    // Full, not failed: no worker failure (sluice_router_worker_failures_total).
    EXPECT_EQ(backend.counters().num_worker_failures, 0);
  }
  prefill_server->Shutdown();
  decode_server->Shutdown();
}

// The reservation is a grant (worker.proto): the router passes the token Reserve answered in
// the Decode that claims it and in the Cancel that drops it; a request decoded without a
// reservation carries none.
TEST(RemoteBackendReserve, DecodeAndCancelCarryTheReservationToken) {
  FakePrefill prefill;
  FakeDecode decode(/*capacity=*/4);
  std::string decode_address;
  std::unique_ptr<grpc::Server> prefill_server = Serve(&prefill, &prefill.address);
  std::unique_ptr<grpc::Server> decode_server = Serve(&decode, &decode_address);
  WorkerRegistry registry;
  ASSERT_TRUE(registry.Register(WorkerRole::kPrefill, prefill.address, WorkerLoad{}).ok());
  ASSERT_TRUE(registry.Register(WorkerRole::kDecode, decode_address, WorkerLoad{}).ok());
  RemoteBackendOptions options;
  options.reserve_attempt_wait = absl::Milliseconds(50);
  Outcomes outcomes;
  {
    RemoteBackend backend(&registry, options);
    // Prefilled remotely: reserved, then decoded with the reservation's token.
    ASSERT_TRUE(backend.Submit(Request("short", kShort), outcomes.For("short")).ok());
    const Outcome s = outcomes.Wait("short");
    ASSERT_TRUE(s.status.ok()) << s.status;
    EXPECT_EQ(decode.decode_tokens().at("short"), "token-short");
    // Reserved while its prefill runs, then aborted: the Cancel carries the token.
    ASSERT_TRUE(backend.Submit(Request("long-1", kLong), outcomes.For("long-1")).ok());
    ASSERT_TRUE(prefill.WaitQueued(1));
    for (int i = 0; i < 200 && decode.held().count("long-1") == 0; ++i) {
      absl::SleepFor(absl::Milliseconds(10));
    }
    ASSERT_EQ(decode.held().count("long-1"), 1u);
    // The answer may still be on its way here: the router waits for it (see
    // AbortDuringReserveCancelsWithTheTokenOfItsAnswer).
    backend.Abort("long-1");
    EXPECT_EQ(decode.WaitCancel("long-1"), std::optional<std::string>("token-long-1"));
    EXPECT_EQ(outcomes.Wait("long-1").reason, FinishReason::kAbort);
    prefill.ReleaseQueued();
  }
  {
    // Too short for a remote prefill: the decode worker prefills, no reservation, no token.
    options.min_remote_prefill_tokens = 1000;
    RemoteBackend backend(&registry, options);
    ASSERT_TRUE(backend.Submit(Request("local", kShort), outcomes.For("local")).ok());
    ASSERT_TRUE(outcomes.Wait("local").status.ok());
    EXPECT_EQ(decode.decode_tokens().at("local"), "");
  }
  prefill_server->Shutdown();
  decode_server->Shutdown();
}

// An abort that lands while the Reserve is in flight (the decode worker reserved; its answer,
// with the token, is on its way): the router lets the Reserve answer and cancels with its token,
// so the decode worker frees the blocks at once. Before, Abort cancelled the Reserve call, and
// the Cancel that followed had no token: refused, the blocks stayed reserved until the decode
// worker's reservation timeout (30 s).
TEST(RemoteBackendReserve, AbortDuringReserveCancelsWithTheTokenOfItsAnswer) {
  FakePrefill prefill;
  FakeDecode decode(/*capacity=*/4);
  std::string decode_address;
  std::unique_ptr<grpc::Server> prefill_server = Serve(&prefill, &prefill.address);
  std::unique_ptr<grpc::Server> decode_server = Serve(&decode, &decode_address);
  WorkerRegistry registry;
  ASSERT_TRUE(registry.Register(WorkerRole::kPrefill, prefill.address, WorkerLoad{}).ok());
  ASSERT_TRUE(registry.Register(WorkerRole::kDecode, decode_address, WorkerLoad{}).ok());
  RemoteBackendOptions options;
  options.reserve_attempt_wait = absl::Milliseconds(50);
  Outcomes outcomes;
  {
    RemoteBackend backend(&registry, options);
    decode.HoldReserveAnswers();
    // The prefill worker is idle: the Reserve goes out at once, in parallel with the prefill.
    ASSERT_TRUE(backend.Submit(Request("long-1", kLong), outcomes.For("long-1")).ok());
    ASSERT_TRUE(prefill.WaitQueued(1));
    ASSERT_TRUE(decode.WaitHeldReserveAnswer());
    backend.Abort("long-1");
    // Time for a cancelled Reserve to end and its (tokenless) Cancel to arrive.
    absl::SleepFor(absl::Milliseconds(300));
    decode.ReleaseReserveAnswers();
    EXPECT_EQ(decode.WaitCancel("long-1"), std::optional<std::string>("token-long-1"));
    const Outcome o = outcomes.Wait("long-1");
    EXPECT_TRUE(o.done);
    EXPECT_EQ(o.reason, FinishReason::kAbort);
    EXPECT_TRUE(o.tokens.empty());
    for (int i = 0; i < 200 && !decode.held().empty(); ++i) {
      absl::SleepFor(absl::Milliseconds(10));
    }
    EXPECT_EQ(decode.held(), std::set<std::string>{});
    prefill.ReleaseQueued();
  }
  prefill_server->Shutdown();
  decode_server->Shutdown();
}


// FakeEncoder holds every Encode call until Answer: OK answers each image with kImageTokens x
// kHidden embeddings under the content hash its bytes spell (the tests send
// ContentHashToWire(hash) as the image), as an encoder serving the router's model would.
constexpr int32_t kImageTokens = 2;
constexpr int32_t kHidden = 4;

class FakeEncoder final : public v1::Encoder::CallbackService {
 public:
  grpc::ServerUnaryReactor* Encode(grpc::CallbackServerContext* context,
                                   const v1::EncodeRequest* request,
                                   v1::EncodeResponse* response) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    const std::vector<float> values(kImageTokens * kHidden, 0.5f);
    for (const std::string& image : request->images()) {
      v1::ImageEmbedding* e = response->add_embeddings();
      e->set_content_hash(image);
      e->set_num_tokens(kImageTokens);
      e->set_hidden_size(kHidden);
      e->set_values(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
    }
    std::lock_guard<std::mutex> lock(mu_);
    held_.push_back(reactor);
    contexts_.push_back(context);
    cv_.notify_all();
    return reactor;
  }
  bool WaitHeld() {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(20), [&] { return !held_.empty(); });
  }
  size_t num_held() {
    std::lock_guard<std::mutex> lock(mu_);
    return held_.size();
  }
  // Every held call was cancelled by its caller (waits up to 20 s).
  bool WaitHeldCancelled() {
    for (int i = 0; i < 2000; ++i) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        bool all = !contexts_.empty();
        for (grpc::CallbackServerContext* c : contexts_) all = all && c->IsCancelled();
        if (all) return true;
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
    return false;
  }
  void Answer(const grpc::Status& status) {
    std::lock_guard<std::mutex> lock(mu_);
    for (grpc::ServerUnaryReactor* reactor : held_) reactor->Finish(status);
    held_.clear();
    contexts_.clear();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<grpc::ServerUnaryReactor*> held_;
  std::vector<grpc::CallbackServerContext*> contexts_;  // of held_
};

// One image at prompt positions 1..2, as bytes (the API checked it; no embeddings yet).
EngineRequest ImageRequest(const std::string& id) {
  EngineRequest r = Request(id, kShort);
  MultimodalInput mm;
  mm.offset = 1;
  mm.num_tokens = kImageTokens;
  mm.content_hash = BlockHash{11, 22};
  mm.image = std::make_shared<const std::string>(ContentHashToWire(mm.content_hash));
  r.mm_inputs.push_back(mm);
  return r;
}

// Fake prefill, decode and encoder workers on loopback; `decode_encodes`: the decode worker
// advertises image_encode.
struct ImageCluster {
  explicit ImageCluster(bool decode_encodes) : decode(/*capacity=*/4) {
    prefill_server = Serve(&prefill, &prefill.address);
    decode_server = Serve(&decode, &decode_address);
    encoder_server = Serve(&encoder, &encoder_address);
    const std::vector<std::string> encodes = {kImageEncodeCapability};
    EXPECT_TRUE(
        registry.Register(WorkerRole::kPrefill, prefill.address, WorkerLoad{}, encodes).ok());
    EXPECT_TRUE(registry
                    .Register(WorkerRole::kDecode, decode_address, WorkerLoad{},
                              decode_encodes ? encodes : std::vector<std::string>{})
                    .ok());
    EXPECT_TRUE(registry.Register(WorkerRole::kEncoder, encoder_address, WorkerLoad{}).ok());
    options.reserve_attempt_wait = absl::Milliseconds(50);
  }
  ~ImageCluster() {
    encoder.Answer(grpc::Status(grpc::StatusCode::CANCELLED, "shutting down"));
    encoder_server->Shutdown();
    prefill_server->Shutdown();
    decode_server->Shutdown();
  }

  FakePrefill prefill;
  FakeDecode decode;
  FakeEncoder encoder;
  std::string decode_address, encoder_address;
  std::unique_ptr<grpc::Server> prefill_server, decode_server, encoder_server;
  WorkerRegistry registry;
  RemoteBackendOptions options;
};

// The decode Reserve goes out while the encoder still holds the images (it carries their
// bytes); the prefill only once the embeddings are there, and carries them. The tokens are
// those of a request encoded first.
TEST(RemoteBackendEncodeOverlap, DecodeReservesWhileTheImagesAreEncoded) {
  ImageCluster cluster(/*decode_encodes=*/true);
  Outcomes outcomes;
  {
    RemoteBackend backend(&cluster.registry, cluster.options);
    ASSERT_TRUE(backend.Submit(ImageRequest("img"), outcomes.For("img")).ok());
    ASSERT_TRUE(cluster.encoder.WaitHeld());
    ASSERT_TRUE(cluster.decode.WaitReserved(1));
    // Reserved, the encode still held, and no prefill sent without the embeddings.
    EXPECT_EQ(cluster.encoder.num_held(), 1u);
    EXPECT_EQ(cluster.decode.held(), std::set<std::string>{"img"});
    EXPECT_EQ(cluster.decode.reserve_images(),
              std::vector<std::string>{ContentHashToWire(BlockHash{11, 22})});
    absl::SleepFor(absl::Milliseconds(100));
    EXPECT_TRUE(cluster.prefill.calls().empty());

    cluster.encoder.Answer(grpc::Status::OK);
    const Outcome o = outcomes.Wait("img");
    ASSERT_TRUE(o.done);
    EXPECT_TRUE(o.status.ok()) << o.status;
    EXPECT_EQ(o.reason, FinishReason::kLength);
    EXPECT_EQ(o.tokens, (std::vector<int32_t>{kFirstToken, kSecondToken}));
    EXPECT_EQ(cluster.prefill.calls(), std::vector<std::string>{"img"});
    EXPECT_EQ(cluster.prefill.image_embedding_bytes(),
              std::vector<int64_t>{kImageTokens * kHidden * 4});
    EXPECT_EQ(cluster.decode.decode_tokens().at("img"), "token-img");
    EXPECT_EQ(cluster.decode.held(), std::set<std::string>{});
    const RemoteBackendCounters c = backend.counters();
    EXPECT_EQ(c.num_encoded_images, 1);
    EXPECT_EQ(c.num_remote_prefills, 1);
    EXPECT_EQ(c.num_worker_failures, 0);
  }
}

// The encoder refuses the image after decode reserved: the request fails with the encoder's
// error (INVALID_ARGUMENT, a 400), no prefill is sent, and the reservation is cancelled with
// its token, so the decode worker holds no blocks. An abort during the encode does the same.
TEST(RemoteBackendEncodeOverlap, FailedEncodeFreesTheReservation) {
  ImageCluster cluster(/*decode_encodes=*/true);
  Outcomes outcomes;
  {
    RemoteBackend backend(&cluster.registry, cluster.options);
    ASSERT_TRUE(backend.Submit(ImageRequest("bad"), outcomes.For("bad")).ok());
    ASSERT_TRUE(cluster.encoder.WaitHeld());
    ASSERT_TRUE(cluster.decode.WaitReserved(1));
    cluster.encoder.Answer(
        grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "image 0 is not a PNG, JPEG or WebP"));
    const Outcome o = outcomes.Wait("bad");
    ASSERT_TRUE(o.done);
    EXPECT_EQ(o.reason, FinishReason::kError);
    EXPECT_EQ(o.status.code(), absl::StatusCode::kInvalidArgument) << o.status;
    EXPECT_NE(std::string(o.status.message()).find("not a PNG"), std::string::npos);
    EXPECT_TRUE(o.tokens.empty());
    EXPECT_EQ(cluster.decode.WaitCancel("bad"), std::optional<std::string>("token-bad"));
    EXPECT_EQ(cluster.decode.held(), std::set<std::string>{});

    ASSERT_TRUE(backend.Submit(ImageRequest("gone"), outcomes.For("gone")).ok());
    ASSERT_TRUE(cluster.encoder.WaitHeld());
    ASSERT_TRUE(cluster.decode.WaitReserved(2));
    backend.Abort("gone");
    EXPECT_EQ(cluster.decode.WaitCancel("gone"), std::optional<std::string>("token-gone"));
    EXPECT_EQ(outcomes.Wait("gone").reason, FinishReason::kAbort);
    EXPECT_EQ(cluster.decode.held(), std::set<std::string>{});
    EXPECT_TRUE(cluster.prefill.calls().empty());
    EXPECT_TRUE(cluster.encoder.WaitHeldCancelled());  // the abort cancelled the Encode
    EXPECT_EQ(backend.counters().num_encoded_images, 0);
    EXPECT_EQ(backend.counters().num_worker_failures, 0);
  }
  EXPECT_EQ(cluster.decode.reserved(), (std::vector<std::string>{"bad", "gone"}));
}

// A decode worker that cannot encode images cannot hold them as bytes: the images are encoded
// first and every call carries the embeddings.
TEST(RemoteBackendEncodeOverlap, DecodeWithoutImageEncodeReservesAfterTheEncode) {
  ImageCluster cluster(/*decode_encodes=*/false);
  Outcomes outcomes;
  {
    RemoteBackend backend(&cluster.registry, cluster.options);
    ASSERT_TRUE(backend.Submit(ImageRequest("img"), outcomes.For("img")).ok());
    ASSERT_TRUE(cluster.encoder.WaitHeld());
    absl::SleepFor(absl::Milliseconds(100));
    EXPECT_TRUE(cluster.decode.reserved().empty());
    cluster.encoder.Answer(grpc::Status::OK);
    const Outcome o = outcomes.Wait("img");
    EXPECT_TRUE(o.status.ok()) << o.status;
    EXPECT_EQ(o.tokens, (std::vector<int32_t>{kFirstToken, kSecondToken}));
    EXPECT_EQ(cluster.decode.reserve_images(), std::vector<std::string>{""});
    EXPECT_EQ(cluster.prefill.image_embedding_bytes(),
              std::vector<int64_t>{kImageTokens * kHidden * 4});
  }
}

}  // namespace
}  // namespace sluice
