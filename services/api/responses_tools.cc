#include "services/api/responses_tools.h"

#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "services/api/openai_errors.h"
#include "services/api/structured_output.h"
#include "services/api/openai_fields.h"

namespace sluice {
namespace {

using nlohmann::json;

const json* Present(const json& obj, const char* name) {
  auto it = obj.find(name);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

constexpr std::string_view kToolKeys[] = {"type", "name", "description", "parameters", "strict"};


// Function keeps a flat tool's keys but `type` in their order, nulls dropped.
template <typename Json>
Json Function(const Json& tool) {
  Json function = Json::object();
  for (auto it = tool.begin(); it != tool.end(); ++it) {
    if (it.key() != "type" && !it.value().is_null()) function[it.key()] = it.value();
  }
  return function;
}

}  // namespace

absl::StatusOr<json> ChatTools(const json& tools, bool allow_unknown,
                               std::vector<std::string>* unknown) {
  if (!tools.is_array()) return InvalidParam("tools", "'tools' must be a list of tools");
  json out = json::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const json& tool = tools[i];
    const std::string where = absl::StrCat("tools[", i, "]");
    if (!tool.is_object()) return InvalidParam("tools", absl::StrCat(where, " must be an object"));
    const json* type = Present(tool, "type");
    if (type == nullptr || !type->is_string()) {
      return InvalidParam("tools", absl::StrCat(where, ".type is required (a string)"));
    }
    if (*type != "function") {
      return InvalidParam(
          "tools", absl::StrCat(where, " of type '", type->get<std::string>().substr(0, 80),
                                "' is not supported: this server runs no built-in tools (only "
                                "type \"function\", whose calls the client runs)"));
    }
    if (absl::Status s = CheckKnownKeys(tool, kToolKeys, "tools", where, allow_unknown, unknown);
        !s.ok()) {
      return s;
    }
    const json* name = Present(tool, "name");
    if (name == nullptr || !name->is_string()) {
      return InvalidParam("tools", absl::StrCat(where, ".name is required (a string)"));
    }
    json function = Function(tool);
    // Unknown keys were allowed: they stay out of what the chat parser and template see.
    for (auto it = function.begin(); it != function.end();) {
      bool known = false;
      for (std::string_view k : kToolKeys) known = known || it.key() == k;
      it = known ? std::next(it) : function.erase(it);
    }
    out.push_back({{"type", "function"}, {"function", std::move(function)}});
  }
  return out;
}

std::shared_ptr<const nlohmann::ordered_json> ChatOrderedTools(
    const nlohmann::ordered_json& tools) {
  if (!tools.is_array()) return nullptr;
  auto out = std::make_shared<nlohmann::ordered_json>(nlohmann::ordered_json::array());
  for (const nlohmann::ordered_json& tool : tools) {
    if (!tool.is_object()) return nullptr;
    nlohmann::ordered_json function = Function(tool);
    for (auto it = function.begin(); it != function.end();) {
      bool known = false;
      for (std::string_view k : kToolKeys) known = known || it.key() == k;
      it = known ? std::next(it) : function.erase(it);
    }
    out->push_back({{"type", "function"}, {"function", std::move(function)}});
  }
  return out;
}

absl::StatusOr<json> ChatToolChoice(const json& choice) {
  constexpr char kShapes[] =
      "\"none\", \"auto\", \"required\" or {\"type\": \"function\", \"name\": ...}";
  if (choice.is_string()) {
    const std::string& s = choice.get_ref<const std::string&>();
    if (s == "none" || s == "auto" || s == "required") return choice;
    return InvalidParam("tool_choice", absl::StrCat("'tool_choice' must be ", kShapes, ", got \"",
                                                    s.substr(0, 80), "\""));
  }
  const json* type = choice.is_object() ? Present(choice, "type") : nullptr;
  if (type == nullptr || !type->is_string()) {
    return InvalidParam("tool_choice", absl::StrCat("'tool_choice' must be ", kShapes));
  }
  if (*type != "function") {
    return InvalidParam(
        "tool_choice",
        absl::StrCat("'tool_choice' of type '", type->get<std::string>().substr(0, 80),
                     "' is not supported by this server (it runs no built-in tools and has no "
                     "allowed_tools subsets); use ", kShapes));
  }
  if (absl::Status s = CheckKnownKeys(choice, {"type", "name"}, "tool_choice", "tool_choice",
                                      /*allow_unknown=*/false, nullptr);
      !s.ok()) {
    return s;
  }
  const json* name = Present(choice, "name");
  if (name == nullptr || !name->is_string()) {
    return InvalidParam("tool_choice", "'tool_choice.name' is required (a string)");
  }
  return json{{"type", "function"}, {"function", {{"name", *name}}}};
}

absl::StatusOr<std::optional<StructuredOutputRequest>> ParseTextFormat(
    const json& text, bool allow_unknown, std::vector<std::string>* unknown,
    const nlohmann::ordered_json* ordered_schema) {
  using Result = std::optional<StructuredOutputRequest>;
  if (text.is_null()) return Result();
  if (!text.is_object()) return InvalidParam("text", "'text' must be an object");
  if (absl::Status s =
          CheckKnownKeys(text, {"format", "verbosity"}, "text", "text", allow_unknown, unknown);
      !s.ok()) {
    return s;
  }
  if (Present(text, "verbosity") != nullptr) {
    return InvalidParam("text.verbosity",
                        "'text.verbosity' is not supported by this server (no verbosity control)");
  }
  const json* format = Present(text, "format");
  if (format == nullptr) return Result();
  const json* type = format->is_object() ? Present(*format, "type") : nullptr;
  if (type == nullptr || !type->is_string()) {
    return InvalidParam("text.format", "'text.format' must be an object with a string 'type'");
  }
  const std::string& kind = type->get_ref<const std::string&>();
  if (kind == "text" || kind == "json_object") {
    if (absl::Status s = CheckKnownKeys(*format, {"type"}, "text.format", "text.format",
                                        allow_unknown, unknown);
        !s.ok()) {
      return s;
    }
    if (kind == "text") return Result();
    return Result(StructuredOutputRequest{
        grammar::GrammarSpec{grammar::GrammarKind::kJsonObject, "", {}}, "text.format"});
  }
  if (kind != "json_schema") {
    return InvalidParam("text.format",
                        absl::StrCat("text.format type '", kind.substr(0, 80),
                                     "' is not supported (use text, json_object or json_schema)"));
  }
  // name/description/strict describe the schema; it is always enforced strictly.
  if (absl::Status s =
          CheckKnownKeys(*format, {"type", "name", "schema", "description", "strict"},
                         "text.format", "text.format", allow_unknown, unknown);
      !s.ok()) {
    return s;
  }
  const json* name = Present(*format, "name");
  if (name == nullptr || !name->is_string() || !ValidSchemaFormatName(name->get<std::string>())) {
    return InvalidParam("text.format.name",
                        "'text.format.name' is required: 1 to 64 of a-z, A-Z, 0-9, _ and -");
  }
  if (const json* d = Present(*format, "description"); d != nullptr && !d->is_string()) {
    return InvalidParam("text.format.description", "'text.format.description' must be a string");
  }
  if (const json* s = Present(*format, "strict"); s != nullptr && !s->is_boolean()) {
    return InvalidParam("text.format.strict", "'text.format.strict' must be a boolean");
  }
  const json* schema = Present(*format, "schema");
  if (schema == nullptr || !schema->is_object()) {
    return InvalidParam("text.format.schema",
                        "'text.format.schema' is required (a JSON Schema object)");
  }
  const std::string schema_text = ordered_schema != nullptr && ordered_schema->is_object()
                                      ? ordered_schema->dump()
                                      : schema->dump();
  return Result(StructuredOutputRequest{
      grammar::GrammarSpec{grammar::GrammarKind::kJsonSchema, schema_text, {}}, "text.format"});
}

absl::Status AppendFunctionCallItem(const json& item, size_t index, bool allow_unknown,
                                    std::vector<std::string>* unknown, json& messages) {
  const std::string where = absl::StrCat("input[", index, "]");
  // id and status: what an earlier response's function_call item carries.
  if (absl::Status s = CheckKnownKeys(item, {"type", "call_id", "name", "arguments", "id", "status"},
                                      "input", where, allow_unknown, unknown);
      !s.ok()) {
    return s;
  }
  for (const char* key : {"call_id", "name", "arguments"}) {
    const json* v = Present(item, key);
    if (v == nullptr || !v->is_string()) {
      return InvalidParam("input", absl::StrCat(where, ".", key, " is required (a string)"));
    }
  }
  json call{{"id", item["call_id"]},
            {"type", "function"},
            {"function", {{"name", item["name"]}, {"arguments", item["arguments"]}}}};
  if (!messages.empty() && messages.back().value("role", "") == "assistant") {
    json& last = messages.back();
    if (!last.contains("tool_calls")) last["tool_calls"] = json::array();
    last["tool_calls"].push_back(std::move(call));
    return absl::OkStatus();
  }
  messages.push_back({{"role", "assistant"}, {"content", nullptr},
                      {"tool_calls", json::array({std::move(call)})}});
  return absl::OkStatus();
}

absl::StatusOr<json> FunctionCallOutputMessage(const json& item, size_t index,
                                               bool allow_unknown,
                                               std::vector<std::string>* unknown) {
  const std::string where = absl::StrCat("input[", index, "]");
  if (absl::Status s = CheckKnownKeys(item, {"type", "call_id", "output", "id", "status"},
                                      "input", where, allow_unknown, unknown);
      !s.ok()) {
    return s;
  }
  const json* call_id = Present(item, "call_id");
  if (call_id == nullptr || !call_id->is_string()) {
    return InvalidParam("input", absl::StrCat(where, ".call_id is required (a string)"));
  }
  const json* output = Present(item, "output");
  std::string content;
  if (output != nullptr && output->is_string()) {
    content = output->get<std::string>();
  } else if (output != nullptr && output->is_array()) {
    for (size_t i = 0; i < output->size(); ++i) {
      const json& part = (*output)[i];
      const json* text = part.is_object() ? Present(part, "text") : nullptr;
      if (!part.is_object() || part.value("type", "") != "input_text" || text == nullptr ||
          !text->is_string()) {
        return InvalidParam("input", absl::StrCat(where, ".output[", i,
                                                  "] must be an input_text part (only text)"));
      }
      if (absl::Status s = CheckKnownKeys(part, {"type", "text"}, "input",
                                          absl::StrCat(where, ".output[", i, "]"), allow_unknown,
                                          unknown);
          !s.ok()) {
        return s;
      }
      if (i > 0) content += "\n";
      content += text->get<std::string>();
    }
  } else {
    return InvalidParam("input", absl::StrCat(where, ".output is required (a string or a list "
                                                     "of input_text parts)"));
  }
  return json{{"role", "tool"}, {"tool_call_id", *call_id}, {"content", std::move(content)}};
}

absl::Status ResponsesToolsError(const absl::Status& status) {
  if (status.ok() || OpenAiErrorJson(status)["error"]["param"] != "tools") return status;
  return InvalidParam("tools", absl::StrReplaceAll(status.message(), {{"].function.", "]."}}));
}

}  // namespace sluice
