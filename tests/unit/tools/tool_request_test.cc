// Tool request fields: validation (400s naming the field), the calls-only grammar, messages
// with tool calls, and the embedded model's tools-aware chat template.
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "engine/grammar/grammar_compiler.h"
#include "engine/grammar/grammar_import.h"
#include "engine/grammar/grammar_matcher.h"
#include "engine/grammar/json_schema_to_grammar.h"
#include "engine/tokenizer/chat_template.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "services/api/openai_errors.h"
#include "services/api/tool_calls/tool_call_output.h"
#include "services/api/tool_calls/tool_request.h"
#include "tests/unit/grammar/grammar_test_util.h"
#include "tests/util/test_paths.h"

namespace sluice::tools {
namespace {

using nlohmann::json;

std::string ErrorParam(const absl::Status& status) {
  const json param = OpenAiErrorJson(status)["error"]["param"];
  return param.is_string() ? param.get<std::string>() : "";
}

json Weather() {
  return json::parse(R"({"type": "function", "function": {"name": "get_weather",
    "description": "Current weather", "parameters": {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 10}, "unit": {"enum": ["c", "f"]}},
    "required": ["city"]}}})");
}
json Time() {
  return json::parse(R"({"type": "function", "function": {"name": "get_time"}})");
}

// The error of parsing `body`: its param and message.
std::pair<std::string, std::string> Error(const json& body) {
  auto r = ParseToolRequest(body);
  EXPECT_FALSE(r.ok());
  if (r.ok()) return {};
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  return {ErrorParam(r.status()), std::string(r.status().message())};
}

TEST(ToolRequest, ParsesChoices) {
  auto r = ParseToolRequest(json{{"tools", {Weather(), Time()}}});
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->has_value());
  EXPECT_EQ((*r)->choice, ToolChoice::kAuto);
  EXPECT_TRUE((*r)->parallel);
  ASSERT_EQ((*r)->functions.size(), 2u);
  EXPECT_EQ((*r)->functions[1].parameters,
            nlohmann::ordered_json::parse(R"({"type":"object","properties":{}})"));
  EXPECT_EQ(json((*r)->template_tools[0]), Weather());

  r = ParseToolRequest(json{{"tools", {Weather()}},
                            {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_weather"}}}}},
                            {"parallel_tool_calls", false}});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)->choice, ToolChoice::kFunction);
  EXPECT_EQ((*r)->function, "get_weather");
  EXPECT_FALSE((*r)->parallel);
  EXPECT_TRUE((*r)->constrained());

  // No tools: plain chat, also with tool_choice "none" / "auto".
  for (const char* choice : {"none", "auto"}) {
    r = ParseToolRequest(json{{"tool_choice", choice}});
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_FALSE(r->has_value());
  }
  r = ParseToolRequest(json{{"tools", json::array()}});
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->has_value());
}

TEST(ToolRequest, BadToolsName400sNamingTheField) {
  EXPECT_EQ(Error(json{{"tools", "get_weather"}}).first, "tools");
  EXPECT_EQ(Error(json{{"tools", {{{"type", "function"}, {"function", {{"description", "x"}}}}}}}),
            std::make_pair(std::string("tools"),
                           std::string("tools[0].function.name is required (a string)")));
  EXPECT_EQ(Error(json{{"tools", {{{"type", "retrieval"}}}}}).second,
            "tools[0].type must be \"function\"");
  EXPECT_EQ(Error(json{{"tools", {Weather(), Weather()}}}).second,
            "tools[1]: function 'get_weather' is defined twice");
  EXPECT_EQ(Error(json{{"tools", {{{"type", "function"}, {"function", {{"name", "has space"}}}}}}}).first,
            "tools");
  json bad = Weather();
  bad["function"]["parameters"] = json::parse(
      R"({"type": "object", "patternProperties": {"^x": {"type": "integer"}}})");
  auto [param, message] = Error(json{{"tools", {Time(), bad}}});
  EXPECT_EQ(param, "tools");
  EXPECT_NE(message.find("tools[1].function.parameters (get_weather)"), std::string::npos) << message;
  EXPECT_NE(message.find("patternProperties"), std::string::npos) << message;
  bad["function"]["parameters"] = "object";
  EXPECT_EQ(Error(json{{"tools", {bad}}}).second,
            "tools[0].function.parameters must be a JSON Schema object");
  json many = json::array();
  for (size_t i = 0; i <= kMaxTools; ++i) {
    json t = Time();
    t["function"]["name"] = "f" + std::to_string(i);
    many.push_back(t);
  }
  EXPECT_EQ(Error(json{{"tools", many}}).first, "tools");
}

TEST(ToolRequest, BadToolChoice400sNamingTheField) {
  EXPECT_EQ(Error(json{{"tools", {Weather()}},
                       {"tool_choice", {{"type", "function"}, {"function", {{"name", "nope"}}}}}}),
            std::make_pair(std::string("tool_choice"),
                           std::string("tool_choice names function 'nope', which is not in 'tools'")));
  EXPECT_EQ(Error(json{{"tool_choice", "required"}}),
            std::make_pair(std::string("tool_choice"),
                           std::string("tool_choice \"required\" needs at least one tool in 'tools'")));
  EXPECT_EQ(Error(json{{"tools", {Weather()}}, {"tool_choice", "always"}}).first, "tool_choice");
  EXPECT_EQ(Error(json{{"tools", {Weather()}}, {"tool_choice", {{"type", "function"}}}}).first,
            "tool_choice");
  EXPECT_EQ(Error(json{{"tools", {Weather()}}, {"parallel_tool_calls", "yes"}}).first,
            "parallel_tool_calls");
}

std::shared_ptr<const grammar::CompiledGrammar> Compile(const json& body, const char* syntax,
                                                        grammar::GrammarCompiler& compiler) {
  auto r = ParseToolRequest(body);
  EXPECT_TRUE(r.ok() && r->has_value());
  auto s = ToolCallSyntaxByName(syntax);
  auto g = CompileToolGrammar(**r, **s, compiler);
  EXPECT_TRUE(g.ok()) << g.status();
  return g.ok() ? *g : nullptr;
}

TEST(ToolGrammar, RequiredAcceptsOnlyCallsToTheTools) {
  grammar::GrammarCompiler compiler(grammar::testing::ByteVocab());
  const json body{{"tools", {Weather(), Time()}}, {"tool_choice", "required"}};
  auto g = Compile(body, "hermes", compiler);
  ASSERT_NE(g, nullptr);
  using grammar::testing::FullMatch;
  const std::string weather =
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\", \"unit\": "
      "\"c\"}}\n</tool_call>";
  const std::string time = "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";
  EXPECT_TRUE(FullMatch(g, weather));
  EXPECT_TRUE(FullMatch(g, time));
  EXPECT_TRUE(FullMatch(g, weather + "\n" + time));  // parallel_tool_calls defaults to true
  EXPECT_FALSE(FullMatch(g, "Sure! " + weather));
  EXPECT_FALSE(FullMatch(g, "<tool_call>\n{\"name\": \"get_date\", \"arguments\": {}}\n</tool_call>"));
  EXPECT_FALSE(FullMatch(g, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n</tool_call>"))
      << "city is required";
  EXPECT_FALSE(FullMatch(g, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
                            "\"Oslo\", \"unit\": \"k\"}}\n</tool_call>"));
  EXPECT_FALSE(FullMatch(g, ""));

  // Without parallel calls exactly one; a named function only that one.
  json one = body;
  one["parallel_tool_calls"] = false;
  auto g1 = Compile(one, "hermes", compiler);
  EXPECT_TRUE(FullMatch(g1, weather));
  EXPECT_FALSE(FullMatch(g1, weather + "\n" + time));
  json named{{"tools", {Weather(), Time()}},
             {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_time"}}}}}};
  auto gn = Compile(named, "hermes", compiler);
  EXPECT_TRUE(FullMatch(gn, time));
  EXPECT_FALSE(FullMatch(gn, weather));
  EXPECT_FALSE(FullMatch(gn, time + "\n" + time));

  auto gl = Compile(body, "llama3_json", compiler);
  EXPECT_TRUE(FullMatch(gl, "{\"name\": \"get_time\", \"parameters\": {}}; {\"name\": "
                            "\"get_weather\", \"parameters\": {\"city\": \"x\"}}"));
  EXPECT_FALSE(FullMatch(gl, time));

  // Compiled once per request shape.
  const int64_t compiles = compiler.num_compiles();
  Compile(body, "hermes", compiler);
  EXPECT_EQ(compiler.num_compiles(), compiles);
}

// What the tool-call grammar lets out is what the parser takes as a call: \u escapes that spell
// scalar values (a surrogate pair too) pass both, unpaired surrogates neither (nlohmann::json
// rejects them, so a grammar that allowed them would turn a forced call into plain content).
TEST(ToolGrammar, StringEscapesTheGrammarAllowsAreTheOnesTheParserTakes) {
  grammar::GrammarCompiler compiler(grammar::testing::ByteVocab());
  const json body{{"tools", {Weather()}}, {"tool_choice", "required"}};
  struct Case {
    std::string escaped;  // the city as the model writes it, inside the quotes
    bool valid;
    std::string decoded;  // UTF-8, when valid
  };
  const std::vector<Case> cases = {
      {R"(\uD83D\uDE00)", true, "\xF0\x9F\x98\x80"},
      {R"(\ud83d\ude00x)", true, "\xF0\x9F\x98\x80x"},
      {R"(Z\u00fcrich)", true, "Z\xC3\xBCrich"},
      {R"(\uDBFF\uDFFF)", true, "\xF4\x8F\xBF\xBF"},
      {R"(\uD83D)", false, ""},
      {R"(\uD83Dx)", false, ""},
      {R"(\uDE00)", false, ""},
      {R"(\uDE00\uD83D)", false, ""},
      {R"(\uD83D\uD83D)", false, ""},
  };
  for (const char* syntax : {"hermes", "llama3_json"}) {
    auto g = Compile(body, syntax, compiler);
    ASSERT_NE(g, nullptr);
    auto parser = ToolCallSyntaxByName(syntax);
    ASSERT_TRUE(parser.ok());
    for (const Case& c : cases) {
      const std::string args = "{\"city\": \"" + c.escaped + "\"}";
      const std::string text =
          std::string(syntax) == "hermes"
              ? "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": " + args + "}\n</tool_call>"
              : "{\"name\": \"get_weather\", \"parameters\": " + args + "}";
      EXPECT_EQ(grammar::testing::FullMatch(g, text), c.valid) << syntax << ": " << text;
      const ToolCallMessage m = ParseToolCallMessage(**parser, text);
      ASSERT_EQ(m.has_calls(), c.valid) << syntax << ": " << text;
      if (!c.valid) {
        EXPECT_EQ(m.content, text);
        continue;
      }
      const std::string arguments = m.tool_calls[0]["function"]["arguments"];
      EXPECT_EQ(arguments, args);  // sent as the model wrote them
      EXPECT_EQ(json::parse(arguments)["city"], c.decoded) << text;
    }
  }
}

// DeepSeek-V3's markers are special tokens: a vocabulary of the bytes, EOS (256) and the five
// markers (257...), which no byte string spells.
constexpr const char* kDeepSeekMarkers[] = {"<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>",
                                            "<｜tool▁sep｜>", "<｜tool▁call▁end｜>",
                                            "<｜tool▁calls▁end｜>"};
std::shared_ptr<const grammar::TokenVocab> DeepSeekVocab() {
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) tokens.push_back(std::string(1, static_cast<char>(b)));
  std::vector<std::pair<std::string, int32_t>> named;
  tokens.push_back("");  // EOS
  for (const char* m : kDeepSeekMarkers) {
    named.emplace_back(m, static_cast<int32_t>(tokens.size()));
    tokens.push_back("");
  }
  return grammar::TokenVocab::FromTokens(std::move(tokens), {256}, std::move(named));
}

// DeepSeekTokens: `text` as tokens, the markers as their special tokens, the rest as bytes.
std::vector<int32_t> DeepSeekTokens(const std::string& text) {
  std::vector<int32_t> ids;
  for (size_t i = 0; i < text.size();) {
    bool marker = false;
    for (int32_t m = 0; m < 5; ++m) {
      const std::string s = kDeepSeekMarkers[m];
      if (text.compare(i, s.size(), s) == 0) {
        ids.push_back(257 + m);
        i += s.size();
        marker = true;
        break;
      }
    }
    if (!marker) ids.push_back(static_cast<unsigned char>(text[i++]));
  }
  return ids;
}

bool AcceptsTokens(const std::shared_ptr<const grammar::CompiledGrammar>& g,
                   const std::vector<int32_t>& ids) {
  grammar::GrammarMatcher m(g);
  for (int32_t id : ids) {
    if (!m.AcceptToken(id)) return false;
  }
  return m.CanEnd();
}

TEST(ToolGrammar, DeepSeekRequiredUsesTheMarkerTokens) {
  grammar::GrammarCompiler compiler(DeepSeekVocab());
  auto r = ParseToolRequest(json{{"tools", {Weather(), Time()}}, {"tool_choice", "required"}});
  auto g = CompileToolGrammar(**r, **ToolCallSyntaxByName("deepseek_v3"), compiler);
  ASSERT_TRUE(g.ok()) << g.status();
  const std::string weather =
      "<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Oslo\"}"
      "\n```<｜tool▁call▁end｜>";
  const std::string time =
      "<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```json\n{}\n```<｜tool▁call▁end｜>";
  const std::string begin = "<｜tool▁calls▁begin｜>", end = "<｜tool▁calls▁end｜>";
  EXPECT_TRUE(AcceptsTokens(*g, DeepSeekTokens(begin + weather + end)));
  EXPECT_TRUE(AcceptsTokens(*g, DeepSeekTokens(begin + weather + "\n" + time + end)));
  EXPECT_FALSE(AcceptsTokens(*g, DeepSeekTokens(begin + end)));
  EXPECT_FALSE(AcceptsTokens(*g, DeepSeekTokens("Sure. " + begin + time + end)));
  // The markers' text spelled byte by byte is not the marker.
  std::vector<int32_t> spelled;
  for (char c : begin) spelled.push_back(static_cast<unsigned char>(c));
  std::vector<int32_t> rest = DeepSeekTokens(time + end);
  spelled.insert(spelled.end(), rest.begin(), rest.end());
  EXPECT_FALSE(AcceptsTokens(*g, spelled));
  // What the grammar produces parses back into the same calls.
  ToolCallMessage message =
      ParseToolCallMessage(**ToolCallSyntaxByName("deepseek_v3"), begin + weather + "\n" + time + end);
  ASSERT_EQ(message.tool_calls.size(), 2u);
  EXPECT_EQ(message.tool_calls[0]["function"]["name"], "get_weather");
  EXPECT_EQ(message.tool_calls[0]["function"]["arguments"], "{\"city\": \"Oslo\"}");
  EXPECT_EQ(message.tool_calls[1]["function"]["name"], "get_time");
  EXPECT_TRUE(message.content.is_null());

  // A vocabulary without the markers cannot constrain DeepSeek calls: a 400 on tool_choice.
  grammar::GrammarCompiler bytes_only(grammar::testing::ByteVocab());
  auto missing = CompileToolGrammar(**r, **ToolCallSyntaxByName("deepseek_v3"), bytes_only);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(ErrorParam(missing.status()), "tool_choice");
  EXPECT_NE(missing.status().message().find("<｜tool▁calls▁begin｜> is not in the model's vocabulary"),
            std::string::npos) << missing.status();
}

TEST(ToolGrammar, DeepSeekNamedFunctionRandomWalksParseToThatFunction) {
  // Sampling uniformly among the allowed tokens (seeded): every output is exactly one call of
  // the named function whose arguments satisfy its schema.
  grammar::GrammarCompiler compiler(DeepSeekVocab());
  json lookup = json::parse(R"({"type": "function", "function": {"name": "lookup", "parameters":
    {"type": "object", "properties": {"city": {"type": "string", "pattern": "^[a-z ]{1,8}$"},
     "days": {"type": "integer", "minimum": 1, "maximum": 7}},
     "required": ["city", "days"], "additionalProperties": false}}})");
  auto r = ParseToolRequest(json{{"tools", {Weather(), lookup}},
                                 {"tool_choice", {{"type", "function"}, {"function", {{"name", "lookup"}}}}}});
  auto g = CompileToolGrammar(**r, **ToolCallSyntaxByName("deepseek_v3"), compiler);
  ASSERT_TRUE(g.ok()) << g.status();
  for (uint32_t seed = 1; seed <= 20; ++seed) {
    std::mt19937 rng(seed);
    grammar::GrammarMatcher m(*g);
    std::vector<uint32_t> mask(m.num_bitmask_words());
    std::string text;
    for (int step = 0; step < 400 && !m.IsTerminated(); ++step) {
      m.FillNextTokenBitmask(absl::MakeSpan(mask));
      const std::vector<int32_t> allowed = grammar::testing::MaskIds(mask);
      ASSERT_FALSE(allowed.empty());
      const int32_t t = allowed[rng() % allowed.size()];
      ASSERT_TRUE(m.AcceptToken(t));
      if (t == 256) break;
      text += t > 256 ? std::string(kDeepSeekMarkers[t - 257]) : std::string(1, static_cast<char>(t));
    }
    ASSERT_TRUE(m.IsTerminated()) << text;
    ASSERT_TRUE(text.starts_with("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>lookup\n```json\n"))
        << text;
    ToolCallMessage message = ParseToolCallMessage(**ToolCallSyntaxByName("deepseek_v3"), text);
    ASSERT_EQ(message.tool_calls.size(), 1u) << text;
    EXPECT_EQ(message.tool_calls[0]["function"]["name"], "lookup");
    const json args = json::parse(message.tool_calls[0]["function"]["arguments"].get<std::string>());
    ASSERT_TRUE(args.is_object()) << text;
    EXPECT_EQ(args.size(), 2u) << text;
    ASSERT_TRUE(args["city"].is_string()) << text;
    const std::string city = args["city"].get<std::string>();
    EXPECT_TRUE(!city.empty() && city.size() <= 8 &&
                city.find_first_not_of("abcdefghijklmnopqrstuvwxyz ") == std::string::npos)
        << text;
    ASSERT_TRUE(args["days"].is_number_integer()) << text;
    EXPECT_GE(args["days"].get<int>(), 1);
    EXPECT_LE(args["days"].get<int>(), 7);
  }
}

TEST(ImportRules, RemapsReferences) {
  auto sub = grammar::JsonSchemaToGrammar(json::parse(
      R"({"$defs": {"n": {"type": "object", "properties": {"k": {"$ref": "#/$defs/n"}}}},
          "$ref": "#/$defs/n"})"));
  ASSERT_TRUE(sub.ok()) << sub.status();
  grammar::Grammar g;
  const int32_t root = g.AddRule("root");
  const int32_t a = grammar::ImportRules(g, *sub, "a-");
  const int32_t b = grammar::ImportRules(g, *sub, "b-");
  g.rule(root).body = grammar::Choice({grammar::RuleRef(a), grammar::Sequence({grammar::Literal("!"), grammar::RuleRef(b)})});
  auto compiled = grammar::CompiledGrammar::Create(g, grammar::testing::ByteVocab(), {});
  ASSERT_TRUE(compiled.ok()) << compiled.status();
  EXPECT_TRUE(grammar::testing::FullMatch(*compiled, "{\"k\": {\"k\": {}}}"));
  EXPECT_TRUE(grammar::testing::FullMatch(*compiled, "!{}"));
  EXPECT_FALSE(grammar::testing::FullMatch(*compiled, "!{\"j\": {}}"));
}

TEST(ToolMessages, AssistantCallsAndToolResults) {
  json message{{"role", "assistant"}, {"content", ""}};
  json m = json::parse(R"({"role": "assistant", "content": null, "tool_calls": [{"id": "call_1",
      "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]})");
  ASSERT_TRUE(AddToolMessageFields(m, 2, message).ok());
  EXPECT_EQ(message["tool_calls"][0]["function"]["arguments"], json::parse(R"({"city": "Oslo"})"));
  EXPECT_EQ(message["tool_calls"][0]["id"], "call_1");

  m["tool_calls"][0]["function"]["arguments"] = "{\"city\": ";
  absl::Status s = AddToolMessageFields(m, 2, message);
  EXPECT_EQ(ErrorParam(s), "messages");
  EXPECT_EQ(s.message(), "messages[2].tool_calls[0].function.arguments is not valid JSON");

  json user{{"role", "user"}, {"content", "x"}};
  EXPECT_FALSE(AddToolMessageFields(json::parse(R"({"role": "user", "tool_calls": []})"), 0, user).ok());

  json tool{{"role", "tool"}, {"content", "21"}};
  ASSERT_TRUE(AddToolMessageFields(json::parse(R"({"role": "tool", "tool_call_id": "call_1"})"), 3, tool).ok());
  EXPECT_EQ(tool["tool_call_id"], "call_1");
}

// The embedded model's chat_template.jinja renders every golden conversation exactly as the
// reference template does when there are no tools, and writes tools and calls in the syntax
// the constrained grammar produces.
TEST(EmbeddedTemplate, RendersGoldensAndTools) {
  auto tmpl = ChatTemplate::FromModelDir(testing::EmbeddedModelDir());
  ASSERT_TRUE(tmpl.ok()) << tmpl.status();
  EXPECT_STREQ(DetectToolCallSyntax((*tmpl)->source())->name(), "hermes");
  std::ifstream in(testing::FixtureDir("tokenizer") + "/chat_golden.json");
  const nlohmann::ordered_json golden = nlohmann::ordered_json::parse(in);
  int checked = 0;
  for (const auto& conversation : golden.at("conversations")) {
    SCOPED_TRACE(conversation.at("name").get<std::string>());
    for (bool prompt : {true, false}) {
      auto text = (*tmpl)->RenderMessagesOrdered(conversation.at("messages"), prompt);
      const auto& want =
          conversation.at(prompt ? "with_generation_prompt" : "without_generation_prompt");
      if (want.contains("error")) {
        // "TemplateError: <message>" in transformers.
        ASSERT_FALSE(text.ok());
        EXPECT_EQ("TemplateError: " + std::string(text.status().message()),
                  want.at("error").get<std::string>());
        continue;
      }
      ASSERT_TRUE(text.ok()) << text.status();
      EXPECT_EQ(*text, want.at("text").get<std::string>());
      ++checked;
    }
  }
  EXPECT_EQ(checked, 46);

  json messages = json::parse(R"([
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Oslo?"},
    {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function",
      "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp_c\": 21}"}])");
  json tools = json::array({Time()});
  auto text = (*tmpl)->RenderMessages(messages, true, json{{"tools", tools}});
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text,
            "<|begin_of_text|><|system|>\nBe brief.\n\nYou can call these functions (one JSON "
            "signature per line):\n<tools>\n{\"function\": {\"name\": \"get_time\"}, \"type\": "
            "\"function\"}\n</tools>\nTo call functions, reply with one block per call, each on "
            "its own lines:\n<tool_call>\n{\"name\": <function name>, \"arguments\": <JSON "
            "object>}\n</tool_call><|end_of_text|>\n<|user|>\nWeather in Oslo?<|end_of_text|>\n"
            "<|assistant|>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
            "\"Oslo\"}}\n</tool_call><|end_of_text|>\n<|tool|>\n{\"temp_c\": "
            "21}<|end_of_text|>\n<|assistant|>\n");
}

TEST(ToolRequest, TemplateToolsKeepTheClientsKeyOrder) {
  const std::string tools_text =
      R"([{"function": {"parameters": {"type": "object", "properties": {"b": {}, "a": {}}},)"
      R"( "name": "f", "description": null}, "type": "function"}])";
  const json body{{"tools", json::parse(tools_text)}};
  const nlohmann::ordered_json ordered = nlohmann::ordered_json::parse(tools_text);
  auto r = ParseToolRequest(body, &ordered);
  ASSERT_TRUE(r.ok()) << r.status();
  // As written, the null description dropped.
  EXPECT_EQ((*r)->template_tools[0].dump(),
            R"({"function":{"parameters":{"type":"object","properties":{"b":{},"a":{}}},)"
            R"("name":"f"},"type":"function"})");
  // Without the ordered copy: sorted keys.
  r = ParseToolRequest(body);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)->template_tools[0].dump(),
            R"({"type":"function","function":{"name":"f","parameters":{"properties":{"a":{},)"
            R"("b":{}},"type":"object"}}})");
}

}  // namespace
}  // namespace sluice::tools
