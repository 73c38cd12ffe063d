// Structured-output request fields: which constraint a body asks for, and 400s naming the field
// and the problem.
#include <string>

#include "engine/grammar/grammar_matcher.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/api/openai_errors.h"
#include "services/api/structured_output.h"
#include "tests/unit/grammar/grammar_test_util.h"

namespace sluice {
namespace {

using grammar::GrammarKind;
using nlohmann::json;
using ::testing::HasSubstr;

TEST(StructuredOutputTest, ParsesEveryFieldSpelling) {
  struct Case {
    json body;
    GrammarKind kind;
    std::string param;
  };
  const json schema = {{"type", "integer"}};
  const std::vector<Case> cases = {
      {{{"response_format", {{"type", "json_object"}}}}, GrammarKind::kJsonObject, "response_format"},
      {{{"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "n"}, {"schema", schema}, {"strict", true}}}}}},
       GrammarKind::kJsonSchema, "response_format"},
      {{{"structured_outputs", {{"json", schema}}}}, GrammarKind::kJsonSchema, "structured_outputs.json"},
      {{{"structured_outputs", {{"regex", "a+"}}}}, GrammarKind::kRegex, "structured_outputs.regex"},
      {{{"structured_outputs", {{"choice", {"a", "b"}}}}}, GrammarKind::kChoice, "structured_outputs.choice"},
      {{{"structured_outputs", {{"grammar", "root ::= \"a\""}}}}, GrammarKind::kEbnf, "structured_outputs.grammar"},
      {{{"structured_outputs", {{"json_object", true}}}}, GrammarKind::kJsonObject, "structured_outputs.json_object"},
      {{{"guided_json", schema.dump()}}, GrammarKind::kJsonSchema, "guided_json"},
      {{{"guided_regex", "a+"}}, GrammarKind::kRegex, "guided_regex"},
      {{{"guided_choice", {"a"}}}, GrammarKind::kChoice, "guided_choice"},
      {{{"guided_grammar", "root ::= \"a\""}}, GrammarKind::kEbnf, "guided_grammar"},
  };
  for (const Case& c : cases) {
    auto r = ParseStructuredOutput(c.body);
    ASSERT_TRUE(r.ok()) << c.body.dump() << r.status();
    ASSERT_TRUE(r->has_value()) << c.body.dump();
    EXPECT_EQ((*r)->spec.kind, c.kind) << c.body.dump();
    EXPECT_EQ((*r)->param, c.param);
  }
  for (const json& none : {json::object(), json{{"response_format", {{"type", "text"}}}},
                           json{{"guided_json", nullptr}}}) {
    auto r = ParseStructuredOutput(none);
    ASSERT_TRUE(r.ok());
    EXPECT_FALSE(r->has_value()) << none.dump();
  }
}

TEST(StructuredOutputTest, SchemasKeepTheClientsPropertyOrder) {
  // The body as nlohmann::json has its keys sorted; the ordered copy of the raw body gives the
  // schema's text in the client's order, for every field that takes a schema object.
  const std::string schema = R"({"type": "object", "properties": {"b": {"type": "integer"},
                                "a": {"type": "integer"}}, "required": ["b", "a"]})";
  for (const std::string& raw :
       {R"({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": )" +
            schema + "}}}",
        R"({"structured_outputs": {"json": )" + schema + "}}", R"({"guided_json": )" + schema + "}"}) {
    const json body = json::parse(raw);
    const nlohmann::ordered_json ordered = nlohmann::ordered_json::parse(raw);
    auto kept = ParseStructuredOutput(body, false, nullptr, &ordered);
    ASSERT_TRUE(kept.ok() && kept->has_value()) << raw;
    EXPECT_EQ((*kept)->spec.text, nlohmann::ordered_json::parse(schema).dump()) << raw;
    auto sorted = ParseStructuredOutput(body);
    ASSERT_TRUE(sorted.ok() && sorted->has_value());
    EXPECT_EQ((*sorted)->spec.text, json::parse(schema).dump()) << raw;
  }
  // A schema given as JSON text keeps its order without the ordered body.
  auto text = ParseStructuredOutput(json{{"guided_json", schema}});
  ASSERT_TRUE(text.ok() && text->has_value());
  EXPECT_EQ((*text)->spec.text, nlohmann::ordered_json::parse(schema).dump());
}

TEST(StructuredOutputTest, BadConstraintsAre400NamingTheField) {
  grammar::GrammarCompiler compiler(grammar::testing::ByteVocab());
  struct Case {
    json body;
    std::string param, message;
  };
  const std::vector<Case> cases = {
      {{{"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "n"}, {"schema", {{"enum", json::array()}}}}}}}},
       "response_format", "empty 'enum'"},
      {{{"guided_json", {{"type", "object"}, {"patternProperties", json::object()}}}}, "guided_json", "patternProperties"},
      {{{"guided_json", "{oops"}}, "guided_json", "not a valid JSON schema"},
      {{{"guided_regex", "(a)\\1"}}, "guided_regex", "backreference"},
      {{{"guided_grammar", "root ::= [a-"}}, "guided_grammar", "grammar syntax error"},
      {{{"guided_choice", json::array()}}, "guided_choice", "non-empty list"},
      {{{"guided_regex", "a"}, {"guided_choice", {"a"}}}, "guided_choice", "only one output constraint"},
      {{{"response_format", {{"type", "xml"}}}}, "response_format", "'xml' is not supported"},
      {{{"response_format", {{"type", "json_schema"}}}}, "response_format", "needs a 'json_schema' object"},
      {{{"response_format", {{"type", "json_schema"}, {"json_schema", {{"schema", {{"type", "object"}}}}}}}},
       "response_format", "'response_format.json_schema.name' is required"},
      {{{"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "bad name!"}, {"schema", {{"type", "object"}}}}}}}},
       "response_format", "1 to 64 of a-z, A-Z, 0-9, _ and -"},
      {{{"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "n"}, {"strict", "yes"}, {"schema", {{"type", "object"}}}}}}}},
       "response_format", "'response_format.json_schema.strict' must be a boolean"},
      {{{"structured_outputs", {{"regexp", "a"}}}}, "structured_outputs", "'structured_outputs.regexp' is not supported"},
  };
  for (const Case& c : cases) {
    auto g = StructuredOutputGrammar(c.body, &compiler);
    ASSERT_FALSE(g.ok()) << c.body.dump();
    EXPECT_EQ(HttpStatusFor(g.status()), 400);
    const json error = OpenAiErrorJson(g.status());
    EXPECT_EQ(error["error"]["param"], c.param) << c.body.dump();
    EXPECT_THAT(error["error"]["message"].get<std::string>(), HasSubstr(c.message)) << c.body.dump();
  }
  // Without a compiler (structured outputs off) a constraint is refused by name.
  auto off = StructuredOutputGrammar(json{{"guided_regex", "a"}}, nullptr);
  ASSERT_FALSE(off.ok());
  EXPECT_EQ(OpenAiErrorJson(off.status())["error"]["param"], "guided_regex");
}

// response_format.json_schema.schema is an object, as in OpenAI's API (and vLLM's): a schema
// sent as a string, even one holding JSON, is a 400 saying so, not a JSON syntax error about
// the string's text. (vLLM's guided_json and structured_outputs.json do take JSON text.)
TEST(StructuredOutputTest, ResponseFormatSchemaMustBeAnObject) {
  grammar::GrammarCompiler compiler(grammar::testing::ByteVocab());
  const std::vector<std::pair<json, std::string>> cases = {
      {"{\"type\": \"object\"}", "a string"},
      {"object", "a string"},
      {json::array({json{{"type", "object"}}}), "an array"},
      {42, "a number"},
      {true, "a boolean"},
  };
  for (const auto& [schema, got] : cases) {
    const json body = {{"response_format",
                        {{"type", "json_schema"}, {"json_schema", {{"name", "n"}, {"schema", schema}}}}}};
    auto g = StructuredOutputGrammar(body, &compiler);
    ASSERT_FALSE(g.ok()) << schema.dump();
    EXPECT_EQ(HttpStatusFor(g.status()), 400);
    const json error = OpenAiErrorJson(g.status())["error"];
    EXPECT_EQ(error["type"], "invalid_request_error");
    EXPECT_EQ(error["param"], "response_format.json_schema.schema");
    EXPECT_EQ(error["message"],
              "'response_format.json_schema.schema' must be a JSON Schema object, got " + got)
        << schema.dump();
  }
}

TEST(StructuredOutputTest, CompilesWhatItParsed) {
  grammar::GrammarCompiler compiler(grammar::testing::ByteVocab());
  auto g = StructuredOutputGrammar(json{{"structured_outputs", {{"regex", "[0-9]{2}"}}}}, &compiler);
  ASSERT_TRUE(g.ok()) << g.status();
  ASSERT_NE(*g, nullptr);
  EXPECT_TRUE(grammar::testing::FullMatch(*g, "42"));
  EXPECT_FALSE(grammar::testing::FullMatch(*g, "4"));
  auto none = StructuredOutputGrammar(json::object(), &compiler);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*none, nullptr);
}

}  // namespace
}  // namespace sluice
