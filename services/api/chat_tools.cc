#include "services/api/chat_tools.h"

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/json_parse.h"
#include "services/api/openai_errors.h"
#include "services/api/tool_calls/tool_call_output.h"

namespace sluice {

using nlohmann::json;

nlohmann::ordered_json TemplateTools(const std::optional<tools::ToolRequest>& request) {
  if (!request.has_value() || request->choice == tools::ToolChoice::kNone) {
    return nlohmann::ordered_json();
  }
  return request->template_tools;
}

void KeepArgumentOrder(const json& messages, nlohmann::ordered_json& conversation) {
  for (size_t i = 0; i < messages.size() && i < conversation.size(); ++i) {
    auto calls = messages[i].is_object() ? messages[i].find("tool_calls") : messages[i].end();
    if (calls == messages[i].end() || !calls->is_array()) continue;
    nlohmann::ordered_json& out = conversation[i]["tool_calls"];
    for (size_t j = 0; j < calls->size() && j < out.size(); ++j) {
      const json& call = (*calls)[j];
      auto function = call.is_object() ? call.find("function") : call.end();
      if (function == call.end() || !function->is_object()) continue;
      auto arguments = function->find("arguments");
      if (arguments == function->end() || !arguments->is_string()) continue;
      // Already checked (AddToolMessageFields): a JSON object.
      absl::StatusOr<nlohmann::ordered_json> parsed =
          ParseJsonLimited<nlohmann::ordered_json>(arguments->get_ref<const std::string&>());
      if (parsed.ok() && parsed->is_object()) {
        out[j]["function"]["arguments"] = *std::move(parsed);
      }
    }
  }
}

absl::Status ApplyToolRequest(const std::optional<tools::ToolRequest>& request, const json& body,
                              const ParseContext& context, GenerationRequest& req) {
  if (!request.has_value() || request->choice == tools::ToolChoice::kNone) return absl::OkStatus();
  std::shared_ptr<const tools::ToolCallSyntax> syntax = context.tool_call_syntax;
  if (syntax == nullptr) {
    auto source = body.find("chat_template");
    if (source != body.end() && source->is_string()) {
      syntax = tools::DetectToolCallSyntax(source->get_ref<const std::string&>());
    } else if (context.chat_template != nullptr) {
      syntax = tools::DetectToolCallSyntax(context.chat_template->source());
    }
  }
  if (syntax == nullptr) {
    return InvalidParam("tools",
                        "this model's chat template writes no tool calls (no known tool-call "
                        "syntax in it); start the server with --tool-call-parser or pass a "
                        "'chat_template' that renders tools");
  }
  req.tool_call_syntax = syntax;
  if (syntax->needs_special_tokens()) req.sampling.skip_special_tokens = false;
  if (!request->constrained()) return absl::OkStatus();
  if (req.grammar != nullptr) {
    return InvalidParam("tool_choice",
                        "tool_choice \"required\" or a named function cannot be combined with "
                        "another output constraint (response_format, structured_outputs, "
                        "guided_*)");
  }
  if (context.grammar_compiler == nullptr) {
    return InvalidParam("tool_choice",
                        "tool_choice \"required\" or a named function is not supported by this "
                        "server (no constrained decoding); use \"auto\"");
  }
  absl::StatusOr<std::shared_ptr<const grammar::CompiledGrammar>> g =
      tools::CompileToolGrammar(*request, *syntax, *context.grammar_compiler);
  if (!g.ok()) return g.status();
  req.grammar = *std::move(g);
  return absl::OkStatus();
}

void SetToolCallMessage(const tools::ToolCallSyntax& syntax, absl::string_view text,
                        json& choice) {
  tools::ToolCallMessage message = tools::ParseToolCallMessage(syntax, text);
  if (!message.has_calls()) return;
  // An echoed prefix stays in front of the content.
  json& out = choice["message"];
  const std::string full = out["content"].get<std::string>();
  const std::string echo = full.substr(0, full.size() - text.size());
  if (!echo.empty()) {
    message.content = echo + (message.content.is_string() ? message.content.get<std::string>() : "");
  }
  out["content"] = std::move(message.content);
  out["tool_calls"] = std::move(message.tool_calls);
  if (choice["finish_reason"] == "stop") choice["finish_reason"] = "tool_calls";
}

}  // namespace sluice
