// /v1/responses function calling and text.format through the chat code: Responses tools and
// function_call / function_call_output input items render the same prompt as their chat
// equivalents; the model's Hermes-style calls come back as function_call items (non-streamed
// and as the event sequence the SDK accumulates); text.format compiles a grammar; what stays
// unsupported is a 400 naming the Responses field.
#include <memory>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "engine/grammar/grammar_compiler.h"
#include "services/api/openai_errors.h"
#include "services/api/openai_service.h"
#include "services/api/responses_api.h"
#include "services/api/responses_output.h"
#include "tests/unit/api_test_fakes.h"
#include "tests/util/test_paths.h"

namespace sluice {
namespace {

using nlohmann::json;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using testing::ByteTokenizer;
using testing::FakeBackend;
using testing::ManualExecutor;
using testing::RecordingSink;

const json kWeather = {{"type", "object"},
                       {"properties", {{"city", {{"type", "string"}}}}},
                       {"required", {"city"}}};
const char kCall[] = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>";

json ResponsesTools() {
  return json::array({{{"type", "function"},
                       {"name", "get_weather"},
                       {"description", "Weather now"},
                       {"parameters", kWeather}}});
}
json ChatTools() {
  return json::array({{{"type", "function"},
                       {"function", {{"name", "get_weather"},
                                     {"description", "Weather now"},
                                     {"parameters", kWeather}}}}});
}

// EventData parses a Responses stream event ("event: TYPE\ndata: {...}\n\n").
json EventData(const std::string& event) {
  const size_t data = event.find("data: ");
  return json::parse(event.substr(data + 6, event.size() - data - 8));
}

class ResponsesToolsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto tmpl = ChatTemplate::FromModelDir(testing::EmbeddedModelDir());
    ASSERT_TRUE(tmpl.ok()) << tmpl.status();
    chat_template_ = *std::move(tmpl);
    backend_.max_len = 4096;
    OpenAiServiceOptions options;
    options.served_model_name = "mini";
    service_ = std::make_unique<OpenAiService>(&backend_, &tokenizer_, chat_template_.get(),
                                               options);
  }
  // Post sends `body` to `path`; the sink holds the answer once the engine outputs are emitted.
  std::shared_ptr<RecordingSink> Post(const std::string& path, json body) {
    body["model"] = "mini";
    return PostText(path, body.dump());
  }
  // PostText sends a raw body (its key order is what the chat template sees of the tools).
  std::shared_ptr<RecordingSink> PostText(const std::string& path, const std::string& body) {
    auto sink = std::make_shared<RecordingSink>();
    service_->Handle({"POST", path, body}, sink, executor_.poster());
    executor_.Drain();
    return sink;
  }
  // The prompt the last submitted request renders to.
  std::string LastPrompt() {
    return tokenizer_.Decode(backend_.request(backend_.order().back()).prompt_token_ids, false);
  }
  // Answer emits `text` then EOS (finish stop) for the last submitted request.
  void Answer(const std::string& text, FinishReason finish = FinishReason::kStop) {
    const std::string id = backend_.order().back();
    backend_.EmitText(id, text);
    backend_.Emit(id, finish == FinishReason::kStop ? std::vector<int32_t>{ByteTokenizer::kEos}
                                                    : std::vector<int32_t>{},
                  finish);
    executor_.Drain();
  }
  static void ExpectError(const RecordingSink& sink, const std::string& param,
                          const std::string& message) {
    EXPECT_EQ(sink.status, 400) << sink.body;
    const json error = sink.json()["error"];
    EXPECT_EQ(error["param"], param) << sink.body;
    EXPECT_EQ(error["message"], message);
  }

  ByteTokenizer tokenizer_;
  FakeBackend backend_;
  std::unique_ptr<ChatTemplate> chat_template_;
  std::unique_ptr<OpenAiService> service_;
  ManualExecutor executor_;
};

TEST_F(ResponsesToolsTest, ToolsAndCallItemsRenderLikeChat) {
  // A turn with a call and its result, fed back as Responses items and as chat messages; both
  // bodies keep their key order (clients write "type" first), as the template prints tools.
  using ordered = nlohmann::ordered_json;
  const ordered chat{
      {"model", "mini"},
      {"tools", {{{"type", "function"},
                  {"function", {{"name", "get_weather"},
                                {"description", "Weather now"},
                                {"parameters", kWeather}}}}}},
      {"messages",
       {{{"role", "user"}, {"content", "Weather in Oslo?"}},
        {{"role", "assistant"},
         {"content", "Checking."},
         {"tool_calls", {{{"id", "call_1"},
                          {"type", "function"},
                          {"function", {{"name", "get_weather"},
                                        {"arguments", "{\"city\": \"Oslo\"}"}}}}}}},
        {{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "sunny"}}}}};
  PostText("/v1/chat/completions", chat.dump());
  ASSERT_EQ(backend_.order().size(), 1u);
  const std::string chat_prompt = LastPrompt();
  const ordered responses{
      {"model", "mini"},
      {"tools", {{{"type", "function"},
                  {"name", "get_weather"},
                  {"description", "Weather now"},
                  {"parameters", kWeather}}}},
      {"input",
       {{{"role", "user"}, {"content", "Weather in Oslo?"}},
        {{"type", "message"}, {"role", "assistant"},
         {"content", {{{"type", "output_text"}, {"text", "Checking."}}}}},
        {{"type", "function_call"}, {"id", "fc_1"}, {"call_id", "call_1"},
         {"name", "get_weather"}, {"arguments", "{\"city\": \"Oslo\"}"},
         {"status", "completed"}},
        {{"type", "function_call_output"}, {"call_id", "call_1"}, {"output", "sunny"}}}}};
  PostText("/v1/responses", responses.dump());
  ASSERT_EQ(backend_.order().size(), 2u);
  EXPECT_EQ(LastPrompt(), chat_prompt);
  EXPECT_THAT(chat_prompt, ::testing::HasSubstr(
                               "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\""));
  EXPECT_THAT(chat_prompt, ::testing::HasSubstr("<|tool|>\nsunny"));
}

TEST_F(ResponsesToolsTest, CallsBecomeFunctionCallItems) {
  auto sink = Post("/v1/responses", {{"input", "Weather?"}, {"tools", ResponsesTools()}});
  Answer(std::string("Let me look.\n") + kCall);
  ASSERT_EQ(sink->status, 200) << sink->body;
  const json r = sink->json();
  EXPECT_EQ(r["status"], "completed");
  EXPECT_EQ(r["tool_choice"], "auto");
  EXPECT_EQ(r["parallel_tool_calls"], true);
  EXPECT_EQ(r["tools"], ResponsesTools());
  const json& output = r["output"];
  ASSERT_EQ(output.size(), 2u) << output;
  EXPECT_EQ(output[0]["type"], "message");
  EXPECT_EQ(output[0]["content"][0]["text"], "Let me look.");
  EXPECT_EQ(output[1]["type"], "function_call");
  EXPECT_EQ(output[1]["name"], "get_weather");
  EXPECT_EQ(output[1]["arguments"], "{\"city\": \"Oslo\"}");
  EXPECT_EQ(output[1]["status"], "completed");
  EXPECT_EQ(output[1]["call_id"].get<std::string>().rfind("call_", 0), 0u);
  EXPECT_EQ(output[1]["id"].get<std::string>().rfind("fc_", 0), 0u);
}

TEST_F(ResponsesToolsTest, StreamedCallEventsBuildTheFinalOutput) {
  auto sink = Post("/v1/responses",
                   {{"input", "Weather?"}, {"tools", ResponsesTools()}, {"stream", true}});
  Answer(kCall);
  std::vector<std::string> types;
  std::string arguments;
  for (size_t i = 0; i < sink->events.size(); ++i) {
    const json e = EventData(sink->events[i]);
    EXPECT_EQ(e["sequence_number"], i);
    types.push_back(e["type"]);
    if (e["type"] == "response.function_call_arguments.delta") {
      EXPECT_EQ(e["output_index"], 0);
      arguments += e["delta"].get<std::string>();
    }
  }
  // No text: the only item is the call.
  ASSERT_GE(types.size(), 7u);
  EXPECT_THAT(std::vector<std::string>(types.begin(), types.begin() + 3),
              ElementsAre("response.created", "response.in_progress",
                          "response.output_item.added"));
  EXPECT_THAT(std::vector<std::string>(types.end() - 3, types.end()),
              ElementsAre("response.function_call_arguments.done",
                          "response.output_item.done", "response.completed"));
  for (size_t i = 3; i + 3 < types.size(); ++i) {
    EXPECT_EQ(types[i], "response.function_call_arguments.delta");
  }
  EXPECT_EQ(arguments, "{\"city\": \"Oslo\"}");
  const json added = EventData(sink->events[2])["item"];
  EXPECT_EQ(added["type"], "function_call");
  EXPECT_EQ(added["arguments"], "");
  EXPECT_EQ(added["status"], "in_progress");
  const json final_output = EventData(sink->events.back())["response"]["output"];
  ASSERT_EQ(final_output.size(), 1u);
  EXPECT_EQ(final_output[0]["arguments"], arguments);
  EXPECT_EQ(final_output[0]["call_id"], added["call_id"]);
  EXPECT_EQ(final_output[0]["id"], added["id"]);
  EXPECT_EQ(EventData(sink->events[sink->events.size() - 2])["item"], final_output[0]);
  EXPECT_TRUE(sink->stream_ended);
}

TEST_F(ResponsesToolsTest, NamedToolChoiceIsConstrainedAndEchoed) {
  const json choice = {{"type", "function"}, {"name", "get_weather"}};
  auto sink = Post("/v1/responses",
                   {{"input", "Weather?"}, {"tools", ResponsesTools()}, {"tool_choice", choice},
                    {"parallel_tool_calls", false}});
  ASSERT_EQ(backend_.order().size(), 1u) << sink->body;
  EXPECT_NE(backend_.request(backend_.order().back()).grammar, nullptr);
  Answer(kCall);
  EXPECT_EQ(sink->json()["tool_choice"], choice);
  EXPECT_EQ(sink->json()["parallel_tool_calls"], false);
  EXPECT_EQ(sink->json()["output"][0]["type"], "function_call");
}

TEST_F(ResponsesToolsTest, TextFormatCompilesAGrammarAndIsEchoed) {
  const json format = {{"type", "json_schema"}, {"name", "city"}, {"schema", kWeather},
                       {"strict", true}};
  auto sink = Post("/v1/responses", {{"input", "Weather?"}, {"text", {{"format", format}}}});
  ASSERT_EQ(backend_.order().size(), 1u) << sink->body;
  EXPECT_NE(backend_.request(backend_.order().back()).grammar, nullptr);
  Answer("{\"city\": \"Oslo\"}");
  EXPECT_EQ(sink->json()["text"]["format"], format);
  EXPECT_EQ(sink->json()["output"][0]["content"][0]["text"], "{\"city\": \"Oslo\"}");
  Post("/v1/responses", {{"input", "Weather?"}, {"text", {{"format", {{"type", "json_object"}}}}}});
  ASSERT_EQ(backend_.order().size(), 2u);
  EXPECT_NE(backend_.request(backend_.order().back()).grammar, nullptr);
}

TEST_F(ResponsesToolsTest, UnsupportedShapesAre400NamingTheResponsesField) {
  const json in{{"input", "q"}};
  auto with = [&](json extra) {
    json body = in;
    body.update(extra);
    return Post("/v1/responses", body);
  };
  ExpectError(*with({{"tools", {{{"type", "web_search"}}}}}), "tools",
              "tools[0] of type 'web_search' is not supported: this server runs no built-in "
              "tools (only type \"function\", whose calls the client runs)");
  ExpectError(*with({{"tools", {{{"type", "function"}}}}}), "tools",
              "tools[0].name is required (a string)");
  ExpectError(*with({{"tools", {{{"type", "function"}, {"name", "f"}, {"parameters", 3}}}}}),
              "tools", "tools[0].parameters must be a JSON Schema object");
  ExpectError(*with({{"tools", ResponsesTools()}, {"tool_choice", {{"type", "file_search"}}}}),
              "tool_choice",
              "'tool_choice' of type 'file_search' is not supported by this server (it runs no "
              "built-in tools and has no allowed_tools subsets); use \"none\", \"auto\", "
              "\"required\" or {\"type\": \"function\", \"name\": ...}");
  ExpectError(*with({{"tools", ResponsesTools()},
                     {"tool_choice", {{"type", "function"}, {"name", "nope"}}}}),
              "tool_choice", "tool_choice names function 'nope', which is not in 'tools'");
  ExpectError(*with({{"max_tool_calls", 2}}), "max_tool_calls",
              "'max_tool_calls' is not supported by this server (it bounds built-in tool "
              "calls, and this server runs none); use parallel_tool_calls: false for one "
              "function call per response");
  ExpectError(*with({{"text", {{"format", {{"type", "json_schema"}, {"schema", kWeather}}}}}}),
              "text.format.name",
              "'text.format.name' is required: 1 to 64 of a-z, A-Z, 0-9, _ and -");
  ExpectError(*with({{"text", {{"format", {{"type", "json_schema"}, {"name", "x"}}}}}}),
              "text.format.schema", "'text.format.schema' is required (a JSON Schema object)");
  ExpectError(*with({{"text", {{"format", {{"type", "grammar"}}}}}}), "text.format",
              "text.format type 'grammar' is not supported (use text, json_object or "
              "json_schema)");
  ExpectError(*with({{"text", {{"verbosity", "low"}}}}), "text.verbosity",
              "'text.verbosity' is not supported by this server (no verbosity control)");
  ExpectError(*with({{"text", {{"format", {{"type", "json_object"}, {"schema", json::object()}}}}}}),
              "text.format", "Unrecognized request argument supplied: text.format.schema");
  ExpectError(*with({{"tools", ResponsesTools()}, {"tool_choice", "required"},
                     {"text", {{"format", {{"type", "json_object"}}}}}}),
              "text.format",
              "a text.format constraint cannot be combined with tool_choice \"required\" or a "
              "named function (the output is then tool calls)");
  ExpectError(*with({{"input", {{{"type", "function_call"}, {"call_id", "c"}, {"name", "f"}}}}}),
              "input", "input[0].arguments is required (a string)");
  ExpectError(*with({{"input", {{{"type", "reasoning"}, {"summary", json::array()}}}}}), "input",
              "input[0] of type 'reasoning' is not supported (only message, function_call and "
              "function_call_output)");
  EXPECT_TRUE(backend_.order().empty());
}

TEST(ResponsesOutputTest, TextThenCallsAndIncompleteEnd) {
  std::vector<std::string> types;
  ResponsesOutput out([&](const std::string& type, const json&) { types.push_back(type); });
  out.AddText("Hi");
  out.AddToolCallDelta({{"index", 0}, {"id", "call_a"}, {"type", "function"},
                        {"function", {{"name", "f"}, {"arguments", ""}}}});
  out.AddToolCallDelta({{"index", 0}, {"function", {{"arguments", "{\"a\":"}}}});
  out.Finish(/*incomplete=*/true);
  const json items = out.Items();
  ASSERT_EQ(items.size(), 2u);
  EXPECT_EQ(items[0]["status"], "completed");
  EXPECT_EQ(items[0]["content"][0]["text"], "Hi");
  EXPECT_EQ(items[1]["status"], "incomplete");
  EXPECT_EQ(items[1]["arguments"], "{\"a\":");
  EXPECT_THAT(types, ElementsAreArray(std::vector<std::string>(
                         {"response.output_item.added", "response.content_part.added",
                          "response.output_text.delta", "response.output_text.done",
                          "response.content_part.done", "response.output_item.done",
                          "response.output_item.added", "response.function_call_arguments.delta",
                          "response.function_call_arguments.done",
                          "response.output_item.done"})));
  // Nothing at all: one empty message.
  ResponsesOutput empty;
  empty.Finish(false);
  ASSERT_EQ(empty.Items().size(), 1u);
  EXPECT_EQ(empty.Items()[0]["content"][0]["text"], "");
}

}  // namespace
}  // namespace sluice
