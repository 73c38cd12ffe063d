// /v1/responses function calling and structured output, mapped onto the chat-completions code
// (tool_calls/tool_request.h, chat_tools.h, structured_output.h) so both endpoints render,
// constrain and parse alike. The Responses shapes (OpenAI's openai.types.responses):
//   tools:        [{type: "function", name, description?, parameters?, strict?}]
//   tool_choice:  "none" | "auto" | "required" | {type: "function", name}
//   text.format:  {type: "text"} | {type: "json_object"} |
//                 {type: "json_schema", name, schema, description?, strict?}
//   input items:  {type: "function_call", call_id, name, arguments} (an earlier call, fed back)
//                 {type: "function_call_output", call_id, output} (its result)
// Built-in tools (web_search, file_search, computer_use, mcp, ...) are never run here: they are
// refused by name. Every error is InvalidArgument naming the Responses field.
#ifndef SLUICE_SERVICES_API_RESPONSES_TOOLS_H_
#define SLUICE_SERVICES_API_RESPONSES_TOOLS_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "services/api/structured_output.h"

namespace sluice {

// ChatTools turns the Responses `tools` into chat tools ({type: "function", function: {name,
// description, parameters, strict}}; nulls dropped). Errors (param tools): not a list, an item
// that is not an object, a tool type other than "function", a missing or non-string name,
// unknown keys in a tool (listed in `unknown` instead when allow_unknown).
absl::StatusOr<nlohmann::json> ChatTools(const nlohmann::json& tools, bool allow_unknown,
                                         std::vector<std::string>* unknown);

// ChatOrderedTools is ChatTools on the client's key-ordered copy (ParseContext::ordered_tools),
// for the chat template; null when it is not a list of objects.
std::shared_ptr<const nlohmann::ordered_json> ChatOrderedTools(
    const nlohmann::ordered_json& tools);

// ChatToolChoice: "none", "auto" and "required" as they are; {type: "function", name} as chat's
// {type: "function", function: {name}}. Errors (param tool_choice): other strings, hosted-tool
// and allowed_tools choices, a function choice without a string name.
absl::StatusOr<nlohmann::json> ChatToolChoice(const nlohmann::json& choice);

// ParseTextFormat reads `text` ({format, verbosity}). nullopt: no constraint (absent, null,
// format absent or {type: "text"}). The constraint's param is "text.format". Errors: a `text`
// or `format` that is not an object, a format type other than text / json_object / json_schema
// (param text.format), json_schema without a valid `name` (text.format.name) or an object
// `schema` (text.format.schema), unknown keys (listed in `unknown` instead when allow_unknown),
// a `verbosity` (text.verbosity: this server has no verbosity control). `ordered_schema` (may
// be null): text.format.schema parsed in the client's key order, which the grammar follows
// (generated objects keep the schema's property order, as chat's response_format).
absl::StatusOr<std::optional<StructuredOutputRequest>> ParseTextFormat(
    const nlohmann::json& text, bool allow_unknown, std::vector<std::string>* unknown,
    const nlohmann::ordered_json* ordered_schema = nullptr);

// AppendFunctionCallItem adds input item `index`, a function_call, to `messages` as an
// assistant tool call ({id: call_id, type: "function", function: {name, arguments}}); calls that
// follow an assistant message join it (one assistant turn: its text, then its calls). Errors
// (param input): a missing or non-string call_id, name or arguments, unknown keys.
absl::Status AppendFunctionCallItem(const nlohmann::json& item, size_t index,
                                    bool allow_unknown, std::vector<std::string>* unknown,
                                    nlohmann::json& messages);

// FunctionCallOutputMessage is input item `index`, a function_call_output, as a tool message
// {role: "tool", tool_call_id: call_id, content: output}; `output` is a string or a list of
// input_text parts (joined). Errors (param input): a missing call_id or output, unknown keys.
absl::StatusOr<nlohmann::json> FunctionCallOutputMessage(const nlohmann::json& item,
                                                         size_t index, bool allow_unknown,
                                                         std::vector<std::string>* unknown);

// ResponsesToolsError rewrites an error of the chat tool parser about `tools` so it names the
// Responses shape ("tools[0].name", not "tools[0].function.name"); other errors pass.
absl::Status ResponsesToolsError(const absl::Status& status);

}  // namespace sluice

#endif  // SLUICE_SERVICES_API_RESPONSES_TOOLS_H_
