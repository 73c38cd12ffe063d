// ToolCallSyntax: how one model family writes tool calls in its output, e.g.
//   hermes       <tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>   (Hermes, Qwen2.5/3,
//                and this repository's models/sluice-mini-moe template)
//   llama3_json  {"name": "f", "parameters": {...}}; {"name": "g", ...}         (Llama 3.1-3.3)
//   deepseek_v3  <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{...}\n```
//                <｜tool▁call▁end｜><｜tool▁calls▁end｜>                            (DeepSeek-V3)
// Each syntax parses (partial) output into content and calls, and gives the grammar of
// "only calls" output for tool_choice "required" / a named function. One file per syntax.
#ifndef SLUICE_SERVICES_API_TOOL_CALLS_TOOL_CALL_SYNTAX_H_
#define SLUICE_SERVICES_API_TOOL_CALLS_TOOL_CALL_SYNTAX_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/grammar/grammar.h"

namespace sluice::tools {

// ToolCallDraft is one call as far as the output shows it.
struct ToolCallDraft {
  std::string name;       // valid once name_done
  bool name_done = false;
  // The raw JSON text of the arguments so far. While the call is open it is a prefix of the
  // final text (a streamed fragment never has to be taken back).
  std::string arguments;
  bool done = false;      // the arguments (and the call) are complete
};

// ToolCallParse is a snapshot of an output: `content` (text outside calls) and `calls`. For a
// growing text, each snapshot's content and arguments extend the previous ones.
struct ToolCallParse {
  std::string content;
  std::vector<ToolCallDraft> calls;
};

// ToolFunctionRule names a function and the grammar rule of its arguments (a JSON Schema).
struct ToolFunctionRule {
  std::string name;
  int32_t arguments_rule = -1;
};

class ToolCallSyntax {
 public:
  virtual ~ToolCallSyntax() = default;
  // The parser's name, as `--tool-call-parser` takes it.
  virtual const char* name() const = 0;
  // Parse reads model output. Not `final`: text that may still turn into a call (a partial
  // marker) is held back from content. `final`: the output has ended.
  virtual ToolCallParse Parse(absl::string_view text, bool final) const = 0;
  // CallsExpr is the output made only of calls to `functions` (rules of `grammar`): exactly
  // one call, or with `parallel` one or more. Markers that are special tokens are token
  // terminals (grammar::Token); compiling fails where the vocabulary lacks them.
  virtual absl::StatusOr<grammar::Expr> CallsExpr(const std::vector<ToolFunctionRule>& functions,
                                                  bool parallel) const = 0;
  // True when the markers are special tokens: the output must keep them
  // (skip_special_tokens=false) for the parser to see them.
  virtual bool needs_special_tokens() const { return false; }
};

std::unique_ptr<ToolCallSyntax> MakeHermesSyntax();
std::unique_ptr<ToolCallSyntax> MakeLlama3JsonSyntax();
std::unique_ptr<ToolCallSyntax> MakeDeepSeekV3Syntax();

// ToolCallSyntaxByName: "hermes", "llama3_json", "deepseek_v3". Errors: InvalidArgument
// listing the names.
absl::StatusOr<std::shared_ptr<const ToolCallSyntax>> ToolCallSyntaxByName(absl::string_view name);

// DetectToolCallSyntax reads a chat template's source for the markers it writes calls with;
// null when it shows none (the template cannot render tool calls).
std::shared_ptr<const ToolCallSyntax> DetectToolCallSyntax(absl::string_view template_source);

// ---- helpers shared by the syntaxes ----

// HeldBackPrefix: how many bytes at the end of `text` could begin `marker` (so must not be
// emitted as content yet).
size_t HeldBackPrefix(absl::string_view text, absl::string_view marker);

// CallObjectScan is a JSON call object {"name": ..., "<arguments key>": {...}} scanned so far.
struct CallObjectScan {
  ToolCallDraft draft;
  std::optional<size_t> end;  // one past the closing brace, once complete
  bool invalid = false;       // not a call object (unexpected text)
};

// ScanCallObject scans the object at `pos` (its '{'); the arguments are the value of the first
// of `arguments_keys` found. Complete only with a name and arguments.
CallObjectScan ScanCallObject(absl::string_view text, size_t pos, bool final,
                              const std::vector<std::string>& arguments_keys);

}  // namespace sluice::tools

#endif  // SLUICE_SERVICES_API_TOOL_CALLS_TOOL_CALL_SYNTAX_H_
