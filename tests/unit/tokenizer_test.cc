// Unit tests for the tokenizer.json loader and its parts (pre-tokenizer behaviours, BPE merge
// order, added-token flags, error cases). Expected values come from HF tokenizers 0.23.2.
#include "engine/tokenizer/tokenizer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "engine/tokenizer/bpe_pretokenizer.h"
#include "engine/tokenizer/byte_level.h"
#include "tests/util/test_paths.h"

namespace sluice {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using json = nlohmann::json;

// A minimal tokenizer.json around `model`.
std::string MakeTokenizerJson(const json& model, const json& pre = nullptr,
                              const json& added = json::array(), const json& post = nullptr,
                              const json& decoder = nullptr, const json& normalizer = nullptr) {
  return json{{"version", "1.0"},      {"truncation", nullptr},    {"padding", nullptr},
              {"added_tokens", added}, {"normalizer", normalizer}, {"pre_tokenizer", pre},
              {"model", model},        {"post_processor", post},   {"decoder", decoder}}
      .dump();
}

json CharBpe(json vocab, json merges, bool fuse_unk) {
  return {{"type", "BPE"},        {"dropout", nullptr},     {"unk_token", "<unk>"},
          {"fuse_unk", fuse_unk}, {"byte_fallback", false}, {"ignore_merges", false},
          {"vocab", vocab},       {"merges", merges}};
}

std::unique_ptr<Tokenizer> MustLoad(const std::string& json_text) {
  auto tokenizer = Tokenizer::FromJsonText(json_text);
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
  return tokenizer.ok() ? *std::move(tokenizer) : nullptr;
}

std::unique_ptr<Tokenizer> FixtureTokenizer() {
  auto tokenizer = Tokenizer::FromFile(testing::FixtureDir("tokenizer") + "/tokenizer.json");
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
  return tokenizer.ok() ? *std::move(tokenizer) : nullptr;
}

std::vector<std::string> PreTokenize(const json& config, std::string_view text) {
  auto pre = BpePreTokenizer::FromJson(config);
  EXPECT_TRUE(pre.ok()) << pre.status();
  std::vector<std::string> words;
  if (pre.ok()) {
    (*pre)->Split(text, /*at_start=*/true, [&](std::string_view w) { words.emplace_back(w); });
  }
  return words;
}

TEST(TokenizerErrorsTest, MalformedJson) {
  auto tokenizer = Tokenizer::FromJsonText("{\"model\": {\"type\": \"BPE\",");
  EXPECT_EQ(tokenizer.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Tokenizer::FromJsonText("[1, 2]").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Tokenizer::FromJsonText("").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(TokenizerErrorsTest, UnknownModelType) {
  auto tokenizer = Tokenizer::FromJsonText(
      MakeTokenizerJson({{"type", "WordPiece"}, {"vocab", {{"a", 0}}}, {"unk_token", "[UNK]"}}));
  ASSERT_EQ(tokenizer.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(tokenizer.status().message(), HasSubstr("WordPiece"));
}

TEST(TokenizerErrorsTest, UnsupportedStagesAreNamed) {
  const json model = CharBpe({{"<unk>", 0}, {"a", 1}}, json::array(), false);
  auto normalizer = Tokenizer::FromJsonText(
      MakeTokenizerJson(model, nullptr, json::array(), nullptr, nullptr,
                        {{"type", "Precompiled"}}));
  EXPECT_EQ(normalizer.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(normalizer.status().message(), HasSubstr("Precompiled"));
  auto pre = Tokenizer::FromJsonText(MakeTokenizerJson(model, {{"type", "UnicodeScripts"}}));
  EXPECT_EQ(pre.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(pre.status().message(), HasSubstr("UnicodeScripts"));
  auto decoder = Tokenizer::FromJsonText(
      MakeTokenizerJson(model, nullptr, json::array(), nullptr, {{"type", "WordPiece"}}));
  EXPECT_EQ(decoder.status().code(), absl::StatusCode::kInvalidArgument);
  auto regex = Tokenizer::FromJsonText(MakeTokenizerJson(
      model, {{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}}));
  EXPECT_EQ(regex.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(regex.status().message(), HasSubstr("(unclosed"));
}

TEST(TokenizerErrorsTest, MergeWithUnknownToken) {
  auto tokenizer = Tokenizer::FromJsonText(
      MakeTokenizerJson(CharBpe({{"<unk>", 0}, {"a", 1}, {"b", 2}}, {"a b"}, false)));
  EXPECT_EQ(tokenizer.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(tokenizer.status().message(), HasSubstr("merge 0"));
}

TEST(TokenizerErrorsTest, MissingFileIsNotFound) {
  EXPECT_EQ(Tokenizer::FromFile("/nonexistent/tokenizer.json").status().code(),
            absl::StatusCode::kNotFound);
}

TEST(BpeModelTest, MergesApplyByRankNotPosition) {
  const json vocab = {{"<unk>", 0}, {"a", 1},  {"b", 2},   {"c", 3},
                      {"ab", 4},    {"bc", 5}, {"abc", 6}, {"ca", 7}};
  // "b c" outranks "a b": "abc" -> a bc -> abc (via "a bc"); as [a, b] pairs.
  auto t1 = MustLoad(
      MakeTokenizerJson(CharBpe(vocab, json::array({{"b", "c"}, {"a", "b"}, {"a", "bc"}}), false)));
  ASSERT_NE(t1, nullptr);
  EXPECT_THAT(t1->Encode("abc", false), ElementsAre(6));
  EXPECT_THAT(t1->Encode("ab", false), ElementsAre(4));
  // Without the "a bc" merge the word stops at [a, bc]; "ab c" is never tried.
  auto t2 = MustLoad(MakeTokenizerJson(CharBpe(vocab, {"b c", "a b"}, false)));
  ASSERT_NE(t2, nullptr);
  EXPECT_THAT(t2->Encode("abc", false), ElementsAre(1, 5));
  // Equal pairs merge leftmost first: "cac" with "c a" -> [ca, c].
  auto t3 = MustLoad(MakeTokenizerJson(CharBpe(vocab, {"c a"}, false)));
  ASSERT_NE(t3, nullptr);
  EXPECT_THAT(t3->Encode("cacac", false), ElementsAre(7, 7, 3));
}

TEST(BpeModelTest, UnknownCharactersFuseOrNot) {
  // tokenizers 0.23.2: "abxxac" -> [ab, <unk>, a, c] with fuse_unk, [ab, <unk>, <unk>, a, c]
  // without.
  const json vocab = {{"<unk>", 0}, {"a", 1}, {"b", 2}, {"ab", 3}, {"c", 4}};
  auto fused = MustLoad(MakeTokenizerJson(CharBpe(vocab, {"a b"}, true)));
  auto unfused = MustLoad(MakeTokenizerJson(CharBpe(vocab, {"a b"}, false)));
  ASSERT_NE(fused, nullptr);
  ASSERT_NE(unfused, nullptr);
  EXPECT_THAT(fused->Encode("abxxac", false), ElementsAre(3, 0, 1, 4));
  EXPECT_THAT(unfused->Encode("abxxac", false), ElementsAre(3, 0, 0, 1, 4));
  // No decoder: tokens joined with spaces, as HF does.
  EXPECT_EQ(fused->Decode(std::vector<int32_t>{3, 0, 1}, false), "ab <unk> a");
}

TEST(BpeModelTest, IgnoreMergesTakesWholeWords) {
  json model =
      CharBpe({{"<unk>", 0}, {"a", 1}, {"b", 2}, {"c", 3}, {"ab", 4}, {"abc", 5}}, {"a b"}, false);
  auto merging = MustLoad(MakeTokenizerJson(model));
  model["ignore_merges"] = true;
  auto ignoring = MustLoad(MakeTokenizerJson(model));
  ASSERT_NE(merging, nullptr);
  ASSERT_NE(ignoring, nullptr);
  EXPECT_THAT(merging->Encode("abc", false), ElementsAre(4, 3));
  EXPECT_THAT(ignoring->Encode("abc", false), ElementsAre(5));
  EXPECT_THAT(ignoring->Encode("abca", false), ElementsAre(4, 3, 1));
}

TEST(PreTokenizerTest, SplitBehaviours) {
  // Expected pieces from tokenizers.pre_tokenizers.Split("b", behavior, invert) on "abbcab".
  const auto split = [](const char* behavior, bool invert) {
    return PreTokenize({{"type", "Split"},
                        {"pattern", {{"String", "b"}}},
                        {"behavior", behavior},
                        {"invert", invert}},
                       "abbcab");
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(split("Isolated", false), (V{"a", "b", "b", "ca", "b"}));
  EXPECT_EQ(split("Removed", false), (V{"a", "ca"}));
  EXPECT_EQ(split("Removed", true), (V{"b", "b", "b"}));
  EXPECT_EQ(split("MergedWithPrevious", false), (V{"ab", "b", "cab"}));
  EXPECT_EQ(split("MergedWithPrevious", true), (V{"a", "b", "bca", "b"}));
  EXPECT_EQ(split("MergedWithNext", false), (V{"a", "b", "bca", "b"}));
  EXPECT_EQ(split("MergedWithNext", true), (V{"ab", "b", "cab"}));
  EXPECT_EQ(split("Contiguous", false), (V{"a", "bb", "ca", "b"}));
}

TEST(PreTokenizerTest, ByteLevelWithGpt2RegexAndPrefixSpace) {
  // tokenizers: ByteLevel(add_prefix_space=True, use_regex=True) on "hello world  x" gives
  // Ġhello, Ġworld, Ġ, Ġx (here as raw bytes).
  EXPECT_EQ(PreTokenize({{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", true}},
                        "hello world  x"),
            (std::vector<std::string>{" hello", " world", " ", " x"}));
  EXPECT_EQ(PreTokenize({{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}},
                        "it's 42"),
            (std::vector<std::string>{"it", "'s", " 42"}));
}

TEST(PreTokenizerTest, Llama3RegexMatchesOniguruma) {
  // Pieces from the fixture tokenizer's pre_tokenizer.pre_tokenize_str (tokenizers 0.23.2):
  // U+0085 is not \s for Oniguruma, U+180E / U+200B are not whitespace either.
  const json config = json::parse(R"({"type": "Split", "pattern": {"Regex":
      "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
      "behavior": "Isolated", "invert": false})");
  using V = std::vector<std::string>;
  EXPECT_EQ(PreTokenize(config, "x\u0085y"), (V{"x", "\u0085y"}));
  EXPECT_EQ(PreTokenize(config, "a \u0085 b"), (V{"a", " \u0085", " b"}));
  EXPECT_EQ(PreTokenize(config, "\u017Ft's"), (V{"\u017Ft", "'s"}));
  EXPECT_EQ(PreTokenize(config, "\u180E \u200B "), (V{"\u180E", " \u200B", " "}));
  EXPECT_EQ(PreTokenize(config, "12345 don'T"), (V{"123", "45", " don", "'T"}));
  // U+180E is \s for PCRE2 but not for Oniguruma (TranslateOnigurumaPattern fixes it).
  EXPECT_EQ(PreTokenize(config, "\u180E'S"), (V{"\u180E'", "S"}));
  EXPECT_EQ(PreTokenize(config, "\u180E\u180E!"), (V{"\u180E\u180E!"}));
  // Unicode 16 letters (U+105C0) and digits (U+10D40..) that PCRE2 10.42's tables lack.
  EXPECT_EQ(PreTokenize(config, "a\U000105C0 x"), (V{"a\U000105C0", " x"}));
  EXPECT_EQ(PreTokenize(config, "1\U00010D40\U00010D41\U00010D42\U00010D43"),
            (V{"1\U00010D40\U00010D41", "\U00010D42\U00010D43"}));
}

// Expected ids from tokenizers 0.23.2 on the same JSON (ids follow the vocabulary, as HF
// would reassign inconsistent ones).
TEST(AddedTokensTest, StripAndSingleWordFlags) {
  const json model = CharBpe(
      {{"<unk>", 0}, {"a", 1}, {"b", 2}, {" ", 3}, {"h", 4}, {"i", 5}, {"t", 6}}, {}, false);
  const json added = json::array({{{"id", 7},
                                   {"content", "<m>"},
                                   {"lstrip", true},
                                   {"rstrip", false},
                                   {"single_word", false},
                                   {"normalized", false},
                                   {"special", true}},
                                  {{"id", 8},
                                   {"content", "<r>"},
                                   {"lstrip", false},
                                   {"rstrip", true},
                                   {"single_word", false},
                                   {"normalized", false},
                                   {"special", true}},
                                  {{"id", 9},
                                   {"content", "hi"},
                                   {"lstrip", false},
                                   {"rstrip", false},
                                   {"single_word", true},
                                   {"normalized", true},
                                   {"special", false}}});
  auto tokenizer = MustLoad(MakeTokenizerJson(model, nullptr, added));
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_THAT(tokenizer->Encode("a  <m> b", false), ElementsAre(1, 7, 3, 2));
  EXPECT_THAT(tokenizer->Encode("a <r>  b", false), ElementsAre(1, 3, 8, 2));
  EXPECT_THAT(tokenizer->Encode("hi a", false), ElementsAre(9, 3, 1));
  EXPECT_THAT(tokenizer->Encode("thi", false), ElementsAre(6, 4, 5));  // not a single word
  // parse_special=false skips special tokens but still matches the non-special "hi".
  EXPECT_THAT(tokenizer->Encode("<m> hi", false, /*parse_special=*/false),
              ElementsAre(0, 0, 0, 3, 9));
  EXPECT_TRUE(tokenizer->IsSpecial(7));
  EXPECT_FALSE(tokenizer->IsSpecial(9));
  EXPECT_EQ(tokenizer->vocab_size(), 10);
}

TEST(PostProcessorTest, TemplateWrapsSequence) {
  const json model = CharBpe({{"<unk>", 0}, {"a", 1}, {"<s>", 2}, {"</s>", 3}}, {}, false);
  const json post = json::parse(R"({"type": "TemplateProcessing",
      "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                 {"SpecialToken": {"id": "</s>", "type_id": 0}}],
      "pair": [], "special_tokens": {"<s>": {"id": "<s>", "ids": [2], "tokens": ["<s>"]},
                                     "</s>": {"id": "</s>", "ids": [3], "tokens": ["</s>"]}}})");
  auto tokenizer = MustLoad(MakeTokenizerJson(model, nullptr, json::array(), post));
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_THAT(tokenizer->Encode("aa", true), ElementsAre(2, 1, 1, 3));
  EXPECT_THAT(tokenizer->Encode("aa", false), ElementsAre(1, 1));
}

TEST(FixtureTokenizerTest, InvalidUtf8IsHandledBytewise) {
  auto tokenizer = FixtureTokenizer();
  ASSERT_NE(tokenizer, nullptr);
  const std::string text = "ok \xFF\xFE bad \xE2\x82 tail \xF0\x9F\x98\x80 \xC0\xAF";
  const std::vector<int32_t> ids = tokenizer->Encode(text, false);
  // Every byte is kept, so the raw bytes come back exactly...
  EXPECT_EQ(tokenizer->DecodeBytes(ids, false), text);
  // ...and Decode repairs each maximal ill-formed subpart with one U+FFFD.
  EXPECT_EQ(tokenizer->Decode(ids, false),
            "ok \uFFFD\uFFFD bad \uFFFD tail \U0001F600 \uFFFD\uFFFD");
}

TEST(FixtureTokenizerTest, ConcurrentEncodesAgree) {
  auto tokenizer = FixtureTokenizer();
  ASSERT_NE(tokenizer, nullptr);
  std::string text;
  for (int i = 0; i < 200; ++i) {
    text +=
        "In the beginning God created the heaven and the earth " + std::to_string(i) + " 中文 😀\n";
  }
  const std::vector<int32_t> want = tokenizer->Encode(text, true);
  std::vector<std::vector<int32_t>> got(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int k = 0; k < 5; ++k) got[t] = tokenizer->Encode(text, true);
    });
  }
  for (auto& th : threads) th.join();
  for (const auto& g : got) EXPECT_EQ(g, want);
  EXPECT_EQ(tokenizer->Decode(want, true), text);
}

TEST(ByteLevelTest, AlphabetAndLossyDecoding) {
  EXPECT_EQ(byte_level::EncodeBytes(" world\n"), "ĠworldĊ");
  EXPECT_EQ(byte_level::DecodeToken("Ġworld"), " world");
  EXPECT_EQ(byte_level::DecodeToken("<|user|>"), "<|user|>");
  EXPECT_EQ(byte_level::DecodeToken("a b"), std::nullopt);  // ' ' is not in the alphabet
  for (int b = 0; b < 256; ++b) {
    EXPECT_EQ(byte_level::CodepointToByte(byte_level::ByteToCodepoint(b)), b);
  }
  std::string out;
  byte_level::AppendUtf8Lossy("a\xE2\x82\xE2\x82\xAC\xED\xA0\x80z", &out);
  // E2 82 (truncated) -> 1 U+FFFD; € intact; ED A0 80 (surrogate) -> 3 U+FFFD.
  EXPECT_EQ(out, "a\uFFFD\u20AC\uFFFD\uFFFD\uFFFDz");
  EXPECT_EQ(byte_level::IncompleteUtf8TailLength("a\xF0\x9F\x98"), 3u);
  EXPECT_EQ(byte_level::IncompleteUtf8TailLength("a\xF0\x9F\x98\x80"), 0u);
  EXPECT_EQ(byte_level::IncompleteUtf8TailLength("a\xED\xA0"), 0u);  // can never complete
}

}  // namespace
}  // namespace sluice
