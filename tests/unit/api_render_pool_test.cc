// OpenAiService with render pools: a request's chat template renders off the caller's thread,
// a hostile `chat_template` gets 400 naming the exhausted limit, a cancelled request's render
// stops and answers nothing, a request with the model's template is not held up by a busy
// custom-template pool, and a full render queue answers 503.
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "services/api/openai_service.h"
#include "tests/unit/api_test_fakes.h"

namespace sluice {
namespace {

using nlohmann::json;
using testing::ByteTokenizer;
using testing::FakeBackend;
using testing::ManualExecutor;
using testing::RecordingSink;

// A render that would take hours: 10^10 loop iterations under a budget that allows them.
constexpr char kEndlessTemplate[] =
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}";

// Unbounded: limits no render reaches (only cancellation stops kEndlessTemplate).
jinja::RenderLimits Unbounded() {
  jinja::RenderLimits limits;
  limits.max_operations = int64_t{1} << 60;
  limits.max_loop_iterations = int64_t{1} << 60;
  limits.max_work_bytes = int64_t{1} << 60;
  return limits;
}

class RenderPoolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto tmpl = ChatTemplate::Parse(
        "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}");
    ASSERT_TRUE(tmpl.ok()) << tmpl.status();
    chat_template_ = *std::move(tmpl);
    Create(jinja::RenderLimits(), 256);
  }
  void Create(const jinja::RenderLimits& limits, int max_queued,
              std::chrono::milliseconds render_timeout = std::chrono::seconds(30)) {
    OpenAiServiceOptions options;
    options.render_timeout = render_timeout;
    options.served_model_name = "mini";
    options.render_threads = 1;
    options.custom_template_render_threads = 1;
    options.max_queued_renders = max_queued;
    options.render_limits = limits;
    service_ = std::make_unique<OpenAiService>(&backend_, &tokenizer_, chat_template_.get(),
                                               options);
  }
  static json Chat(const std::string& chat_template = "") {
    json body{{"model", "mini"},
              {"messages", json::array({{{"role", "user"}, {"content", "hi"}}})},
              {"max_tokens", 4}};
    if (!chat_template.empty()) body["chat_template"] = chat_template;
    return body;
  }
  std::shared_ptr<RecordingSink> Post(const json& body,
                                      std::shared_ptr<RequestHandle>* handle = nullptr) {
    auto sink = std::make_shared<RecordingSink>();
    auto h = service_->Handle({"POST", "/v1/chat/completions", body.dump()}, sink,
                              executor_.poster());
    if (handle != nullptr) *handle = h;
    return sink;
  }
  // WaitFor runs posted work until `done` holds (the parse runs on the pool's thread).
  template <typename Pred>
  bool WaitFor(Pred done) {
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (std::chrono::steady_clock::now() < give_up) {
      executor_.Drain();
      if (done()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return false;
  }

  ByteTokenizer tokenizer_;
  FakeBackend backend_;
  std::unique_ptr<ChatTemplate> chat_template_;
  std::unique_ptr<OpenAiService> service_;
  ManualExecutor executor_;
};

TEST_F(RenderPoolTest, ParsesOffTheCallerThreadAndGenerates) {
  auto sink = Post(Chat());
  EXPECT_EQ(sink->num_responses, 0);  // nothing answered on the caller's thread
  ASSERT_TRUE(WaitFor([&] { return backend_.order().size() == 1; }));
  const std::string id = backend_.order()[0];
  EXPECT_EQ(backend_.request(id).prompt_token_ids,
            tokenizer_.Encode("<|user|>hi<|assistant|>", false, true));
  backend_.EmitText(id, "ok", FinishReason::kLength);
  ASSERT_TRUE(WaitFor([&] { return sink->num_responses == 1; }));
  EXPECT_EQ(sink->status, 200);
  EXPECT_EQ(sink->json()["choices"][0]["message"]["content"], "ok");
}

TEST_F(RenderPoolTest, HostileTemplateGets400NamingTheLimit) {
  jinja::RenderLimits limits;
  limits.max_work_bytes = 1 << 20;
  Create(limits, 256);
  auto sink = Post(Chat("{% for i in range(1000) %}{% set x = 'y' * 100000 %}{% endfor %}"
                        "{{ messages[0].content }}"));
  ASSERT_TRUE(WaitFor([&] { return sink->num_responses == 1; }));
  EXPECT_EQ(sink->status, 400);
  const json error = sink->json()["error"];
  EXPECT_EQ(error["param"], "chat_template");
  EXPECT_EQ(error["message"],
            "chat template: line 1: template exceeds its render budget of 1048576 bytes of work "
            "(max_work_bytes)");
  EXPECT_TRUE(backend_.order().empty());
}

TEST_F(RenderPoolTest, RenderPastTheTimeoutIs504) {
  Create(Unbounded(), 256, std::chrono::milliseconds(0));
  auto sink = Post(Chat(kEndlessTemplate));
  ASSERT_TRUE(WaitFor([&] { return sink->num_responses == 1; }));
  EXPECT_EQ(sink->status, 504);
  EXPECT_EQ(sink->json()["error"]["param"], "chat_template");
  EXPECT_EQ(sink->json()["error"]["message"],
            "chat template: line 1: template render passed its deadline");
}

TEST_F(RenderPoolTest, CancelStopsTheRenderAndAnswersNothing) {
  Create(Unbounded(), 256);
  std::shared_ptr<RequestHandle> handle;
  auto sink = Post(Chat(kEndlessTemplate), &handle);
  ASSERT_NE(handle, nullptr);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // let the render start
  handle->Cancel();
  // Joining the pools returns only once the render stopped (it would run for hours).
  service_->StopRendering();
  executor_.Drain();
  EXPECT_EQ(sink->num_responses, 0);
  EXPECT_TRUE(backend_.order().empty());
}

TEST_F(RenderPoolTest, ModelTemplateRequestsPassABusyCustomTemplatePool) {
  Create(Unbounded(), 256);
  std::shared_ptr<RequestHandle> hostile;
  auto hostile_sink = Post(Chat(kEndlessTemplate), &hostile);
  auto sink = Post(Chat());
  ASSERT_TRUE(WaitFor([&] { return backend_.order().size() == 1; }));
  backend_.EmitText(backend_.order()[0], "ok", FinishReason::kLength);
  ASSERT_TRUE(WaitFor([&] { return sink->num_responses == 1; }));
  EXPECT_EQ(sink->status, 200);
  EXPECT_EQ(hostile_sink->num_responses, 0);  // still rendering
  hostile->Cancel();
  service_->StopRendering();
}

TEST_F(RenderPoolTest, FullRenderQueueAnswers503) {
  Create(Unbounded(), 1);
  // One thread that never finishes its render and one waiting place: of four requests at most
  // two are taken (one running, one waiting), whenever the thread picks up the first.
  std::vector<std::shared_ptr<RequestHandle>> handles;
  int refused = 0;
  for (int i = 0; i < 4; ++i) {
    std::shared_ptr<RequestHandle> handle;
    auto sink = Post(Chat(kEndlessTemplate), &handle);
    if (handle != nullptr) {
      EXPECT_EQ(sink->num_responses, 0);
      handles.push_back(handle);
      continue;
    }
    ++refused;
    EXPECT_EQ(sink->num_responses, 1);
    EXPECT_EQ(sink->status, 503);
    EXPECT_EQ(sink->json()["error"]["message"],
              "The server is overloaded (1 requests waiting to be parsed); retry later");
  }
  EXPECT_GE(refused, 2);
  for (auto& h : handles) h->Cancel();
  service_->StopRendering();
}

}  // namespace
}  // namespace sluice
