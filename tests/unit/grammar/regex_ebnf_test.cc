// Regex and GBNF front ends: exact accept/reject cases and the errors they must give.
#include <string>

#include "engine/grammar/ebnf_parser.h"
#include "engine/grammar/pda.h"
#include "engine/grammar/regex_to_grammar.h"
#include "engine/grammar/text_escapes.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/grammar/grammar_test_util.h"

namespace sluice::grammar {
namespace {

using ::testing::HasSubstr;
using testing::ByteVocab;
using testing::FullMatch;

std::shared_ptr<const CompiledGrammar> Regex(const std::string& pattern) {
  absl::StatusOr<Grammar> g = RegexToGrammar(pattern);
  EXPECT_TRUE(g.ok()) << g.status();
  absl::StatusOr<std::shared_ptr<const CompiledGrammar>> c = CompiledGrammar::Create(*g, ByteVocab());
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

std::shared_ptr<const CompiledGrammar> Ebnf(const std::string& text) {
  absl::StatusOr<Grammar> g = ParseEbnf(text);
  EXPECT_TRUE(g.ok()) << g.status();
  absl::StatusOr<std::shared_ptr<const CompiledGrammar>> c = CompiledGrammar::Create(*g, ByteVocab());
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

TEST(RegexTest, AcceptsAndRejects) {
  struct Case {
    std::string pattern;
    std::vector<std::string> yes, no;
  };
  const std::vector<Case> cases = {
      {"abc", {"abc"}, {"", "ab", "abcd", "abd"}},
      {"a|bc|", {"a", "bc", ""}, {"b", "abc"}},
      {"[0-9]{3}-[0-9]{2,4}", {"123-45", "000-0000"}, {"12-45", "123-4", "123-45678", "abc-12"}},
      {"(ab)+c?", {"ab", "ababc"}, {"", "abca", "c"}},
      {"\\d+(\\.\\d+)?", {"0", "12.50"}, {"1.", ".5", "1a"}},
      {"[^a-c]x", {"dx", "\xC3\xA9x", "\xF0\x9F\x98\x80x"}, {"ax", "cx", "x"}},
      {"^(?:yes|no)$", {"yes", "no"}, {"yesno", "maybe"}},
      {"(?<word>\\w+)\\s\\W", {"hi_5 !"}, {"hi !x", " !"}},
      {"a{2,}", {"aa", "aaaaa"}, {"a", ""}},
      {"x*?y", {"y", "xxy"}, {"x"}},
      {".", {"a", "\xE2\x82\xAC"}, {"\n", "ab", ""}},
      {"[\\]\\-a]", {"]", "-", "a"}, {"b", "\\"}},
      {"\\u00e9|\\x41", {"\xC3\xA9", "A"}, {"e"}},
  };
  for (const Case& c : cases) {
    auto g = Regex(c.pattern);
    for (const std::string& s : c.yes) EXPECT_TRUE(FullMatch(g, s)) << c.pattern << " should match '" << s << "'";
    for (const std::string& s : c.no) EXPECT_FALSE(FullMatch(g, s)) << c.pattern << " should not match '" << s << "'";
  }
}

TEST(RegexTest, RefusesUnsupportedConstructs) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"(a)\\1", "backreference"},        {"(?<x>a)\\k<x>", "backreference"},
      {"a(?=b)", "lookahead"},            {"(?<!a)b", "lookbehind"},
      {"\\bword", "word boundary"},       {"(?i)abc", "inline flags"},
      {"\\p{L}", "Unicode property"},     {"a++", "possessive"},
      {"(?>ab)", "atomic group"},         {"a$b", "'$'"},
  };
  for (const auto& [pattern, what] : cases) {
    absl::StatusOr<Grammar> g = RegexToGrammar(pattern);
    ASSERT_FALSE(g.ok()) << pattern;
    EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(g.status().message()), HasSubstr(what)) << pattern;
  }
  for (const std::string& bad : {"(ab", "ab)", "[a-", "*a", "[z-a]"}) {
    EXPECT_FALSE(RegexToGrammar(bad).ok()) << bad;
  }
}

TEST(EbnfTest, ParsesGbnf) {
  auto g = Ebnf(R"g(
    # arithmetic over single digits
    root ::= expr
    expr ::= term (("+" | "-") term)*
    term ::= [0-9] | "(" expr ")"
  )g");
  for (const std::string s : {"1", "1+2", "(1-2)+3", "((4))"}) EXPECT_TRUE(FullMatch(g, s)) << s;
  for (const std::string s : {"", "1+", "(1", "12", "1 + 2"}) EXPECT_FALSE(FullMatch(g, s)) << s;

  auto list = Ebnf("root ::= item (\",\" item){0,2}\nitem ::= [a-z]+ | \"\\\"q\\\"\"");
  EXPECT_TRUE(FullMatch(list, "ab,c,\"q\""));
  EXPECT_FALSE(FullMatch(list, "a,b,c,d"));
  auto any = Ebnf("root ::= . [^x]?");
  EXPECT_TRUE(FullMatch(any, "\xE2\x82\xAC"));
  EXPECT_TRUE(FullMatch(any, "ab"));
  EXPECT_FALSE(FullMatch(any, "ax"));
}

TEST(EbnfTest, ErrorsNameTheProblem) {
  struct Case {
    std::string text, what;
  };
  const std::vector<Case> cases = {
      {"root ::= \"a", "unterminated string"},
      {"root ::= (\"a\"", "expected ')'"},
      {"root ::= [a-", "unterminated character class"},
      {"root ::= foo", "rule 'foo' is used but never defined"},
      {"start ::= \"a\"", "no rule named 'root'"},
      {"root ::= \"a\"\nroot ::= \"b\"", "defined twice"},
      {"root = \"a\"", "expected '::='"},
      {"root ::= \"a\" @", "line 1 column 14: unexpected character '@'"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<Grammar> g = ParseEbnf(c.text);
    ASSERT_FALSE(g.ok()) << c.text;
    EXPECT_THAT(std::string(g.status().message()), HasSubstr(c.what)) << c.text;
  }
}

TEST(EbnfTest, RefusesLeftRecursion) {
  for (const std::string text : {"root ::= root \"a\" | \"b\"", "root ::= x\nx ::= y? root \"a\" | \"b\"\ny ::= \"c\""}) {
    absl::StatusOr<Grammar> g = ParseEbnf(text);
    ASSERT_TRUE(g.ok());
    absl::StatusOr<Pda> pda = BuildPda(*g);
    ASSERT_FALSE(pda.ok()) << text;
    EXPECT_EQ(pda.status().message(),
              "grammar rule 'root' is left-recursive (it can reach itself before matching any "
              "character)")
        << text;
  }
  // Right recursion and nullable loops are fine.
  auto g = Ebnf("root ::= \"a\" root | \"\"\n");
  EXPECT_TRUE(FullMatch(g, "aaa"));
  auto loop = Ebnf("root ::= (x)* \"b\"\nx ::= \"a\"?");
  EXPECT_TRUE(FullMatch(loop, "aab"));
  EXPECT_TRUE(FullMatch(loop, "b"));
}

TEST(Utf8RangesTest, SplitsExactly) {
  // Every code point in [lo, hi] matches exactly one sequence; none outside does.
  auto matches = [](const std::vector<std::vector<std::pair<uint8_t, uint8_t>>>& seqs, const std::string& s) {
    int n = 0;
    for (const auto& seq : seqs) {
      if (seq.size() != s.size()) continue;
      bool ok = true;
      for (size_t i = 0; i < s.size(); ++i) {
        const uint8_t b = static_cast<uint8_t>(s[i]);
        ok = ok && b >= seq[i].first && b <= seq[i].second;
      }
      n += ok;
    }
    return n;
  };
  const auto seqs = Utf8ByteRanges(0x70, 0x10A00);
  for (char32_t cp : {0x6Fu, 0x70u, 0x7Fu, 0x80u, 0x7FFu, 0x800u, 0xD7FFu, 0xE000u, 0xFFFFu,
                      0x10000u, 0x109FFu, 0x10A00u, 0x10A01u}) {
    std::string s;
    AppendCodepoint(cp, &s);
    EXPECT_EQ(matches(seqs, s), (cp >= 0x70 && cp <= 0x10A00) ? 1 : 0) << std::hex << static_cast<uint32_t>(cp);
  }
}

}  // namespace
}  // namespace sluice::grammar
