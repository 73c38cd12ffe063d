// GenerationSession for the newer API fields over a scripted backend: continuous usage stats,
// echo + logprobs (prompt logprobs), prompt_logprobs, chat echo, and /v1/responses (Response
// object and its typed event stream).
#include <memory>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_split.h"
#include "services/api/openai_service.h"
#include "tests/unit/api_test_fakes.h"

namespace sluice {
namespace {

using nlohmann::json;
using ::testing::ElementsAre;
using ::testing::StartsWith;
using testing::ByteTokenizer;
using testing::FakeBackend;
using testing::ManualExecutor;
using testing::RecordingSink;

class SessionFieldsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto tmpl = ChatTemplate::Parse(
        "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}");
    ASSERT_TRUE(tmpl.ok()) << tmpl.status();
    chat_template_ = *std::move(tmpl);
    OpenAiServiceOptions options;
    options.served_model_name = "mini";
    service_ = std::make_unique<OpenAiService>(&backend_, &tokenizer_, chat_template_.get(),
                                               options);
  }
  std::shared_ptr<RecordingSink> Post(const std::string& target, const json& body) {
    auto sink = std::make_shared<RecordingSink>();
    handle_ = service_->Handle({"POST", target, body.dump()}, sink, executor_.poster());
    executor_.Drain();
    return sink;
  }
  void EmitText(const std::string& id, const std::string& text,
                FinishReason finish = FinishReason::kNone) {
    backend_.EmitText(id, text, finish);
    executor_.Drain();
  }
  std::string OnlyId() const {
    std::vector<std::string> ids = backend_.order();
    EXPECT_EQ(ids.size(), 1u);
    return ids.empty() ? "" : ids[0];
  }
  // Data of SSE events ("data: {...}" → JSON; the [DONE] marker is skipped).
  static std::vector<json> Data(const RecordingSink& sink) {
    std::vector<json> out;
    for (const std::string& e : sink.events) {
      const size_t at = e.find("data: ");
      const std::string data = e.substr(at + 6, e.size() - at - 8);
      if (data != "[DONE]") out.push_back(json::parse(data));
    }
    return out;
  }

  ByteTokenizer tokenizer_;
  FakeBackend backend_;
  std::unique_ptr<ChatTemplate> chat_template_;
  std::unique_ptr<OpenAiService> service_;
  ManualExecutor executor_;
  std::shared_ptr<RequestHandle> handle_;
};

TEST_F(SessionFieldsTest, ContinuousUsageStatsOnEveryChunk) {
  auto sink = Post("/v1/completions",
                   {{"model", "mini"}, {"prompt", "ab"}, {"max_tokens", 3}, {"stream", true},
                    {"stream_options", {{"continuous_usage_stats", true}}}});
  const std::string id = OnlyId();
  EmitText(id, "x");
  EmitText(id, "y");
  EmitText(id, "z", FinishReason::kLength);
  std::vector<json> chunks = Data(*sink);
  ASSERT_GE(chunks.size(), 4u);
  int64_t last = 0;
  for (const json& c : chunks) {
    ASSERT_TRUE(c["usage"].is_object()) << c.dump();
    EXPECT_EQ(c["usage"]["prompt_tokens"], 3);
    const int64_t n = c["usage"]["completion_tokens"];
    EXPECT_GE(n, last);
    EXPECT_EQ(c["usage"]["total_tokens"], 3 + n);
    last = n;
  }
  EXPECT_EQ(chunks[0]["usage"]["completion_tokens"], 1);
  EXPECT_TRUE(chunks.back()["choices"].empty());
  EXPECT_EQ(chunks.back()["usage"]["completion_tokens"], 3);
}

TEST_F(SessionFieldsTest, EchoWithLogprobsScoresThePrompt) {
  auto sink = Post("/v1/completions", {{"model", "mini"}, {"prompt", "ab"}, {"max_tokens", 1},
                                       {"echo", true}, {"logprobs", 1}});
  const std::string id = OnlyId();
  EXPECT_EQ(backend_.request(id).sampling.prompt_logprobs, 1);
  EmitText(id, "c", FinishReason::kLength);
  const json choice = sink->json()["choices"][0];
  EXPECT_EQ(choice["text"], "abc");  // BOS is skipped in the text
  const json& lp = choice["logprobs"];
  EXPECT_EQ(lp["tokens"], json({"<s>", "a", "b", "c"}));
  EXPECT_EQ(lp["token_logprobs"], json({nullptr, -0.25, -0.5, -0.5}));
  EXPECT_TRUE(lp["top_logprobs"][0].is_null());
  EXPECT_EQ(lp["top_logprobs"][1], json({{"a", -0.25}, {"q", -0.125}}));
  EXPECT_EQ(lp["text_offset"], json({0, 0, 1, 2}));
  EXPECT_FALSE(choice.contains("prompt_logprobs"));
}

TEST_F(SessionFieldsTest, StreamedEchoWithLogprobsComesWithTheFirstOutput) {
  auto sink = Post("/v1/completions", {{"model", "mini"}, {"prompt", "ab"}, {"max_tokens", 2},
                                       {"echo", true}, {"logprobs", 0}, {"stream", true}});
  EXPECT_TRUE(sink->events.empty());  // the echo waits for the prompt logprobs
  const std::string id = OnlyId();
  EmitText(id, "c");
  EmitText(id, "d", FinishReason::kLength);
  std::vector<json> chunks = Data(*sink);
  ASSERT_GE(chunks.size(), 3u);
  EXPECT_EQ(chunks[0]["choices"][0]["text"], "ab");
  EXPECT_EQ(chunks[0]["choices"][0]["logprobs"]["token_logprobs"], json({nullptr, -0.25, -0.5}));
  EXPECT_EQ(chunks[1]["choices"][0]["text"], "c");
}

TEST_F(SessionFieldsTest, PromptLogprobsFieldVllmShape) {
  auto sink = Post("/v1/completions", {{"model", "mini"}, {"prompt", "ab"}, {"max_tokens", 1},
                                       {"prompt_logprobs", 1}});
  EmitText(OnlyId(), "c", FinishReason::kLength);
  const json pl = sink->json()["choices"][0]["prompt_logprobs"];
  ASSERT_EQ(pl.size(), 3u);
  EXPECT_TRUE(pl[0].is_null());
  const std::string a = std::to_string(ByteTokenizer::Byte('a'));
  const std::string q = std::to_string(ByteTokenizer::Byte('q'));
  EXPECT_EQ(pl[1][a], json({{"logprob", -0.25}, {"rank", 2}, {"decoded_token", "a"}}));
  EXPECT_EQ(pl[1][q], json({{"logprob", -0.125}, {"rank", 1}, {"decoded_token", "q"}}));

  // Chat: on the response.
  sink = Post("/v1/chat/completions",
              {{"model", "mini"},
               {"messages", {{{"role", "user"}, {"content", "Hi"}}}},
               {"max_tokens", 1},
               {"prompt_logprobs", 0}});
  const std::vector<std::string> ids = backend_.order();
  EmitText(ids.back(), "c", FinishReason::kLength);
  EXPECT_EQ(sink->json()["prompt_logprobs"].size(), 4u);  // <|user|> H i <|assistant|>
}

TEST_F(SessionFieldsTest, ChatEchoPrependsTheContinuedMessage) {
  auto sink = Post("/v1/chat/completions",
                   {{"model", "mini"},
                    {"messages", {{{"role", "user"}, {"content", "Hi"}},
                                  {{"role", "assistant"}, {"content", "He"}}}},
                    {"add_generation_prompt", false},
                    {"continue_final_message", true},
                    {"echo", true},
                    {"max_tokens", 2}});
  EmitText(OnlyId(), "y!", FinishReason::kLength);
  EXPECT_EQ(sink->json()["choices"][0]["message"]["content"], "Hey!");
}

TEST_F(SessionFieldsTest, ResponsesObject) {
  auto sink = Post("/v1/responses", {{"model", "mini"},
                                     {"input", "Hi"},
                                     {"instructions", "Be brief"},
                                     {"max_output_tokens", 2},
                                     {"metadata", {{"k", "v"}}}});
  const std::string id = OnlyId();
  // instructions → system message first.
  EXPECT_EQ(tokenizer_.Decode(backend_.request(id).prompt_token_ids, false),
            "<|system|>Be brief<|user|>Hi<|assistant|>");
  EmitText(id, "ok", FinishReason::kLength);
  ASSERT_EQ(sink->status, 200);
  const json r = sink->json();
  EXPECT_THAT(r["id"].get<std::string>(), StartsWith("resp_"));
  EXPECT_EQ(r["object"], "response");
  EXPECT_EQ(r["status"], "incomplete");
  EXPECT_EQ(r["incomplete_details"]["reason"], "max_output_tokens");
  EXPECT_EQ(r["instructions"], "Be brief");
  EXPECT_EQ(r["max_output_tokens"], 2);
  EXPECT_EQ(r["metadata"], json({{"k", "v"}}));
  ASSERT_EQ(r["output"].size(), 1u);
  const json& item = r["output"][0];
  EXPECT_EQ(item["type"], "message");
  EXPECT_EQ(item["role"], "assistant");
  EXPECT_THAT(item["id"].get<std::string>(), StartsWith("msg_"));
  EXPECT_EQ(item["content"][0], json({{"type", "output_text"},
                                      {"text", "ok"},
                                      {"annotations", json::array()},
                                      {"logprobs", json::array()}}));
  EXPECT_EQ(r["usage"]["input_tokens"], 22);  // "<|system|>" is 10 byte tokens here
  EXPECT_EQ(r["usage"]["output_tokens"], 2);
  EXPECT_EQ(r["usage"]["total_tokens"], 24);
}

TEST_F(SessionFieldsTest, ResponsesStreamEvents) {
  auto sink = Post("/v1/responses", {{"model", "mini"},
                                     {"input", "Hi"},
                                     {"stream", true},
                                     {"max_output_tokens", 5}});
  const std::string id = OnlyId();
  EmitText(id, "o");
  EmitText(id, "k");
  backend_.Emit(id, {ByteTokenizer::kEos}, FinishReason::kStop);  // EOS: no text
  executor_.Drain();
  std::vector<std::string> types;
  std::vector<json> data = Data(*sink);
  for (size_t i = 0; i < sink->events.size(); ++i) {
    const std::string& e = sink->events[i];
    ASSERT_THAT(e, StartsWith("event: "));
    const std::string type = e.substr(7, e.find('\n') - 7);
    EXPECT_EQ(data[i]["type"], type);
    EXPECT_EQ(data[i]["sequence_number"], static_cast<int64_t>(i));
    types.push_back(type);
  }
  EXPECT_THAT(types, ElementsAre("response.created", "response.in_progress",
                                 "response.output_item.added", "response.content_part.added",
                                 "response.output_text.delta", "response.output_text.delta",
                                 "response.output_text.done", "response.content_part.done",
                                 "response.output_item.done", "response.completed"));
  EXPECT_EQ(data[0]["response"]["status"], "in_progress");
  EXPECT_EQ(data[4]["delta"], "o");
  EXPECT_EQ(data[6]["text"], "ok");
  EXPECT_EQ(data[9]["response"]["status"], "completed");
  EXPECT_EQ(data[9]["response"]["output"][0]["content"][0]["text"], "ok");
  EXPECT_EQ(data[9]["response"]["usage"]["output_tokens"], 3);
  EXPECT_TRUE(sink->stream_ended);
}

TEST_F(SessionFieldsTest, BestOfReturnsTheChoicesOfHighestCumulativeLogprob) {
  // 3 candidates for the one prompt (one seed, choice indices 0..2); every token scores -0.5
  // here, so the shortest candidates rank first.
  auto sink = Post("/v1/completions", {{"model", "mini"}, {"prompt", "a"}, {"max_tokens", 4},
                                       {"n", 2}, {"best_of", 3}});
  const std::vector<std::string> ids = backend_.order();
  ASSERT_EQ(ids.size(), 3u);
  // Ranked by logprob: the engine reports the sampled token's even without `logprobs`.
  EXPECT_EQ(backend_.request(ids[0]).sampling.logprobs, 0);
  EmitText(ids[0], "xyz", FinishReason::kLength);
  EmitText(ids[1], "p", FinishReason::kLength);
  EmitText(ids[2], "qr", FinishReason::kLength);
  ASSERT_EQ(sink->status, 200) << sink->body;
  const json r = sink->json();
  ASSERT_EQ(r["choices"].size(), 2u);
  EXPECT_EQ(r["choices"][0]["index"], 0);
  EXPECT_EQ(r["choices"][0]["text"], "p");
  EXPECT_EQ(r["choices"][1]["index"], 1);
  EXPECT_EQ(r["choices"][1]["text"], "qr");
  EXPECT_TRUE(r["choices"][0]["logprobs"].is_null());  // not asked for
  // Every candidate's tokens were generated: usage counts them all (as OpenAI bills best_of).
  EXPECT_EQ(r["usage"]["completion_tokens"], 6);
}

TEST_F(SessionFieldsTest, ResponsesRefusals) {
  for (const auto& [field, value] :
       std::vector<std::pair<std::string, json>>{{"store", true},
                                                 {"previous_response_id", "resp_1"},
                                                 {"tools", {{{"type", "function"}}}},
                                                 {"frob", 1}}) {
    auto sink = Post("/v1/responses", {{"model", "mini"}, {"input", "Hi"}, {field, value}});
    EXPECT_EQ(sink->status, 400) << field;
    EXPECT_EQ(sink->json()["error"]["param"], field);
  }
  auto sink = Post("/v1/responses", {{"model", "mini"}, {"input", json::array()}});
  EXPECT_EQ(sink->json()["error"]["param"], "input");
  sink = Post("/v1/responses", {{"model", "mini"}, {"input", "Hi"}, {"max_output_tokens", 0}});
  EXPECT_EQ(sink->json()["error"]["param"], "max_output_tokens");
}

}  // namespace
}  // namespace sluice
