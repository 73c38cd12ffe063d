// Request shapes that used to be accepted silently and are now refused with a 400 naming the
// field (or honoured): messages without content, unknown keys inside messages / content parts /
// stream_options / response_format / Responses input items (listed instead with
// --allow-unknown-fields), an empty Responses input, truncate_prompt_tokens
// beyond the context, prompt logprobs beyond the memory cap; and the message keys that reach
// the template.
#include <memory>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "services/api/openai_errors.h"
#include "services/api/openai_protocol.h"
#include "services/api/responses_api.h"
#include "tests/unit/api_parse_fixture.h"

namespace sluice {
namespace {

using nlohmann::json;
using ::testing::ElementsAre;
using testing::ByteTokenizer;

class StrictnessTest : public testing::ApiParseTest {
 protected:
  absl::StatusOr<GenerationRequest> Chat(json messages, json extra = json::object()) {
    return ParseMessages(std::move(messages), std::move(extra));
  }
  // ExpectError asserts a 400 naming `param` with exactly `message`.
  static void ExpectError(const absl::StatusOr<GenerationRequest>& r, const std::string& param,
                          const std::string& message) {
    ExpectExactError(r, param, message);
  }
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
  // Allowed: listed for the warning and the constraint still applies (no compiler here, so
  // the field is refused as unsupported, past the key check).
  context_.allow_unknown_fields = true;
  ExpectError(Chat(user, {{"response_format", {{"type", "json_object"}, {"schema", {}}}}}),
              "response_format", "'response_format' is not supported by this server");
  absl::StatusOr<GenerationRequest> r =
      Chat(user, {{"response_format", {{"type", "text"}, {"x_vendor", 1}}}});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(r->unknown_fields, ElementsAre("response_format.x_vendor"));
}

TEST_F(StrictnessTest, UnknownContentPartKeysAre400UnlessAllowed) {
  const json text_part = {{"type", "text"}, {"text", "x"}, {"bogus", 1}};
  ExpectError(Chat({{{"role", "user"}, {"content", {text_part}}}}), "messages",
              "Unrecognized request argument supplied: messages[0].content[0].bogus");
  ExpectError(Chat({{{"role", "system"}, {"content", "s"}},
                    {{"role", "user"},
                     {"content", {{{"type", "text"}, {"text", "a"}}, text_part}}}}),
              "messages", "Unrecognized request argument supplied: messages[1].content[1].bogus");
  // Image parts: checked before the model's image support, so the typo is what is named.
  ExpectError(Chat({{{"role", "user"},
                     {"content", {{{"type", "image_url"},
                                   {"image_url", {{"url", "data:image/png;base64,AA=="}}},
                                   {"detial", "low"}}}}}}),
              "messages", "Unrecognized request argument supplied: messages[0].content[0].detial");
  ExpectError(Chat({{{"role", "user"},
                     {"content", {{{"type", "image_url"},
                                   {"image_url", {{"url", "data:image/png;base64,AA=="},
                                                  {"detial", "low"}}}}}}}}),
              "messages",
              "Unrecognized request argument supplied: messages[0].content[0].image_url.detial");
  ExpectError(Chat({{{"role", "user"},
                     {"content", {{{"type", "image"}, {"image", "data:,"}, {"size", 3}}}}}}),
              "messages", "Unrecognized request argument supplied: messages[0].content[0].size");

  context_.allow_unknown_fields = true;
  absl::StatusOr<GenerationRequest> r =
      Chat({{{"role", "user"}, {"content", {text_part, {{"type", "text"}, {"text", "y"}}}}}});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(r->unknown_fields, ElementsAre("messages[0].content[0].bogus"));
  // The parts still render: text parts joined by newlines.
  EXPECT_EQ(r->prompts[0], tokenizer_.Encode("<|user|>x\ny</s><|assistant|>", false, true));
}

TEST_F(StrictnessTest, UnknownStreamOptionsKeysAre400UnlessAllowed) {
  const json user = {{{"role", "user"}, {"content", "q"}}};
  ExpectError(Chat(user, {{"stream", true}, {"stream_options", {{"include_usgae", true}}}}),
              "stream_options",
              "Unrecognized request argument supplied: stream_options.include_usgae");
  context_.allow_unknown_fields = true;
  absl::StatusOr<GenerationRequest> r =
      Chat(user, {{"stream", true},
                  {"stream_options", {{"include_usgae", true}, {"include_usage", true}}}});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(r->unknown_fields, ElementsAre("stream_options.include_usgae"));
  EXPECT_TRUE(r->include_usage);
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
  // Content parts: an input_text part has type and text; an output_text part fed back also
  // annotations and logprobs.
  body["input"] = {{{"role", "user"},
                    {"content", {{{"type", "input_text"}, {"text", "q"}, {"annotations", 1}}}}}};
  ExpectError(ParseResponsesRequest(body, context_), "input",
              "Unrecognized request argument supplied: input[0].content[0].annotations");
  body["input"] = {{{"role", "assistant"},
                    {"content", {{{"type", "output_text"}, {"text", "a"},
                                  {"annotations", json::array()}, {"logprobs", json::array()}}}}}};
  EXPECT_TRUE(ParseResponsesRequest(body, context_).ok());

  // Allowed: every nested unknown key is listed, with the top-level ones.
  context_.allow_unknown_fields = true;
  body["vendor_extra"] = 1;
  body["input"] = {{{"role", "user"}, {"colour", "red"},
                    {"content", {{{"type", "input_text"}, {"text", "q"}, {"lang", "en"}}}}}};
  absl::StatusOr<GenerationRequest> r = ParseResponsesRequest(body, context_);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(r->unknown_fields,
              ElementsAre("vendor_extra", "input[0].colour", "input[0].content[0].lang"));
}

}  // namespace
}  // namespace sluice
