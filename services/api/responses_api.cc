#include "services/api/responses_api.h"

#include <algorithm>
#include <iterator>
#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"
#include "services/api/openai_errors.h"
#include "services/api/openai_fields.h"
#include "services/api/openai_responses.h"

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
    // id and status: what an earlier response's output item carries when fed back.
    static constexpr std::string_view kItemKeys[] = {"type", "role", "content", "id", "status"};
    if (absl::Status s = CheckKnownKeys(item, kItemKeys, "input", absl::StrCat("input[", i, "]"),
                                        allow_unknown, unknown);
        !s.ok()) {
      return s;
    }
    const std::string type = item.value("type", "message");
    if (type != "message") {
      return InvalidParam("input", absl::StrCat("input[", i, "] of type '", type,
                                                "' is not supported (only messages)"));
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
  if (auto it = body.find("max_output_tokens"); it != body.end() && !it->is_null()) {
    if (!it->is_number_integer() || it->get<int64_t>() < 1) {
      return InvalidParam("max_output_tokens", "'max_output_tokens' must be an integer >= 1");
    }
    chat["max_tokens"] = *it;
  }
  absl::StatusOr<GenerationRequest> req = ParseChatCompletionRequest(chat, context);
  if (!req.ok()) {
    // Name the Responses field, not its chat counterpart.
    if (OpenAiErrorJson(req.status())["error"]["param"] == "max_tokens") {
      return WithParam(req.status(), "max_output_tokens");
    }
    if (OpenAiErrorJson(req.status())["error"]["param"] == "messages") {
      return WithParam(req.status(), "input");
    }
    return req.status();
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

json ResponseTextPartJson(const std::string& text) {
  return json{{"type", "output_text"},
              {"text", text},
              {"annotations", json::array()},
              {"logprobs", json::array()}};
}

json ResponseMessageItemJson(const ResponseState& state, bool done) {
  json content = json::array();
  if (done) content.push_back(ResponseTextPartJson(state.text));
  const char* status =
      !done ? "in_progress" : state.finish_reason == "length" ? "incomplete" : "completed";
  return json{{"type", "message"},
              {"id", state.message_id},
              {"status", status},
              {"role", "assistant"},
              {"content", std::move(content)}};
}

json ResponseObjectJson(const ResponseState& state, const json& echo) {
  const bool done = state.status != "in_progress";
  json output = json::array();
  if (done) output.push_back(ResponseMessageItemJson(state, true));
  json response{{"id", state.id},
                {"object", "response"},
                {"created_at", state.created_at},
                {"status", state.status},
                {"error", nullptr},
                {"incomplete_details", nullptr},
                {"model", state.model},
                {"output", std::move(output)},
                {"parallel_tool_calls", false},
                {"previous_response_id", nullptr},
                {"reasoning", {{"effort", nullptr}, {"summary", nullptr}}},
                {"store", false},
                {"text", {{"format", {{"type", "text"}}}}},
                {"tool_choice", "none"},
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
