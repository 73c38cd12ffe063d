// Token terminals (grammar.h Token / TokenById): a grammar that requires whole special tokens,
// as DeepSeek-V3's tool-call markers are. The mask allows them by id where the grammar
// expects them, text never spells them, the fast mask equals the brute-force one, and the
// GBNF form (<content>, <[id]>) survives the trip to another process (ToString → ParseEbnf).
#include <memory>
#include <string>
#include <vector>

#include "engine/grammar/compiled_grammar.h"
#include "engine/grammar/ebnf_parser.h"
#include "engine/grammar/grammar_matcher.h"
#include "gtest/gtest.h"
#include "tests/unit/grammar/grammar_test_util.h"

namespace sluice::grammar {
namespace {

using testing::BruteForceMask;
using testing::MaskIds;

constexpr int32_t kEos = 256;
constexpr int32_t kBegin = 257;  // <｜begin｜>: a special token, no bytes
constexpr int32_t kThink = 258;  // <think>: special too
constexpr int32_t kText = 259;   // "<think>" spelled as an ordinary token's bytes

// Bytes 0..255, EOS, two special tokens, and an ordinary token whose bytes read "<think>".
std::shared_ptr<const TokenVocab> SpecialVocab() {
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) tokens.push_back(std::string(1, static_cast<char>(b)));
  tokens.insert(tokens.end(), {"", "", "", "<think>"});
  return TokenVocab::FromTokens(std::move(tokens), {kEos},
                                {{"<｜begin｜>", kBegin}, {"<think>", kThink}});
}

std::shared_ptr<const CompiledGrammar> Compile(const std::string& ebnf) {
  absl::StatusOr<Grammar> g = ParseEbnf(ebnf);
  EXPECT_TRUE(g.ok()) << g.status();
  if (!g.ok()) return nullptr;
  auto c = CompiledGrammar::Create(*g, SpecialVocab());
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *c : nullptr;
}

std::vector<int32_t> Mask(GrammarMatcher& m) {
  std::vector<uint32_t> mask(m.num_bitmask_words());
  m.FillNextTokenBitmask(absl::MakeSpan(mask));
  EXPECT_EQ(mask, BruteForceMask(m));
  return MaskIds(mask);
}

TEST(TokenTerminalTest, SpecialTokensAreAllowedByIdOnly) {
  auto g = Compile("root ::= <｜begin｜> body <[258]> | \"y\"\nbody ::= \"x\"+");
  ASSERT_NE(g, nullptr);
  GrammarMatcher m(g);
  EXPECT_EQ(Mask(m), (std::vector<int32_t>{'y', kBegin}));
  EXPECT_FALSE(m.AcceptToken(kThink));  // not here
  ASSERT_TRUE(m.AcceptToken(kBegin));
  EXPECT_EQ(Mask(m), std::vector<int32_t>{'x'});
  ASSERT_TRUE(m.AcceptToken('x'));
  EXPECT_EQ(Mask(m), (std::vector<int32_t>{'x', kThink}));
  EXPECT_FALSE(m.CanEnd());
  // The same text spelled by ordinary tokens is not the token.
  EXPECT_FALSE(m.AcceptToken(kText));
  EXPECT_FALSE(m.AcceptBytes("<think>"));
  ASSERT_TRUE(m.AcceptToken(kThink));
  EXPECT_TRUE(m.CanEnd());
  EXPECT_EQ(Mask(m), std::vector<int32_t>{kEos});
  EXPECT_TRUE(m.AcceptToken(kEos));
  EXPECT_TRUE(m.IsTerminated());
}

TEST(TokenTerminalTest, TokensInsideRulesAndRepeats) {
  // A token reached through rule calls and returns, in a loop, next to text of the same rule.
  auto g = Compile("root ::= item (\",\" item)*\nitem ::= <think> \"a\" | \"b\"");
  ASSERT_NE(g, nullptr);
  GrammarMatcher m(g);
  for (int32_t t : {kThink, int32_t{'a'}, int32_t{','}, int32_t{'b'}, int32_t{','}, kThink,
                    int32_t{'a'}}) {
    Mask(m);
    ASSERT_TRUE(m.AcceptToken(t)) << t;
  }
  EXPECT_TRUE(m.CanEnd());
  EXPECT_EQ(Mask(m), (std::vector<int32_t>{',', kEos}));
}

TEST(TokenTerminalTest, GbnfRoundTrip) {
  const std::string text = "root ::= (<｜begin｜> \"x\" <[258]>)\n";
  absl::StatusOr<Grammar> g = ParseEbnf(text);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->ToString(), text);
  absl::StatusOr<Grammar> again = ParseEbnf(g->ToString());
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->ToString(), text);
  auto c = CompiledGrammar::Create(*again, SpecialVocab());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ((*c)->ebnf(), text);
}

TEST(TokenTerminalTest, Errors) {
  absl::StatusOr<Grammar> g = ParseEbnf("root ::= <｜end｜>");
  ASSERT_TRUE(g.ok());
  auto c = CompiledGrammar::Create(*g, SpecialVocab());
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message(), "grammar token <｜end｜> is not in the model's vocabulary");
  g = ParseEbnf("root ::= <[999]>");
  ASSERT_TRUE(g.ok());
  c = CompiledGrammar::Create(*g, SpecialVocab());
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message(), "grammar token <[999]> is not in the model's vocabulary");
  EXPECT_EQ(ParseEbnf("root ::= <abc").status().message(),
            "grammar syntax error at line 1 column 10: unterminated token: expected '>'");
  EXPECT_EQ(ParseEbnf("root ::= <[1x]>").status().message(),
            "grammar syntax error at line 1 column 10: a token id <[N]> needs a decimal number N");
  EXPECT_EQ(ParseEbnf("root ::= <>").status().message(),
            "grammar syntax error at line 1 column 10: empty token '<>'");
}

}  // namespace
}  // namespace sluice::grammar
