// The field rule of the OpenAI endpoints (openai_fields.h) and the request fields that shape
// the prompt or the sampling: every field honoured, accepted as metadata, or refused by name.
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "services/api/openai_errors.h"
#include "services/api/openai_fields.h"
#include "services/api/openai_protocol.h"
#include "tests/unit/api_parse_fixture.h"

namespace sluice {
namespace {

using nlohmann::json;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Pair;
using testing::ByteTokenizer;

int32_t B(char c) { return ByteTokenizer::Byte(c); }

class FieldsTest : public testing::ApiParseTest {
 protected:
  // ExpectError asserts a 400 naming `param` whose message contains `text`.
  static void ExpectError(const absl::StatusOr<GenerationRequest>& r, const std::string& param,
                          const std::string& text = "") {
    ExpectParamError(r, param);
    if (!r.ok()) {
      EXPECT_THAT(std::string(r.status().message()), HasSubstr(text));
    }
  }
};

TEST_F(FieldsTest, UnknownFieldsAre400UnlessAllowed) {
  ExpectError(ParseChat({{"frobnicate", 1}}), "frobnicate",
              "Unrecognized request argument supplied: frobnicate");
  ExpectError(ParseCompletion({{"max_new_tokens", 5}}), "max_new_tokens");
  context_.allow_unknown_fields = true;
  absl::StatusOr<GenerationRequest> r = ParseChat({{"frobnicate", 1}, {"zzz", nullptr}});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(r->unknown_fields, ElementsAre("frobnicate", "zzz"));
  // Known fields are still checked.
  ExpectError(ParseChat({{"frobnicate", 1}, {"use_beam_search", true}}), "use_beam_search");
}

TEST_F(FieldsTest, OpenAiMetadataIsAcceptedWhereOpenAiAcceptsIt) {
  absl::StatusOr<GenerationRequest> r =
      ParseChat({{"user", "u1"}, {"metadata", {{"k", "v"}}}, {"store", true},
                 {"service_tier", "auto"}, {"prompt_cache_key", "p"}, {"request_id", "r1"}});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(r->unknown_fields, IsEmpty());
  ExpectError(ParseChat({{"user", 5}}), "user", "'user' must be a string");
  ExpectError(ParseChat({{"metadata", {{"k", 1}}}}), "metadata");
  ExpectError(ParseChat({{"store", "yes"}}), "store");
  // Legacy completions take `user` only.
  EXPECT_TRUE(ParseCompletion({{"user", "u1"}}).ok());
  ExpectError(ParseCompletion({{"metadata", {{"k", "v"}}}}), "metadata", "Unrecognized");
  ExpectError(ParseCompletion({{"store", false}}), "store", "Unrecognized");
  ExpectError(ParseCompletion({{"service_tier", "auto"}}), "service_tier", "Unrecognized");
}

TEST_F(FieldsTest, BeamSearchAndLengthPenaltyAreRefusedSayingSo) {
  ExpectError(ParseChat({{"use_beam_search", true}}), "use_beam_search", "beam search");
  ExpectError(ParseCompletion({{"length_penalty", 0.8}}), "length_penalty", "beam search");
  ExpectError(ParseCompletion({{"early_stopping", true}}), "early_stopping", "beam search");
  // The neutral values ask for nothing.
  EXPECT_TRUE(ParseChat({{"use_beam_search", false}, {"length_penalty", 1.0}}).ok());
}

// Every refused entry of every table: a value it does not allow is a 400 naming the field,
// and null (absent) is accepted.
TEST_F(FieldsTest, EveryRefusedFieldIsNamed) {
  for (FieldTable table :
       {FieldTable::kChatCompletions, FieldTable::kCompletions, FieldTable::kResponses}) {
    int refused = 0;
    for (const FieldSpec& f : Fields(table)) {
      const std::string name(f.name);
      EXPECT_TRUE(CheckFields(json{{name, nullptr}}, table, false, nullptr).ok()) << name;
      if (f.use != FieldUse::kRefused) continue;
      ++refused;
      const json bad = json{{name, json{{"x", {1, 2}}}}};  // no field allows this object
      absl::Status s = CheckFields(bad, table, false, nullptr);
      ASSERT_FALSE(s.ok()) << name;
      EXPECT_EQ(OpenAiErrorJson(s)["error"]["param"], name);
      EXPECT_THAT(std::string(s.message()), HasSubstr("'" + name + "'"));
    }
    EXPECT_GT(refused, 5);
  }
  // Names are unique within a table.
  for (FieldTable table :
       {FieldTable::kChatCompletions, FieldTable::kCompletions, FieldTable::kResponses}) {
    std::set<std::string_view> names;
    for (const FieldSpec& f : Fields(table)) EXPECT_TRUE(names.insert(f.name).second) << f.name;
  }
}

TEST_F(FieldsTest, HarmlessFormsOfRefusedFieldsAreAccepted) {
  EXPECT_TRUE(ParseChat({{"tools", json::array()}, {"tool_choice", "none"},
                         {"response_format", {{"type", "text"}}}, {"modalities", {"text"}},
                         {"spaces_between_special_tokens", true}, {"priority", 0}})
                  .ok());
  ExpectError(ParseChat({{"tool_choice", "required"}}), "tool_choice");
  ExpectError(ParseChat({{"spaces_between_special_tokens", false}}),
              "spaces_between_special_tokens");
  ExpectError(ParseCompletion({{"guided_json", {{"type", "object"}}}}), "guided_json");
}

TEST_F(FieldsTest, PriorityIsParsed) {
  absl::StatusOr<GenerationRequest> r = ParseCompletion({{"priority", -3}});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->priority, -3);
  r = ParseChat({{"n", 1}});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->priority, 0);
  ExpectError(ParseCompletion({{"priority", "high"}}), "priority");
  ExpectError(ParseCompletion({{"priority", 1.5}}), "priority");
  ExpectError(ParseCompletion({{"priority", int64_t{1} << 40}}), "priority");
}

TEST_F(FieldsTest, TokenConstraintsAreParsed) {
  absl::StatusOr<GenerationRequest> r =
      ParseCompletion({{"allowed_token_ids", {B('x'), B('y')}},
                       {"logit_bias", {{std::to_string(B('z')), -100}, {"7", 2.5}}},
                       {"bad_words", {"ab", " c"}}});
  ASSERT_TRUE(r.ok()) << r.status();
  const SamplingParams& sp = r->sampling;
  EXPECT_THAT(sp.allowed_token_ids, ElementsAre(B('x'), B('y')));
  EXPECT_THAT(sp.logit_bias, ::testing::UnorderedElementsAre(Pair(B('z'), -100.0f),
                                                             Pair(7, 2.5f)));
  // Byte tokens: " ab" is one token longer than "ab", so only the plain form is banned (vLLM
  // adds the spaced form only when it has as many tokens); " c" is left-stripped first.
  EXPECT_THAT(sp.bad_words_token_ids,
              ElementsAre(ElementsAre(B('a'), B('b')), ElementsAre(B('c'))));
  ExpectError(ParseCompletion({{"allowed_token_ids", json::array()}}), "allowed_token_ids");
  ExpectError(ParseCompletion({{"allowed_token_ids", {100000}}}), "allowed_token_ids");
  ExpectError(ParseCompletion({{"logit_bias", {{"5", 101}}}}), "logit_bias", "[-100, 100]");
  ExpectError(ParseCompletion({{"logit_bias", {{"abc", 1}}}}), "logit_bias");
  ExpectError(ParseCompletion({{"logit_bias", {{"99999", 1}}}}), "logit_bias");
  ExpectError(ParseCompletion({{"bad_words", "ab"}}), "bad_words");
  ExpectError(ParseCompletion({{"bad_words", {"  "}}}), "bad_words");
}

TEST_F(FieldsTest, TruncatePromptTokensKeepsTheLastTokens) {
  // "ab" with BOS is 3 tokens.
  absl::StatusOr<GenerationRequest> r = ParseCompletion({{"truncate_prompt_tokens", 2}});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(r->prompts, ElementsAre(ElementsAre(B('a'), B('b'))));
  r = ParseCompletion({{"truncate_prompt_tokens", 10}});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->prompts[0].size(), 3u);
  r = ParseChat({{"truncate_prompt_tokens", 3}});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(r->prompts[0], ElementsAre(B('i'), ByteTokenizer::kEos, 3));
  EXPECT_EQ(r->sampling.max_tokens, 64 - 3);
  ExpectError(ParseCompletion({{"truncate_prompt_tokens", 0}}), "truncate_prompt_tokens");
  ExpectError(ParseCompletion({{"truncate_prompt_tokens", "x"}}), "truncate_prompt_tokens");
}

TEST_F(FieldsTest, StreamOptions) {
  absl::StatusOr<GenerationRequest> r =
      ParseChat({{"stream", true}, {"stream_options", {{"continuous_usage_stats", true}}}});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->continuous_usage_stats);
  EXPECT_TRUE(r->include_usage);
  ExpectError(ParseChat({{"stream", true}, {"stream_options", {{"frob", true}}}}),
              "stream_options", "stream_options.frob");
  ExpectError(ParseChat({{"stream_options", {{"include_usage", true}}}}), "stream_options",
              "only allowed when 'stream' is true");
  ExpectError(ParseCompletion({{"stream", true},
                               {"stream_options", {{"continuous_usage_stats", 1}}}}),
              "stream_options");
}

TEST_F(FieldsTest, RequestChatTemplateAndKwargs) {
  absl::StatusOr<GenerationRequest> r = ParseChat(
      {{"chat_template", "{{ greeting }}{% for m in messages %}[{{ m.content }}]{% endfor %}"},
       {"chat_template_kwargs", {{"greeting", "yo"}}}});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(tokenizer_.Decode(r->prompts[0], false), "yo[Hi]");
  ExpectError(ParseChat({{"chat_template", "{% for %}"}}), "chat_template", "does not parse");
  ExpectError(ParseChat({{"chat_template", "tool_use"}}), "chat_template", "named templates");
  ExpectError(ParseChat({{"chat_template", "{{ raise_exception('no') }}"}}), "chat_template",
              "no");
  ExpectError(ParseChat({{"chat_template_kwargs", "x"}}), "chat_template_kwargs");
  ExpectError(ParseChat({{"chat_template_kwargs", {{"messages", json::array()}}}}),
              "chat_template_kwargs");
  // documents reach the template.
  r = ParseChat({{"chat_template", "{% for d in documents %}{{ d.text }}{% endfor %}"},
                 {"documents", {{{"text", "doc"}}}}});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(tokenizer_.Decode(r->prompts[0], false), "doc");
}

TEST_F(FieldsTest, ContinueFinalMessageAndChatEcho) {
  const json messages = {{{"role", "user"}, {"content", "Hi"}},
                         {{"role", "assistant"}, {"content", "Hel"}}};
  absl::StatusOr<GenerationRequest> r = ParseChat(
      {{"messages", messages}, {"continue_final_message", true}, {"echo", true}});
  ASSERT_TRUE(r.ok()) << r.status();
  // The assistant turn stays open: no "</s>" after "Hel", no generation prompt.
  EXPECT_EQ(tokenizer_.Decode(r->prompts[0], false), "<|user|>Hi</s><|assistant|>Hel");
  EXPECT_TRUE(r->echo);
  EXPECT_THAT(r->echo_texts, ElementsAre("Hel"));
  // With a generation prompt the last (user) message is not the response's role: no echo text.
  r = ParseChat({{"echo", true}});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(r->echo_texts, ElementsAre(""));
  ExpectError(ParseChat({{"continue_final_message", true}}), "continue_final_message",
              "assistant");
  ExpectError(ParseChat({{"messages", messages}, {"continue_final_message", true},
                         {"add_generation_prompt", true}}),
              "continue_final_message");
}

TEST_F(FieldsTest, AddSpecialTokens) {
  absl::StatusOr<GenerationRequest> r = ParseCompletion({{"add_special_tokens", false}});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(r->prompts, ElementsAre(ElementsAre(B('a'), B('b'))));
  r = ParseChat({{"add_special_tokens", true}});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->prompts[0][0], ByteTokenizer::kBos);
}

}  // namespace
}  // namespace sluice
