// Request parsing and validation of the OpenAI endpoints: each rejection carries the right
// status code and names the offending parameter.
#include <memory>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "services/api/openai_errors.h"
#include "services/api/openai_protocol.h"
#include "tests/unit/api_parse_fixture.h"

namespace sluice {
namespace {

using nlohmann::json;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::ByteTokenizer;

class ProtocolTest : public testing::ApiParseTest {
 protected:
  // Without "</s>" after each message, in a 32-token context.
  void SetUp() override {
    SetUpParser("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}"
                "{% if add_generation_prompt %}<|assistant|>{% endif %}",
                32);
  }

  // ExpectChatError asserts that the chat body with `extra` fails with `code` naming `param`.
  void ExpectChatError(json extra, const std::string& param, int code = 400) {
    ExpectParamError(ParseChat(extra), param, code);
  }
  void ExpectCompletionError(json extra, const std::string& param, int code = 400) {
    ExpectParamError(ParseCompletion(extra), param, code);
  }
};

TEST_F(ProtocolTest, ChatRendersTemplateAndTokenizesSpecialsWithoutBos) {
  absl::StatusOr<GenerationRequest> r = ParseChatCompletionRequest(Chat(), context_);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->prompts.size(), 1u);
  // "<|user|>Hi<|assistant|>": specials parsed, no BOS added (the template owns it).
  EXPECT_THAT(r->prompts[0], ElementsAre(2, ByteTokenizer::Byte('H'), ByteTokenizer::Byte('i'), 3));
  EXPECT_EQ(r->endpoint, Endpoint::kChatCompletions);
  EXPECT_EQ(r->n, 1);
  EXPECT_FALSE(r->stream);
  // max_tokens unset: what is left of the context.
  EXPECT_EQ(r->sampling.max_tokens, 32 - 4);
  EXPECT_FALSE(r->max_tokens_given);
  EXPECT_FALSE(r->sampling.logprobs.has_value());
}

TEST_F(ProtocolTest, ChatContentPartsAreJoinedAndOtherPartTypesRejected) {
  json parts = json::array({{{"type", "text"}, {"text", "a"}}, {{"type", "text"}, {"text", "b"}}});
  absl::StatusOr<GenerationRequest> r = ParseChatCompletionRequest(
      Chat({{"messages", {{{"role", "user"}, {"content", parts}}}}}), context_);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(r->prompts[0], ElementsAre(2, ByteTokenizer::Byte('a'), ByteTokenizer::Byte('\n'),
                                         ByteTokenizer::Byte('b'), 3));

  json image = json::array({{{"type", "image_url"}, {"image_url", {{"url", "data:x"}}}}});
  ExpectChatError({{"messages", {{{"role", "user"}, {"content", image}}}}}, "messages");
  ExpectChatError({{"messages", json::array()}}, "messages");
  ExpectChatError({{"messages", "hello"}}, "messages");
  ExpectChatError({{"messages", {{{"content", "no role"}}}}}, "messages");
}

TEST_F(ProtocolTest, DeeplyNestedTemplateVariablesAreRefusedBeforeTheyAreCopied) {
  // 300,000 levels (a 600 kB body): copying such a value into the template context recursed
  // until the stack overflowed. The body is parsed, never copied, here too.
  const std::string deep = std::string(300000, '[') + std::string(300000, ']');
  for (const std::string field : {"documents", "chat_template_kwargs"}) {
    const std::string value =
        field == "documents" ? "[{\"x\":" + deep + "}]" : "{\"x\":" + deep + "}";
    const json body = json::parse(
        R"({"model":"mini","messages":[{"role":"user","content":"Hi"}],")" + field + "\":" + value +
        "}");
    absl::StatusOr<GenerationRequest> r = ParseChatCompletionRequest(body, context_);
    ASSERT_FALSE(r.ok()) << field;
    EXPECT_EQ(HttpStatusFor(r.status()), 400) << r.status();
    EXPECT_EQ(OpenAiErrorJson(r.status())["error"]["param"], field) << r.status();
  }
  ExpectChatError({{"documents", {5}}}, "documents");
  ExpectChatError({{"documents", {{1}}}}, "documents");
}

TEST_F(ProtocolTest, ChatSamplingFieldsAreMapped) {
  absl::StatusOr<GenerationRequest> r = ParseChatCompletionRequest(
      Chat({{"temperature", 0.5}, {"top_p", 0.9}, {"top_k", 40}, {"min_p", 0.1}, {"n", 3},
            {"seed", 42}, {"max_completion_tokens", 7}, {"stop", "END"},
            {"presence_penalty", 0.5}, {"frequency_penalty", -0.5},
            {"repetition_penalty", 1.2}, {"ignore_eos", true}, {"min_tokens", 2},
            {"stop_token_ids", {5, 6}}, {"skip_special_tokens", false},
            {"include_stop_str_in_output", true}, {"logprobs", true}, {"top_logprobs", 3},
            {"stream", true}, {"stream_options", {{"include_usage", true}}},
            {"user", "u1"}, {"metadata", {{"k", "v"}}}, {"store", false},
            {"service_tier", "auto"}, {"response_format", {{"type", "text"}}},
            {"logit_bias", json::object()}, {"tools", json::array()}}),
      context_);
  ASSERT_TRUE(r.ok()) << r.status();
  const SamplingParams& s = r->sampling;
  EXPECT_FLOAT_EQ(s.temperature, 0.5f);
  EXPECT_FLOAT_EQ(s.top_p, 0.9f);
  EXPECT_EQ(s.top_k, 40);
  EXPECT_FLOAT_EQ(s.min_p, 0.1f);
  EXPECT_EQ(r->n, 3);
  ASSERT_TRUE(s.seed.has_value());
  EXPECT_EQ(*s.seed, 42u);
  EXPECT_EQ(s.max_tokens, 7);
  EXPECT_TRUE(r->max_tokens_given);
  EXPECT_THAT(s.stop, ElementsAre("END"));
  EXPECT_FLOAT_EQ(s.presence_penalty, 0.5f);
  EXPECT_FLOAT_EQ(s.frequency_penalty, -0.5f);
  EXPECT_FLOAT_EQ(s.repetition_penalty, 1.2f);
  EXPECT_TRUE(s.ignore_eos);
  EXPECT_EQ(s.min_tokens, 2);
  EXPECT_THAT(s.stop_token_ids, ElementsAre(5, 6));
  EXPECT_FALSE(s.skip_special_tokens);
  EXPECT_TRUE(s.include_stop_str_in_output);
  EXPECT_TRUE(r->logprobs);
  EXPECT_EQ(r->top_logprobs, 3);
  ASSERT_TRUE(s.logprobs.has_value());
  EXPECT_EQ(*s.logprobs, 3);
  EXPECT_TRUE(r->stream);
  EXPECT_TRUE(r->include_usage);
}

// top_p's range is half-open: every bad value gets the same wording (not "between 0 and 1",
// which would suggest 0 is allowed).
TEST_F(ProtocolTest, TopPErrorsNameTheHalfOpenRange) {
  for (const double bad : {0.0, -0.1, 1.5}) {
    absl::StatusOr<GenerationRequest> r =
        ParseChatCompletionRequest(Chat({{"top_p", bad}}), context_);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(OpenAiErrorJson(r.status())["error"]["message"],
              absl::StrCat("'top_p' must be in (0, 1], got ", bad));
  }
  EXPECT_TRUE(ParseChatCompletionRequest(Chat({{"top_p", 1.0}}), context_).ok());
  EXPECT_TRUE(ParseChatCompletionRequest(Chat({{"top_p", 0.01}}), context_).ok());
}

// An integer too large for int64 is out of range, not of the wrong type.
TEST_F(ProtocolTest, HugeIntegersAreRangeErrors) {
  for (const json& huge : {json(uint64_t{1} << 63), json(1e300)}) {
    absl::StatusOr<GenerationRequest> r =
        ParseChatCompletionRequest(Chat({{"max_tokens", huge}}), context_);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(OpenAiErrorJson(r.status())["error"]["message"],
              absl::StrCat("'max_tokens' must be between 1 and 2147483647, got ", huge.dump()));
  }
  absl::StatusOr<GenerationRequest> r =
      ParseChatCompletionRequest(Chat({{"max_tokens", 1.5}}), context_);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(OpenAiErrorJson(r.status())["error"]["message"], "'max_tokens' must be an integer");
}

TEST_F(ProtocolTest, ChatParameterErrorsNameTheParameter) {
  ExpectChatError({{"temperature", "hot"}}, "temperature");
  ExpectChatError({{"temperature", -1}}, "temperature");
  ExpectChatError({{"top_p", 0}}, "top_p");
  ExpectChatError({{"top_p", 1.5}}, "top_p");
  ExpectChatError({{"n", 0}}, "n");
  ExpectChatError({{"n", 17}}, "n");
  ExpectChatError({{"n", 1.5}}, "n");
  ExpectChatError({{"max_tokens", 0}}, "max_tokens");
  ExpectChatError({{"max_tokens", "5"}}, "max_tokens");
  ExpectChatError({{"max_completion_tokens", -3}}, "max_completion_tokens");
  ExpectChatError({{"logprobs", 3}}, "logprobs");
  ExpectChatError({{"logprobs", true}, {"top_logprobs", 21}}, "top_logprobs");
  ExpectChatError({{"top_logprobs", 2}}, "top_logprobs");
  ExpectChatError({{"stop", 5}}, "stop");
  ExpectChatError({{"stop", {"a", 1}}}, "stop");
  ExpectChatError({{"stop", json(std::vector<std::string>(65, "x"))}}, "stop");
  ExpectChatError({{"stop", std::string(1025, 'x')}}, "stop");
  ExpectChatError({{"seed", "x"}}, "seed");
  ExpectChatError({{"presence_penalty", 3}}, "presence_penalty");
  ExpectChatError({{"frequency_penalty", -2.5}}, "frequency_penalty");
  ExpectChatError({{"repetition_penalty", 0}}, "repetition_penalty");
  ExpectChatError({{"min_p", 2}}, "min_p");
  ExpectChatError({{"top_k", -2}}, "top_k");
  ExpectChatError({{"stop_token_ids", json::array({-1})}}, "stop_token_ids");
  ExpectChatError({{"stop_token_ids", "x"}}, "stop_token_ids");
  ExpectChatError({{"stream", "yes"}}, "stream");
  ExpectChatError({{"stream_options", {{"include_usage", 1}}}}, "stream_options");
  ExpectChatError({{"ignore_eos", 1}}, "ignore_eos");
  ExpectChatError({{"max_tokens", 5}, {"min_tokens", 6}}, "min_tokens");
  ExpectChatError({{"model", 7}}, "model");
}

TEST_F(ProtocolTest, CacheSaltIsANonEmptyBoundedString) {
  absl::StatusOr<GenerationRequest> r =
      ParseChatCompletionRequest(Chat({{"cache_salt", "tenant-7"}}), context_);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->cache_salt, "tenant-7");
  r = ParseCompletionRequest(Completion(), context_);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->cache_salt, "");
  ExpectChatError({{"cache_salt", 5}}, "cache_salt");
  ExpectChatError({{"cache_salt", ""}}, "cache_salt");
  ExpectCompletionError({{"cache_salt", std::string(257, 's')}}, "cache_salt");
}

TEST_F(ProtocolTest, UnsupportedOutputChangingFieldsAreRejectedByName) {
  ExpectChatError({{"response_format", {{"type", "json_object"}}}}, "response_format");
  ExpectChatError({{"tools", {{{"type", "function"}}}}}, "tools");
  ExpectChatError({{"tool_choice", "required"}}, "tool_choice");
  ExpectChatError({{"functions", {{{"name", "f"}}}}}, "functions");
  ExpectChatError({{"parallel_tool_calls", "yes"}}, "parallel_tool_calls");
  ExpectChatError({{"prediction", {{"type", "content"}}}}, "prediction");
  ExpectChatError({{"audio", {{"voice", "x"}}}}, "audio");
  ExpectChatError({{"modalities", {"text", "audio"}}}, "modalities");
  ExpectChatError({{"web_search_options", json::object()}}, "web_search_options");
  ExpectChatError({{"reasoning_effort", "low"}}, "reasoning_effort");
  // best_of below n, or above it with streaming (the best are known only at the end).
  ExpectChatError({{"best_of", 2}, {"n", 3}}, "best_of");
  ExpectCompletionError({{"best_of", 2}, {"stream", true}}, "best_of");
  ExpectCompletionError({{"suffix", "tail"}}, "suffix");
}

TEST_F(ProtocolTest, UnknownModelIs404AndMissingModelIs400) {
  ExpectChatError({{"model", "gpt-4"}}, "model", 404);
  ExpectCompletionError({{"model", "other"}}, "model", 404);
  json body = Completion();
  body.erase("model");
  absl::StatusOr<GenerationRequest> r = ParseCompletionRequest(body, context_);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(HttpStatusFor(r.status()), 400);
  EXPECT_EQ(OpenAiErrorJson(r.status())["error"]["param"], "model");
}

TEST_F(ProtocolTest, CompletionPromptForms) {
  const int32_t a = ByteTokenizer::Byte('a');
  const int32_t b = ByteTokenizer::Byte('b');
  absl::StatusOr<GenerationRequest> r = ParseCompletionRequest(Completion(), context_);
  ASSERT_TRUE(r.ok()) << r.status();
  // A string prompt gets the BOS (add_special_tokens=true).
  EXPECT_THAT(r->prompts, ElementsAre(ElementsAre(ByteTokenizer::kBos, a, b)));

  r = ParseCompletionRequest(Completion({{"prompt", json::array({"ab"})}}), context_);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(r->prompts, ElementsAre(ElementsAre(ByteTokenizer::kBos, a, b)));

  r = ParseCompletionRequest(Completion({{"prompt", {a, b, a}}}), context_);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(r->prompts, ElementsAre(ElementsAre(a, b, a)));

  r = ParseCompletionRequest(Completion({{"prompt", json::array({json::array({a}), json::array({b, b})})}, {"n", 2}}), context_);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(r->prompts, ElementsAre(ElementsAre(a), ElementsAre(b, b)));
  EXPECT_EQ(r->num_choices(), 4);

  ExpectCompletionError({{"prompt", 5}}, "prompt");
  ExpectCompletionError({{"prompt", json::array()}}, "prompt");
  ExpectCompletionError({{"prompt", {1.5, 2}}}, "prompt");
  ExpectCompletionError({{"prompt", json::array({9999})}}, "prompt");  // outside the vocabulary
  ExpectCompletionError({{"prompt", json::parse("[[]]")}}, "prompt");
  ExpectCompletionError({{"prompt", nullptr}}, "prompt");
}

TEST_F(ProtocolTest, CompletionLogprobsEchoAndTokenIds) {
  absl::StatusOr<GenerationRequest> r = ParseCompletionRequest(
      Completion({{"logprobs", 2}, {"return_tokens_as_token_ids", true}}), context_);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->logprobs);
  EXPECT_EQ(*r->sampling.logprobs, 2);
  EXPECT_TRUE(r->return_tokens_as_token_ids);

  r = ParseCompletionRequest(Completion({{"echo", true}}), context_);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->echo);

  ExpectCompletionError({{"logprobs", 21}}, "logprobs");
  ExpectCompletionError({{"logprobs", true}}, "logprobs");
  // echo + logprobs asks the engine for the prompt's logprobs too.
  r = ParseCompletionRequest(Completion({{"echo", true}, {"logprobs", 1}}), context_);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->sampling.prompt_logprobs, 1);
  EXPECT_FALSE(r->prompt_logprobs_field);
  ExpectCompletionError({{"echo", "y"}}, "echo");
}

TEST_F(ProtocolTest, CompletionMaxTokensZeroWithEchoScoresThePromptOnly) {
  // The engine samples one token, which the reply leaves out.
  absl::StatusOr<GenerationRequest> r = ParseCompletionRequest(
      Completion({{"echo", true}, {"logprobs", 0}, {"max_tokens", 0}}), context_);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->echo_only);
  EXPECT_EQ(r->sampling.max_tokens, 1);
  EXPECT_EQ(r->sampling.prompt_logprobs, 0);
  // Completions takes no max_completion_tokens (the legacy API's table has only max_tokens).
  ExpectCompletionError({{"echo", true}, {"max_completion_tokens", 0}}, "max_completion_tokens");
  r = ParseCompletionRequest(Completion({{"echo", true}, {"max_tokens", 2}}), context_);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->echo_only);
  EXPECT_EQ(r->sampling.max_tokens, 2);

  ExpectCompletionError({{"max_tokens", 0}}, "max_tokens");
  ExpectCompletionError({{"max_tokens", 0}, {"echo", false}}, "max_tokens");
  ExpectChatError({{"max_tokens", 0}, {"echo", true}}, "max_tokens");
  ExpectCompletionError({{"max_tokens", 0}, {"echo", true}, {"min_tokens", 1}}, "min_tokens");
  // A prompt filling the context leaves no position for the sampled token.
  std::vector<int32_t> ids(32, ByteTokenizer::Byte('x'));
  ExpectCompletionError({{"prompt", ids}, {"max_tokens", 0}, {"echo", true}}, "prompt");
  ids.pop_back();
  r = ParseCompletionRequest(Completion({{"prompt", ids}, {"max_tokens", 0}, {"echo", true}}),
                             context_);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->sampling.max_tokens, 1);
}

TEST_F(ProtocolTest, ContextLengthErrorsGiveBothNumbers) {
  // Prompt "ab" is 3 tokens with BOS; max_model_len 32.
  absl::StatusOr<GenerationRequest> r =
      ParseCompletionRequest(Completion({{"max_tokens", 30}}), context_);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(HttpStatusFor(r.status()), 400);
  EXPECT_EQ(OpenAiErrorJson(r.status())["error"]["param"], "prompt");
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("maximum context length is 32"));
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("requested 33 tokens"));
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("3 in the prompt"));

  r = ParseCompletionRequest(Completion({{"max_tokens", 29}}), context_);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->sampling.max_tokens, 29);

  // Without max_tokens the prompt alone must leave room for one token.
  std::vector<int32_t> ids(32, ByteTokenizer::Byte('x'));
  r = ParseCompletionRequest(Completion({{"prompt", ids}}), context_);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("32"));
  ids.pop_back();
  r = ParseCompletionRequest(Completion({{"prompt", ids}}), context_);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->sampling.max_tokens, 1);

  absl::StatusOr<GenerationRequest> chat = ParseChatCompletionRequest(
      Chat({{"max_tokens", 100}}), context_);
  ASSERT_FALSE(chat.ok());
  EXPECT_EQ(OpenAiErrorJson(chat.status())["error"]["param"], "messages");
  EXPECT_THAT(std::string(chat.status().message()), HasSubstr("4 in the messages"));
}

TEST_F(ProtocolTest, MalformedJsonIsRejected) {
  EXPECT_EQ(HttpStatusFor(ParseJsonBody("{\"model\": ").status()), 400);
  EXPECT_EQ(HttpStatusFor(ParseJsonBody("[1, 2]").status()), 400);
  EXPECT_EQ(HttpStatusFor(ParseJsonBody("").status()), 400);
  absl::StatusOr<json> ok = ParseJsonBody(R"({"a": 1})");
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ((*ok)["a"], 1);
}

TEST_F(ProtocolTest, ChatWithoutTemplateIs400) {
  context_.chat_template = nullptr;
  ExpectChatError(json::object(), "messages");
}

}  // namespace
}  // namespace sluice
