// Golden tests: the byte-level BPE tokenizer against HF tokenizers 0.23.2 outputs
// (shared/fixtures/tokenizer/tokenizer_golden.json, 369 cases).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/tokenizer/tokenizer.h"
#include "tests/util/test_paths.h"

namespace sluice {
namespace {

using ::testing::ElementsAre;

nlohmann::json ReadJson(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  return nlohmann::json::parse(in);
}

std::unique_ptr<Tokenizer> LoadTokenizer(const std::string& dir) {
  auto tokenizer = Tokenizer::FromFile(dir + "/tokenizer.json");
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
  return tokenizer.ok() ? *std::move(tokenizer) : nullptr;
}

TEST(TokenizerGoldenTest, AllCasesMatchHuggingFace) {
  const std::string dir = testing::FixtureDir("tokenizer");
  std::unique_ptr<Tokenizer> tokenizer = LoadTokenizer(dir);
  ASSERT_NE(tokenizer, nullptr);
  const nlohmann::json golden = ReadJson(dir + "/tokenizer_golden.json");
  const nlohmann::json& cases = golden.at("cases");
  ASSERT_EQ(cases.size(), 369u);
  EXPECT_EQ(tokenizer->vocab_size(), golden.at("vocab_size").get<int32_t>());

  int num_passed = 0;
  for (const nlohmann::json& c : cases) {
    const std::string text = c.at("text").get<std::string>();
    const bool parse_special = c.at("parse_special").get<bool>();
    const auto want_ids = c.at("ids").get<std::vector<int32_t>>();
    const auto want_ids_with_bos = c.at("ids_with_bos").get<std::vector<int32_t>>();
    const auto want_tokens = c.at("tokens").get<std::vector<std::string>>();
    const std::string want_decoded = c.at("decoded").get<std::string>();
    SCOPED_TRACE("case " + std::to_string(c.at("id").get<int>()) + " (" +
                 c.at("category").get<std::string>() + "): " + text.substr(0, 80));

    const std::vector<int32_t> ids = tokenizer->Encode(text, false, parse_special);
    const std::vector<int32_t> ids_with_bos = tokenizer->Encode(text, true, parse_special);
    std::vector<std::string> tokens;
    for (int32_t id : ids) tokens.push_back(tokenizer->IdToToken(id));
    const std::string decoded = tokenizer->Decode(ids, /*skip_special_tokens=*/false);

    EXPECT_EQ(ids, want_ids);
    EXPECT_EQ(ids_with_bos, want_ids_with_bos);
    EXPECT_EQ(tokens, want_tokens);
    EXPECT_EQ(decoded, want_decoded);
    // Every golden case round-trips (roundtrip: true), so decode(encode(text)) == text.
    EXPECT_EQ(c.at("roundtrip").get<bool>(), decoded == text);
    if (ids == want_ids && ids_with_bos == want_ids_with_bos && tokens == want_tokens &&
        decoded == want_decoded && decoded == text) {
      ++num_passed;
    }
  }
  std::printf("tokenizer golden: %d/%zu cases passed\n", num_passed, cases.size());
  EXPECT_EQ(num_passed, static_cast<int>(cases.size()));
}

TEST(TokenizerGoldenTest, SpecialTokensTable) {
  const std::string dir = testing::FixtureDir("tokenizer");
  std::unique_ptr<Tokenizer> tokenizer = LoadTokenizer(dir);
  ASSERT_NE(tokenizer, nullptr);
  const nlohmann::json golden = ReadJson(dir + "/tokenizer_golden.json");
  for (const auto& [content, id] : golden.at("special_tokens").items()) {
    EXPECT_EQ(tokenizer->TokenToId(content), id.get<int32_t>()) << content;
    EXPECT_TRUE(tokenizer->IsSpecial(id.get<int32_t>())) << content;
    EXPECT_EQ(tokenizer->IdToToken(id.get<int32_t>()), content);
  }
  EXPECT_FALSE(tokenizer->IsSpecial(47));
  EXPECT_EQ(tokenizer->TokenToId("Ġworld"), 1041);
  EXPECT_EQ(tokenizer->TokenToId("no-such-token"), std::nullopt);
  EXPECT_EQ(tokenizer->IdToToken(8192), "");
  EXPECT_EQ(tokenizer->IdToToken(-1), "");
  // skip_special_tokens drops BOS/EOS from the text.
  const std::vector<int32_t> ids = {0, 47, 554, 86, 1041, 1};
  EXPECT_EQ(tokenizer->Decode(ids, /*skip_special_tokens=*/true), "Hello world");
  EXPECT_EQ(tokenizer->Decode(ids, /*skip_special_tokens=*/false),
            "<|begin_of_text|>Hello world<|end_of_text|>");
}

// The chat-template example of fixtures/README.md, tokenized with special tokens parsed.
TEST(TokenizerGoldenTest, ChatRenderingExample) {
  std::unique_ptr<Tokenizer> tokenizer = LoadTokenizer(testing::FixtureDir("tokenizer"));
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_THAT(
      tokenizer->Encode("<|begin_of_text|><|user|>\nHello!<|end_of_text|>\n<|assistant|>\n", false),
      ElementsAre(0, 2, 206, 47, 554, 86, 8, 1, 206, 3, 206));
}

// Every model folder ships the same tokenizer.json; each must load and encode identically.
class ModelFolderTokenizerTest : public ::testing::TestWithParam<const char*> {};

TEST_P(ModelFolderTokenizerTest, LoadsAndEncodes) {
  std::unique_ptr<Tokenizer> tokenizer = LoadTokenizer(testing::FixtureDir(GetParam()));
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_EQ(tokenizer->vocab_size(), 8192);
  EXPECT_THAT(tokenizer->Encode("Hello world", true), ElementsAre(0, 47, 554, 86, 1041));
  EXPECT_THAT(tokenizer->Encode("Hi <|user|> there", false), ElementsAre(47, 80, 228, 2, 400));
  EXPECT_EQ(tokenizer->Decode(std::vector<int32_t>{47, 80, 228, 2, 400}, false),
            "Hi <|user|> there");
}

INSTANTIATE_TEST_SUITE_P(AllModels, ModelFolderTokenizerTest,
                         ::testing::Values("llama-tiny", "qwen3-hybrid-tiny", "deepseek-v3-tiny",
                                           "llava-tiny"));

}  // namespace
}  // namespace sluice
