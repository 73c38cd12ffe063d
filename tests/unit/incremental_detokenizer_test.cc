// IncrementalDetokenizer: streaming deltas are valid UTF-8 and add up to the full decode.
#include "engine/tokenizer/incremental_detokenizer.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "engine/tokenizer/tokenizer.h"
#include "tests/util/test_paths.h"

namespace sluice {
namespace {

// Independent strict UTF-8 check (RFC 3629): no overlongs, surrogates or values > U+10FFFF.
bool IsValidUtf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto b = static_cast<unsigned char>(s[i]);
    size_t n = 0;
    uint32_t cp = 0;
    if (b < 0x80) {
      ++i;
      continue;
    } else if ((b & 0xE0) == 0xC0) {
      n = 1, cp = b & 0x1F;
    } else if ((b & 0xF0) == 0xE0) {
      n = 2, cp = b & 0x0F;
    } else if ((b & 0xF8) == 0xF0) {
      n = 3, cp = b & 0x07;
    } else {
      return false;
    }
    if (i + n >= s.size()) return false;  // truncated
    for (size_t k = 1; k <= n; ++k) {
      const auto c = static_cast<unsigned char>(s[i + k]);
      if ((c & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (c & 0x3F);
    }
    static constexpr uint32_t kMin[] = {0, 0x80, 0x800, 0x10000};
    if (cp < kMin[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += n + 1;
  }
  return true;
}

class IncrementalDetokenizerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto tokenizer = Tokenizer::FromFile(testing::FixtureDir("tokenizer") + "/tokenizer.json");
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    tokenizer_ = *std::move(tokenizer);
  }

  // Streams `ids` one at a time; checks every delta is valid UTF-8; returns the concatenation.
  std::string Stream(const std::vector<int32_t>& ids, bool skip_special,
                     std::vector<std::string>* deltas = nullptr) {
    IncrementalDetokenizer detok(*tokenizer_, skip_special);
    std::string text;
    for (int32_t id : ids) {
      const std::string delta = detok.Push(id);
      EXPECT_TRUE(IsValidUtf8(delta)) << "token " << id;
      if (deltas != nullptr) deltas->push_back(delta);
      text += delta;
    }
    const std::string tail = detok.Flush();
    EXPECT_TRUE(IsValidUtf8(tail));
    if (deltas != nullptr) deltas->push_back(tail);
    return text + tail;
  }

  std::unique_ptr<Tokenizer> tokenizer_;
};

TEST_F(IncrementalDetokenizerTest, ValidatorRejectsBrokenUtf8) {
  EXPECT_TRUE(IsValidUtf8("a\xC3\xA9\xE4\xB8\xAD\xF0\x9F\x98\x80"));
  EXPECT_FALSE(IsValidUtf8("\xF0\x9F\x98"));
  EXPECT_FALSE(IsValidUtf8("\xC3"));
  EXPECT_FALSE(IsValidUtf8("\xC0\xAF"));
  EXPECT_FALSE(IsValidUtf8("\xED\xA0\x80"));
}

TEST_F(IncrementalDetokenizerTest, EmojiIsHeldUntilComplete) {
  // "😀" is four byte tokens (golden case 320): nothing is emitted before the last byte.
  std::vector<std::string> deltas;
  EXPECT_EQ(Stream({180, 261, 254, 230}, false, &deltas), "\xF0\x9F\x98\x80");
  EXPECT_EQ(deltas, (std::vector<std::string>{"", "", "", "\xF0\x9F\x98\x80", ""}));
}

TEST_F(IncrementalDetokenizerTest, CombiningMarkAndCjk) {
  // "á" as a + U+0301 (ids from tokenizers 0.23.2) and "中文".
  std::vector<std::string> deltas;
  EXPECT_EQ(Stream({72, 144, 231}, false, &deltas), "a\xCC\x81");
  EXPECT_EQ(deltas, (std::vector<std::string>{"a", "", "\xCC\x81", ""}));
  deltas.clear();
  EXPECT_EQ(Stream({168, 124, 263, 170, 252, 237}, false, &deltas), "中文");
  EXPECT_EQ(deltas, (std::vector<std::string>{"", "", "中", "", "", "文", ""}));
}

TEST_F(IncrementalDetokenizerTest, GoldenMultiByteCasesStreamToFullDecode) {
  std::ifstream in(testing::FixtureDir("tokenizer") + "/tokenizer_golden.json");
  const nlohmann::json golden = nlohmann::json::parse(in);
  const std::set<std::string> categories = {"emoji",       "cjk",
                                            "scripts",     "unicode_nfc",
                                            "unicode_nfd", "unicode_combining",
                                            "control",     "special_parsed",
                                            "long"};
  int num_cases = 0;
  for (const nlohmann::json& c : golden.at("cases")) {
    if (categories.count(c.at("category").get<std::string>()) == 0) continue;
    const auto ids = c.at("ids").get<std::vector<int32_t>>();
    SCOPED_TRACE("case " + std::to_string(c.at("id").get<int>()));
    EXPECT_EQ(Stream(ids, false), c.at("decoded").get<std::string>());
    EXPECT_EQ(Stream(ids, true), tokenizer_->Decode(ids, /*skip_special_tokens=*/true));
    ++num_cases;
  }
  EXPECT_EQ(num_cases, 111);
}

TEST_F(IncrementalDetokenizerTest, SkipSpecialTokens) {
  const std::vector<int32_t> ids = {0, 47, 554, 86, 1041, 1};
  EXPECT_EQ(Stream(ids, true), "Hello world");
  EXPECT_EQ(Stream(ids, false), "<|begin_of_text|>Hello world<|end_of_text|>");
  std::vector<std::string> deltas;
  Stream({0, 47, 1}, true, &deltas);
  EXPECT_EQ(deltas, (std::vector<std::string>{"", "H", "", ""}));
}

TEST_F(IncrementalDetokenizerTest, DanglingBytesFlushAsReplacementCharacter) {
  // The first three bytes of "😀" never complete: Flush emits one U+FFFD, like Decode.
  std::vector<std::string> deltas;
  EXPECT_EQ(Stream({180, 261, 254}, false, &deltas), "\xEF\xBF\xBD");
  EXPECT_EQ(deltas, (std::vector<std::string>{"", "", "", "\xEF\xBF\xBD"}));
  EXPECT_EQ(tokenizer_->Decode(std::vector<int32_t>{180, 261, 254}, false), "\xEF\xBF\xBD");
}

TEST_F(IncrementalDetokenizerTest, InterruptedCharacterBecomesReplacementCharacter) {
  // Half an emoji, then "H" and a special token: the broken prefix is repaired at once.
  const std::vector<int32_t> ids = {180, 261, 47, 180, 2};
  std::vector<std::string> deltas;
  const std::string text = Stream(ids, false, &deltas);
  EXPECT_EQ(text, tokenizer_->Decode(ids, false));
  EXPECT_EQ(text, "\xEF\xBF\xBDH\xEF\xBF\xBD<|user|>");
  EXPECT_EQ(deltas,
            (std::vector<std::string>{"", "", "\xEF\xBF\xBDH", "", "\xEF\xBF\xBD<|user|>", ""}));
}

TEST_F(IncrementalDetokenizerTest, UnknownIdsAreIgnored) {
  EXPECT_EQ(Stream({47, -5, 99999, 554}, false), "Hell");
}

}  // namespace
}  // namespace sluice
