// Llama 3.1-3.3 JSON calls: the whole output is {"name": "f", "parameters": {...}} (optionally
// after <|python_tag|>), several calls separated by ";". Output that does not start with '{'
// is content; output that starts with '{' but is not a call becomes content when it ends.
#include "absl/strings/match.h"
#include "nlohmann/json.hpp"
#include "services/api/tool_calls/json_scan.h"
#include "services/api/tool_calls/tool_call_syntax.h"

namespace sluice::tools {
namespace {

constexpr absl::string_view kPythonTag = "<|python_tag|>";

class Llama3JsonSyntax final : public ToolCallSyntax {
 public:
  const char* name() const override { return "llama3_json"; }

  ToolCallParse Parse(absl::string_view text, bool final) const override {
    ToolCallParse out;
    size_t p = SkipJsonSpace(text, 0);
    if (absl::StartsWith(text.substr(p), kPythonTag)) p = SkipJsonSpace(text, p + kPythonTag.size());
    if (p >= text.size() ||
        (!final && absl::StartsWith(kPythonTag, text.substr(p)))) {  // undecided yet
      if (final) out.content = std::string(text);
      return out;
    }
    if (text[p] != '{') {
      out.content = std::string(text);
      return out;
    }
    static const std::vector<std::string> kArguments = {"parameters", "arguments"};
    bool whole = false;  // every call complete and nothing else in the output
    while (true) {
      CallObjectScan scan = ScanCallObject(text, p, final, kArguments);
      if (scan.invalid) break;
      out.calls.push_back(std::move(scan.draft));
      if (!scan.end.has_value()) break;
      p = SkipJsonSpace(text, *scan.end);
      if (p >= text.size()) {
        whole = true;
        break;
      }
      if (text[p] != ';') break;
      p = SkipJsonSpace(text, p + 1);
      if (p >= text.size()) break;
    }
    if (final && !whole) {  // not (only) calls: the output is text
      out.calls.clear();
      out.content = std::string(text);
    }
    return out;
  }

  absl::StatusOr<grammar::Expr> CallsExpr(const std::vector<ToolFunctionRule>& functions,
                                          bool parallel) const override {
    std::vector<grammar::Expr> calls;
    for (const ToolFunctionRule& f : functions) {
      calls.push_back(grammar::Sequence(
          {grammar::Literal("{\"name\": " + nlohmann::json(f.name).dump() + ", \"parameters\": "),
           grammar::RuleRef(f.arguments_rule), grammar::Literal("}")}));
    }
    grammar::Expr one = grammar::Choice(std::move(calls));
    if (!parallel) return one;
    grammar::Expr more = grammar::Star(grammar::Sequence({grammar::Literal("; "), one}));
    return grammar::Sequence({std::move(one), std::move(more)});
  }
};

}  // namespace

std::unique_ptr<ToolCallSyntax> MakeLlama3JsonSyntax() {
  return std::make_unique<Llama3JsonSyntax>();
}

}  // namespace sluice::tools
