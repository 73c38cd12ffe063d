// The gRPC Inference API renders chat templates on the HTTP API's render pools (render_pools.h):
// under the same budget, stopped when the call is cancelled or passes its deadline, and when
// the pools stop at shutdown; a full render queue is UNAVAILABLE. Each test holds the only
// render thread with a render that would run for hours unless it is stopped.
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "services/api/render_pools.h"
#include "services/router/inference_grpc_service.h"
#include "tests/unit/api_test_fakes.h"

namespace sluice {
namespace {

using testing::ByteTokenizer;
using testing::FakeBackend;

// The model's template: a conversation whose first message is "spin" takes 10^10 loop
// iterations; any other renders "<|role|>content" + "<|assistant|>".
constexpr char kTemplate[] =
    "{% if messages[0]['content'] == 'spin' %}{% for i in range(100000) %}"
    "{% for j in range(100000) %}{% endfor %}{% endfor %}{% endif %}"
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}<|assistant|>";

jinja::RenderLimits Unbounded() {
  jinja::RenderLimits limits;
  limits.max_operations = int64_t{1} << 60;
  limits.max_loop_iterations = int64_t{1} << 60;
  limits.max_work_bytes = int64_t{1} << 60;
  return limits;
}

v1::GenerateRequest Chat(const std::string& content) {
  v1::GenerateRequest request;
  v1::ChatMessage* m = request.mutable_chat()->add_messages();
  m->set_role("user");
  m->set_content(content);
  request.mutable_chat()->set_add_generation_prompt(true);
  request.mutable_sampling()->set_max_tokens(2);
  return request;
}

class GrpcRenderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto tmpl = ChatTemplate::Parse(kTemplate);
    ASSERT_TRUE(tmpl.ok()) << tmpl.status();
    chat_template_ = *std::move(tmpl);
  }
  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown(std::chrono::system_clock::now());
    if (pools_ != nullptr) pools_->Stop();
  }

  void Start(const jinja::RenderLimits& limits, int max_queued = 16) {
    RenderPoolOptions pool_options;
    pool_options.threads = 1;
    pool_options.custom_template_threads = 0;
    pool_options.max_queued = max_queued;
    pool_options.limits = limits;
    pools_ = std::make_unique<RenderPools>(pool_options);
    InferenceGrpcServiceOptions options;
    options.served_model_name = "mini";
    options.render_pools = pools_.get();
    service_ = std::make_unique<InferenceGrpcService>(&backend_, &tokenizer_,
                                                      chat_template_.get(), nullptr, options);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    stub_ = v1::Inference::NewStub(
        grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                            grpc::InsecureChannelCredentials()));
  }

  // Call runs a Generate to its end and returns its status; `context` may set a deadline.
  grpc::Status Call(const v1::GenerateRequest& request, grpc::ClientContext* context) {
    auto reader = stub_->Generate(context, request);
    v1::TokenOutput out;
    while (reader->Read(&out)) {
    }
    return reader->Finish();
  }

  // ExpectServed: a plain request gets through the (only) render thread, reaches the engine
  // and ends with its output.
  void ExpectServed() {
    ++served_;
    std::thread finisher([this] {
      const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
      while (backend_.order().size() < served_ && std::chrono::steady_clock::now() < give_up) {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
      if (backend_.order().size() >= served_) {
        backend_.EmitText(backend_.order()[served_ - 1], "ok", FinishReason::kLength);
      }
    });
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    grpc::Status status = Call(Chat("hi"), &context);
    finisher.join();
    EXPECT_TRUE(status.ok()) << status.error_code() << " " << status.error_message();
    ASSERT_EQ(backend_.order().size(), served_);
    EXPECT_EQ(backend_.request(backend_.order().back()).prompt_token_ids,
              tokenizer_.Encode("<|user|>hi<|assistant|>", false, true));
  }

  ByteTokenizer tokenizer_;
  FakeBackend backend_;
  std::unique_ptr<ChatTemplate> chat_template_;
  std::unique_ptr<RenderPools> pools_;
  std::unique_ptr<InferenceGrpcService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::Inference::Stub> stub_;
  size_t served_ = 0;
};

TEST_F(GrpcRenderTest, RendersOnThePoolWithItsBudget) {
  jinja::RenderLimits limits;
  limits.max_loop_iterations = 1000;
  Start(limits);
  grpc::ClientContext context;
  grpc::Status status = Call(Chat("spin"), &context);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(status.error_message(),
            "chat template: line 1: template exceeds its render budget of 1000 loop iterations "
            "(max_loop_iterations)");
  EXPECT_TRUE(backend_.order().empty());
  ExpectServed();
}

TEST_F(GrpcRenderTest, TheCallsDeadlineStopsItsRender) {
  Start(Unbounded());
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
  grpc::Status status = Call(Chat("spin"), &context);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  // The render thread is free again (the render would have run for hours).
  ExpectServed();
}

TEST_F(GrpcRenderTest, CancellingTheCallStopsItsRender) {
  Start(Unbounded());
  grpc::ClientContext context;
  std::thread canceller([&context] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    context.TryCancel();
  });
  grpc::Status status = Call(Chat("spin"), &context);
  canceller.join();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::CANCELLED);
  ExpectServed();
}

TEST_F(GrpcRenderTest, StoppingThePoolsCancelsARunningRender) {
  Start(Unbounded());
  grpc::Status status;
  std::thread caller([&] {
    grpc::ClientContext context;
    status = Call(Chat("spin"), &context);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // let the render start
  // Returns once the render stopped (Stop joins the thread, which would render for hours).
  pools_->Stop();
  caller.join();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_EQ(status.error_message(), "chat template: line 1: template render cancelled");
  // Later calls are refused while the server shuts down.
  grpc::ClientContext context;
  status = Call(Chat("hi"), &context);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(status.error_message(), "The server is shutting down");
}

TEST_F(GrpcRenderTest, AFullRenderQueueIsUnavailable) {
  Start(Unbounded(), /*max_queued=*/1);
  // One thread that never finishes its render and one waiting place: of four calls at most two
  // are taken (one running, one waiting), whenever the thread picks up the first. The taken
  // ones end at their deadline.
  const auto deadline = std::chrono::system_clock::now() + std::chrono::seconds(2);
  grpc::Status statuses[4];
  std::thread callers[4];
  for (int i = 0; i < 4; ++i) {
    callers[i] = std::thread([&, i] {
      grpc::ClientContext context;
      context.set_deadline(deadline);
      statuses[i] = Call(Chat("spin"), &context);
    });
  }
  for (std::thread& t : callers) t.join();
  int refused = 0;
  for (const grpc::Status& s : statuses) {
    if (s.error_code() == grpc::StatusCode::UNAVAILABLE) {
      ++refused;
      EXPECT_EQ(s.error_message(),
                "The server is overloaded (1 requests waiting to be parsed); retry later");
    } else {
      EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
    }
  }
  EXPECT_GE(refused, 2);
  EXPECT_LE(refused, 3);
  // The render thread is free again once the deadlines passed: the clients see theirs at once,
  // the running render at its next budget poll, after which the waiting one leaves the queue.
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (pools_->num_queued() > 0 && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(pools_->num_queued(), 0);
  ExpectServed();
}

}  // namespace
}  // namespace sluice
