#include "services/api/responses_api.h"

#include <algorithm>
#include <iterator>
#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"
#include "services/api/openai_errors.h"
#include "services/api/openai_fields.h"
#include "services/api/openai_responses.h"
#include "services/api/responses_tools.h"
#include "services/api/structured_output.h"

namespace sluice {
namespace {

using nlohmann::json;

// Fields copied as they are into the chat request (same name and meaning there).
constexpr const char* kPassThrough[] = {
    "model",          "temperature", "top_p",     "top_k",          "min_p",
    "presence_penalty", "frequency_penalty", "repetition_penalty", "seed",
    "logit_bias",     "allowed_token_ids", "bad_words", "ignore_eos", "min_tokens",
    "cache_salt",     "skip_special_tokens"};

// ItemContent flattens an input item's content: a string, or a list of input_text /
// output_text (also "text") parts joined by newlines.
absl::StatusOr<std::string> ItemContent(const json& content, size_t index, bool allow_unknown,
                                        std::vector<std::string>* unknown) {
  const std::string where = absl::StrCat("input[", index, "].content");
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) {
    return InvalidParam("input", absl::StrCat(where, " must be a string or a list of parts"));
  }
  std::string out;
  for (size_t i = 0; i < content.size(); ++i) {
    const json& part = content[i];
    const std::string type = part.is_object() ? part.value("type", "") : "";
    if (type != "input_text" && type != "output_text" && type != "text") {
      return InvalidParam("input", absl::StrCat(where, " part type '", type,
                                                "' is not supported (only text)"));
    }
    // annotations and logprobs: what an earlier response's output_text part carries.
    static constexpr std::string_view kInputTextKeys[] = {"type", "text"};
    static constexpr std::string_view kOutputTextKeys[] = {"type", "text", "annotations",
                                                           "logprobs"};
    if (absl::Status s = CheckKnownKeys(
            part, type == "output_text" ? absl::MakeConstSpan(kOutputTextKeys)
                                  : absl::MakeConstSpan(kInputTextKeys),
            "input", absl::StrCat(where, "[", i, "]"), allow_unknown, unknown);
        !s.ok()) {
      return s;
    }
    auto text = part.find("text");
    if (text == part.end() || !text->is_string()) {
      return InvalidParam("input", absl::StrCat(where, " text part needs a string 'text'"));
    }
    if (i > 0) out += "\n";
    out += text->get<std::string>();
  }
  return out;
}

absl::StatusOr<json> InputMessages(const json& body, bool allow_unknown,
                                   std::vector<std::string>* unknown) {
  json messages = json::array();
  auto instructions = body.find("instructions");
  if (instructions != body.end() && !instructions->is_null()) {
    if (!instructions->is_string()) {
      return InvalidParam("instructions", "'instructions' must be a string");
    }
    messages.push_back({{"role", "system"}, {"content", *instructions}});
  }
  auto input = body.find("input");
  if (input == body.end() || input->is_null()) {
    return InvalidParam("input", "'input' is required");
  }
  if (input->is_string()) {
    // OpenAI refuses an empty input; rendering nothing but the template's frame would give the
    // model no prompt to answer.
    if (input->get_ref<const std::string&>().empty()) {
      return InvalidParam("input", "'input' must not be an empty string");
    }
    messages.push_back({{"role", "user"}, {"content", *input}});
    return messages;
  }
  if (!input->is_array() || input->empty()) {
    return InvalidParam("input", "'input' must be a string or a non-empty list of messages");
  }
  for (size_t i = 0; i < input->size(); ++i) {
    const json& item = (*input)[i];
    if (!item.is_object()) return InvalidParam("input", "each input item must be an object");
    const std::string type = item.value("type", "message");
    if (type == "function_call") {
      if (absl::Status s = AppendFunctionCallItem(item, i, allow_unknown, unknown, messages);
          !s.ok()) {
        return s;
      }
      continue;
    }
    if (type == "function_call_output") {
      absl::StatusOr<json> tool = FunctionCallOutputMessage(item, i, allow_unknown, unknown);
      if (!tool.ok()) return tool.status();
      messages.push_back(*std::move(tool));
      continue;
    }
    if (type != "message") {
      return InvalidParam("input", absl::StrCat("input[", i, "] of type '", type,
                                                "' is not supported (only message, "
                                                "function_call and function_call_output)"));
    }
    // id and status: what an earlier response's output item carries when fed back.
    static constexpr std::string_view kItemKeys[] = {"type", "role", "content", "id", "status"};
    if (absl::Status s = CheckKnownKeys(item, kItemKeys, "input", absl::StrCat("input[", i, "]"),
                                        allow_unknown, unknown);
        !s.ok()) {
      return s;
    }
    auto role = item.find("role");
    if (role == item.end() || !role->is_string()) {
      return InvalidParam("input", absl::StrCat("input[", i, "].role must be a string"));
    }
    auto content = item.find("content");
    if (content == item.end()) {
      return InvalidParam("input", absl::StrCat("input[", i, "].content is required"));
    }
    absl::StatusOr<std::string> text = ItemContent(*content, i, allow_unknown, unknown);
    if (!text.ok()) return text.status();
    messages.push_back({{"role", *role}, {"content", *text}});
  }
  return messages;
}

}  // namespace

absl::StatusOr<GenerationRequest> ParseResponsesRequest(const json& body,
                                                        const ParseContext& context) {
  std::vector<std::string> unknown;
  if (absl::Status s =
          CheckFields(body, FieldTable::kResponses, context.allow_unknown_fields, &unknown);
      !s.ok()) {
    return s;
  }
  absl::StatusOr<json> messages = InputMessages(body, context.allow_unknown_fields, &unknown);
  if (!messages.ok()) return messages.status();
  json chat{{"messages", *messages}};
  for (const char* name : kPassThrough) {
    if (auto it = body.find(name); it != body.end()) chat[name] = *it;
  }
  // Function calling: the chat parser's fields, in chat's shapes (responses_tools.h).
  ParseContext chat_context = context;
  chat_context.ordered_tools = nullptr;
  if (auto it = body.find("tools"); it != body.end() && !it->is_null()) {
    absl::StatusOr<json> tools = ChatTools(*it, context.allow_unknown_fields, &unknown);
    if (!tools.ok()) return tools.status();
    chat["tools"] = *std::move(tools);
    if (context.ordered_tools != nullptr) {
      chat_context.ordered_tools = ChatOrderedTools(*context.ordered_tools);
    }
  }
  if (auto it = body.find("tool_choice"); it != body.end() && !it->is_null()) {
    absl::StatusOr<json> choice = ChatToolChoice(*it);
    if (!choice.ok()) return choice.status();
    chat["tool_choice"] = *std::move(choice);
  }
  if (auto it = body.find("parallel_tool_calls"); it != body.end()) {
    chat["parallel_tool_calls"] = *it;
  }
  // text.format.schema in the client's key order, when the service parsed the body so.
  const nlohmann::ordered_json* ordered_schema = nullptr;
  if (const nlohmann::ordered_json* b = context.ordered_body.get(); b != nullptr) {
    auto text = b->find("text");
    if (text != b->end() && text->is_object()) {
      auto format = text->find("format");
      if (format != text->end() && format->is_object()) {
        auto schema = format->find("schema");
        if (schema != format->end()) ordered_schema = &*schema;
      }
    }
  }
  absl::StatusOr<std::optional<StructuredOutputRequest>> format = ParseTextFormat(
      body.value("text", json()), context.allow_unknown_fields, &unknown, ordered_schema);
  if (!format.ok()) return format.status();
  if (auto it = body.find("max_output_tokens"); it != body.end() && !it->is_null()) {
    if (!it->is_number_integer() || it->get<int64_t>() < 1) {
      return InvalidParam("max_output_tokens", "'max_output_tokens' must be an integer >= 1");
    }
    chat["max_tokens"] = *it;
  }
  absl::StatusOr<GenerationRequest> req = ParseChatCompletionRequest(chat, chat_context);
  if (!req.ok()) {
    // Name the Responses field, not its chat counterpart.
    if (OpenAiErrorJson(req.status())["error"]["param"] == "max_tokens") {
      return WithParam(req.status(), "max_output_tokens");
    }
    if (OpenAiErrorJson(req.status())["error"]["param"] == "messages") {
      return WithParam(req.status(), "input");
    }
    return ResponsesToolsError(req.status());
  }
  // text.format: compiled like chat's response_format; the tool grammar of tool_choice
  // "required" or a named function is the other constraint a request may not add to it.
  if (format->has_value()) {
    if (req->grammar != nullptr) {
      return InvalidParam("text.format",
                          "a text.format constraint cannot be combined with tool_choice "
                          "\"required\" or a named function (the output is then tool calls)");
    }
    if (context.grammar_compiler == nullptr) {
      return InvalidParam("text.format",
                          "'text.format' json_object / json_schema is not supported by this "
                          "server (no structured output / guided decoding)");
    }
    absl::StatusOr<std::shared_ptr<const grammar::CompiledGrammar>> g =
        CompileStructuredOutput(**format, *context.grammar_compiler);
    if (!g.ok()) return g.status();
    req->grammar = *std::move(g);
  }
  req->endpoint = Endpoint::kResponses;
  // Keep what the chat parse allowed too (unknown keys inside pass-through fields).
  unknown.insert(unknown.end(), req->unknown_fields.begin(), req->unknown_fields.end());
  req->unknown_fields = std::move(unknown);
  if (auto it = body.find("stream"); it != body.end() && !it->is_null()) {
    if (!it->is_boolean()) return InvalidParam("stream", "'stream' must be a boolean");
    req->stream = it->get<bool>();
  }
  json echo = json::object();
  for (const char* name : {"instructions", "max_output_tokens", "metadata", "user",
                           "service_tier", "safety_identifier", "prompt_cache_key"}) {
    auto it = body.find(name);
    echo[name] = it == body.end() ? json() : *it;
  }
  echo["temperature"] = req->sampling.temperature;
  echo["top_p"] = req->sampling.top_p;
  if (echo["metadata"].is_null()) echo["metadata"] = json::object();
  // The tool and format fields as the client sent them (OpenAI's defaults otherwise).
  echo["tools"] = body.value("tools", json());
  if (echo["tools"].is_null()) echo["tools"] = json::array();
  echo["tool_choice"] = body.value("tool_choice", json());
  if (echo["tool_choice"].is_null()) echo["tool_choice"] = "auto";
  echo["parallel_tool_calls"] = body.value("parallel_tool_calls", json());
  if (echo["parallel_tool_calls"].is_null()) echo["parallel_tool_calls"] = true;
  json text_format = json{{"type", "text"}};
  if (auto it = body.find("text"); it != body.end() && it->is_object()) {
    if (auto f = it->find("format"); f != it->end() && f->is_object()) text_format = *f;
  }
  echo["text"] = json{{"format", std::move(text_format)}};
  req->responses_echo = std::move(echo);
  return req;
}

json ResponsesUsageJson(int64_t input_tokens, int64_t output_tokens, int64_t cached_tokens) {
  return json{{"input_tokens", input_tokens},
              {"input_tokens_details", {{"cached_tokens", cached_tokens}}},
              {"output_tokens", output_tokens},
              {"output_tokens_details", {{"reasoning_tokens", 0}}},
              {"total_tokens", input_tokens + output_tokens}};
}

json ResponseObjectJson(const ResponseState& state, const json& echo) {
  json response{{"id", state.id},
                {"object", "response"},
                {"created_at", state.created_at},
                {"status", state.status},
                {"error", nullptr},
                {"incomplete_details", nullptr},
                {"model", state.model},
                {"output", state.output},
                {"parallel_tool_calls", true},
                {"previous_response_id", nullptr},
                {"reasoning", {{"effort", nullptr}, {"summary", nullptr}}},
                {"store", false},
                {"text", {{"format", {{"type", "text"}}}}},
                {"tool_choice", "auto"},
                {"tools", json::array()},
                {"truncation", "disabled"},
                {"usage", state.usage}};
  if (state.status == "incomplete") {
    response["incomplete_details"] = {{"reason", "max_output_tokens"}};
  }
  for (const auto& [key, value] : echo.items()) response[key] = value;
  return response;
}

std::string ResponseEvent(const std::string& type, int64_t sequence_number, json fields) {
  fields["type"] = type;
  fields["sequence_number"] = sequence_number;
  return absl::StrCat("event: ", type, "\ndata: ", DumpJson(fields), "\n\n");
}

}  // namespace sluice
