// The fixture of the request-parser tests (openai_protocol.h): a chat template over the byte
// tokenizer of api_test_fakes.h, the ParseContext the parsers read, body builders and the
// error assertion they share.
#ifndef SLUICE_TESTS_UNIT_API_PARSE_FIXTURE_H_
#define SLUICE_TESTS_UNIT_API_PARSE_FIXTURE_H_

#include <memory>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "engine/tokenizer/chat_template.h"
#include "nlohmann/json.hpp"
#include "services/api/openai_errors.h"
#include "services/api/openai_protocol.h"
#include "tests/unit/api_test_fakes.h"

namespace sluice::testing {

// "<|role|>content</s>" per message, then "<|assistant|>" with add_generation_prompt.
inline constexpr char kParseTestTemplate[] =
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}";

class ApiParseTest : public ::testing::Test {
 protected:
  void SetUp() override { SetUpParser(kParseTestTemplate, 64); }

  // SetUpParser points the context at `template_source` (the model's template) and a context
  // of `max_model_len` tokens.
  void SetUpParser(const std::string& template_source, int32_t max_model_len) {
    auto tmpl = ChatTemplate::Parse(template_source);
    ASSERT_TRUE(tmpl.ok()) << tmpl.status();
    chat_template_ = *std::move(tmpl);
    context_.tokenizer = &tokenizer_;
    context_.chat_template = chat_template_.get();
    context_.served_model_name = "mini";
    context_.max_model_len = max_model_len;
  }

  // Chat / Completion: a minimal valid body ("Hi" from the user / the prompt "ab") with the
  // fields of `extra` added or replaced.
  static nlohmann::json Chat(nlohmann::json extra = nlohmann::json::object()) {
    nlohmann::json body{{"model", "mini"}, {"messages", {{{"role", "user"}, {"content", "Hi"}}}}};
    body.update(extra);
    return body;
  }
  static nlohmann::json Completion(nlohmann::json extra = nlohmann::json::object()) {
    nlohmann::json body{{"model", "mini"}, {"prompt", "ab"}};
    body.update(extra);
    return body;
  }
  absl::StatusOr<GenerationRequest> ParseChat(nlohmann::json extra) {
    return ParseChatCompletionRequest(Chat(std::move(extra)), context_);
  }
  absl::StatusOr<GenerationRequest> ParseCompletion(nlohmann::json extra) {
    return ParseCompletionRequest(Completion(std::move(extra)), context_);
  }
  // ParseMessages parses a chat body with `messages` and the fields of `extra`.
  absl::StatusOr<GenerationRequest> ParseMessages(nlohmann::json messages,
                                                  nlohmann::json extra = nlohmann::json::object()) {
    nlohmann::json body{{"model", "mini"}, {"messages", std::move(messages)}};
    body.update(extra);
    return ParseChatCompletionRequest(body, context_);
  }

  // ExpectParamError asserts that `r` failed with HTTP `code` naming `param`.
  static void ExpectParamError(const absl::StatusOr<GenerationRequest>& r,
                               const std::string& param, int code = 400) {
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(HttpStatusFor(r.status()), code) << r.status();
    EXPECT_EQ(OpenAiErrorJson(r.status())["error"]["param"], param) << r.status();
  }
  // ExpectExactError: a 400 naming `param` with exactly `message`.
  static void ExpectExactError(const absl::StatusOr<GenerationRequest>& r,
                               const std::string& param, const std::string& message) {
    ExpectParamError(r, param);
    if (!r.ok()) {
      EXPECT_EQ(r.status().message(), message);
    }
  }

  ByteTokenizer tokenizer_;
  std::unique_ptr<ChatTemplate> chat_template_;
  ParseContext context_;
};

}  // namespace sluice::testing

#endif  // SLUICE_TESTS_UNIT_API_PARSE_FIXTURE_H_
