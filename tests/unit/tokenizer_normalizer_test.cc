// Unit tests for the tokenizer's normalizers, decoders and the Metaspace pre-tokenizer, and for
// the load-time refusal of tokenizer.json features Sluice does not implement. Expected values
// come from HF tokenizers 0.23.2 (`normalizers.X().normalize_str(...)`, `decoders.X().decode`).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/tokenizer/bpe_pretokenizer.h"
#include "engine/tokenizer/decoder.h"
#include "engine/tokenizer/normalizer.h"
#include "engine/tokenizer/tokenizer.h"

namespace sluice {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using json = nlohmann::json;

std::string Normalize(const json& config, const std::string& text) {
  auto normalizer = Normalizer::FromJson(config);
  EXPECT_TRUE(normalizer.ok()) << normalizer.status();
  if (!normalizer.ok() || *normalizer == nullptr) return text;
  std::string buffer;
  return std::string((*normalizer)->Normalize(text, &buffer));
}

TEST(NormalizerTest, UnicodeFormsMatchHuggingFace) {
  EXPECT_EQ(Normalize({{"type", "NFC"}}, "cafe\u0301"), "caf\u00e9");
  EXPECT_EQ(Normalize({{"type", "NFC"}}, "\u1100\u1161\u11a8"), "\uac01");
  EXPECT_EQ(Normalize({{"type", "NFC"}}, "\u2126 \u212b"), "\u03a9 \u00c5");
  EXPECT_EQ(Normalize({{"type", "NFD"}}, "\u00e9"), "e\u0301");
  EXPECT_EQ(Normalize({{"type", "NFKC"}}, "\ufb01 \u2460 x\u00b2"), "fi 1 x2");
  EXPECT_EQ(Normalize({{"type", "NFKD"}}, "\ufb01\u00e9"), "fie\u0301");
}

// HF's tables are Unicode 9.0: later characters are left alone, as HF leaves them.
TEST(NormalizerTest, CharactersAfterUnicode9AreNotNormalized) {
  // U+11938 (Unicode 13) has a canonical decomposition HF does not apply.
  EXPECT_EQ(Normalize({{"type", "NFD"}}, "\u00e9\U00011938"), "e\u0301\U00011938");
  EXPECT_EQ(Normalize({{"type", "NFC"}}, "\U00011935\U00011930"), "\U00011935\U00011930");
  // U+1DF6 (Unicode 10, ccc 232) is not reordered before U+0316 (ccc 220).
  EXPECT_EQ(Normalize({{"type", "NFC"}}, "a\u1df6\u0316"), "a\u1df6\u0316");
  // ...while a Unicode 1.1 pair is.
  EXPECT_EQ(Normalize({{"type", "NFD"}}, "a\u0301\u0316"), "a\u0316\u0301");
}

TEST(NormalizerTest, FastPathsReturnTheInputItself) {
  auto nfc = Normalizer::FromJson({{"type", "NFC"}});
  ASSERT_TRUE(nfc.ok());
  std::string buffer;
  const std::string ascii = "plain ASCII text, 123";
  EXPECT_EQ((*nfc)->Normalize(ascii, &buffer).data(), ascii.data());
  const std::string latin1 = "d\u00e9j\u00e0 vu \u00bd";  // all below U+0300
  EXPECT_EQ((*nfc)->Normalize(latin1, &buffer).data(), latin1.data());
  // Text of characters with quick check Yes and combining class 0 skips ICU altogether.
  const std::string stable = "\u4f60\u597d\uff0c\u4e16\u754c \u043f\u0440\u0438 \U0001F600";
  EXPECT_EQ((*nfc)->Normalize(stable, &buffer).data(), stable.data());
  // A combining mark takes the ICU path; an unchanged result is still the same text.
  const std::string mark = "\u4f60 \u0301";
  EXPECT_EQ((*nfc)->Normalize(mark, &buffer), mark);
}

TEST(NormalizerTest, InvalidUtf8IsKeptBytewise) {
  EXPECT_EQ(Normalize({{"type", "NFC"}},
                      "e\u0301\xff"
                      "e\u0301\xc3"),
            "\u00e9\xff\u00e9\xc3");
  EXPECT_EQ(Normalize({{"type", "Lowercase"}},
                      "A\xff"
                      "B"),
            "a\xff"
            "b");
}

TEST(NormalizerTest, LowercaseIsRustCharToLowercase) {
  // U+0130 maps to two characters; no final-sigma rule.
  EXPECT_EQ(Normalize({{"type", "Lowercase"}}, "\u0130I \u03a3\u0391\u03a3 \u01c5"),
            "i\u0307i \u03c3\u03b1\u03c3 \u01c6");
  // Case pairs newer than the system ICU (Unicode 16/17), as Rust's std maps them.
  EXPECT_EQ(Normalize({{"type", "Lowercase"}}, "\U00016EAE\U00010D50\uA7DC"),
            "\U00016EC9\U00010D70\u019B");
}

TEST(NormalizerTest, StripReplacePrependStripAccents) {
  EXPECT_EQ(Normalize({{"type", "Strip"}, {"strip_left", true}, {"strip_right", false}},
                      " \u3000 a b \t\n"),
            "a b \t\n");
  EXPECT_EQ(
      Normalize({{"type", "Strip"}, {"strip_left", false}, {"strip_right", true}}, " a b \u00a0\n"),
      " a b");
  EXPECT_EQ(Normalize({{"type", "Replace"}, {"pattern", {{"Regex", "\\s+"}}}, {"content", "_"}},
                      "a  b\t\nc "),
            "a_b_c_");
  EXPECT_EQ(Normalize({{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\u2581"}},
                      "a b  c"),
            "a\u2581b\u2581\u2581c");
  EXPECT_EQ(Normalize({{"type", "Prepend"}, {"prepend", ">"}}, ""), "");
  EXPECT_EQ(Normalize({{"type", "Prepend"}, {"prepend", ">"}}, "x"), ">x");
  EXPECT_EQ(Normalize({{"type", "StripAccents"}}, "e\u0301a\u0300 \u0915\u093c"), "ea \u0915");
  const json chain = {
      {"type", "Sequence"},
      {"normalizers", {{{"type", "NFD"}}, {{"type", "StripAccents"}}, {{"type", "Lowercase"}}}}};
  EXPECT_EQ(Normalize(chain, "\u00c9COLE \u00e9t\u00e9"), "ecole ete");
}

std::string DecodeWith(const json& config, const std::vector<std::string_view>& tokens) {
  auto decoder = Decoder::FromJson(config);
  EXPECT_TRUE(decoder.ok()) << decoder.status();
  return decoder.ok() ? (*decoder)->Decode(tokens) : "";
}

TEST(DecoderTest, LlamaChain) {
  const json llama = {
      {"type", "Sequence"},
      {"decoders",
       {{{"type", "Replace"}, {"pattern", {{"String", "\u2581"}}}, {"content", " "}},
        {{"type", "ByteFallback"}},
        {{"type", "Fuse"}},
        {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}};
  EXPECT_EQ(DecodeWith(llama, {"\u2581Hello", "\u2581world"}), "Hello world");
  EXPECT_EQ(DecodeWith(llama, {"\u2581\u2581x"}), " x");
  // <0xE4><0xBD><0xA0> is "你"; a lone <0xE4> is one U+FFFD per byte.
  EXPECT_EQ(DecodeWith(llama, {"<0xE4>", "<0xBD>", "<0xA0>", "!"}), "\u4f60!");
  EXPECT_EQ(DecodeWith(llama, {"a", "<0xE4>", "<0xBD>", "b"}), "a\ufffd\ufffdb");
  // TokenBytes: continuation bytes, no start-of-text Strip.
  auto decoder = Decoder::FromJson(llama);
  ASSERT_TRUE(decoder.ok());
  EXPECT_EQ((*decoder)->TokenBytes("\u2581Paris"), " Paris");
  EXPECT_EQ((*decoder)->TokenBytes("<0xE4>"), "\xe4");
}

TEST(DecoderTest, MetaspaceAndStrip) {
  const json metaspace = {
      {"type", "Metaspace"}, {"replacement", "\u2581"}, {"prepend_scheme", "always"}};
  // The first token loses every replacement character, the others turn them into spaces.
  EXPECT_EQ(DecodeWith(metaspace, {"\u2581a\u2581b", "\u2581c"}), "ab c");
  const json never = {
      {"type", "Metaspace"}, {"replacement", "\u2581"}, {"prepend_scheme", "never"}};
  EXPECT_EQ(DecodeWith(never, {"\u2581a", "\u2581c"}), " a c");
  const json strip = {{"type", "Strip"}, {"content", "x"}, {"start", 2}, {"stop", 1}};
  EXPECT_EQ(DecodeWith(strip, {"xxxaxx", "ax"}), "xaxa");
  EXPECT_EQ(DecodeWith(nullptr, {"a", "b"}), "a b");
}

std::vector<std::string> PreTokenize(const json& config, std::string_view text, bool at_start) {
  auto pre = BpePreTokenizer::FromJson(config);
  EXPECT_TRUE(pre.ok()) << pre.status();
  std::vector<std::string> words;
  if (pre.ok()) (*pre)->Split(text, at_start, [&](std::string_view w) { words.emplace_back(w); });
  return words;
}

TEST(PreTokenizerTest, Metaspace) {
  const json split = {{"type", "Metaspace"},
                      {"replacement", "\u2581"},
                      {"prepend_scheme", "always"},
                      {"split", true}};
  EXPECT_THAT(PreTokenize(split, "Hey  friend", false),
              ElementsAre("\u2581Hey", "\u2581", "\u2581friend"));
  EXPECT_THAT(PreTokenize(split, " x", true), ElementsAre("\u2581x"));
  const json first = {{"type", "Metaspace"},
                      {"replacement", "\u2581"},
                      {"prepend_scheme", "first"},
                      {"split", false}};
  EXPECT_THAT(PreTokenize(first, "a b", true), ElementsAre("\u2581a\u2581b"));
  EXPECT_THAT(PreTokenize(first, "a b", false), ElementsAre("a\u2581b"));
  // Older files: add_prefix_space instead of prepend_scheme.
  const json legacy = {
      {"type", "Metaspace"}, {"replacement", "\u2581"}, {"add_prefix_space", false}};
  EXPECT_THAT(PreTokenize(legacy, "a b", true), ElementsAre("a", "\u2581b"));
}

// Every unsupported feature is refused at load, naming it.
struct Refusal {
  const char* what;
  json patch;  // top-level keys replaced in a valid tokenizer.json
  const char* message;
};

json ValidTokenizer() {
  return {
      {"version", "1.0"},
      {"added_tokens", json::array()},
      {"normalizer", nullptr},
      {"pre_tokenizer", nullptr},
      {"post_processor", nullptr},
      {"decoder", nullptr},
      {"model", {{"type", "BPE"}, {"vocab", {{"<unk>", 0}, {"a", 1}}}, {"merges", json::array()}}}};
}

json BpeWith(const char* key, json value) {
  json model = ValidTokenizer()["model"];
  model[key] = std::move(value);
  return model;
}

TEST(TokenizerErrorsTest, UnsupportedFeaturesAreRefusedByName) {
  const std::vector<Refusal> refusals = {
      {"Unigram model",
       {{"model", {{"type", "Unigram"}, {"vocab", json::array()}}}},
       "unsupported model type 'Unigram'"},
      {"WordPiece model",
       {{"model", {{"type", "WordPiece"}, {"vocab", {{"a", 0}}}}}},
       "unsupported model type 'WordPiece'"},
      {"BPE dropout", {{"model", BpeWith("dropout", 0.1)}}, "unsupported BPE option: dropout"},
      {"BPE continuing_subword_prefix",
       {{"model", BpeWith("continuing_subword_prefix", "##")}},
       "continuing_subword_prefix"},
      {"BPE end_of_word_suffix",
       {{"model", BpeWith("end_of_word_suffix", "</w>")}},
       "end_of_word_suffix"},
      {"Precompiled normalizer",
       {{"normalizer", {{"type", "Precompiled"}, {"precompiled_charsmap", "AAAA"}}}},
       "unsupported normalizer type 'Precompiled'"},
      {"BertNormalizer inside a Sequence",
       {{"normalizer",
         {{"type", "Sequence"},
          {"normalizers", {{{"type", "NFC"}}, {{"type", "BertNormalizer"}}}}}}},
       "unsupported normalizer type 'BertNormalizer'"},
      {"Whitespace pre-tokenizer",
       {{"pre_tokenizer", {{"type", "Whitespace"}}}},
       "unsupported pre-tokenizer type 'Whitespace'"},
      {"Digits pre-tokenizer",
       {{"pre_tokenizer",
         {{"type", "Sequence"},
          {"pretokenizers", {{{"type", "Digits"}, {"individual_digits", true}}}}}}},
       "unsupported pre-tokenizer type 'Digits'"},
      {"Metaspace prepend_scheme",
       {{"pre_tokenizer",
         {{"type", "Metaspace"}, {"replacement", "\u2581"}, {"prepend_scheme", "sometimes"}}}},
       "unsupported Metaspace prepend_scheme 'sometimes'"},
      {"WordPiece decoder",
       {{"decoder", {{"type", "WordPiece"}, {"prefix", "##"}}}},
       "unsupported decoder type 'WordPiece'"},
      {"CTC decoder in a Sequence",
       {{"decoder", {{"type", "Sequence"}, {"decoders", {{{"type", "Fuse"}}, {{"type", "CTC"}}}}}}},
       "unsupported decoder type 'CTC'"},
      {"Strip decoder of a string",
       {{"decoder", {{"type", "Strip"}, {"content", "ab"}, {"start", 1}, {"stop", 0}}}},
       "'content' must be one character"},
      {"post-processor",
       {{"post_processor", {{"type", "Custom"}}}},
       "unsupported post-processor type 'Custom'"},
  };
  for (const Refusal& r : refusals) {
    json root = ValidTokenizer();
    for (const auto& [key, value] : r.patch.items()) root[key] = value;
    auto tokenizer = Tokenizer::FromJsonText(root.dump());
    EXPECT_EQ(tokenizer.status().code(), absl::StatusCode::kInvalidArgument) << r.what;
    EXPECT_THAT(tokenizer.status().message(), HasSubstr(r.message)) << r.what;
  }
  // The base is valid, so each refusal above comes from its patch.
  EXPECT_TRUE(Tokenizer::FromJsonText(ValidTokenizer().dump()).ok());
}

}  // namespace
}  // namespace sluice
