// Hermes-style calls (NousResearch Hermes 2 Pro, Qwen2.5 / Qwen3, models/sluice-mini-moe):
// content, then calls each wrapped as <tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>.
// Text after a call other than the next call is dropped.
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "services/api/tool_calls/json_scan.h"
#include "services/api/tool_calls/tool_call_syntax.h"

namespace sluice::tools {
namespace {

constexpr absl::string_view kOpen = "<tool_call>";
constexpr absl::string_view kClose = "</tool_call>";

class HermesSyntax final : public ToolCallSyntax {
 public:
  const char* name() const override { return "hermes"; }

  ToolCallParse Parse(absl::string_view text, bool final) const override {
    ToolCallParse out;
    size_t open = text.find(kOpen);
    if (open == absl::string_view::npos) {
      const size_t held = final ? 0 : HeldBackPrefix(text, kOpen);
      out.content = std::string(text.substr(0, text.size() - held));
      return out;
    }
    out.content = std::string(text.substr(0, open));
    static const std::vector<std::string> kArguments = {"arguments", "parameters"};
    while (open != absl::string_view::npos) {
      const size_t start = SkipJsonSpace(text, open + kOpen.size());
      if (start >= text.size()) break;
      CallObjectScan scan = ScanCallObject(text, start, final, kArguments);
      if (scan.invalid) break;
      out.calls.push_back(std::move(scan.draft));
      if (!scan.end.has_value()) break;
      open = text.find(kOpen, *scan.end);
    }
    return out;
  }

  absl::StatusOr<grammar::Expr> CallsExpr(const std::vector<ToolFunctionRule>& functions,
                                          bool parallel) const override {
    std::vector<grammar::Expr> calls;
    for (const ToolFunctionRule& f : functions) {
      calls.push_back(grammar::Sequence(
          {grammar::Literal(absl::StrCat(kOpen, "\n{\"name\": ", nlohmann::json(f.name).dump(),
                                         ", \"arguments\": ")),
           grammar::RuleRef(f.arguments_rule), grammar::Literal(absl::StrCat("}\n", kClose))}));
    }
    grammar::Expr one = grammar::Choice(std::move(calls));
    if (!parallel) return one;
    grammar::Expr more = grammar::Star(grammar::Sequence({grammar::Literal("\n"), one}));
    return grammar::Sequence({std::move(one), std::move(more)});
  }
};

}  // namespace

std::unique_ptr<ToolCallSyntax> MakeHermesSyntax() { return std::make_unique<HermesSyntax>(); }

}  // namespace sluice::tools
