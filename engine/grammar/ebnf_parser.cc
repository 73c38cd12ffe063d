#include "engine/grammar/ebnf_parser.h"

#include <cctype>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "engine/grammar/text_escapes.h"

namespace sluice::grammar {
namespace {

bool IsNameChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
}

class Parser {
 public:
  explicit Parser(absl::string_view text) : text_(text) {}

  absl::StatusOr<Grammar> Parse(absl::string_view root_rule) {
    SkipSpace();
    if (pos_ >= text_.size()) return Error("the grammar is empty");
    while (pos_ < text_.size()) {
      const size_t name_pos = pos_;
      std::string name = ReadName();
      if (name.empty()) return Error("expected a rule name");
      SkipSpace();
      if (text_.substr(pos_, 3) != "::=") return Error(absl::StrCat("expected '::=' after '", name, "'"));
      pos_ += 3;
      const int32_t index = RuleIndex(name);
      if (defined_.contains(index)) {
        pos_ = name_pos;
        return Error(absl::StrCat("rule '", name, "' is defined twice"));
      }
      defined_[index] = true;
      absl::StatusOr<Expr> body = ParseChoice(0);
      if (!body.ok()) return body.status();
      grammar_.rule(index).body = *std::move(body);
      SkipSpace();
    }
    for (int32_t i = 0; i < grammar_.num_rules(); ++i) {
      if (!defined_.contains(i)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "grammar error: rule '", grammar_.rule(i).name, "' is used but never defined"));
      }
    }
    std::optional<int32_t> root = grammar_.FindRule(root_rule);
    if (!root.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat("grammar error: there is no rule named '", root_rule, "'"));
    }
    grammar_.set_root(*root);
    return std::move(grammar_);
  }

 private:
  absl::Status Error(absl::string_view what) const {
    int line = 1, col = 1;
    for (size_t i = 0; i < pos_ && i < text_.size(); ++i) {
      if (text_[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    return absl::InvalidArgumentError(
        absl::StrCat("grammar syntax error at line ", line, " column ", col, ": ", what));
  }

  void SkipSpace() {
    while (pos_ < text_.size()) {
      const char c = text_[pos_];
      if (c == '#') {
        while (pos_ < text_.size() && text_[pos_] != '\n') ++pos_;
      } else if (std::isspace(static_cast<unsigned char>(c))) {
        ++pos_;
      } else {
        break;
      }
    }
  }

  std::string ReadName() {
    const size_t start = pos_;
    while (pos_ < text_.size() && IsNameChar(text_[pos_])) ++pos_;
    return std::string(text_.substr(start, pos_ - start));
  }

  int32_t RuleIndex(const std::string& name) {
    auto it = names_.find(name);
    if (it != names_.end()) return it->second;
    const int32_t index = grammar_.AddRule(name);
    names_[name] = index;
    return index;
  }

  // AtRuleStart: the next tokens are `name ::=` (the current rule's body ends here).
  bool AtRuleStart() const {
    size_t p = pos_;
    while (p < text_.size() && IsNameChar(text_[p])) ++p;
    if (p == pos_) return false;
    while (p < text_.size() && std::isspace(static_cast<unsigned char>(text_[p]))) ++p;
    return text_.substr(p, 3) == "::=";
  }

  absl::StatusOr<Expr> ParseChoice(int depth) {
    if (depth > 200) return Error("groups nested too deeply");
    std::vector<Expr> alternatives;
    while (true) {
      absl::StatusOr<Expr> seq = ParseSequence(depth);
      if (!seq.ok()) return seq.status();
      alternatives.push_back(*std::move(seq));
      SkipSpace();
      if (pos_ < text_.size() && text_[pos_] == '|') {
        ++pos_;
        continue;
      }
      break;
    }
    return Choice(std::move(alternatives));
  }

  absl::StatusOr<Expr> ParseSequence(int depth) {
    std::vector<Expr> items;
    while (true) {
      SkipSpace();
      if (pos_ >= text_.size()) break;
      const char c = text_[pos_];
      if (c == '|' || c == ')') break;
      if (IsNameChar(c) && AtRuleStart()) break;
      absl::StatusOr<Expr> item = ParsePrimary(depth);
      if (!item.ok()) return item.status();
      absl::StatusOr<Expr> repeated = ParsePostfix(*std::move(item));
      if (!repeated.ok()) return repeated.status();
      items.push_back(*std::move(repeated));
    }
    if (items.empty()) return Empty();
    return Sequence(std::move(items));
  }

  absl::StatusOr<Expr> ParsePrimary(int depth) {
    const char c = text_[pos_];
    if (c == '"') {
      ++pos_;
      std::string bytes;
      while (true) {
        if (pos_ >= text_.size() || text_[pos_] == '\n') return Error("unterminated string literal");
        if (text_[pos_] == '"') {
          ++pos_;
          break;
        }
        absl::StatusOr<char32_t> cp = ReadChar();
        if (!cp.ok()) return cp.status();
        AppendCodepoint(*cp, &bytes);
      }
      return Literal(bytes);
    }
    if (c == '[') {
      ++pos_;
      bool negated = false;
      if (pos_ < text_.size() && text_[pos_] == '^') {
        negated = true;
        ++pos_;
      }
      std::vector<CodepointRange> ranges;
      while (true) {
        if (pos_ >= text_.size()) return Error("unterminated character class");
        if (text_[pos_] == ']') {
          ++pos_;
          break;
        }
        absl::StatusOr<char32_t> lo = ReadChar();
        if (!lo.ok()) return lo.status();
        char32_t hi = *lo;
        if (pos_ + 1 < text_.size() && text_[pos_] == '-' && text_[pos_ + 1] != ']') {
          ++pos_;
          absl::StatusOr<char32_t> h = ReadChar();
          if (!h.ok()) return h.status();
          hi = *h;
          if (hi < *lo) return Error("character range is out of order");
        }
        ranges.push_back(CodepointRange{*lo, hi});
      }
      if (ranges.empty() && !negated) return Error("empty character class");
      return CharClass(std::move(ranges), negated);
    }
    if (c == '.') {
      ++pos_;
      return CharClass({}, /*negated=*/true);
    }
    if (c == '<') return ParseToken();
    if (c == '(') {
      ++pos_;
      absl::StatusOr<Expr> inner = ParseChoice(depth + 1);
      if (!inner.ok()) return inner.status();
      SkipSpace();
      if (pos_ >= text_.size() || text_[pos_] != ')') return Error("expected ')'");
      ++pos_;
      return inner;
    }
    if (IsNameChar(c)) return RuleRef(RuleIndex(ReadName()));
    return Error(absl::StrCat("unexpected character '", std::string(1, c), "'"));
  }

  // ParseToken reads a token terminal: <[id]> or <content> (the token's text, e.g. <think>).
  absl::StatusOr<Expr> ParseToken() {
    const size_t end = text_.find('>', pos_);
    const size_t newline = text_.find('\n', pos_);
    if (end == absl::string_view::npos || (newline != absl::string_view::npos && newline < end)) {
      return Error("unterminated token: expected '>'");
    }
    const absl::string_view token = text_.substr(pos_, end + 1 - pos_);
    if (token.size() > 4 && token[1] == '[' && token[token.size() - 2] == ']') {
      int64_t id = 0;
      for (char d : token.substr(2, token.size() - 4)) {
        if (!std::isdigit(static_cast<unsigned char>(d)) || id > 100000000) {
          return Error("a token id <[N]> needs a decimal number N");
        }
        id = id * 10 + (d - '0');
      }
      pos_ = end + 1;
      return TokenById(static_cast<int32_t>(id));
    }
    if (!IsTokenText(token)) return Error("empty token '<>'");
    pos_ = end + 1;
    return Token(token);
  }

  absl::StatusOr<Expr> ParsePostfix(Expr item) {
    while (pos_ < text_.size()) {
      const char c = text_[pos_];
      if (c == '*') {
        ++pos_;
        item = Star(std::move(item));
      } else if (c == '+') {
        ++pos_;
        item = Plus(std::move(item));
      } else if (c == '?') {
        ++pos_;
        item = Optional(std::move(item));
      } else if (c == '{') {
        ++pos_;
        absl::StatusOr<std::pair<int32_t, int32_t>> counts = ReadCounts();
        if (!counts.ok()) return counts.status();
        item = Repeat(std::move(item), counts->first, counts->second);
      } else {
        break;
      }
    }
    return item;
  }

  absl::StatusOr<std::pair<int32_t, int32_t>> ReadCounts() {
    auto read_int = [&]() -> int64_t {
      SkipSpace();
      int64_t v = -1;
      while (pos_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[pos_]))) {
        v = (v < 0 ? 0 : v) * 10 + (text_[pos_++] - '0');
        if (v > 100000) return -2;
      }
      SkipSpace();
      return v;
    };
    const int64_t lo = read_int();
    if (lo < 0) return Error("expected a repetition count");
    int64_t hi = lo;
    if (pos_ < text_.size() && text_[pos_] == ',') {
      ++pos_;
      hi = read_int();
      if (hi == -2) return Error("repetition count too large");
    }
    if (pos_ >= text_.size() || text_[pos_] != '}') return Error("expected '}'");
    ++pos_;
    if (hi >= 0 && hi < lo) return Error("repetition bounds are out of order");
    return std::make_pair(static_cast<int32_t>(lo), static_cast<int32_t>(hi));
  }

  // ReadChar reads one (possibly escaped) code point of a literal or class.
  absl::StatusOr<char32_t> ReadChar() {
    absl::string_view rest = text_.substr(pos_);
    absl::StatusOr<std::pair<char32_t, size_t>> r = DecodeEscapedChar(rest);
    if (!r.ok()) return Error(r.status().message());
    pos_ += r->second;
    return r->first;
  }

  absl::string_view text_;
  size_t pos_ = 0;
  Grammar grammar_;
  absl::flat_hash_map<std::string, int32_t> names_;
  absl::flat_hash_map<int32_t, bool> defined_;
};

}  // namespace

absl::StatusOr<Grammar> ParseEbnf(absl::string_view text, absl::string_view root_rule) {
  return Parser(text).Parse(root_rule);
}

}  // namespace sluice::grammar
