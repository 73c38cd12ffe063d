// Tool calling on /v1/chat/completions: ties the tool fields (tool_calls/tool_request.h) to a
// GenerationRequest — the tool-call syntax its output is parsed with and, for tool_choice
// "required" or a named function, the grammar that constrains decoding to calls.
#ifndef SLUICE_SERVICES_API_CHAT_TOOLS_H_
#define SLUICE_SERVICES_API_CHAT_TOOLS_H_

#include <optional>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"
#include "services/api/openai_protocol.h"
#include "services/api/tool_calls/tool_request.h"

namespace sluice {

// TemplateTools: the `tools` variable of the chat template; null when there are none or
// tool_choice is "none" (the model is not shown tools it may not call).
nlohmann::ordered_json TemplateTools(const std::optional<tools::ToolRequest>& request);

// KeepArgumentOrder re-parses the arguments of the assistant tool calls in `messages` (their
// JSON text) into `conversation` (the template's messages, built from `messages`) keeping the
// client's key order, as Hugging Face's templates see them.
void KeepArgumentOrder(const nlohmann::json& messages, nlohmann::ordered_json& conversation);

// ApplyToolRequest resolves the syntax (context.tool_call_syntax, else the one the chat
// template in use writes) and sets req.tool_call_syntax; for a constrained choice compiles the
// calls grammar into req.grammar. Call after the rest of the request is parsed. Errors
// (InvalidParam): the template shows no tool-call syntax (tools); a structured-output
// constraint together with a constrained choice, a server without grammars, a syntax without a
// constrained form (tool_choice).
absl::Status ApplyToolRequest(const std::optional<tools::ToolRequest>& request,
                              const nlohmann::json& body, const ParseContext& context,
                              GenerationRequest& req);

// SetToolCallMessage rewrites a non-streamed chat choice whose output `text` holds tool calls:
// message.content (null when empty) and message.tool_calls, finish_reason "tool_calls" where
// it was "stop". Output without (valid) calls is left as it is.
void SetToolCallMessage(const tools::ToolCallSyntax& syntax, absl::string_view text,
                        nlohmann::json& choice);

}  // namespace sluice

#endif  // SLUICE_SERVICES_API_CHAT_TOOLS_H_
