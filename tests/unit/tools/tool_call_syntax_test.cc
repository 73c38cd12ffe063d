// Tool-call parsers: whole outputs, streamed outputs (every prefix), held-back markers.
#include <string>
#include <vector>

#include "engine/grammar/grammar.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "services/api/tool_calls/tool_call_output.h"
#include "services/api/tool_calls/tool_call_syntax.h"

namespace sluice::tools {
namespace {

using nlohmann::json;

std::shared_ptr<const ToolCallSyntax> Syntax(const char* name) {
  auto s = ToolCallSyntaxByName(name);
  EXPECT_TRUE(s.ok()) << s.status();
  return *s;
}

// Streams `text` in pieces of `step` bytes and joins what the stream sends.
struct Streamed {
  std::string content;
  std::vector<std::string> ids, names, arguments;
  bool any_call = false;
};
Streamed Stream(const std::shared_ptr<const ToolCallSyntax>& syntax, const std::string& text,
                size_t step) {
  ToolCallStream stream(syntax);
  Streamed out;
  for (size_t end = step;; end += step) {
    const bool final = end >= text.size();
    ToolCallStream::Delta d = stream.Update(text.substr(0, std::min(end, text.size())), final);
    out.content += d.content;
    for (const json& entry : d.tool_calls) {
      const size_t index = entry.at("index").get<size_t>();
      if (entry.contains("id")) {
        // The first entry of a call: id, type and name, arguments "".
        EXPECT_EQ(index, out.ids.size());
        EXPECT_EQ(entry.at("type"), "function");
        EXPECT_EQ(entry.at("function").at("arguments"), "");
        out.ids.push_back(entry.at("id"));
        out.names.push_back(entry.at("function").at("name"));
        out.arguments.emplace_back();
      } else {
        EXPECT_LT(index, out.ids.size());
        EXPECT_FALSE(entry.at("function").contains("name"));
        out.arguments[index] += entry.at("function").at("arguments").get<std::string>();
      }
    }
    if (final) break;
  }
  out.any_call = stream.any_call();
  return out;
}

TEST(HermesSyntax, ParsesContentAndCalls) {
  auto hermes = Syntax("hermes");
  const std::string text =
      "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
      "\"Paris\", \"unit\": \"c\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", "
      "\"arguments\": {}}\n</tool_call>";
  ToolCallMessage m = ParseToolCallMessage(*hermes, text);
  EXPECT_EQ(m.content, "Let me check.");
  ASSERT_EQ(m.tool_calls.size(), 2u);
  EXPECT_EQ(m.tool_calls[0]["type"], "function");
  EXPECT_EQ(m.tool_calls[0]["function"]["name"], "get_weather");
  EXPECT_EQ(m.tool_calls[0]["function"]["arguments"], "{\"city\": \"Paris\", \"unit\": \"c\"}");
  EXPECT_EQ(m.tool_calls[1]["function"]["name"], "get_time");
  EXPECT_EQ(m.tool_calls[1]["function"]["arguments"], "{}");
  const std::string id = m.tool_calls[0]["id"];
  EXPECT_EQ(id.substr(0, 5), "call_");
  EXPECT_EQ(id.size(), 29u);
  EXPECT_NE(m.tool_calls[0]["id"], m.tool_calls[1]["id"]);

  for (size_t step : {1, 3, 7, 1000}) {
    SCOPED_TRACE(step);
    Streamed s = Stream(hermes, text, step);
    EXPECT_EQ(s.content, "Let me check.");
    EXPECT_EQ(s.names, (std::vector<std::string>{"get_weather", "get_time"}));
    EXPECT_EQ(s.arguments,
              (std::vector<std::string>{"{\"city\": \"Paris\", \"unit\": \"c\"}", "{}"}));
    EXPECT_TRUE(s.any_call);
  }
}

TEST(HermesSyntax, CallOnlyHasNullContent) {
  ToolCallMessage m = ParseToolCallMessage(
      *Syntax("hermes"),
      "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": [1, {\"b\": \"}\"}]}}\n</tool_call>");
  EXPECT_TRUE(m.content.is_null());
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.tool_calls[0]["function"]["arguments"], "{\"a\": [1, {\"b\": \"}\"}]}");
}

TEST(HermesSyntax, HoldsBackAPartialMarkerOnly) {
  auto hermes = Syntax("hermes");
  EXPECT_EQ(hermes->Parse("Hi <tool_c", false).content, "Hi ");
  EXPECT_EQ(hermes->Parse("Hi <tool_c", true).content, "Hi <tool_c");
  EXPECT_EQ(hermes->Parse("a < b", false).content, "a < b");
  // Text without calls streams whole, including text that only looked like a marker start.
  Streamed s = Stream(hermes, "x <tool_cal and more", 1);
  EXPECT_EQ(s.content, "x <tool_cal and more");
  EXPECT_TRUE(s.ids.empty());
  EXPECT_FALSE(s.any_call);
}

TEST(HermesSyntax, TruncatedOrMalformedCallIsContent) {
  auto hermes = Syntax("hermes");
  const std::string cut = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1";
  ToolCallMessage m = ParseToolCallMessage(*hermes, cut);
  EXPECT_TRUE(m.tool_calls.empty());
  EXPECT_EQ(m.content, cut);
  m = ParseToolCallMessage(*hermes, "<tool_call>\nnot json\n</tool_call>");
  EXPECT_TRUE(m.tool_calls.empty());
  m = ParseToolCallMessage(*hermes, "<tool_call>\n{\"name\": \"f\", \"arguments\": 3}\n</tool_call>");
  EXPECT_TRUE(m.tool_calls.empty()) << "arguments must be an object";
}

TEST(Llama3JsonSyntax, ParsesCallsSeparatedBySemicolons) {
  auto llama = Syntax("llama3_json");
  const std::string text =
      "{\"name\": \"add\", \"parameters\": {\"a\": 2, \"b\": 3}}; {\"name\": \"neg\", "
      "\"parameters\": {\"x\": -1.5e3}}";
  ToolCallMessage m = ParseToolCallMessage(*llama, text);
  EXPECT_TRUE(m.content.is_null());
  ASSERT_EQ(m.tool_calls.size(), 2u);
  EXPECT_EQ(m.tool_calls[0]["function"]["name"], "add");
  EXPECT_EQ(m.tool_calls[0]["function"]["arguments"], "{\"a\": 2, \"b\": 3}");
  EXPECT_EQ(m.tool_calls[1]["function"]["arguments"], "{\"x\": -1.5e3}");
  Streamed s = Stream(llama, "<|python_tag|>" + text, 2);
  EXPECT_EQ(s.content, "");
  EXPECT_EQ(s.names, (std::vector<std::string>{"add", "neg"}));
  EXPECT_EQ(s.arguments[1], "{\"x\": -1.5e3}");
}

TEST(Llama3JsonSyntax, TextAndNonCallJsonAreContent) {
  auto llama = Syntax("llama3_json");
  EXPECT_EQ(ParseToolCallMessage(*llama, "The answer is 5.").content, "The answer is 5.");
  ToolCallMessage m = ParseToolCallMessage(*llama, "{\"answer\": 5}");
  EXPECT_TRUE(m.tool_calls.empty());
  EXPECT_EQ(m.content, "{\"answer\": 5}");
  Streamed s = Stream(llama, "{\"answer\": 5}", 1);
  EXPECT_EQ(s.content, "{\"answer\": 5}");  // sent when the output ends
  EXPECT_FALSE(s.any_call);
  // "arguments" is accepted as well as "parameters".
  m = ParseToolCallMessage(*llama, "{\"name\": \"f\", \"arguments\": {}}");
  ASSERT_EQ(m.tool_calls.size(), 1u);
}

TEST(DeepSeekV3Syntax, ParsesMarkedCalls) {
  auto ds = Syntax("deepseek_v3");
  EXPECT_TRUE(ds->needs_special_tokens());
  const std::string text =
      "Checking.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n"
      "```json\n{\"city\": \"Oslo\"}\n```<｜tool▁call▁end｜><｜tool▁call▁begin｜>function"
      "<｜tool▁sep｜>get_time\n```json\n{}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
  ToolCallMessage m = ParseToolCallMessage(*ds, text);
  EXPECT_EQ(m.content, "Checking.");
  ASSERT_EQ(m.tool_calls.size(), 2u);
  EXPECT_EQ(m.tool_calls[0]["function"]["name"], "get_weather");
  EXPECT_EQ(m.tool_calls[0]["function"]["arguments"], "{\"city\": \"Oslo\"}");
  EXPECT_EQ(m.tool_calls[1]["function"]["name"], "get_time");
  Streamed s = Stream(ds, text, 1);
  EXPECT_EQ(s.content, "Checking.");
  EXPECT_EQ(s.names, (std::vector<std::string>{"get_weather", "get_time"}));
  EXPECT_EQ(s.arguments, (std::vector<std::string>{"{\"city\": \"Oslo\"}", "{}"}));
  // The constrained form requires the markers as tokens (<...> terminals in GBNF).
  grammar::Grammar g;
  const int32_t root = g.AddRule("root");
  const int32_t args = g.AddRule("args", grammar::Literal("{}"));
  auto expr = ds->CallsExpr({{"f", args}}, false);
  ASSERT_TRUE(expr.ok()) << expr.status();
  g.rule(root).body = *expr;
  EXPECT_EQ(g.ToString(),
            "root ::= (<｜tool▁calls▁begin｜> (<｜tool▁call▁begin｜> \"function\" <｜tool▁sep｜> "
            "\"f\\n```json\\n\" args \"\\n```\" <｜tool▁call▁end｜>) <｜tool▁calls▁end｜>)\n"
            "args ::= \"{}\"\n");
}

TEST(ToolCallSyntax, DetectsFromTemplateSource) {
  EXPECT_STREQ(DetectToolCallSyntax("{{ '<tool_call>\\n' }}")->name(), "hermes");
  EXPECT_STREQ(DetectToolCallSyntax("{{ '<|python_tag|>' }}")->name(), "llama3_json");
  EXPECT_STREQ(DetectToolCallSyntax("{{'<｜tool▁calls▁begin｜>'}}")->name(), "deepseek_v3");
  EXPECT_EQ(DetectToolCallSyntax("{{ bos_token }}{% for m in messages %}{% endfor %}"), nullptr);
  EXPECT_FALSE(ToolCallSyntaxByName("mistral").ok());
}

}  // namespace
}  // namespace sluice::tools
