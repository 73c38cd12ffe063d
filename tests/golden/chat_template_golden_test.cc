// Golden test of ChatTemplate against transformers' apply_chat_template (Jinja2 3.1.6):
// every conversation of shared/fixtures/tokenizer/chat_golden.json, with and without the
// generation prompt, must render byte-identically, and the error cases must be rejected with the
// template's raise_exception message.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

#include "engine/tokenizer/chat_template.h"
#include "nlohmann/json.hpp"
#include "tests/util/test_paths.h"

namespace sluice {
namespace {

using ::testing::HasSubstr;

nlohmann::ordered_json LoadJson(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  std::stringstream buffer;
  buffer << in.rdbuf();
  return nlohmann::ordered_json::parse(buffer.str(), nullptr, /*allow_exceptions=*/false);
}

std::string GoldenPath() { return sluice::testing::FixtureDir("tokenizer") + "/chat_golden.json"; }

// Checks one golden conversation rendered by `tmpl`; returns true when it matched.
bool CheckConversation(const ChatTemplate& tmpl, const nlohmann::ordered_json& conversation,
                       bool add_generation_prompt) {
  const std::string name = conversation.at("name").get<std::string>();
  const auto& expected = conversation.at(add_generation_prompt ? "with_generation_prompt"
                                                               : "without_generation_prompt");
  auto rendered = tmpl.RenderMessagesOrdered(conversation.at("messages"), add_generation_prompt);
  SCOPED_TRACE(name + (add_generation_prompt ? " (with generation prompt)" : ""));
  if (expected.contains("error")) {
    const std::string error = expected.at("error").get<std::string>();
    const std::string prefix = "TemplateError: ";
    EXPECT_EQ(error.rfind(prefix, 0), 0u) << error;
    const std::string message = error.substr(prefix.size());
    EXPECT_FALSE(rendered.ok()) << "rendered instead of failing: " << *rendered;
    if (rendered.ok()) return false;
    EXPECT_EQ(rendered.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(rendered.status().message()), HasSubstr(message));
    // raise_exception's message is passed through verbatim.
    EXPECT_EQ(rendered.status().message(), message);
    return !rendered.ok() && rendered.status().message() == message;
  }
  EXPECT_TRUE(rendered.ok()) << rendered.status();
  if (!rendered.ok()) return false;
  const std::string text = expected.at("text").get<std::string>();
  EXPECT_EQ(*rendered, text);
  return *rendered == text;
}

TEST(ChatTemplateGoldenTest, EveryConversationMatchesTransformers) {
  const nlohmann::ordered_json golden = LoadJson(GoldenPath());
  ASSERT_TRUE(golden.is_object());
  const auto& conversations = golden.at("conversations");
  ASSERT_EQ(conversations.size(), 26u);

  auto tmpl = ChatTemplate::FromModelDir(sluice::testing::FixtureDir("tokenizer"));
  ASSERT_TRUE(tmpl.ok()) << tmpl.status();

  int passed = 0;
  int errors_checked = 0;
  for (const auto& conversation : conversations) {
    for (bool add_generation_prompt : {false, true}) {
      if (CheckConversation(**tmpl, conversation, add_generation_prompt)) ++passed;
      const char* key =
          add_generation_prompt ? "with_generation_prompt" : "without_generation_prompt";
      if (conversation.at(key).contains("error")) ++errors_checked;
    }
  }
  EXPECT_EQ(passed, 52);
  EXPECT_EQ(errors_checked, 6);
}

TEST(ChatTemplateGoldenTest, TemplateInGoldenFileEqualsTokenizerConfig) {
  const nlohmann::ordered_json golden = LoadJson(GoldenPath());
  const nlohmann::ordered_json config =
      LoadJson(sluice::testing::FixtureDir("tokenizer") + "/tokenizer_config.json");
  ASSERT_TRUE(golden.is_object());
  ASSERT_TRUE(config.is_object());
  EXPECT_EQ(golden.at("chat_template"), config.at("chat_template"));

  // Parse() of the same source, with the special tokens passed explicitly, renders the same.
  auto parsed = ChatTemplate::Parse(golden.at("chat_template").get<std::string>());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const auto& conversation = golden.at("conversations").at(1);
  nlohmann::json context;
  context["messages"] = nlohmann::json::parse(conversation.at("messages").dump());
  context["add_generation_prompt"] = true;
  context["bos_token"] = config.at("bos_token");
  context["eos_token"] = config.at("eos_token");
  auto rendered = (*parsed)->Render(context);
  ASSERT_TRUE(rendered.ok()) << rendered.status();
  EXPECT_EQ(*rendered, conversation.at("with_generation_prompt").at("text").get<std::string>());
}

// The trained model folders ship the same template; it must load and render the golden text.
void ExpectModelDirRendersGolden(const std::string& model_dir) {
  auto tmpl = ChatTemplate::FromModelDir(model_dir);
  ASSERT_TRUE(tmpl.ok()) << model_dir << ": " << tmpl.status();
  const nlohmann::ordered_json golden = LoadJson(GoldenPath());
  for (const auto& conversation : golden.at("conversations")) {
    if (conversation.at("name") != "tool_roundtrip") continue;
    auto rendered = (*tmpl)->RenderMessagesOrdered(conversation.at("messages"), true);
    ASSERT_TRUE(rendered.ok()) << rendered.status();
    EXPECT_EQ(*rendered, conversation.at("with_generation_prompt").at("text").get<std::string>());
    auto unordered =
        (*tmpl)->RenderMessages(nlohmann::json::parse(conversation.at("messages").dump()), false);
    ASSERT_TRUE(unordered.ok()) << unordered.status();
    EXPECT_EQ(*unordered,
              conversation.at("without_generation_prompt").at("text").get<std::string>());
    return;
  }
  ADD_FAILURE() << "tool_roundtrip conversation missing from the golden file";
}

TEST(ChatTemplateGoldenTest, LoadsFromTrainedModelDirs) {
  ExpectModelDirRendersGolden(sluice::testing::EmbeddedModelDir());
  ExpectModelDirRendersGolden(sluice::testing::SharedModelDir("sluice-mini-moe"));
}

TEST(ChatTemplateGoldenTest, LoadsStandaloneChatTemplateJinja) {
  // llava-tiny keeps its template in chat_template.jinja next to tokenizer_config.json.
  ExpectModelDirRendersGolden(sluice::testing::FixtureDir("llava-tiny"));
}

TEST(ChatTemplateGoldenTest, MissingTemplateIsNotFound) {
  auto tmpl = ChatTemplate::FromModelDir(sluice::testing::SharedDir() + "/no-such-model-dir");
  ASSERT_FALSE(tmpl.ok());
  EXPECT_EQ(tmpl.status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace sluice
