// OpenAiService + GenerationSession over a scripted backend: response shapes, SSE framing,
// stop strings, UTF-8 hold-back, n > 1, logprobs, errors, cancellation, overload, routing.
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "services/api/openai_responses.h"
#include "services/api/openai_service.h"
#include "tests/unit/api_test_fakes.h"

namespace sluice {
namespace {

using nlohmann::json;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;
using testing::ByteTokenizer;
using testing::FakeBackend;
using testing::ManualExecutor;
using testing::RecordingSink;

class ServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto tmpl = ChatTemplate::Parse(
        "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}");
    ASSERT_TRUE(tmpl.ok()) << tmpl.status();
    chat_template_ = *std::move(tmpl);
    Recreate(512);
  }
  void Recreate(int64_t max_concurrent) {
    OpenAiServiceOptions options;
    options.served_model_name = "mini";
    options.max_concurrent_requests = max_concurrent;
    service_ = std::make_unique<OpenAiService>(&backend_, &tokenizer_, chat_template_.get(),
                                               options);
  }

  // Post sends a request and runs everything the handler posted.
  std::shared_ptr<RecordingSink> Send(const std::string& method, const std::string& target,
                                      const std::string& body = "") {
    auto sink = std::make_shared<RecordingSink>();
    handle_ = service_->Handle({method, target, body}, sink, executor_.poster());
    executor_.Drain();
    return sink;
  }
  std::shared_ptr<RecordingSink> Post(const std::string& target, const json& body) {
    return Send("POST", target, body.dump());
  }
  // Emit delivers engine output and runs the posted session work.
  void EmitText(const std::string& id, const std::string& text,
                FinishReason finish = FinishReason::kNone) {
    backend_.EmitText(id, text, finish);
    executor_.Drain();
  }
  void Emit(const std::string& id, const std::vector<int32_t>& tokens,
            FinishReason finish = FinishReason::kNone, absl::Status status = absl::OkStatus()) {
    backend_.Emit(id, tokens, finish, std::move(status));
    executor_.Drain();
  }

  ByteTokenizer tokenizer_;
  FakeBackend backend_;
  std::unique_ptr<ChatTemplate> chat_template_;
  std::unique_ptr<OpenAiService> service_;
  ManualExecutor executor_;
  std::shared_ptr<RequestHandle> handle_;
};

// Fuzz finding (tests/fuzz/corpus/http_openai_fuzz): a body nested 100,000 levels deep (in
// `messages` or in a structured-output schema, given as an object or as JSON text) overflowed
// the stack while the request was copied. It is a 400 now, and the next request is served.
TEST_F(ServiceTest, DeeplyNestedBodiesAre400) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  const std::string chat_prefix = R"({"model":"mini","messages":[{"role":"user","content":)";
  for (const std::string& body :
       {chat_prefix + deep + "}]}",
        chat_prefix + R"("hi"}],"response_format":{"type":"json_schema","json_schema":)"
                      R"({"name":"x","schema":{"type":"array","items":)" + deep + "}}}}"}) {
    auto sink = Send("POST", "/v1/chat/completions", body);
    EXPECT_EQ(sink->status, 400);
    EXPECT_EQ(sink->json()["error"]["message"], "The request body is nested deeper than 128 levels");
  }
  // guided_json takes the schema as JSON text (response_format's schema must be an object).
  const std::string schema_text = json(std::string(200, '[') + std::string(200, ']')).dump();
  auto text = Send("POST", "/v1/chat/completions",
                   chat_prefix + R"("hi"}],"guided_json":)" + schema_text + "}");
  EXPECT_EQ(text->status, 400);
  EXPECT_THAT(text->json()["error"]["message"].get<std::string>(),
              HasSubstr("nested deeper than 128 levels"));
  // 128 levels are accepted (the body's own object is the first).
  std::string nested = "1";
  for (int i = 0; i < 125; ++i) nested = "[" + nested + "]";
  auto ok = Send("POST", "/v1/completions",
                 R"({"model":"mini","prompt":"hi","max_tokens":1,"metadata":{"x":)" + nested + "}}");
  EXPECT_NE(ok->json()["error"]["message"], "The request body is nested deeper than 128 levels");
  EXPECT_EQ(Post("/v1/completions", {{"model", "mini"}, {"prompt", "hi"}})->num_responses, 0);
}

TEST_F(ServiceTest, CompletionResponseShape) {
  backend_.cached_tokens = 1;
  auto sink = Post("/v1/completions", {{"model", "mini"}, {"prompt", "ab"}, {"max_tokens", 5}});
  EXPECT_EQ(sink->num_responses, 0);  // waiting for the engine
  ASSERT_EQ(backend_.order().size(), 1u);
  const std::string id = backend_.order()[0];
  EXPECT_EQ(backend_.request(id).sampling.max_tokens, 5);
  EmitText(id, "Hel");
  EmitText(id, "lo", FinishReason::kLength);
  ASSERT_EQ(sink->num_responses, 1);
  EXPECT_EQ(sink->status, 200);
  EXPECT_EQ(sink->type, "application/json");
  json r = sink->json();
  EXPECT_THAT(r["id"].get<std::string>(), StartsWith("cmpl-"));
  EXPECT_EQ(id, r["id"].get<std::string>() + "-0");
  EXPECT_EQ(r["object"], "text_completion");
  EXPECT_EQ(r["model"], "mini");
  EXPECT_TRUE(r["created"].is_number_integer());
  ASSERT_EQ(r["choices"].size(), 1u);
  EXPECT_EQ(r["choices"][0]["index"], 0);
  EXPECT_EQ(r["choices"][0]["text"], "Hello");
  EXPECT_EQ(r["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(r["choices"][0]["logprobs"].is_null());
  EXPECT_EQ(r["usage"], json::parse(R"({"prompt_tokens":3,"completion_tokens":5,
      "total_tokens":8,"prompt_tokens_details":{"cached_tokens":1}})"));
  EXPECT_EQ(service_->num_in_flight(), 0);
}

TEST_F(ServiceTest, ChatResponseShapeAndEosNotInText) {
  auto sink = Post("/v1/chat/completions",
                   {{"model", "mini"}, {"messages", {{{"role", "user"}, {"content", "Hi"}}}},
                    {"skip_special_tokens", false}});
  const std::string id = backend_.order().at(0);
  EmitText(id, "Yo");
  // The EOS that ends the request is not part of the text (vLLM), even with specials kept.
  Emit(id, {ByteTokenizer::kEos}, FinishReason::kStop);
  json r = sink->json();
  EXPECT_THAT(r["id"].get<std::string>(), StartsWith("chatcmpl-"));
  EXPECT_EQ(r["object"], "chat.completion");
  EXPECT_EQ(r["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(r["choices"][0]["message"]["content"], "Yo");
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(r["usage"]["completion_tokens"], 3);
  EXPECT_EQ(r["usage"]["prompt_tokens"], 4);
}

TEST_F(ServiceTest, StopStringTruncatesAndAbortsEngineRequest) {
  auto sink = Post("/v1/completions",
                   {{"model", "mini"}, {"prompt", "x"}, {"max_tokens", 20}, {"stop", {"STOP"}}});
  const std::string id = backend_.order().at(0);
  EmitText(id, "a ST");
  EXPECT_EQ(sink->num_responses, 0);
  EmitText(id, "OP tail");
  ASSERT_EQ(sink->num_responses, 1);
  json r = sink->json();
  EXPECT_EQ(r["choices"][0]["text"], "a ");
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
  EXPECT_THAT(backend_.aborted(), ElementsAre(id));
  // Tokens up to the one completing the stop string count: "a ST" + "O" + "P".
  EXPECT_EQ(r["usage"]["completion_tokens"], 6);
  // The engine's late abort output is ignored.
  Emit(id, {}, FinishReason::kAbort);
  EXPECT_EQ(sink->num_responses, 1);
}

// vLLM: stop strings apply once min_tokens tokens are out; earlier text is not searched.
TEST_F(ServiceTest, StopStringsWaitForMinTokens) {
  auto sink = Post("/v1/completions", {{"model", "mini"}, {"prompt", "x"}, {"max_tokens", 20},
                                       {"min_tokens", 4}, {"stop", {"S"}}});
  const std::string id = backend_.order().at(0);
  EmitText(id, "aSbc");
  EXPECT_EQ(sink->num_responses, 0);
  EmitText(id, "dSe");
  ASSERT_EQ(sink->num_responses, 1);
  json r = sink->json();
  EXPECT_EQ(r["choices"][0]["text"], "aSbcd");
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(r["usage"]["completion_tokens"], 6);
  EXPECT_THAT(backend_.aborted(), ElementsAre(id));
}

TEST_F(ServiceTest, StreamedChatEventsAreFramedLikeOpenAi) {
  auto sink = Post("/v1/chat/completions",
                   {{"model", "mini"}, {"messages", {{{"role", "user"}, {"content", "Hi"}}}},
                    {"stream", true}, {"stream_options", {{"include_usage", true}}}});
  EXPECT_TRUE(sink->stream_started);
  const std::string id = backend_.order().at(0);
  // "é" is two bytes split across two tokens: no event may carry half of it.
  Emit(id, {ByteTokenizer::Byte('A'), ByteTokenizer::Byte('\xC3')});
  Emit(id, {ByteTokenizer::Byte('\xA9')});
  Emit(id, {ByteTokenizer::Byte('!')}, FinishReason::kLength);
  EXPECT_TRUE(sink->stream_ended);
  for (const std::string& e : sink->events) {
    EXPECT_THAT(e, StartsWith("data: "));
    EXPECT_EQ(e.substr(e.size() - 2), "\n\n");
  }
  ASSERT_EQ(sink->events.size(), 7u);
  json first = sink->EventJson(0);
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_THAT(first["id"].get<std::string>(), StartsWith("chatcmpl-"));
  EXPECT_EQ(first["choices"][0]["delta"], json::parse(R"({"role":"assistant","content":""})"));
  EXPECT_TRUE(first["choices"][0]["finish_reason"].is_null());
  EXPECT_TRUE(first.contains("usage") && first["usage"].is_null());
  EXPECT_EQ(sink->EventJson(1)["choices"][0]["delta"]["content"], "A");
  EXPECT_EQ(sink->EventJson(2)["choices"][0]["delta"]["content"], "\xC3\xA9");
  EXPECT_EQ(sink->EventJson(3)["choices"][0]["delta"]["content"], "!");
  json last = sink->EventJson(4);
  EXPECT_EQ(last["choices"][0]["delta"], json::object());
  EXPECT_EQ(last["choices"][0]["finish_reason"], "length");
  json usage = sink->EventJson(5);
  EXPECT_EQ(usage["choices"], json::array());
  EXPECT_EQ(usage["usage"]["completion_tokens"], 4);
  EXPECT_EQ(usage["usage"]["total_tokens"], 8);
  EXPECT_EQ(sink->events[6], "data: [DONE]\n\n");
  // Every chunk carries the same id and created.
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(sink->EventJson(i)["id"], first["id"]);
}

TEST_F(ServiceTest, StreamWithoutIncludeUsageHasNoUsageKey) {
  auto sink = Post("/v1/completions",
                   {{"model", "mini"}, {"prompt", "x"}, {"stream", true}, {"max_tokens", 2}});
  const std::string id = backend_.order().at(0);
  EmitText(id, "ok", FinishReason::kLength);
  ASSERT_EQ(sink->events.size(), 3u);
  json chunk = sink->EventJson(0);
  EXPECT_EQ(chunk["object"], "text_completion");
  EXPECT_EQ(chunk["choices"][0]["text"], "ok");
  EXPECT_FALSE(chunk.contains("usage"));
  EXPECT_EQ(sink->EventJson(1)["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(sink->EventJson(1)["choices"][0]["text"], "");
  EXPECT_EQ(sink->events[2], SseDone());
}

TEST_F(ServiceTest, NChoicesUseOneEngineRequestEachSharingTheSeed) {
  auto sink = Post("/v1/completions", {{"model", "mini"}, {"prompt", "x"}, {"n", 2},
                                       {"seed", 7}, {"max_tokens", 3}});
  std::vector<std::string> ids = backend_.order();
  ASSERT_EQ(ids.size(), 2u);
  EXPECT_THAT(ids[0], ::testing::EndsWith("-0"));
  EXPECT_THAT(ids[1], ::testing::EndsWith("-1"));
  // One seed, told apart by the choice index of the draw key (engine/sample/philox.h).
  EXPECT_EQ(*backend_.request(ids[0]).sampling.seed, 7u);
  EXPECT_EQ(*backend_.request(ids[1]).sampling.seed, 7u);
  EXPECT_EQ(backend_.request(ids[0]).sampling.choice_index, 0u);
  EXPECT_EQ(backend_.request(ids[1]).sampling.choice_index, 1u);
  EmitText(ids[1], "bbb", FinishReason::kLength);
  EXPECT_EQ(sink->num_responses, 0);
  EmitText(ids[0], "aaa", FinishReason::kLength);
  json r = sink->json();
  ASSERT_EQ(r["choices"].size(), 2u);
  EXPECT_EQ(r["choices"][0]["index"], 0);
  EXPECT_EQ(r["choices"][0]["text"], "aaa");
  EXPECT_EQ(r["choices"][1]["index"], 1);
  EXPECT_EQ(r["choices"][1]["text"], "bbb");
  EXPECT_EQ(r["usage"]["prompt_tokens"], 2);
  EXPECT_EQ(r["usage"]["completion_tokens"], 6);
  EXPECT_EQ(r["seed"], 7);
}

TEST_F(ServiceTest, UnseededRequestGetsASeedReportedInTheResponse) {
  auto sink = Post("/v1/chat/completions",
                   {{"model", "mini"},
                    {"messages", json::array({{{"role", "user"}, {"content", "hi"}}})},
                    {"max_tokens", 3},
                    {"stream", true}});
  std::vector<std::string> ids = backend_.order();
  ASSERT_EQ(ids.size(), 1u);
  const std::optional<uint64_t> seed = backend_.request(ids[0]).sampling.seed;
  ASSERT_TRUE(seed.has_value());
  EXPECT_LT(*seed, uint64_t{1} << 53);
  EmitText(ids[0], "ok", FinishReason::kLength);
  ASSERT_GE(sink->events.size(), 2u);
  for (size_t i = 0; i + 1 < sink->events.size(); ++i) {
    EXPECT_EQ(sink->EventJson(i)["seed"].get<uint64_t>(), *seed) << "chunk " << i;
  }
}

TEST_F(ServiceTest, ChatLogprobsShape) {
  auto sink = Post("/v1/chat/completions",
                   {{"model", "mini"}, {"messages", {{{"role", "user"}, {"content", "Hi"}}}},
                    {"logprobs", true}, {"top_logprobs", 2}});
  const std::string id = backend_.order().at(0);
  EXPECT_EQ(*backend_.request(id).sampling.logprobs, 2);
  EmitText(id, "ab", FinishReason::kLength);
  json lp = sink->json()["choices"][0]["logprobs"];
  ASSERT_EQ(lp["content"].size(), 2u);
  json t0 = lp["content"][0];
  EXPECT_EQ(t0["token"], "a");
  EXPECT_DOUBLE_EQ(t0["logprob"].get<double>(), -0.5);
  EXPECT_EQ(t0["bytes"], json::array({97}));
  ASSERT_EQ(t0["top_logprobs"].size(), 2u);
  EXPECT_EQ(t0["top_logprobs"][1]["token"], "z");
  EXPECT_DOUBLE_EQ(t0["top_logprobs"][1]["logprob"].get<double>(), -1.5);
  EXPECT_EQ(t0["top_logprobs"][1]["bytes"], json::array({122}));
}

TEST_F(ServiceTest, CompletionLogprobsWithTokenIdsAndOffsets) {
  auto sink = Post("/v1/completions", {{"model", "mini"}, {"prompt", "x"}, {"logprobs", 1},
                                       {"return_tokens_as_token_ids", true}});
  const std::string id = backend_.order().at(0);
  EmitText(id, "ab");
  EmitText(id, "c", FinishReason::kLength);
  json lp = sink->json()["choices"][0]["logprobs"];
  const int a = ByteTokenizer::Byte('a');
  EXPECT_EQ(lp["tokens"], json::array({"token_id:" + std::to_string(a),
                                       "token_id:" + std::to_string(a + 1),
                                       "token_id:" + std::to_string(a + 2)}));
  EXPECT_EQ(lp["token_logprobs"], json::array({-0.5, -0.5, -0.5}));
  EXPECT_EQ(lp["text_offset"], json::array({0, 1, 2}));
  ASSERT_EQ(lp["top_logprobs"].size(), 3u);
  EXPECT_EQ(lp["top_logprobs"][0], json({{"token_id:" + std::to_string(a), -0.5}}));
}

TEST_F(ServiceTest, CompletionTopLogprobsAlwaysHoldTheSampledToken) {
  auto sink = Post("/v1/completions", {{"model", "mini"}, {"prompt", "x"}, {"logprobs", 0}});
  const std::string id = backend_.order().at(0);
  EmitText(id, "q", FinishReason::kLength);
  json lp = sink->json()["choices"][0]["logprobs"];
  EXPECT_EQ(lp["tokens"], json::array({"q"}));
  EXPECT_EQ(lp["top_logprobs"], json::parse(R"([{"q": -0.5}])"));
}

TEST_F(ServiceTest, EchoPrependsPrompt) {
  auto sink = Post("/v1/completions",
                   {{"model", "mini"}, {"prompt", "ab"}, {"echo", true}, {"max_tokens", 1}});
  EmitText(backend_.order().at(0), "c", FinishReason::kLength);
  EXPECT_EQ(sink->json()["choices"][0]["text"], "abc");
}

TEST_F(ServiceTest, EngineErrorMidStreamBecomesErrorEvent) {
  auto sink = Post("/v1/completions", {{"model", "mini"}, {"prompt", "x"}, {"n", 2},
                                       {"stream", true}});
  std::vector<std::string> ids = backend_.order();
  EmitText(ids[0], "a");
  Emit(ids[0], {}, FinishReason::kError, absl::InternalError("device lost"));
  EXPECT_TRUE(sink->stream_ended);
  ASSERT_GE(sink->events.size(), 3u);
  json error = sink->EventJson(sink->events.size() - 2);
  EXPECT_EQ(error["error"]["message"], "device lost");
  EXPECT_EQ(sink->events.back(), SseDone());
  EXPECT_THAT(backend_.aborted(), ElementsAre(ids[1]));
  EXPECT_EQ(service_->num_in_flight(), 0);
}

TEST_F(ServiceTest, EngineAbortWithoutStreamIsAnErrorResponse) {
  auto sink = Post("/v1/completions", {{"model", "mini"}, {"prompt", "x"}});
  Emit(backend_.order().at(0), {}, FinishReason::kAbort);
  EXPECT_EQ(sink->status, 503);
  EXPECT_TRUE(sink->json()["error"]["message"].is_string());
  EXPECT_EQ(sink->headers["Retry-After"], "1");
}

TEST_F(ServiceTest, CancelAbortsUnfinishedChoices) {
  auto sink = Post("/v1/completions", {{"model", "mini"}, {"prompt", "x"}, {"n", 3},
                                       {"stream", true}});
  std::vector<std::string> ids = backend_.order();
  EmitText(ids[1], "z", FinishReason::kLength);
  const size_t events_before = sink->events.size();
  ASSERT_NE(handle_, nullptr);
  handle_->Cancel();
  EXPECT_THAT(backend_.aborted(), ElementsAre(ids[0], ids[2]));
  EXPECT_EQ(service_->num_in_flight(), 0);
  EmitText(ids[0], "late");  // nothing more is written after a cancel
  EXPECT_EQ(sink->events.size(), events_before);
}

TEST_F(ServiceTest, SubmitErrorsMapToHttpCodes) {
  backend_.submit_error = absl::ResourceExhaustedError("queue full");
  auto sink = Post("/v1/completions", {{"model", "mini"}, {"prompt", "x"}, {"stream", true}});
  EXPECT_FALSE(sink->stream_started);
  EXPECT_EQ(sink->status, 429);
  EXPECT_EQ(sink->json()["error"]["message"], "queue full");
  EXPECT_EQ(sink->headers.count("Retry-After"), 0u);  // no wait is known
  EXPECT_EQ(service_->num_in_flight(), 0);

  // Unavailable (a router draining, no worker free): 503 with Retry-After.
  backend_.submit_error = absl::UnavailableError("no decode worker is available");
  auto unavailable = Post("/v1/completions", {{"model", "mini"}, {"prompt", "x"}});
  EXPECT_EQ(unavailable->status, 503);
  EXPECT_EQ(unavailable->headers["Retry-After"], "1");
  EXPECT_EQ(unavailable->json()["error"]["message"], "no decode worker is available");
  EXPECT_EQ(service_->num_in_flight(), 0);
}

TEST_F(ServiceTest, OverloadAnswers503) {
  Recreate(1);
  auto first = Post("/v1/completions", {{"model", "mini"}, {"prompt", "x"}});
  auto second = Post("/v1/completions", {{"model", "mini"}, {"prompt", "y"}});
  EXPECT_EQ(second->status, 503);
  EXPECT_THAT(second->json()["error"]["message"].get<std::string>(), HasSubstr("overloaded"));
  EXPECT_EQ(second->headers["Retry-After"], "1");
  EXPECT_EQ(first->headers.count("Retry-After"), 0u);
  EmitText(backend_.order().at(0), "k", FinishReason::kLength);
  EXPECT_EQ(first->status, 200);
  auto third = Post("/v1/completions", {{"model", "mini"}, {"prompt", "z"}});
  EXPECT_EQ(third->num_responses, 0);  // admitted
}

TEST_F(ServiceTest, RoutingAndErrors) {
  auto health = Send("GET", "/health");
  EXPECT_EQ(health->status, 200);
  EXPECT_EQ(health->json(), json::parse(R"({"status":"ok"})"));

  auto models = Send("GET", "/v1/models");
  EXPECT_EQ(models->status, 200);
  EXPECT_EQ(models->json()["object"], "list");
  EXPECT_EQ(models->json()["data"][0]["id"], "mini");
  EXPECT_EQ(models->json()["data"][0]["object"], "model");
  EXPECT_EQ(Send("GET", "/v1/models/mini")->status, 200);
  EXPECT_EQ(Send("GET", "/v1/models/nope")->status, 404);

  auto not_found = Send("GET", "/v2/nothing");
  EXPECT_EQ(not_found->status, 404);
  EXPECT_TRUE(not_found->json()["error"]["message"].is_string());
  EXPECT_EQ(Send("GET", "/v1/completions")->status, 405);
  EXPECT_EQ(Send("POST", "/health")->status, 405);
  EXPECT_EQ(Send("DELETE", "/v1/chat/completions")->status, 405);

  auto bad_json = Send("POST", "/v1/chat/completions", "{not json");
  EXPECT_EQ(bad_json->status, 400);
  EXPECT_EQ(bad_json->json()["error"]["type"], "invalid_request_error");

  auto unknown_model = Post("/v1/chat/completions",
                            {{"model", "gpt-4"}, {"messages", {{{"role", "user"}, {"content", "Hi"}}}}});
  EXPECT_EQ(unknown_model->status, 404);
  EXPECT_EQ(unknown_model->json()["error"]["param"], "model");

  auto beam = Post("/v1/completions", {{"model", "mini"}, {"prompt", "x"},
                                       {"use_beam_search", true}});
  EXPECT_EQ(beam->status, 400);
  EXPECT_EQ(beam->json()["error"]["param"], "use_beam_search");
  EXPECT_THAT(beam->json()["error"]["message"].get<std::string>(), HasSubstr("beam search"));
  EXPECT_TRUE(backend_.order().empty());
}

TEST_F(ServiceTest, MetricsExposition) {
  auto done = Post("/v1/completions", {{"model", "mini"}, {"prompt", "x"}, {"max_tokens", 2}});
  const std::string id = backend_.order().at(0);
  EmitText(id, "a");
  EmitText(id, "b", FinishReason::kLength);
  Send("GET", "/nope");
  // Client-chosen paths never become label values (found by a hostile-client test: a quote in
  // the path broke the exposition format and every distinct path added a series).
  EXPECT_EQ(Send("POST", "/v1/models/a\"b\\c")->status, 405);
  EXPECT_EQ(Send("POST", "/v1/models/other-id")->status, 405);
  auto metrics = Send("GET", "/metrics");
  EXPECT_EQ(metrics->status, 200);
  EXPECT_THAT(metrics->type, StartsWith("text/plain; version=0.0.4"));
  const std::string& m = metrics->body;
  EXPECT_THAT(m, HasSubstr("# TYPE sluice_http_requests_total counter\n"));
  EXPECT_THAT(m, HasSubstr("sluice_http_requests_total{endpoint=\"/v1/completions\",status=\"200\"} 1\n"));
  EXPECT_THAT(m, HasSubstr("sluice_http_requests_total{endpoint=\"other\",status=\"404\"} 1\n"));
  EXPECT_THAT(m, HasSubstr("sluice_http_requests_total{endpoint=\"/v1/models\",status=\"405\"} 2\n"));
  EXPECT_THAT(m, Not(HasSubstr("a\"b")));
  EXPECT_THAT(m, HasSubstr("# TYPE sluice_time_to_first_token_seconds histogram\n"));
  EXPECT_THAT(m, HasSubstr("sluice_time_to_first_token_seconds_count 1\n"));
  EXPECT_THAT(m, HasSubstr("sluice_inter_token_latency_seconds_count 1\n"));
  EXPECT_THAT(m, HasSubstr("sluice_e2e_request_latency_seconds_bucket{le=\"+Inf\"} 1\n"));
  EXPECT_THAT(m, HasSubstr("sluice_prompt_tokens_total 2\n"));
  EXPECT_THAT(m, HasSubstr("sluice_generation_tokens_total 2\n"));
  EXPECT_THAT(m, HasSubstr("sluice_num_requests_waiting 2\n"));
  EXPECT_THAT(m, HasSubstr("sluice_num_requests_running 3\n"));
  EXPECT_THAT(m, HasSubstr("sluice_kv_cache_blocks 100\n"));
  EXPECT_THAT(m, HasSubstr("sluice_kv_cache_free_blocks 25\n"));
  EXPECT_THAT(m, HasSubstr("sluice_kv_cache_usage_ratio 0.75\n"));
  EXPECT_THAT(m, HasSubstr("sluice_kv_cache_block_size_tokens 16\n"));
  EXPECT_THAT(m, HasSubstr("sluice_time_to_first_token_seconds_bucket{le=\"0.005\"} "));
  // The same observations under vLLM's names, labelled with the served model name.
  EXPECT_THAT(m, HasSubstr("vllm:num_requests_waiting{model_name=\"mini\"} 2\n"));
  EXPECT_THAT(m, HasSubstr("vllm:num_requests_running{model_name=\"mini\"} 3\n"));
  EXPECT_THAT(m, HasSubstr("vllm:kv_cache_usage_perc{model_name=\"mini\"} 0.75\n"));
  EXPECT_THAT(m, HasSubstr("vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"100\"} 1\n"));
  EXPECT_THAT(m, HasSubstr("vllm:prompt_tokens_total{model_name=\"mini\"} 2\n"));
  EXPECT_THAT(m, HasSubstr("vllm:generation_tokens_total{model_name=\"mini\"} 2\n"));
  EXPECT_THAT(m, HasSubstr(
                     "vllm:request_success_total{model_name=\"mini\",finished_reason=\"length\"} 1\n"));
  EXPECT_THAT(m, HasSubstr(
                     "vllm:request_success_total{model_name=\"mini\",finished_reason=\"stop\"} 0\n"));
  EXPECT_THAT(m, HasSubstr("vllm:time_to_first_token_seconds_count{model_name=\"mini\"} 1\n"));
  EXPECT_THAT(m, HasSubstr("vllm:inter_token_latency_seconds_count{model_name=\"mini\"} 1\n"));
  EXPECT_THAT(m, HasSubstr("vllm:e2e_request_latency_seconds_count{model_name=\"mini\"} 1\n"));
  EXPECT_THAT(m, HasSubstr("vllm:request_prefill_time_seconds_count{model_name=\"mini\"} 1\n"));
  EXPECT_THAT(m, HasSubstr("vllm:request_decode_time_seconds_count{model_name=\"mini\"} 1\n"));
  // The fake backend reports no queue time: none is recorded.
  EXPECT_THAT(m, HasSubstr("vllm:request_queue_time_seconds_count{model_name=\"mini\"} 0\n"));
  // Every sample line belongs to a family declared with HELP and TYPE.
  std::istringstream lines(m);
  std::string line;
  std::set<std::string> typed;
  while (std::getline(lines, line)) {
    if (line.rfind("# TYPE ", 0) == 0) {
      typed.insert(line.substr(7, line.find(' ', 7) - 7));
    } else if (!line.empty() && line[0] != '#') {
      std::string name = line.substr(0, line.find_first_of("{ "));
      for (const char* suffix : {"_bucket", "_sum", "_count"}) {
        const std::string s(suffix);
        if (!typed.count(name) && name.size() > s.size() &&
            name.compare(name.size() - s.size(), s.size(), s) == 0) {
          name = name.substr(0, name.size() - s.size());
        }
      }
      EXPECT_TRUE(typed.count(name)) << line;
    }
  }
}

}  // namespace
}  // namespace sluice
