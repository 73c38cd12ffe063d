// String set difference (ExcludeStrings) and JSON spellings (JsonSpellings), checked
// exhaustively against their definitions; and the keys of additional properties, which never
// spell a declared property name (a repeated key), in any escape.
#include "engine/grammar/string_exclusion.h"

#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "engine/grammar/compiled_grammar.h"
#include "engine/grammar/grammar_matcher.h"
#include "engine/grammar/json_schema_to_grammar.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/unit/grammar/grammar_test_util.h"

namespace sluice::grammar {
namespace {

using testing::ByteVocab;
using testing::FullMatch;

std::shared_ptr<const CompiledGrammar> Compile(const Expr& e) {
  Grammar g;
  g.set_root(g.AddRule("root", e));
  absl::StatusOr<std::shared_ptr<const CompiledGrammar>> c = CompiledGrammar::Create(g, ByteVocab());
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *c : nullptr;
}

// Every string over `alphabet` of length <= n.
std::vector<std::string> AllStrings(const std::string& alphabet, int n) {
  std::vector<std::string> out = {""};
  for (size_t i = 0; i < out.size(); ++i) {
    if (static_cast<int>(out[i].size()) == n) continue;
    for (char c : alphabet) out.push_back(out[i] + c);
  }
  return out;
}

TEST(StringExclusionTest, DifferenceMatchesDefinitionExhaustively) {
  // (e, its language as a predicate) pairs, each minus several finite sets.
  struct Lang {
    Expr e;
    bool (*in)(const std::string&);
  };
  const std::vector<Lang> langs = {
      {Repeat(CharClass({{'a', 'c'}}), 0, 3), [](const std::string& s) { return s.size() <= 3 && s.find('d') == std::string::npos; }},
      {Sequence({Literal("a"), Star(CharClass({{'b', 'c'}}))}),
       [](const std::string& s) { return !s.empty() && s[0] == 'a' && s.find_first_not_of("bc", 1) == std::string::npos; }},
      {Choice({Literal("ab"), Literal("abc"), Sequence({Optional(Literal("c")), Repeat(CharClass({{'a', 'b'}}), 1, 2)})}),
       [](const std::string& s) {
         std::string t = s.size() > 0 && s[0] == 'c' ? s.substr(1) : s;
         return s == "ab" || s == "abc" || (!t.empty() && t.size() <= 2 && t.find_first_not_of("ab") == std::string::npos);
       }},
  };
  const std::vector<std::vector<std::string>> excluded_sets = {
      {}, {""}, {"a"}, {"ab", "a", "abc"}, {"b", "ba", "cab", "ccc"}, {"abcd", "dd"}};
  const std::vector<std::string> all = AllStrings("abcd", 5);
  for (size_t l = 0; l < langs.size(); ++l) {
    for (const auto& excluded : excluded_sets) {
      absl::StatusOr<Expr> d = ExcludeStrings(langs[l].e, excluded);
      ASSERT_TRUE(d.ok()) << d.status();
      if (IsNothing(*d)) continue;  // (not for these sets)
      auto g = Compile(*d);
      ASSERT_NE(g, nullptr);
      const std::set<std::string> ex(excluded.begin(), excluded.end());
      for (const std::string& s : all) {
        EXPECT_EQ(FullMatch(g, s), langs[l].in(s) && !ex.contains(s))
            << "language " << l << " string '" << s << "' excluded " << excluded.size();
      }
    }
  }
  // Everything excluded: nothing left.
  absl::StatusOr<Expr> none = ExcludeStrings(Choice({Literal("x"), Literal("yz")}), {"x", "yz"});
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(IsNothing(*none));
  // Rule references are not regular expressions.
  EXPECT_FALSE(ExcludeStrings(RuleRef(0), {"a"}).ok());
}

TEST(StringExclusionTest, JsonSpellingsSpellEveryCodePointOfTheClassOnly) {
  // All code points but 'a', '"', U+00E9 and U+1F600..U+1F64F.
  const Expr cls = CharClass({{'a', 'a'}, {'"', '"'}, {0xE9, 0xE9}, {0x1F600, 0x1F64F}}, /*negated=*/true);
  auto g = Compile(JsonSpellings(cls));
  ASSERT_NE(g, nullptr);
  auto in_class = [](uint32_t cp) { return cp != 'a' && cp != '"' && cp != 0xE9 && (cp < 0x1F600 || cp > 0x1F64F); };
  char buf[32];
  for (uint32_t cp = 0; cp < 0x200; ++cp) {
    std::snprintf(buf, sizeof(buf), "\\u%04x", cp);
    EXPECT_EQ(FullMatch(g, buf), in_class(cp)) << buf;
    std::snprintf(buf, sizeof(buf), "\\u%04X", cp);
    EXPECT_EQ(FullMatch(g, buf), in_class(cp)) << buf;
  }
  EXPECT_FALSE(FullMatch(g, "a"));
  EXPECT_TRUE(FullMatch(g, "b"));
  EXPECT_FALSE(FullMatch(g, "\\\""));   // '"' escaped
  EXPECT_TRUE(FullMatch(g, "\\\\"));    // '\' escaped
  EXPECT_TRUE(FullMatch(g, "\\n"));
  EXPECT_FALSE(FullMatch(g, "\xC3\xA9"));  // U+00E9 as UTF-8
  EXPECT_TRUE(FullMatch(g, "\xC3\xA8"));   // U+00E8
  // U+1F600 = \uD83D\uDE00 (excluded), U+1F650 = \uD83D\uDE50 (in), U+1F5FF = \uD83D\uDDFF (in).
  EXPECT_FALSE(FullMatch(g, "\\uD83D\\uDE00"));
  EXPECT_FALSE(FullMatch(g, "\\ud83d\\ude4f"));
  EXPECT_FALSE(FullMatch(g, "\xF0\x9F\x98\x80"));
  EXPECT_TRUE(FullMatch(g, "\\uD83D\\uDE50"));
  EXPECT_TRUE(FullMatch(g, "\\ud83d\\uddff"));
  EXPECT_FALSE(FullMatch(g, "\\uD83D"));  // never an unpaired surrogate
  EXPECT_FALSE(FullMatch(g, "\\uDE50"));
}

std::shared_ptr<const CompiledGrammar> Schema(const std::string& text) {
  absl::StatusOr<Grammar> g = JsonSchemaToGrammar(nlohmann::ordered_json::parse(text));
  EXPECT_TRUE(g.ok()) << g.status();
  if (!g.ok()) return nullptr;
  absl::StatusOr<std::shared_ptr<const CompiledGrammar>> c = CompiledGrammar::Create(*g, ByteVocab());
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *c : nullptr;
}

TEST(StringExclusionTest, AdditionalKeysNeverRepeatADeclaredName) {
  auto g = Schema(R"({"type":"object","properties":{"id":{"type":"integer"},"name":{"type":"string"}},
                      "required":["id"],"additionalProperties":{"type":"string"}})");
  ASSERT_NE(g, nullptr);
  // At the byte level: after `"id` as an additional key, the closing quote is refused; one
  // more character is fine.
  GrammarMatcher m(g);
  ASSERT_TRUE(m.AcceptBytes(R"({"id": 1, "id)"));
  EXPECT_FALSE(GrammarMatcher(m).AcceptBytes("\""));
  EXPECT_TRUE(GrammarMatcher(m).AcceptBytes("s\": \"x\"}"));
  GrammarMatcher n(g);
  ASSERT_TRUE(n.AcceptBytes(R"({"id": 1, "x": "y", "name)"));  // past "name": an additional key
  EXPECT_FALSE(GrammarMatcher(n).AcceptBytes("\""));
  EXPECT_TRUE(GrammarMatcher(n).AcceptBytes("x\": \"x\"}"));
  for (const char* yes : {R"({"id": 1, "ids": "x"})", R"({"id": 1, "i": "x"})", R"({"id": 1, "nam": "x"})",
                          R"({"id": 1, "name": "n", "namex": "x"})", R"({"id": 1, "Id": "x"})",
                          R"({"id": 1, "\u0069": "x"})", R"({"id": 1, "\u0049d": "x"})",
                          // Additional keys may repeat one another (not excluded: see README).
                          R"({"id": 1, "x": "a", "x": "b"})"}) {
    EXPECT_TRUE(FullMatch(g, yes)) << yes;
  }
  for (const char* no : {R"({"id": 1, "id": "x"})", R"({"id": 1, "x": "y", "name": "z"})",
                         R"({"id": 1, "name": "a", "name": "b"})", R"({"id": 1, "\u0069d": "x"})",
                         R"({"id": 1, "i\u0064": "x"})", R"({"id": 1, "\u0069\u0064": "x"})",
                         R"({"id": 1, "na\u006De": "x"})", R"({"id": 1, "na\u006de": "x"})"}) {
    EXPECT_FALSE(FullMatch(g, no)) << no;
  }
}

TEST(StringExclusionTest, KeysFromPropertyNamesRequiredAndCountedObjects) {
  struct Case {
    std::string schema;
    std::vector<std::string> yes, no;
  };
  const std::vector<Case> cases = {
      // A pattern for the keys: the declared name is the one spelling the pattern allows.
      {R"({"type":"object","properties":{"ab":{"type":"integer"}},"additionalProperties":{"type":"integer"},
           "propertyNames":{"pattern":"^[a-z]+$"}})",
       {R"({"ab": 1, "a": 2})", R"({"ab": 1, "abc": 2, "b": 3})", R"({"a": 2})"},
       {R"({"ab": 1, "ab": 2})", R"({"c": 1, "ab": 2})", R"({"ab": 1, "a1": 2})"}},
      // Every name the pattern allows is declared: no additional property at all.
      {R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"integer"}},
           "additionalProperties":{"type":"integer"},"propertyNames":{"pattern":"^(a|b)$"}})",
       {R"({"a": 1, "b": 2})", R"({"b": 2})", "{}"}, {R"({"a": 1, "a": 2})", R"({"a": 1, "c": 2})"}},
      // Bounded key length.
      {R"({"type":"object","properties":{"k":{"type":"null"}},"additionalProperties":{"type":"integer"},
           "propertyNames":{"maxLength":1}})",
       {R"({"k": null, "j": 1})"}, {R"({"k": null, "k": 1})", R"({"j": 1, "k": 1})"}},
      // A required name that only additionalProperties describes is emitted as declared.
      {R"({"type":"object","required":["k"],"additionalProperties":{"type":"integer"}})",
       {R"({"k": 1})", R"({"k": 1, "kk": 2})"}, {R"({"k": 1, "k": 2})", "{}"}},
      // Counted objects.
      {R"({"type":"object","properties":{"a":{"type":"boolean"}},"additionalProperties":{"type":"integer"},
           "maxProperties":3})",
       {R"({"a": true, "b": 1, "c": 2})", R"({"b": 1})"}, {R"({"a": true, "a": 1})", R"({"b": 1, "a": 2})"}},
  };
  for (const Case& c : cases) {
    auto g = Schema(c.schema);
    ASSERT_NE(g, nullptr) << c.schema;
    for (const std::string& s : c.yes) EXPECT_TRUE(FullMatch(g, s)) << c.schema << "\n should match: " << s;
    for (const std::string& s : c.no) EXPECT_FALSE(FullMatch(g, s)) << c.schema << "\n should not match: " << s;
  }
}

}  // namespace
}  // namespace sluice::grammar
