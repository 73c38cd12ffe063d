// Tool calls in a chat choice's output, in OpenAI's shapes:
//   message:  {"content": null | "...", "tool_calls": [{"id": "call_…", "type": "function",
//              "function": {"name": "f", "arguments": "{\"city\": \"Paris\"}"}}]}
//   streamed: delta.tool_calls[] entries, each with `index`; a call's first entry has `id`,
//             `type` and `function.name` (arguments ""), later ones argument fragments that
//             join into the arguments text.
#ifndef SLUICE_SERVICES_API_TOOL_CALLS_TOOL_CALL_OUTPUT_H_
#define SLUICE_SERVICES_API_TOOL_CALLS_TOOL_CALL_OUTPUT_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"
#include "services/api/tool_calls/tool_call_syntax.h"

namespace sluice::tools {

// NewToolCallId returns "call_" and 24 random alphanumerics (thread-safe).
std::string NewToolCallId();

// ToolCallMessage is a finished choice's message fields.
struct ToolCallMessage {
  nlohmann::json content;                            // string, or null when empty
  nlohmann::json tool_calls = nlohmann::json::array();
  bool has_calls() const { return !tool_calls.empty(); }
};

// ParseToolCallMessage parses a finished output. Calls count only when every call is complete
// and its arguments are a JSON object; otherwise the whole text is content (as unparsable
// model output is in vLLM).
ToolCallMessage ParseToolCallMessage(const ToolCallSyntax& syntax, absl::string_view text);

// ToolCallStream turns a streamed choice's growing text into content and tool_calls deltas.
class ToolCallStream {
 public:
  explicit ToolCallStream(std::shared_ptr<const ToolCallSyntax> syntax);

  struct Delta {
    std::string content;                                // new content text
    std::vector<nlohmann::json> tool_calls;             // delta.tool_calls entries, in order
  };
  // Update takes the choice's whole text so far; `final`: the choice has ended.
  Delta Update(absl::string_view text, bool final);
  // Whether a call was streamed (finish_reason "tool_calls" when the choice stopped).
  bool any_call() const { return !calls_.empty(); }

 private:
  struct SentCall {
    std::string id;
    size_t arguments_sent = 0;
  };
  std::shared_ptr<const ToolCallSyntax> syntax_;
  size_t content_sent_ = 0;
  std::vector<SentCall> calls_;
};

}  // namespace sluice::tools

#endif  // SLUICE_SERVICES_API_TOOL_CALLS_TOOL_CALL_OUTPUT_H_
