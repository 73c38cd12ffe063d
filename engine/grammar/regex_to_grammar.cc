#include "engine/grammar/regex_to_grammar.h"

#include <algorithm>
#include <cctype>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/grammar/text_escapes.h"

namespace sluice::grammar {

std::vector<CodepointRange> NormalizeRanges(std::vector<CodepointRange> ranges) {
  std::sort(ranges.begin(), ranges.end(),
            [](const CodepointRange& a, const CodepointRange& b) { return a.lo < b.lo; });
  std::vector<CodepointRange> out;
  for (const CodepointRange& r : ranges) {
    if (!out.empty() && r.lo <= out.back().hi + 1) {
      out.back().hi = std::max(out.back().hi, r.hi);
    } else {
      out.push_back(r);
    }
  }
  return out;
}

std::vector<CodepointRange> ComplementRanges(const std::vector<CodepointRange>& ranges) {
  std::vector<CodepointRange> norm = NormalizeRanges(ranges);
  // The surrogates are never characters: treat them as part of the set being complemented.
  norm.push_back(CodepointRange{0xD800, 0xDFFF});
  norm = NormalizeRanges(std::move(norm));
  std::vector<CodepointRange> out;
  char32_t next = 0;
  for (const CodepointRange& r : norm) {
    if (r.lo > next) out.push_back(CodepointRange{next, r.lo - 1});
    next = r.hi + 1;
  }
  if (next <= 0x10FFFF) out.push_back(CodepointRange{next, 0x10FFFF});
  return out;
}

namespace {

const std::vector<CodepointRange> kDigit = {{'0', '9'}};
const std::vector<CodepointRange> kWord = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
const std::vector<CodepointRange> kSpace = {{'\t', '\r'}, {' ', ' '}};

class RegexParser {
 public:
  explicit RegexParser(absl::string_view p) : p_(p) {}

  absl::StatusOr<Expr> Parse() {
    if (!p_.empty() && p_[0] == '^') ++pos_;
    absl::StatusOr<Expr> e = ParseAlternation(0);
    if (!e.ok()) return e;
    if (pos_ < p_.size()) {
      if (p_[pos_] == ')') return Error("unmatched ')'");
      return Error("unexpected character");
    }
    return e;
  }

 private:
  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrCat("regex error at offset ", pos_, " in '", p_, "': ", what));
  }
  absl::Status Unsupported(absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat("regex '", p_, "' uses ", what,
                                                   ", which is not supported (offset ", pos_, ")"));
  }
  bool AtEndAnchor() const {
    // `$` (or \z, \Z) is allowed only as the pattern's last item, or right before `|` or `)`
    // at the top level ends an alternative; we only accept the very end.
    return pos_ + 1 == p_.size();
  }

  absl::StatusOr<Expr> ParseAlternation(int depth) {
    if (depth > 200) return Error("groups nested too deeply");
    std::vector<Expr> alts;
    while (true) {
      absl::StatusOr<Expr> seq = ParseConcat(depth);
      if (!seq.ok()) return seq;
      alts.push_back(*std::move(seq));
      if (pos_ < p_.size() && p_[pos_] == '|') {
        ++pos_;
        continue;
      }
      break;
    }
    return Choice(std::move(alts));
  }

  absl::StatusOr<Expr> ParseConcat(int depth) {
    std::vector<Expr> items;
    std::string pending;  // adjacent literal characters merge into one literal
    auto flush = [&]() {
      if (!pending.empty()) items.push_back(Literal(pending));
      pending.clear();
    };
    while (pos_ < p_.size() && p_[pos_] != '|' && p_[pos_] != ')') {
      if (p_[pos_] == '$') {
        if (!AtEndAnchor()) return Unsupported("'$' before the end of the pattern");
        ++pos_;
        continue;
      }
      if (p_[pos_] == '^') return Unsupported("'^' after the start of the pattern");
      absl::StatusOr<Expr> atom = ParseAtom(depth);
      if (!atom.ok()) return atom;
      absl::StatusOr<std::pair<bool, Expr>> q = ParseQuantifier(*std::move(atom));
      if (!q.ok()) return q.status();
      auto& [quantified, e] = *q;
      if (!quantified && e.kind == ExprKind::kLiteral) {
        pending += e.text;
      } else if (e.kind != ExprKind::kEmpty) {
        flush();
        items.push_back(std::move(e));
      }
    }
    flush();
    return Sequence(std::move(items));
  }

  absl::StatusOr<std::pair<bool, Expr>> ParseQuantifier(Expr atom) {
    bool quantified = false;
    while (pos_ < p_.size()) {
      const char c = p_[pos_];
      int32_t lo = 0, hi = -1;
      if (c == '*') {
        ++pos_;
      } else if (c == '+') {
        lo = 1;
        ++pos_;
      } else if (c == '?') {
        hi = 1;
        ++pos_;
      } else if (c == '{') {
        size_t p = pos_ + 1;
        auto read = [&]() -> int64_t {
          int64_t v = -1;
          while (p < p_.size() && std::isdigit(static_cast<unsigned char>(p_[p]))) {
            v = (v < 0 ? 0 : v) * 10 + (p_[p++] - '0');
            if (v > 100000) v = 100001;
          }
          return v;
        };
        const int64_t a = read();
        int64_t b = a;
        if (p < p_.size() && p_[p] == ',') {
          ++p;
          b = read();
          if (b < 0) b = -1;
        }
        if (a < 0 || p >= p_.size() || p_[p] != '}') break;  // a literal '{' (PCRE)
        if (a > 100000 || b > 100000) return Unsupported("a repetition count over 100000");
        if (b >= 0 && b < a) return Error("repetition bounds are out of order");
        pos_ = p + 1;
        lo = static_cast<int32_t>(a);
        hi = static_cast<int32_t>(b);
      } else {
        break;
      }
      if (pos_ < p_.size() && p_[pos_] == '?') {
        ++pos_;  // lazy: the same set of full matches
      } else if (pos_ < p_.size() && p_[pos_] == '+') {
        return Unsupported("a possessive quantifier");
      }
      atom = Repeat(std::move(atom), lo, hi);
      quantified = true;
    }
    return std::make_pair(quantified, std::move(atom));
  }

  absl::StatusOr<Expr> ParseAtom(int depth) {
    const char c = p_[pos_];
    if (c == '(') {
      ++pos_;
      if (pos_ < p_.size() && p_[pos_] == '?') {
        absl::string_view rest = p_.substr(pos_);
        if (absl::StartsWith(rest, "?:")) {
          pos_ += 2;
        } else if (absl::StartsWith(rest, "?=") || absl::StartsWith(rest, "?!")) {
          return Unsupported("a lookahead assertion");
        } else if (absl::StartsWith(rest, "?<=") || absl::StartsWith(rest, "?<!")) {
          return Unsupported("a lookbehind assertion");
        } else if (absl::StartsWith(rest, "?>")) {
          return Unsupported("an atomic group");
        } else if (absl::StartsWith(rest, "?<") || absl::StartsWith(rest, "?P<") || absl::StartsWith(rest, "?'")) {
          const char close = rest[1] == '\'' ? '\'' : '>';
          const size_t end = p_.find(close, pos_ + 2);
          if (end == absl::string_view::npos) return Error("unterminated group name");
          pos_ = end + 1;
        } else if (absl::StartsWith(rest, "?P=")) {
          return Unsupported("a backreference");
        } else {
          return Unsupported("inline flags or a special group");
        }
      }
      absl::StatusOr<Expr> inner = ParseAlternation(depth + 1);
      if (!inner.ok()) return inner;
      if (pos_ >= p_.size() || p_[pos_] != ')') return Error("missing ')'");
      ++pos_;
      return inner;
    }
    if (c == '[') return ParseClass();
    if (c == '.') {
      ++pos_;
      return CharClass(ComplementRanges({{'\n', '\n'}}));
    }
    if (c == '*' || c == '+' || c == '?') return Error("quantifier without a preceding item");
    if (c == '\\') {
      std::vector<CodepointRange> ranges;
      absl::StatusOr<int> kind = ParseEscape(/*in_class=*/false, &ranges);
      if (!kind.ok()) return kind.status();
      if (*kind == 0) return Empty();  // \A, \z at an allowed place
      if (*kind == 1 && ranges.size() == 1 && ranges[0].lo == ranges[0].hi) {
        std::string s;
        AppendCodepoint(ranges[0].lo, &s);
        return Literal(s);
      }
      return CharClass(NormalizeRanges(std::move(ranges)));
    }
    auto [cp, len] = DecodeUtf8Char(p_.substr(pos_));
    if (len == 0) return Error("invalid UTF-8");
    pos_ += len;
    std::string s;
    AppendCodepoint(cp, &s);
    return Literal(s);
  }

  // ParseEscape reads an escape at pos_ (a backslash). Returns 1 and appends the code points it
  // stands for to `ranges`, or 0 for an anchor that matches the empty string.
  absl::StatusOr<int> ParseEscape(bool in_class, std::vector<CodepointRange>* ranges) {
    if (pos_ + 1 >= p_.size()) return Error("pattern ends with a backslash");
    const char e = p_[pos_ + 1];
    auto add = [&](const std::vector<CodepointRange>& set, bool negate) {
      const std::vector<CodepointRange> r = negate ? ComplementRanges(set) : set;
      ranges->insert(ranges->end(), r.begin(), r.end());
      pos_ += 2;
      return 1;
    };
    switch (e) {
      case 'd': return add(kDigit, false);
      case 'D': return add(kDigit, true);
      case 'w': return add(kWord, false);
      case 'W': return add(kWord, true);
      case 's': return add(kSpace, false);
      case 'S': return add(kSpace, true);
      case 'b':
        if (in_class) {
          pos_ += 2;
          ranges->push_back({'\b', '\b'});
          return 1;
        }
        return Unsupported("a word boundary (\\b)");
      case 'B': return Unsupported("a word boundary (\\B)");
      case 'k': return Unsupported("a backreference (\\k)");
      case 'g': return Unsupported("a backreference (\\g)");
      case 'p':
      case 'P': return Unsupported("a Unicode property (\\p)");
      case 'A':
        if (in_class || pos_ != 0) return Unsupported("'\\A' after the start of the pattern");
        pos_ += 2;
        return 0;
      case 'z':
      case 'Z':
        if (in_class || pos_ + 2 != p_.size()) {
          return Unsupported("'\\z' before the end of the pattern");
        }
        pos_ += 2;
        return 0;
      default:
        break;
    }
    if (e >= '1' && e <= '9') return Unsupported(absl::StrCat("a backreference (\\", std::string(1, e), ")"));
    if (std::isalpha(static_cast<unsigned char>(e)) &&
        absl::string_view("nrtfvxuU").find(e) == absl::string_view::npos) {
      return Unsupported(absl::StrCat("the escape '\\", std::string(1, e), "'"));
    }
    absl::StatusOr<std::pair<char32_t, size_t>> r = DecodeEscapedChar(p_.substr(pos_));
    if (!r.ok()) return Error(r.status().message());
    pos_ += r->second;
    ranges->push_back({r->first, r->first});
    return 1;
  }

  absl::StatusOr<Expr> ParseClass() {
    ++pos_;  // '['
    bool negated = false;
    if (pos_ < p_.size() && p_[pos_] == '^') {
      negated = true;
      ++pos_;
    }
    std::vector<CodepointRange> ranges;
    bool first = true;
    while (true) {
      if (pos_ >= p_.size()) return Error("unterminated character class");
      const char c = p_[pos_];
      if (c == ']' && !first) {
        ++pos_;
        break;
      }
      first = false;
      if (c == '[' && pos_ + 1 < p_.size() && p_[pos_ + 1] == ':') {
        return Unsupported("a POSIX class ([:name:])");
      }
      char32_t lo;
      if (c == '\\') {
        std::vector<CodepointRange> r;
        absl::StatusOr<int> kind = ParseEscape(/*in_class=*/true, &r);
        if (!kind.ok()) return kind.status();
        if (r.size() != 1 || r[0].lo != r[0].hi) {
          ranges.insert(ranges.end(), r.begin(), r.end());
          continue;
        }
        lo = r[0].lo;
      } else {
        auto [cp, len] = DecodeUtf8Char(p_.substr(pos_));
        if (len == 0) return Error("invalid UTF-8");
        pos_ += len;
        lo = cp;
      }
      char32_t hi = lo;
      if (pos_ + 1 < p_.size() && p_[pos_] == '-' && p_[pos_ + 1] != ']') {
        ++pos_;
        if (p_[pos_] == '\\') {
          std::vector<CodepointRange> r;
          absl::StatusOr<int> kind = ParseEscape(true, &r);
          if (!kind.ok()) return kind.status();
          if (r.size() != 1 || r[0].lo != r[0].hi) return Error("a class cannot end a range");
          hi = r[0].lo;
        } else {
          auto [cp, len] = DecodeUtf8Char(p_.substr(pos_));
          if (len == 0) return Error("invalid UTF-8");
          pos_ += len;
          hi = cp;
        }
        if (hi < lo) return Error("character range is out of order");
      }
      ranges.push_back({lo, hi});
    }
    ranges = NormalizeRanges(std::move(ranges));
    if (negated) ranges = ComplementRanges(ranges);
    if (ranges.empty()) return Choice({});  // matches nothing
    return CharClass(std::move(ranges));
  }

  absl::string_view p_;
  size_t pos_ = 0;
};

}  // namespace

absl::StatusOr<Expr> RegexToExpr(absl::string_view pattern) { return RegexParser(pattern).Parse(); }

absl::StatusOr<Grammar> RegexToGrammar(absl::string_view pattern) {
  absl::StatusOr<Expr> e = RegexToExpr(pattern);
  if (!e.ok()) return e.status();
  Grammar g;
  g.set_root(g.AddRule("root", *std::move(e)));
  return g;
}

}  // namespace sluice::grammar
