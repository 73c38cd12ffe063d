// The tool fields of a chat request: `tools`, `tool_choice` ("none", "auto", "required",
// {"type": "function", "function": {"name": ...}}), `parallel_tool_calls`; and tool calls in
// `messages` (assistant `tool_calls`, tool results with `tool_call_id`).
//
// "required" and a named function constrain decoding to calls in the model's tool-call
// syntax (tool_call_syntax.h) with a grammar built from the functions' parameter schemas;
// "auto" leaves decoding free and parses the output; "none" renders no tools and parses
// nothing. Every error is InvalidArgument naming the field (InvalidParam).
#ifndef SLUICE_SERVICES_API_TOOL_CALLS_TOOL_REQUEST_H_
#define SLUICE_SERVICES_API_TOOL_CALLS_TOOL_REQUEST_H_

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/grammar/grammar_compiler.h"
#include "nlohmann/json.hpp"
#include "services/api/tool_calls/tool_call_syntax.h"

namespace sluice::tools {

enum class ToolChoice { kNone, kAuto, kRequired, kFunction };

struct ToolFunction {
  std::string name;
  // A JSON Schema ({"type": "object", "properties": {}} if absent), in the client's key order
  // when it was known: call arguments list properties in the schema's order.
  nlohmann::ordered_json parameters;
};

struct ToolRequest {
  ToolChoice choice = ToolChoice::kAuto;
  std::string function;                 // kFunction: the function to call
  bool parallel = true;                 // parallel_tool_calls
  std::vector<ToolFunction> functions;
  // `tools` for the chat template, in the client's key order when it was known.
  nlohmann::ordered_json template_tools = nlohmann::ordered_json::array();
  bool constrained() const { return choice == ToolChoice::kRequired || choice == ToolChoice::kFunction; }
};

// At most this many tools per request (OpenAI's limit).
inline constexpr size_t kMaxTools = 128;

// ParseToolRequest reads tools / tool_choice / parallel_tool_calls. nullopt: no tools and no
// forced choice (the request is plain chat). Errors (param in parentheses): tools not a list,
// over kMaxTools, a tool without type "function", a missing or malformed name, a duplicate
// name, parameters that are not an object or not a supported JSON Schema (tools);
// tool_choice of the wrong shape, naming an unknown function, or "required" / a function
// without tools (tool_choice); parallel_tool_calls not a boolean. `ordered_tools` (may be null)
// is the body's `tools` parsed keeping key order: the template tools are built from it, so a
// template's `tojson` prints them as the client wrote them (Hugging Face's order); without it
// their keys come sorted.
absl::StatusOr<std::optional<ToolRequest>> ParseToolRequest(
    const nlohmann::json& body, const nlohmann::ordered_json* ordered_tools = nullptr);

// CompileToolGrammar compiles the calls-only grammar of a constrained request in `syntax`
// (cached by the compiler under the syntax, functions and schemas). Errors: InvalidArgument
// (param tool_choice) when the syntax has no constrained form.
absl::StatusOr<std::shared_ptr<const grammar::CompiledGrammar>> CompileToolGrammar(
    const ToolRequest& request, const ToolCallSyntax& syntax, grammar::GrammarCompiler& compiler);

// AddToolMessageFields copies the tool fields of request message `m` (messages[index]) into
// the template's `message`: an assistant's `tool_calls` (arguments parsed from their JSON
// text into objects, as templates expect) and a tool result's `tool_call_id`. Errors
// (param messages): malformed tool_calls, arguments that are not JSON, tool_calls on a
// message that is not the assistant's.
absl::Status AddToolMessageFields(const nlohmann::json& m, size_t index, nlohmann::json& message);

}  // namespace sluice::tools

#endif  // SLUICE_SERVICES_API_TOOL_CALLS_TOOL_REQUEST_H_
