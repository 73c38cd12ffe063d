// Tools and tool-call arguments reach the chat template in the client's key order, as
// transformers' apply_chat_template gives them (nlohmann::json would sort them): the prompt of
// models/sluice-mini-moe's template equals the golden that
// tests/fixtures/make_tool_order_golden.py rendered with jinja2 as transformers does.
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "services/api/openai_service.h"
#include "tests/unit/api_test_fakes.h"
#include "tests/util/test_paths.h"

namespace sluice {
namespace {

using nlohmann::json;
using testing::ByteTokenizer;
using testing::FakeBackend;
using testing::ManualExecutor;
using testing::RecordingSink;

json LoadGolden() {
  const std::string path = testing::RepoFixtureDir("tool-order") + "/golden.json";
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return json::parse(text.str());
}

class ToolOrderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto tmpl = ChatTemplate::FromModelDir(testing::EmbeddedModelDir());
    ASSERT_TRUE(tmpl.ok()) << tmpl.status();
    chat_template_ = *std::move(tmpl);
    backend_.max_len = 4096;
    OpenAiServiceOptions options;
    options.served_model_name = "sluice-mini-moe";
    service_ = std::make_unique<OpenAiService>(&backend_, &tokenizer_, chat_template_.get(),
                                               options);
  }
  // Prompt posts `body` (raw JSON text) and returns the rendered prompt the engine got.
  std::string Prompt(const std::string& body) {
    auto sink = std::make_shared<RecordingSink>();
    service_->Handle({"POST", "/v1/chat/completions", body}, sink, executor_.poster());
    executor_.Drain();
    if (backend_.order().size() != ++submitted_) {
      ADD_FAILURE() << "not submitted: " << sink->status << " " << sink->body;
      return "";
    }
    return tokenizer_.Decode(backend_.request(backend_.order().back()).prompt_token_ids,
                             /*skip_special_tokens=*/false);
  }

  ByteTokenizer tokenizer_;
  FakeBackend backend_;
  std::unique_ptr<ChatTemplate> chat_template_;
  std::unique_ptr<OpenAiService> service_;
  ManualExecutor executor_;
  size_t submitted_ = 0;
};

TEST_F(ToolOrderTest, PromptEqualsTransformersGolden) {
  const json golden = LoadGolden();
  EXPECT_EQ(Prompt(golden["body"].get<std::string>()), golden["prompt"].get<std::string>());
}

TEST_F(ToolOrderTest, SortedKeysWouldDifferFromTheGolden) {
  // The same body re-serialized by nlohmann::json (keys sorted) renders another prompt: the
  // golden depends on the order.
  const json golden = LoadGolden();
  const std::string sorted = json::parse(golden["body"].get<std::string>()).dump();
  EXPECT_NE(Prompt(sorted), golden["prompt"].get<std::string>());
}

}  // namespace
}  // namespace sluice
