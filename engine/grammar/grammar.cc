#include "engine/grammar/grammar.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace sluice::grammar {

Expr Empty() { return Expr{}; }

bool ExprEquals(const Expr& a, const Expr& b) {
  if (a.kind != b.kind || a.text != b.text || a.negated != b.negated || a.rule != b.rule ||
      a.min_count != b.min_count || a.max_count != b.max_count || a.token_id != b.token_id ||
      a.ranges.size() != b.ranges.size() || a.children.size() != b.children.size()) {
    return false;
  }
  for (size_t i = 0; i < a.ranges.size(); ++i) {
    if (a.ranges[i].lo != b.ranges[i].lo || a.ranges[i].hi != b.ranges[i].hi) return false;
  }
  for (size_t i = 0; i < a.children.size(); ++i) {
    if (!ExprEquals(a.children[i], b.children[i])) return false;
  }
  return true;
}

Expr Literal(absl::string_view utf8) {
  if (utf8.empty()) return Empty();
  Expr e;
  e.kind = ExprKind::kLiteral;
  e.text = std::string(utf8);
  return e;
}

Expr CharClass(std::vector<CodepointRange> ranges, bool negated) {
  Expr e;
  e.kind = ExprKind::kCharClass;
  e.ranges = std::move(ranges);
  e.negated = negated;
  return e;
}

Expr Token(absl::string_view content) {
  Expr e;
  e.kind = ExprKind::kToken;
  e.text = std::string(content);
  return e;
}

Expr TokenById(int32_t id) {
  Expr e;
  e.kind = ExprKind::kToken;
  e.token_id = id;
  return e;
}

bool IsTokenText(absl::string_view content) {
  return content.size() >= 3 && content.front() == '<' && content.back() == '>' &&
         content.substr(1, content.size() - 2).find('>') == absl::string_view::npos;
}

Expr RuleRef(int32_t rule) {
  Expr e;
  e.kind = ExprKind::kRuleRef;
  e.rule = rule;
  return e;
}

Expr Sequence(std::vector<Expr> children) {
  if (children.size() == 1) return std::move(children[0]);
  if (children.empty()) return Empty();
  Expr e;
  e.kind = ExprKind::kSequence;
  e.children = std::move(children);
  return e;
}

Expr Choice(std::vector<Expr> children) {
  if (children.size() == 1) return std::move(children[0]);
  Expr e;
  e.kind = ExprKind::kChoice;  // no children: matches nothing
  e.children = std::move(children);
  return e;
}

Expr Repeat(Expr child, int32_t min_count, int32_t max_count) {
  Expr e;
  e.kind = ExprKind::kRepeat;
  e.min_count = min_count;
  e.max_count = max_count;
  e.children.push_back(std::move(child));
  return e;
}

int32_t Grammar::AddRule(std::string name, Expr body) {
  std::string unique = name;
  for (int i = 1; FindRule(unique).has_value(); ++i) unique = absl::StrCat(name, "-", i);
  rules_.push_back(Rule{std::move(unique), std::move(body), {}});
  return static_cast<int32_t>(rules_.size()) - 1;
}

std::optional<int32_t> Grammar::FindRule(absl::string_view name) const {
  for (size_t i = 0; i < rules_.size(); ++i) {
    if (rules_[i].name == name) return static_cast<int32_t>(i);
  }
  return std::nullopt;
}

namespace {

void AppendEscaped(char32_t cp, bool in_class, std::string* out) {
  if (cp == '\n' || cp == '\r' || cp == '\t') {
    out->append(cp == '\n' ? "\\n" : cp == '\r' ? "\\r" : "\\t");
    return;
  }
  if (cp == '\\' || (!in_class && cp == '"') || (in_class && (cp == ']' || cp == '-' || cp == '^'))) {
    out->push_back('\\');
    out->push_back(static_cast<char>(cp));
    return;
  }
  if (cp < 0x20 || cp == 0x7f || cp > 0x7f) {
    // Two calls: clang checks absl format strings at compile time, a ?: is not a constant.
    if (cp > 0xffff) {
      absl::StrAppendFormat(out, "\\U%08x", static_cast<uint32_t>(cp));
    } else {
      absl::StrAppendFormat(out, "\\u%04x", static_cast<uint32_t>(cp));
    }
    return;
  }
  out->push_back(static_cast<char>(cp));
}

void Print(const Grammar& g, const Expr& e, std::string* out) {
  switch (e.kind) {
    case ExprKind::kEmpty:
      out->append("\"\"");
      return;
    case ExprKind::kLiteral:
      out->push_back('"');
      for (unsigned char c : e.text) {
        if (c >= 0x80) {
          out->push_back(static_cast<char>(c));  // UTF-8 passes through
        } else {
          AppendEscaped(c, false, out);
        }
      }
      out->push_back('"');
      return;
    case ExprKind::kCharClass:
      out->append(e.negated ? "[^" : "[");
      for (const CodepointRange& r : e.ranges) {
        AppendEscaped(r.lo, true, out);
        if (r.hi != r.lo) {
          out->push_back('-');
          AppendEscaped(r.hi, true, out);
        }
      }
      out->push_back(']');
      return;
    case ExprKind::kRuleRef:
      out->append(g.rule(e.rule).name);
      return;
    case ExprKind::kToken:
      if (e.token_id >= 0) {
        absl::StrAppend(out, "<[", e.token_id, "]>");
      } else {
        out->append(e.text);  // IsTokenText: already <...>
      }
      return;
    case ExprKind::kSequence:
    case ExprKind::kChoice: {
      out->push_back('(');
      for (size_t i = 0; i < e.children.size(); ++i) {
        if (i > 0) out->append(e.kind == ExprKind::kChoice ? " | " : " ");
        Print(g, e.children[i], out);
      }
      out->push_back(')');
      return;
    }
    case ExprKind::kRepeat:
      Print(g, e.children[0], out);
      if (e.min_count == 0 && e.max_count == -1) {
        out->push_back('*');
      } else if (e.min_count == 1 && e.max_count == -1) {
        out->push_back('+');
      } else if (e.min_count == 0 && e.max_count == 1) {
        out->push_back('?');
      } else if (e.max_count == -1) {
        absl::StrAppend(out, "{", e.min_count, ",}");
      } else if (e.max_count == e.min_count) {
        absl::StrAppend(out, "{", e.min_count, "}");
      } else {
        absl::StrAppend(out, "{", e.min_count, ",", e.max_count, "}");
      }
      return;
  }
}

}  // namespace

std::string ExprToString(const Grammar& grammar, const Expr& expr) {
  std::string out;
  Print(grammar, expr, &out);
  return out;
}

std::string Grammar::ToString() const {
  std::string out;
  auto print_rule = [&](int32_t i) {
    absl::StrAppend(&out, rules_[i].name, " ::= ");
    Print(*this, rules_[i].body, &out);
    out.push_back('\n');
  };
  if (root_ < num_rules()) print_rule(root_);
  for (int32_t i = 0; i < num_rules(); ++i) {
    if (i != root_) print_rule(i);
  }
  return out;
}

}  // namespace sluice::grammar
