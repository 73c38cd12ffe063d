// Golden tests: the tokenizer against HF tokenizers 0.23.2 outputs, for the byte-level fixture
// (shared/fixtures/tokenizer), the real Llama 3 and Qwen2 (NFC) tokenizers
// (shared/tokenizers), and the SentencePiece-style Llama 2 vocab with its variants
// (tests/fixtures, made by make_spm_tokenizers.py).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "engine/tokenizer/incremental_detokenizer.h"
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

// One golden: the tokenizer.json it was computed on and its cases. `overrides` (optional)
// replaces top-level keys of the tokenizer.json (the spm-variants share llama-spm's vocab).
struct GoldenSpec {
  const char* name;
  std::string (*tokenizer_json)();
  std::string (*golden)();
  std::string (*overrides)();
  size_t num_cases;
};

std::string SharedTokenizer(const std::string& name) {
  return testing::RequirePath(testing::SharedDir() + "/tokenizers/" + name + "/tokenizer.json");
}

std::string ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  std::ostringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

std::unique_ptr<Tokenizer> LoadGoldenTokenizer(const GoldenSpec& spec) {
  std::string text = ReadText(spec.tokenizer_json());
  if (spec.overrides != nullptr) {
    nlohmann::json root = nlohmann::json::parse(text);
    const nlohmann::json overrides = ReadJson(spec.overrides());
    for (const auto& [key, value] : overrides.items()) root[key] = value;
    text = root.dump();
  }
  auto tokenizer = Tokenizer::FromJsonText(text);
  EXPECT_TRUE(tokenizer.ok()) << spec.name << ": " << tokenizer.status();
  return tokenizer.ok() ? *std::move(tokenizer) : nullptr;
}

const GoldenSpec kGoldens[] = {
    {"fixture_byte_level", [] { return testing::FixtureDir("tokenizer") + "/tokenizer.json"; },
     [] { return testing::FixtureDir("tokenizer") + "/tokenizer_golden.json"; }, nullptr, 369},
    {"llama3", [] { return SharedTokenizer("llama3"); },
     [] { return testing::SharedDir() + "/tokenizers/llama3/tokenizer_golden.json"; }, nullptr,
     369},
    {"qwen2", [] { return SharedTokenizer("qwen2"); },
     [] { return testing::SharedDir() + "/tokenizers/qwen2/tokenizer_golden.json"; }, nullptr,
     369},
    // Texts the qwen2 NFC normalizer changes (the shared golden avoids them).
    {"qwen2_nfc", [] { return SharedTokenizer("qwen2"); },
     [] { return testing::RepoFixtureDir("qwen2-nfc") + "/tokenizer_golden.json"; }, nullptr, 80},
    {"llama_spm", [] { return testing::RepoFixtureDir("llama-spm") + "/tokenizer.json"; },
     [] { return testing::RepoFixtureDir("llama-spm") + "/tokenizer_golden.json"; }, nullptr,
     414},
    {"spm_metaspace", [] { return testing::RepoFixtureDir("llama-spm") + "/tokenizer.json"; },
     [] { return testing::RepoFixtureDir("spm-variants/metaspace") + "/tokenizer_golden.json"; },
     [] { return testing::RepoFixtureDir("spm-variants/metaspace") + "/overrides.json"; }, 318},
    {"spm_gemma_style", [] { return testing::RepoFixtureDir("llama-spm") + "/tokenizer.json"; },
     [] { return testing::RepoFixtureDir("spm-variants/gemma-style") + "/tokenizer_golden.json"; },
     [] { return testing::RepoFixtureDir("spm-variants/gemma-style") + "/overrides.json"; },
     240},
};

class TokenizerGoldenCasesTest : public ::testing::TestWithParam<GoldenSpec> {};

TEST_P(TokenizerGoldenCasesTest, AllCasesMatchHuggingFace) {
  const GoldenSpec& spec = GetParam();
  std::unique_ptr<Tokenizer> tokenizer = LoadGoldenTokenizer(spec);
  ASSERT_NE(tokenizer, nullptr);
  const nlohmann::json golden = ReadJson(spec.golden());
  const nlohmann::json& cases = golden.at("cases");
  ASSERT_EQ(cases.size(), spec.num_cases);
  EXPECT_EQ(tokenizer->vocab_size(), golden.at("vocab_size").get<int32_t>());

  int num_passed = 0;
  for (const nlohmann::json& c : cases) {
    const std::string text = c.at("text").get<std::string>();
    const bool parse_special = c.at("parse_special").get<bool>();
    const auto want_ids = c.at("ids").get<std::vector<int32_t>>();
    const auto want_ids_with_bos = c.at("ids_with_bos").get<std::vector<int32_t>>();
    const auto want_tokens = c.at("tokens").get<std::vector<std::string>>();
    const std::string want_decoded = c.at("decoded").get<std::string>();
    const bool want_roundtrip = c.at("roundtrip").get<bool>();
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
    // roundtrip: whether HF's decode(encode(text)) gave back the text (false where a
    // normalizer changed it).
    EXPECT_EQ(want_roundtrip, decoded == text);
    if (ids == want_ids && ids_with_bos == want_ids_with_bos && tokens == want_tokens &&
        decoded == want_decoded && want_roundtrip == (decoded == text)) {
      ++num_passed;
    }
  }
  std::printf("tokenizer golden %s: %d/%zu cases passed\n", spec.name, num_passed, cases.size());
  EXPECT_EQ(num_passed, static_cast<int>(cases.size()));
}

INSTANTIATE_TEST_SUITE_P(Goldens, TokenizerGoldenCasesTest, ::testing::ValuesIn(kGoldens),
                         [](const ::testing::TestParamInfo<GoldenSpec>& info) {
                           return std::string(info.param.name);
                         });

// llama.cpp's own test pairs for its Llama 2 vocab (ids from the original HF tokenizer).
TEST(LlamaSpmTokenizerTest, MatchesLlamaCppPairs) {
  const std::string dir = testing::RepoFixtureDir("llama-spm");
  auto tokenizer = Tokenizer::FromFile(dir + "/tokenizer.json");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  const std::string inp = ReadText(dir + "/ggml-vocab-llama-spm.gguf.inp");
  std::istringstream out(ReadText(dir + "/ggml-vocab-llama-spm.gguf.out"));
  const std::string separator = "\n__ggml_vocab_test__\n";
  int num_cases = 0;
  for (size_t pos = 0, next; (next = inp.find(separator, pos)) != std::string::npos;
       pos = next + separator.size()) {
    const std::string text = inp.substr(pos, next - pos);
    std::string line;
    ASSERT_TRUE(std::getline(out, line));
    std::istringstream fields(line);
    std::vector<int32_t> want;
    for (int32_t id; fields >> id;) want.push_back(id);
    EXPECT_EQ((*tokenizer)->Encode(text, /*add_special_tokens=*/false), want) << text;
    ++num_cases;
  }
  EXPECT_EQ(num_cases, 46);
}

// Streaming a SentencePiece-style output token by token: byte-fallback pieces of one character
// are held back until complete, and "▁" pieces keep their space (the text continues a prompt),
// while Decode of the whole sequence applies Llama 2's Strip of the first space.
TEST(LlamaSpmTokenizerTest, IncrementalDetokenization) {
  auto tokenizer = Tokenizer::FromFile(testing::RepoFixtureDir("llama-spm") + "/tokenizer.json");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  const std::string text = "Hello \U0001F999 w\u00f6rld\n\u4f60\u597d";
  const std::vector<int32_t> ids = (*tokenizer)->Encode(text, /*add_special_tokens=*/false);
  // The llama is four byte-fallback pieces (<0xF0><0x9F><0xA6><0x99>).
  EXPECT_NE(std::find(ids.begin(), ids.end(), *(*tokenizer)->TokenToId("<0xF0>")), ids.end());
  IncrementalDetokenizer detokenizer(**tokenizer, /*skip_special_tokens=*/true);
  std::string streamed;
  for (int32_t id : ids) {
    const std::string delta = detokenizer.Push(id);
    EXPECT_EQ(delta.find("\xEF\xBF\xBD"), std::string::npos) << "half a character emitted";
    streamed += delta;
  }
  streamed += detokenizer.Flush();
  EXPECT_EQ(streamed, " " + text);
  EXPECT_EQ((*tokenizer)->Decode(ids, /*skip_special_tokens=*/false), text);
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
