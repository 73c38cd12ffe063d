// JSON Schema to grammar: exact accept/reject cases per keyword, and the errors that name
// unsupported or unsatisfiable schemas.
#include <string>

#include "engine/grammar/grammar_compiler.h"
#include "engine/grammar/json_schema_to_grammar.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/unit/grammar/grammar_test_util.h"

namespace sluice::grammar {
namespace {

using ::testing::HasSubstr;
using testing::ByteVocab;
using testing::FullMatch;

std::shared_ptr<const CompiledGrammar> Schema(const std::string& text) {
  absl::StatusOr<Grammar> g = JsonSchemaToGrammar(nlohmann::json::parse(text));
  EXPECT_TRUE(g.ok()) << g.status();
  if (!g.ok()) return nullptr;
  absl::StatusOr<std::shared_ptr<const CompiledGrammar>> c = CompiledGrammar::Create(*g, ByteVocab());
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *c : nullptr;
}

struct Case {
  std::string schema;
  std::vector<std::string> yes, no;
};

void Check(const std::vector<Case>& cases) {
  for (const Case& c : cases) {
    auto g = Schema(c.schema);
    ASSERT_NE(g, nullptr) << c.schema;
    for (const std::string& s : c.yes) EXPECT_TRUE(FullMatch(g, s)) << c.schema << "\n should match: " << s;
    for (const std::string& s : c.no) EXPECT_FALSE(FullMatch(g, s)) << c.schema << "\n should not match: " << s;
  }
}

TEST(JsonSchemaTest, ScalarsEnumConst) {
  Check({
      {R"({"type":"string"})", {R"("")", R"("a\"b\\c\u00e9")", "\"\xC3\xA9\""}, {R"(")", R"("a)", "\"\x01\"", R"("\x")"}},
      {R"({"type":"integer"})", {"0", "-7", "1234", "1234567890123456"}, {"01", "-0", "1.5", "+1", "", "12345678901234567"}},
      {R"({"type":"number"})", {"0", "-1.25", "3e10", "2.5E-3", "0.1234567890123456"}, {"1.", ".5", "01", "e5", "0.12345678901234567", "1e1234"}},
      {R"({"type":"boolean"})", {"true", "false"}, {"True", "1"}},
      {R"({"type":"null"})", {"null"}, {"nul", "None"}},
      {R"({"type":["string","null"]})", {"null", R"("x")"}, {"1"}},
      {R"({"enum":["red",1,null,{"a":[1,2]}]})", {R"("red")", "1", "null", R"({"a":[1,2]})"}, {R"("blue")", "2"}},
      {R"({"const":"fixed"})", {R"("fixed")"}, {R"("other")"}},
      {R"({"type":"string","enum":["a",1]})", {R"("a")"}, {"1"}},
  });
}

TEST(JsonSchemaTest, StringConstraints) {
  Check({
      {R"({"type":"string","minLength":2,"maxLength":3})", {R"("ab")", R"("a\nc")", "\"\xC3\xA9\xC3\xA9\""}, {R"("a")", R"("abcd")"}},
      {R"({"type":"string","pattern":"^[A-Z][a-z]+$"})", {R"("Hello")"}, {R"("hello")", R"("H")"}},
      {R"({"type":"string","pattern":"a\"b"})", {R"("a\"b")"}, {R"("a"b")"}},
      {R"({"type":"string","format":"date"})", {R"("2024-02-29")"}, {R"("2024-13-01")", R"("24-01-01")"}},
      {R"({"type":"string","format":"time"})", {R"("23:59:59Z")", R"("08:00:00.5+02:00")"}, {R"("24:00:00Z")", R"("08:00")"}},
      {R"({"type":"string","format":"date-time"})", {R"("2024-01-02T03:04:05Z")"}, {R"("2024-01-02 03:04:05Z")"}},
      {R"({"type":"string","format":"uuid"})", {R"("123e4567-e89b-12d3-a456-426614174000")"}, {R"("123e4567e89b12d3a456426614174000")"}},
      {R"({"type":"string","format":"email"})", {R"("a.b+c@ex-ample.co.uk")"}, {R"("a@b")", R"("@b.com")", R"("a b@c.com")"}},
      {R"({"type":"string","format":"ipv4"})", {R"("192.168.0.255")", R"("0.0.0.0")"}, {R"("256.1.1.1")", R"("1.2.3")", R"("01.2.3.4")"}},
  });
}

TEST(JsonSchemaTest, UnicodeEscapesSpellScalarValues) {
  // \u escapes: any non-surrogate code unit, or a high surrogate (D800-DBFF) followed by a low
  // one (DC00-DFFF), in either case of hex digits; never an unpaired surrogate (what
  // nlohmann::json and pydantic reject; json_schema_to_grammar.cc says why).
  const std::vector<std::string> yes = {
      R"("\u0000")", R"("\u00e9\u00E9")", R"("\uD7FF")", R"("\uE000")", R"("\uFFFF")",
      R"("\uD83D\uDE00")", R"("\ud83d\ude00")", R"("\uDBFF\uDFFF")", R"("\uD800\uDC00")",
      R"("a\uD83D\uDE00b\uD83D\uDE00")"};
  const std::vector<std::string> no = {
      R"("\uD83D")", R"("\uD83Dx")", R"("\uD83D\u0041")", R"("\uD83D\uD83D")", R"("\uDE00")",
      R"("\uDE00\uD83D")", R"("\uDC00")", R"("\ud800")", R"("\uD83D\n")", R"("\uD83D\\uDE00")",
      R"("\u12")", R"("\u12g4")"};
  Check({{R"({"type":"string"})", yes, no}});
  // The same strings inside any JSON (json_object) and as object keys.
  auto any = *CompiledGrammar::Create(AnyJsonGrammar(false), ByteVocab());
  for (const std::string& s : yes) {
    EXPECT_TRUE(FullMatch(any, s)) << s;
    EXPECT_TRUE(FullMatch(any, "{" + s + ": 1}")) << s;
  }
  for (const std::string& s : no) {
    EXPECT_FALSE(FullMatch(any, s)) << s;
    EXPECT_FALSE(FullMatch(any, "{" + s + ": 1}")) << s;
  }
  // minLength / maxLength count code points: a pair is one character.
  Check({{R"({"type":"string","minLength":2,"maxLength":2})",
          {R"("\uD83D\uDE00\uD83D\uDE00")", R"("a\uD83D\uDE00")"},
          {R"("\uD83D\uDE00")", R"("\uD83D\uDE00\uD83D\uDE00\uD83D\uDE00")"}}});
}

TEST(JsonSchemaTest, IntegerBounds) {
  Check({
      {R"({"type":"integer","minimum":-12,"maximum":105})", {"-12", "-1", "0", "9", "10", "99", "100", "105"}, {"-13", "106", "110", "1000", "-0"}},
      {R"({"type":"integer","exclusiveMinimum":0,"exclusiveMaximum":10})", {"1", "9"}, {"0", "10"}},
      {R"({"type":"integer","minimum":7})", {"7", "9", "10", "123456"}, {"6", "0", "-1"}},
      {R"({"type":"integer","maximum":-3})", {"-3", "-4", "-100"}, {"-2", "0", "5"}},
      {R"({"type":"number","minimum":0})", {"0", "0.5", "17.25"}, {"-1", "-0.5"}},
  });
  // Exhaustively: every integer in [-150, 150] against several ranges.
  for (auto [lo, hi] : std::vector<std::pair<int, int>>{{-37, 42}, {0, 0}, {5, 99}, {-120, -15}, {98, 101}, {1, 150}}) {
    Grammar g;
    g.set_root(g.AddRule("root", IntegerRangeExpr(lo, hi)));
    auto c = *CompiledGrammar::Create(g, ByteVocab());
    for (int v = -150; v <= 150; ++v) {
      EXPECT_EQ(FullMatch(c, std::to_string(v)), v >= lo && v <= hi) << lo << ".." << hi << " v=" << v;
    }
  }
}

TEST(JsonSchemaTest, Objects) {
  Check({
      {R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"string"}},"required":["a"]})",
       {R"({"a": 1})", R"({"a": 1, "b": "x"})"},
       {R"({})", R"({"b": "x"})", R"({"a": 1, "c": 2})", R"({"b": "x", "a": 1})", R"({"a":1})"}},
      {R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"integer"}}})",
       {"{}", R"({"a": 1})", R"({"b": 2})", R"({"a": 1, "b": 2})"}, {R"({, "b": 2})", R"({"a": 1, })"}},
      {R"({"type":"object","properties":{"a":{"type":"integer"}},"additionalProperties":{"type":"boolean"}})",
       {R"({"a": 1, "x": true})", R"({"y": false, "z": true})", "{}"}, {R"({"x": 1})"}},
      {R"({"type":"object","additionalProperties":true})", {R"({"k": [1, {"n": null}]})"}, {R"({"k" 1})"}},
      {R"({"type":"object","additionalProperties":false})", {"{}"}, {R"({"a": 1})"}},
  });
}

// propertyNames constrains the keys of additional properties; without it they are free strings
// of at most 64 characters (so a sampled key closes). min/maxProperties count every property.
TEST(JsonSchemaTest, PropertyNamesAndPropertyCounts) {
  const std::string k64(64, 'k'), k65(65, 'k');
  Check({
      {R"({"type":"object","additionalProperties":{"type":"integer"}})",
       {"{\"" + k64 + "\": 1}", R"({"": 1})"}, {"{\"" + k65 + "\": 1}"}},
      {R"({"type":"object","additionalProperties":{"type":"integer"},"propertyNames":{"maxLength":3}})",
       {R"({"abc": 1, "x": 2})"}, {R"({"abcd": 1})"}},
      {R"({"type":"object","additionalProperties":{"type":"integer"},"propertyNames":{"pattern":"^x_[a-z]{1,3}$"}})",
       {R"({"x_a": 1, "x_abc": 2})"}, {R"({"y_a": 1})", R"({"x_abcd": 1})", R"({"x_": 1})"}},
      {R"({"type":"object","additionalProperties":{"type":"boolean"},"propertyNames":{"enum":["a","b",1]}})",
       {R"({"a": true, "b": false})"}, {R"({"c": true})", R"({1: true})"}},
      {R"({"type":"object","additionalProperties":{"type":"boolean"},"propertyNames":{"const":"only"}})",
       {R"({"only": true})"}, {R"({"a": true})"}},
      // Listed names that are declared properties are not additional keys (no repeated key).
      {R"({"type":"object","properties":{"id":{"type":"integer"}},"additionalProperties":{"type":"null"},"propertyNames":{"enum":["id","x"]}})",
       {R"({"id": 1, "x": null})", R"({"x": null})"}, {R"({"id": 1, "id": null})", R"({"id": null})"}},
      // propertyNames binds declared keys too: a declared name that does not fit never appears.
      {R"({"type":"object","properties":{"id":{"type":"integer"}},"additionalProperties":{"type":"integer"},"propertyNames":false})",
       {"{}"}, {R"({"id": 1})", R"({"x": 2})"}},
      {R"({"type":"object","properties":{"Abc":{"type":"integer"},"zed":{"type":"integer"}},"propertyNames":{"pattern":"^z"}})",
       {R"({"zed": 1})", "{}"}, {R"({"Abc": 1})"}},
      {R"({"type":"object","properties":{"longname":{"type":"integer"},"ab":{"type":"integer"},"é":{"type":"integer"}},"propertyNames":{"maxLength":2,"minLength":1}})",
       {R"({"ab": 1, "é": 2})"}, {R"({"longname": 1})"}},
      {R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"integer"}},"propertyNames":{"enum":["b","c"]}})",
       {R"({"b": 1})"}, {R"({"a": 1})"}},
      // Counts: additional properties only, declared ones (optional and required), both.
      {R"({"type":"object","additionalProperties":{"type":"integer"},"minProperties":1,"maxProperties":2})",
       {R"({"a": 1})", R"({"a": 1, "b": 2})"}, {"{}", R"({"a": 1, "b": 2, "c": 3})"}},
      {R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"integer"},"c":{"type":"integer"}},"required":["c"],"maxProperties":2})",
       {R"({"c": 3})", R"({"a": 1, "c": 3})", R"({"b": 2, "c": 3})"}, {R"({"a": 1, "b": 2, "c": 3})", R"({"a": 1, "b": 2})"}},
      {R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"integer"}},"minProperties":1})",
       {R"({"a": 1})", R"({"b": 2})", R"({"a": 1, "b": 2})"}, {"{}"}},
      // At most one additional property counts toward minProperties (additional keys may
      // repeat one another: {"x": null, "x": null} is one property once parsed).
      {R"({"type":"object","properties":{"a":{"type":"integer"}},"additionalProperties":{"type":"null"},"propertyNames":{"maxLength":2},"minProperties":2,"maxProperties":3})",
       {R"({"a": 1, "x": null})", R"({"a": 1, "x": null, "yy": null})", R"({"a": 1, "x": null, "x": null})"},
       {R"({"a": 1})", R"({"x": null})", R"({"x": null, "x": null})", R"({"x": null, "y": null})",
        R"({"a": 1, "x": null, "y": null, "z": null})", R"({"a": 1, "a": null})"}},
      {R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"integer"}},"additionalProperties":{"type":"integer"},"minProperties":3})",
       {R"({"a": 1, "b": 2, "c": 3})", R"({"a": 1, "b": 2, "c": 3, "c": 4, "d": 5})"},
       {R"({"a": 1, "c": 3, "d": 4})", R"({"b": 1, "c": 3, "c": 4})", R"({"a": 1, "b": 2})"}},
      {R"({"type":"object","additionalProperties":{"type":"integer"},"minProperties":1})",
       {R"({"k": 1})", R"({"k": 1, "k": 2})"}, {"{}"}},
  });
  // A prefix that leaves no way to end never happens: with a required "c" and at most two
  // properties, after "a" and "b" the object cannot go on, so "b" is not allowed after "a".
  auto g = Schema(R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"integer"},"c":{"type":"integer"}},"required":["c"],"maxProperties":2})");
  ASSERT_NE(g, nullptr);
  GrammarMatcher m(g);
  EXPECT_TRUE(m.AcceptBytes(R"({"a": 1, )"));
  EXPECT_FALSE(GrammarMatcher(m).AcceptBytes("\"b"));
  EXPECT_TRUE(GrammarMatcher(m).AcceptBytes("\"c"));
  // Errors name the keyword.
  for (const auto& [schema, message] : std::vector<std::pair<std::string, std::string>>{
           {R"({"type":"object","additionalProperties":true,"propertyNames":{"minimum":1}})", "'minimum'"},
           {R"({"type":"object","additionalProperties":true,"propertyNames":{"type":"integer"}})", "propertyNames must allow strings"},
           {R"({"type":"object","additionalProperties":true,"propertyNames":{"enum":[1,2]}})", "no value of 'enum'"},
           {R"({"type":"object","properties":{"a":{},"b":{}},"required":["a","b"],"maxProperties":1})", "maxProperties is below the number of required"},
           {R"({"type":"object","minProperties":3,"maxProperties":2})", "maxProperties is below minProperties"},
           {R"({"type":"object","properties":{"a":{"type":"integer"}},"required":["a"],"propertyNames":false})",
            "required property 'a' does not match 'propertyNames' (nothing can match)"},
           {R"({"type":"object","properties":{"longname":{}},"required":["longname"],"propertyNames":{"maxLength":3}})",
            "required property 'longname' does not match 'propertyNames'"},
           {R"({"type":"object","properties":{"a":{}},"propertyNames":{"format":"email"}})",
            "'format' in propertyNames with declared properties"},
           {R"({"type":"object","properties":{"a":{}},"propertyNames":{"pattern":"("}})",
            "'pattern' is not a valid regular expression"},
           {R"({"type":"object","properties":{"a":{}},"additionalProperties":false,"minProperties":2})", "minProperties exceeds"},
           // Two additional properties would be needed, and their keys could be one key.
           {R"({"type":"object","additionalProperties":{"type":"integer"},"minProperties":2})",
            "minProperties 2 with additionalProperties needs more than one additional property"},
           {R"({"type":"object","properties":{"a":{}},"additionalProperties":true,"minProperties":3})",
            "at most minProperties 2 with 1 declared properties"},
       }) {
    absl::StatusOr<Grammar> bad = JsonSchemaToGrammar(nlohmann::json::parse(schema));
    ASSERT_FALSE(bad.ok()) << schema;
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(bad.status().message()), HasSubstr(message)) << schema;
  }
}

TEST(JsonSchemaTest, Arrays) {
  Check({
      {R"({"type":"array","items":{"type":"integer"}})", {"[]", "[1]", "[1, 2, 3]"}, {"[1,2]", "[1, ]", R"(["a"])"}},
      {R"({"type":"array","items":{"type":"integer"},"minItems":2,"maxItems":2})", {"[1, 2]"}, {"[1]", "[1, 2, 3]", "[]"}},
      {R"({"type":"array","items":{"type":"boolean"},"minItems":1,"maxItems":3})", {"[true]", "[true, false, true]"}, {"[]", "[true, true, true, true]"}},
      {R"({"type":"array","prefixItems":[{"type":"string"},{"type":"integer"}],"items":false})",
       {"[]", R"(["a"])", R"(["a", 1])"}, {R"(["a", 1, 2])", R"([1])"}},
      {R"({"type":"array","prefixItems":[{"type":"string"}],"items":{"type":"integer"},"minItems":2})",
       {R"(["a", 1])", R"(["a", 1, 2])"}, {R"(["a"])", R"(["a", "b"])"}},
      {R"({"type":"array","items":[{"type":"null"}],"minItems":1})", {"[null]", "[null, 1]"}, {"[]", "[1]"}},
  });
}

TEST(JsonSchemaTest, CompositionAndRefs) {
  Check({
      {R"({"anyOf":[{"type":"integer"},{"type":"string","maxLength":1}]})", {"5", R"("a")"}, {R"("ab")", "true"}},
      {R"({"oneOf":[{"const":1},{"const":2}]})", {"1", "2"}, {"3"}},
      {R"({"allOf":[{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]},
                    {"properties":{"b":{"type":"boolean"}},"required":["b"]}]})",
       {R"({"a": 1, "b": true})"}, {R"({"a": 1})", R"({"b": true})"}},
      {R"({"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},"kids":{"type":"array","items":{"$ref":"#/$defs/node"}}},"required":["v"]}},
           "$ref":"#/$defs/node"})",
       // Properties come in the order the schema object iterates them (sorted keys).
       {R"({"v": 1})", R"({"kids": [{"kids": [], "v": 2}, {"kids": [{"v": 4}], "v": 3}], "v": 1})"},
       {R"({"v": 1, "kids": [{}]})"}},
      {R"({"type":"object","properties":{"p":{"$ref":"#/definitions/pos"}},"required":["p"],"definitions":{"pos":{"type":"integer","minimum":1}}})",
       {R"({"p": 3})"}, {R"({"p": 0})"}},
      {R"({"type":"object","properties":{"next":{"$ref":"#"}}})", {"{}", R"({"next": {"next": {}}})"}, {R"({"next": 1})"}},
  });
}

TEST(JsonSchemaTest, ErrorsNameTheProblem) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"enum":[]})", "empty 'enum'"},
      {R"({"type":"object","patternProperties":{"^a":{}}})", "'patternProperties'"},
      {R"({"$ref":"https://example.com/s.json"})", "is not local"},
      {R"({"$ref":"#/$defs/missing"})", "does not resolve"},
      {R"({"type":"array","uniqueItems":true})", "'uniqueItems'"},
      {R"({"type":"string","format":"hostname"})", "format 'hostname'"},
      {R"({"type":"strange"})", "unknown type 'strange'"},
      {R"({"allOf":[{"type":"string"},{"type":"integer"}]})", "disjoint"},
      {R"({"type":"object","properties":{"a":{"type":"string","pattern":"(a)\\1"}}})", "#/properties/a/pattern"},
      {R"({"type":"integer","minimum":5,"maximum":4})", "no value"},
      {R"({"type":"object","properties":{"x":{"not":{}}}})", "'not' at #/properties/x"},
      {R"(false)", "nothing can match"},
  };
  for (const auto& [schema, what] : cases) {
    absl::StatusOr<Grammar> g = JsonSchemaToGrammar(nlohmann::json::parse(schema));
    ASSERT_FALSE(g.ok()) << schema;
    EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(g.status().message()), HasSubstr(what)) << schema;
  }
}

// A $ref that reaches itself before any character is generated can never produce a value: the
// error names the $ref as the schema writes it, not the grammar rule made for it ("node",
// "root-ref", "x-1" when names collide).
TEST(JsonSchemaTest, LeftRecursiveRefIsNamedAsWritten) {
  GrammarCompiler compiler(ByteVocab());
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"$defs":{"node":{"anyOf":[{"$ref":"#/$defs/node"},{"type":"string"}]}},"$ref":"#/$defs/node"})",
       "#/$defs/node"},
      {R"({"anyOf":[{"$ref":"#"},{"type":"null"}]})", "#"},
      {R"({"definitions":{"a":{"$ref":"#/definitions/b"},"b":{"anyOf":[{"$ref":"#/definitions/a"},{"type":"integer"}]}},
           "$ref":"#/definitions/a"})",
       "#/definitions/a"},
      {R"({"type":"object","properties":{"x":{"$ref":"#/$defs/x"}},
           "$defs":{"x":{"anyOf":[{"$ref":"#/properties/x"},{"type":"null"}]}}})",
       "#/$defs/x"},
  };
  for (const auto& [schema, ref] : cases) {
    auto g = compiler.Compile(GrammarSpec{GrammarKind::kJsonSchema, schema, {}});
    ASSERT_FALSE(g.ok()) << schema;
    EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(g.status().message(),
              "JSON Schema $ref '" + ref +
                  "' is left-recursive (it can reach itself before matching any character)")
        << schema;
  }
}

TEST(JsonSchemaTest, AnyJsonAndChoice) {
  auto obj = *CompiledGrammar::Create(AnyJsonGrammar(true), ByteVocab());
  EXPECT_TRUE(FullMatch(obj, R"({"a": [1, -2.5e3, "s", true, null, {}], "b": {"c": []}})"));
  EXPECT_FALSE(FullMatch(obj, "[1]"));
  EXPECT_FALSE(FullMatch(obj, R"({"a": 1)"));
  auto choice = *CompiledGrammar::Create(*ChoiceGrammar({"yes", "no", "yes please"}), ByteVocab());
  EXPECT_TRUE(FullMatch(choice, "yes"));
  EXPECT_TRUE(FullMatch(choice, "yes please"));
  EXPECT_FALSE(FullMatch(choice, "ye"));
  EXPECT_FALSE(ChoiceGrammar({}).ok());
}

TEST(GrammarCompilerTest, CachesByCanonicalText) {
  GrammarCompiler compiler(ByteVocab(), GrammarCompilerOptions{.cache_capacity = 2});
  GrammarSpec a{GrammarKind::kJsonSchema, R"({"type":"object","properties":{"x":{"type":"integer"}}})", {}};
  GrammarSpec a2{GrammarKind::kJsonSchema, "{ \"properties\": {\"x\": {\"type\": \"integer\"}},\n \"type\": \"object\" }", {}};
  auto g1 = compiler.Compile(a);
  ASSERT_TRUE(g1.ok());
  auto g2 = compiler.Compile(a2);
  ASSERT_TRUE(g2.ok());
  EXPECT_EQ(g1->get(), g2->get());
  EXPECT_EQ(compiler.num_compiles(), 1);
  EXPECT_EQ(compiler.num_cache_hits(), 1);
  // Evicted least recently used first.
  ASSERT_TRUE(compiler.Compile(GrammarSpec{GrammarKind::kRegex, "a+", {}}).ok());
  ASSERT_TRUE(compiler.Compile(GrammarSpec{GrammarKind::kRegex, "b+", {}}).ok());
  auto g3 = compiler.Compile(a);
  ASSERT_TRUE(g3.ok());
  EXPECT_NE(g1->get(), g3->get());
  EXPECT_EQ(compiler.num_compiles(), 4);
  // Errors are returned, not cached.
  EXPECT_FALSE(compiler.Compile(GrammarSpec{GrammarKind::kJsonSchema, "{not json", {}}).ok());
  EXPECT_FALSE(compiler.Compile(GrammarSpec{GrammarKind::kEbnf, "root ::= (", {}}).ok());
}

TEST(JsonSchemaTest, PropertiesFollowTheSchemasOrder) {
  // As xgrammar and outlines: objects list their properties in the schema's order, which the
  // schema's text gives (GrammarSpec keeps it; nlohmann::json would sort the keys).
  const std::string required = R"({"type": "object", "properties": {"zeta": {"type": "integer"},
      "alpha": {"type": "string"}, "mid": {"type": "boolean"}},
      "required": ["zeta", "alpha", "mid"], "additionalProperties": false})";
  GrammarCompiler compiler(ByteVocab());
  auto g = compiler.Compile({GrammarKind::kJsonSchema, required, {}});
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_TRUE(FullMatch(*g, R"({"zeta": 1, "alpha": "a", "mid": true})"));
  EXPECT_FALSE(FullMatch(*g, R"({"alpha": "a", "mid": true, "zeta": 1})"));
  EXPECT_FALSE(FullMatch(*g, R"({"zeta": 1, "mid": true, "alpha": "a"})"));
  // Optional ones too, and nested objects.
  const std::string optional = R"({"type": "object", "properties": {"zeta": {"type": "integer"},
      "alpha": {"type": "object", "properties": {"y": {"const": 1}, "x": {"const": 2}},
                "required": ["y", "x"]}},
      "required": ["alpha"], "additionalProperties": false})";
  auto o = compiler.Compile({GrammarKind::kJsonSchema, optional, {}});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_TRUE(FullMatch(*o, R"({"zeta": 3, "alpha": {"y": 1, "x": 2}})"));
  EXPECT_TRUE(FullMatch(*o, R"({"alpha": {"y": 1, "x": 2}})"));
  EXPECT_FALSE(FullMatch(*o, R"({"alpha": {"y": 1, "x": 2}, "zeta": 3})"));
  EXPECT_FALSE(FullMatch(*o, R"({"alpha": {"x": 2, "y": 1}})"));
  // The order is part of the cache key; keyword order and spacing are not.
  const std::string reordered = R"({"type": "object", "properties": {"alpha": {"type": "string"},
      "zeta": {"type": "integer"}, "mid": {"type": "boolean"}},
      "required": ["zeta", "alpha", "mid"], "additionalProperties": false})";
  const std::string respaced = R"({"additionalProperties":false,"required":["zeta","alpha","mid"],
      "properties":{"zeta":{"type":"integer"},"alpha":{"type":"string"},"mid":{"type":"boolean"}},
      "type":"object"})";
  auto key = GrammarSpec{GrammarKind::kJsonSchema, required, {}}.CacheKey();
  auto key_reordered = GrammarSpec{GrammarKind::kJsonSchema, reordered, {}}.CacheKey();
  auto key_respaced = GrammarSpec{GrammarKind::kJsonSchema, respaced, {}}.CacheKey();
  ASSERT_TRUE(key.ok() && key_reordered.ok() && key_respaced.ok());
  EXPECT_NE(*key, *key_reordered);
  EXPECT_EQ(*key, *key_respaced);
  auto r = compiler.Compile({GrammarKind::kJsonSchema, reordered, {}});
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(FullMatch(*r, R"({"alpha": "a", "zeta": 1, "mid": true})"));
  EXPECT_FALSE(FullMatch(*r, R"({"zeta": 1, "alpha": "a", "mid": true})"));
  // An ordered_json schema keeps its order; a sorted nlohmann::json one lists keys sorted.
  auto from_ordered = JsonSchemaToGrammar(nlohmann::ordered_json::parse(required));
  auto from_sorted = JsonSchemaToGrammar(nlohmann::json::parse(required));
  ASSERT_TRUE(from_ordered.ok() && from_sorted.ok());
  EXPECT_TRUE(FullMatch(*CompiledGrammar::Create(*from_ordered, ByteVocab()),
                        R"({"zeta": 1, "alpha": "a", "mid": true})"));
  EXPECT_TRUE(FullMatch(*CompiledGrammar::Create(*from_sorted, ByteVocab()),
                        R"({"alpha": "a", "mid": true, "zeta": 1})"));
}

}  // namespace
}  // namespace sluice::grammar
