// DeepSeek-V3 calls: content, then
//   <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\nARGS\n```<｜tool▁call▁end｜>
//   ... <｜tool▁calls▁end｜>
// (later calls each after a "\n", as DeepSeek's chat template writes them). The markers are
// special tokens of DeepSeek's tokenizer: the output keeps them (needs_special_tokens) and the
// constrained form ("required" / a named function) matches them as whole tokens (grammar.h
// Token), never as text spelled by other tokens.
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "services/api/tool_calls/json_scan.h"
#include "services/api/tool_calls/tool_call_syntax.h"

namespace sluice::tools {
namespace {

constexpr absl::string_view kCallsBegin = "<｜tool▁calls▁begin｜>";
constexpr absl::string_view kCallBegin = "<｜tool▁call▁begin｜>";
constexpr absl::string_view kSep = "<｜tool▁sep｜>";
constexpr absl::string_view kCallEnd = "<｜tool▁call▁end｜>";
constexpr absl::string_view kCallsEnd = "<｜tool▁calls▁end｜>";
constexpr absl::string_view kFence = "```json";

class DeepSeekV3Syntax final : public ToolCallSyntax {
 public:
  const char* name() const override { return "deepseek_v3"; }
  bool needs_special_tokens() const override { return true; }

  ToolCallParse Parse(absl::string_view text, bool final) const override {
    ToolCallParse out;
    const size_t begin = text.find(kCallsBegin);
    if (begin == absl::string_view::npos) {
      const size_t held = final ? 0 : HeldBackPrefix(text, kCallsBegin);
      out.content = std::string(text.substr(0, text.size() - held));
      return out;
    }
    out.content = std::string(text.substr(0, begin));
    size_t call = text.find(kCallBegin, begin);
    while (call != absl::string_view::npos) {
      const size_t sep = text.find(kSep, call);
      if (sep == absl::string_view::npos) break;
      const size_t name_start = sep + kSep.size();
      const size_t newline = text.find('\n', name_start);
      if (newline == absl::string_view::npos) break;
      ToolCallDraft draft;
      draft.name = std::string(absl::StripAsciiWhitespace(text.substr(name_start, newline - name_start)));
      draft.name_done = true;
      size_t p = SkipJsonSpace(text, newline);
      if (!absl::StartsWith(text.substr(p), kFence)) {
        if (absl::StartsWith(kFence, text.substr(p))) out.calls.push_back(std::move(draft));
        break;  // a partial fence, or not this syntax
      }
      p = SkipJsonSpace(text, p + kFence.size());
      if (p >= text.size()) {
        out.calls.push_back(std::move(draft));
        break;
      }
      std::optional<size_t> end = ScanJsonValue(text, p, final);
      if (!end.has_value()) {
        if (text[p] == '{' || text[p] == '[') draft.arguments = std::string(text.substr(p));
        out.calls.push_back(std::move(draft));
        break;
      }
      draft.arguments = std::string(text.substr(p, *end - p));
      draft.done = true;
      out.calls.push_back(std::move(draft));
      call = text.find(kCallBegin, *end);
    }
    return out;
  }

  absl::StatusOr<grammar::Expr> CallsExpr(const std::vector<ToolFunctionRule>& functions,
                                          bool parallel) const override {
    std::vector<grammar::Expr> calls;
    for (const ToolFunctionRule& f : functions) {
      calls.push_back(grammar::Sequence(
          {grammar::Token(kCallBegin), grammar::Literal("function"), grammar::Token(kSep),
           grammar::Literal(absl::StrCat(f.name, "\n", kFence, "\n")),
           grammar::RuleRef(f.arguments_rule), grammar::Literal("\n```"),
           grammar::Token(kCallEnd)}));
    }
    grammar::Expr one = grammar::Choice(std::move(calls));
    std::vector<grammar::Expr> seq = {grammar::Token(kCallsBegin), one};
    if (parallel) seq.push_back(grammar::Star(grammar::Sequence({grammar::Literal("\n"), one})));
    seq.push_back(grammar::Token(kCallsEnd));
    return grammar::Sequence(std::move(seq));
  }
};

}  // namespace

std::unique_ptr<ToolCallSyntax> MakeDeepSeekV3Syntax() {
  return std::make_unique<DeepSeekV3Syntax>();
}

}  // namespace sluice::tools
