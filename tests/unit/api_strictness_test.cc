// Request shapes that used to be accepted silently and are now refused with a 400 naming the
// field (or honoured): messages without content, unknown keys inside messages /
// response_format / Responses input items, an empty Responses input, truncate_prompt_tokens
// beyond the context, prompt logprobs beyond the memory cap; and the message keys that reach
// the template.
#include <memory>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "services/api/openai_errors.h"
#include "services/api/openai_protocol.h"
#include "services/api/responses_api.h"
#include "tests/unit/api_test_fakes.h"

namespace sluice {
namespace {

using nlohmann::json;
using ::testing::ElementsAre;
using testing::ByteTokenizer;

class StrictnessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto tmpl = ChatTemplate::Parse(
        "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}</s>{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}");
    ASSERT_TRUE(tmpl.ok()) << tmpl.status();
    chat_template_ = *std::move(tmpl);
    context_.tokenizer = &tokenizer_;
    context_.chat_template = chat_template_.get();
    context_.served_model_name = "mini";
    context_.max_model_len = 64;
  }
  absl::StatusOr<GenerationRequest> Chat(json messages, json extra = json::object()) {
    json body{{"model", "mini"}, {"messages", std::move(messages)}};
    body.update(extra);
    return ParseChatCompletionRequest(body, context_);
  }
  // ExpectError asserts a 400 naming `param` with exactly `message`.
  static void ExpectError(const absl::StatusOr<GenerationRequest>& r, const std::string& param,
                          const std::string& message) {
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(HttpStatusFor(r.status()), 400) << r.status();
    EXPECT_EQ(OpenAiErrorJson(r.status())["error"]["param"], param) << r.status();
    EXPECT_EQ(r.status().message(), message);
  }

  ByteTokenizer tokenizer_;
  std::unique_ptr<ChatTemplate> chat_template_;
  ParseContext context_;
};

TEST_F(StrictnessTest, MessageContentIsRequired) {
  ExpectError(Chat({{{"role", "user"}}}), "messages",
              "messages[0].content is required for a 'user' message");
  ExpectError(Chat({{{"role", "system"}, {"content", "s"}}, {{"role", "user"}, {"content", nullptr}}}),
              "messages", "messages[1].content is required for a 'user' message");
  ExpectError(Chat({{{"role", "user"}, {"content", "q"}}, {{"role", "assistant"}}}), "messages",
              "messages[1].content is required for a 'assistant' message");
  // An empty string is content (OpenAI and vLLM accept it).
  EXPECT_TRUE(Chat({{{"role", "user"}, {"content", ""}}}).ok());
}

TEST_F(StrictnessTest, UnknownMessageKeysAre400UnlessAllowed) {
  ExpectError(Chat({{{"role", "user"}, {"content", "q"}, {"contnet", "typo"}}}), "messages",
              "Unrecognized request argument supplied: messages[0].contnet");
  context_.allow_unknown_fields = true;
  absl::StatusOr<GenerationRequest> r =
      Chat({{{"role", "user"}, {"content", "q"}, {"contnet", "typo"}}});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(r->unknown_fields, ElementsAre("messages[0].contnet"));
}

TEST_F(StrictnessTest, MessageKeysReachTheTemplate) {
  auto tmpl = ChatTemplate::Parse(
      "{% for m in messages %}{{ m.name }}|{{ m.tool_call_id }}|{{ m.reasoning_content }}|"
      "{{ m.content }}{% endfor %}");
  ASSERT_TRUE(tmpl.ok());
  context_.chat_template = tmpl->get();
  absl::StatusOr<GenerationRequest> r =
      Chat({{{"role", "tool"}, {"content", "c"}, {"name", "n"}, {"tool_call_id", "t1"},
             {"reasoning_content", "r"}}});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->prompts[0], tokenizer_.Encode("n|t1|r|c", false, true));
  ExpectError(Chat({{{"role", "tool"}, {"content", "c"}, {"tool_call_id", 5}}}), "messages",
              "messages[0].tool_call_id must be a string");
}

TEST_F(StrictnessTest, UnknownResponseFormatKeysAre400) {
  const json user = {{{"role", "user"}, {"content", "q"}}};
  ExpectError(Chat(user, {{"response_format", {{"type", "json_object"}, {"schema", {}}}}}),
              "response_format", "Unrecognized request argument supplied: response_format.schema");
  ExpectError(
      Chat(user, {{"response_format",
                   {{"type", "json_schema"},
                    {"json_schema", {{"name", "x"}, {"schema", {{"type", "object"}}},
                                     {"strcit", true}}}}}}),
      "response_format",
      "Unrecognized request argument supplied: response_format.json_schema.strcit");
}

TEST_F(StrictnessTest, TruncatePromptTokensBeyondTheContextIs400) {
  const json user = {{{"role", "user"}, {"content", "q"}}};
  ExpectError(Chat(user, {{"truncate_prompt_tokens", 65}}), "truncate_prompt_tokens",
              "'truncate_prompt_tokens' must be at most the model's context length (64), got 65");
  EXPECT_TRUE(Chat(user, {{"truncate_prompt_tokens", 64}}).ok());
  EXPECT_TRUE(Chat(user, {{"truncate_prompt_tokens", -1}}).ok());
}

TEST_F(StrictnessTest, PromptLogprobsBeyondTheCapAre400) {
  context_.max_prompt_logprob_entries = 100;
  json body{{"model", "mini"}, {"prompt", std::string(8, 'a')}, {"max_tokens", 1}};
  // BOS + 8 tokens x (1 + 10) = 99 entries fit; n = 2 doubles them.
  body["prompt_logprobs"] = 10;
  EXPECT_TRUE(ParseCompletionRequest(body, context_).ok());
  body["n"] = 2;
  ExpectError(ParseCompletionRequest(body, context_), "prompt_logprobs",
              "prompt logprobs would hold 198 entries (prompt tokens x (1 + alternatives) x n), "
              "more than the limit of 100; ask for fewer alternatives, a shorter prompt or a "
              "smaller n");
  // echo + logprobs asks for them too, and is named by `logprobs`.
  json echo{{"model", "mini"}, {"prompt", std::string(60, 'a')}, {"max_tokens", 1},
            {"echo", true}, {"logprobs", 1}};
  ExpectError(ParseCompletionRequest(echo, context_), "logprobs",
              "prompt logprobs would hold 122 entries (prompt tokens x (1 + alternatives) x n), "
              "more than the limit of 100; ask for fewer alternatives, a shorter prompt or a "
              "smaller n");
}

TEST_F(StrictnessTest, ResponsesInputMustNotBeEmptyNorHoldUnknownKeys) {
  json body{{"model", "mini"}, {"input", ""}};
  ExpectError(ParseResponsesRequest(body, context_), "input",
              "'input' must not be an empty string");
  body["input"] = json::array();
  ExpectError(ParseResponsesRequest(body, context_), "input",
              "'input' must be a string or a non-empty list of messages");
  body["input"] = {{{"role", "user"}, {"content", "q"}, {"colour", "red"}}};
  ExpectError(ParseResponsesRequest(body, context_), "input",
              "Unrecognized request argument supplied: input[0].colour");
  // What an earlier response's output item carries may be fed back.
  body["input"] = {{{"type", "message"}, {"id", "msg_1"}, {"status", "completed"},
                    {"role", "user"}, {"content", "q"}}};
  EXPECT_TRUE(ParseResponsesRequest(body, context_).ok());
}

}  // namespace
}  // namespace sluice
