// A grammar crosses the router -> worker wire as its GBNF text (Grammar::ToString): parsing
// that text back gives the same grammar, for JSON Schema, regex, choice and tool-call grammars.
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"

#include "engine/grammar/ebnf_parser.h"
#include "engine/grammar/grammar_compiler.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace sluice::grammar {
namespace {

std::vector<std::string> SortedLines(const std::string& text) {
  std::vector<std::string> lines = absl::StrSplit(text, '\n');
  std::sort(lines.begin(), lines.end());
  return lines;
}

void ExpectRoundTrip(const GrammarSpec& spec) {
  absl::StatusOr<Grammar> g = BuildGrammar(spec);
  ASSERT_TRUE(g.ok()) << g.status();
  const std::string text = g->ToString();
  absl::StatusOr<Grammar> back = ParseEbnf(text, g->rule(g->root()).name);
  ASSERT_TRUE(back.ok()) << back.status() << "\n" << text;
  // The same rules (the parser numbers them in another order).
  EXPECT_EQ(SortedLines(back->ToString()), SortedLines(text));
}

TEST(GrammarWire, ToStringParsesBackToTheSameGrammar) {
  for (const char* schema : {
           R"({"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
               "age": {"type": "integer", "minimum": -40, "maximum": 1234}},
               "required": ["name"]})",
           R"({"enum": ["a", 1, null, true, {"k": [1, 2]}], "$comment": "é ü 😀"})",
           R"({"type": "array", "items": {"type": ["number", "null"]}, "minItems": 2, "maxItems": 2})",
           R"({"$defs": {"n": {"type": "object", "properties": {"v": {"type": "integer"},
               "kids": {"type": "array", "items": {"$ref": "#/$defs/n"}}}}}, "$ref": "#/$defs/n"})",
           R"({"type": "object", "properties": {"d": {"type": "string", "format": "date-time"},
               "e": {"type": "string", "format": "email"}, "u": {"type": "string", "format": "uuid"},
               "p": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2,4}$"},
               "s": {"type": "string", "minLength": 2}}})",
           R"({"type": "object", "additionalProperties": {"type": "boolean"}})",
       }) {
    SCOPED_TRACE(schema);
    ExpectRoundTrip({GrammarKind::kJsonSchema, schema, {}});
  }
  ExpectRoundTrip({GrammarKind::kJsonObject, "", {}});
  ExpectRoundTrip({GrammarKind::kRegex, "[^a-c\\]\\-]+\\n(x|y)?é{2,5}", {}});
  ExpectRoundTrip({GrammarKind::kChoice, "", {"yes", "no \"quoted\"", "tab\there", ""}});
  ExpectRoundTrip({GrammarKind::kEbnf, "root ::= [\\x00-\\x1f] \"\\\\\" ( a | )\na ::= \"a\"*", {}});
}

}  // namespace
}  // namespace sluice::grammar
