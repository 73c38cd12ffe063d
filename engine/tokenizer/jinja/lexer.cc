#include "engine/tokenizer/jinja/lexer.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"
#include "engine/tokenizer/jinja/value.h"

namespace sluice::jinja {
namespace {

bool IsSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}
bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsNameStart(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool IsNameChar(char c) { return IsNameStart(c) || IsDigit(c); }

std::string NormalizeNewlines(const std::string& source, bool keep_trailing_newline) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out.push_back('\n');
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out.push_back(source[i]);
    }
  }
  if (!keep_trailing_newline && !out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

// Unescape applies Python's "unicode-escape" decoding (what Jinja applies to literals).
std::string Unescape(absl::string_view body) {
  std::string out;
  for (size_t i = 0; i < body.size(); ++i) {
    const char c = body[i];
    if (c != '\\' || i + 1 >= body.size()) {
      out.push_back(c);
      continue;
    }
    const char e = body[++i];
    auto hex_run = [&](size_t count) -> bool {
      uint32_t cp = 0;
      for (size_t k = 1; k <= count; ++k) {
        if (i + k >= body.size()) return false;
        const char h = body[i + k];
        int d = -1;
        if (h >= '0' && h <= '9') d = h - '0';
        if (h >= 'a' && h <= 'f') d = h - 'a' + 10;
        if (h >= 'A' && h <= 'F') d = h - 'A' + 10;
        if (d < 0) return false;
        cp = cp * 16 + static_cast<uint32_t>(d);
      }
      if (cp > 0x10FFFF) return false;
      Utf8Append(cp, &out);
      i += count;
      return true;
    };
    switch (e) {
      case '\n':
        break;
      case '\\':
        out.push_back('\\');
        break;
      case '\'':
        out.push_back('\'');
        break;
      case '"':
        out.push_back('"');
        break;
      case 'a':
        out.push_back('\a');
        break;
      case 'b':
        out.push_back('\b');
        break;
      case 'f':
        out.push_back('\f');
        break;
      case 'n':
        out.push_back('\n');
        break;
      case 'r':
        out.push_back('\r');
        break;
      case 't':
        out.push_back('\t');
        break;
      case 'v':
        out.push_back('\v');
        break;
      case 'x':
        if (!hex_run(2)) out.append("\\x");
        break;
      case 'u':
        if (!hex_run(4)) out.append("\\u");
        break;
      case 'U':
        if (!hex_run(8)) out.append("\\U");
        break;
      default:
        if (e >= '0' && e <= '7') {
          uint32_t cp = static_cast<uint32_t>(e - '0');
          for (int k = 0; k < 2 && i + 1 < body.size() && body[i + 1] >= '0' && body[i + 1] <= '7';
               ++k) {
            cp = cp * 8 + static_cast<uint32_t>(body[++i] - '0');
          }
          Utf8Append(cp, &out);
        } else {
          // Unknown escapes keep their backslash (Python behaviour).
          out.push_back('\\');
          out.push_back(e);
        }
        break;
    }
  }
  return out;
}

class Lexer {
 public:
  Lexer(std::string source, const LexOptions& options)
      : src_(std::move(source)), options_(options) {}

  absl::StatusOr<std::vector<Token>> Run() {
    bool line_starting = true;
    while (pos_ < src_.size()) {
      size_t start = FindTagStart(pos_);
      if (start == std::string::npos) {
        EmitText(src_.substr(pos_), pos_);
        pos_ = src_.size();
        break;
      }
      std::string text = src_.substr(pos_, start - pos_);
      const char kind = src_[start + 1];
      const char mod = start + 2 < src_.size() ? src_[start + 2] : '\0';
      const bool has_mod = mod == '-' || mod == '+';
      // A block tag `{% raw %}` is recognised before any other tag rule.
      size_t raw_body = std::string::npos;
      if (kind == '%') raw_body = MatchRawBegin(start + 2 + (has_mod ? 1 : 0));
      ApplyLeftStrip(&text, has_mod ? mod : '\0', kind != '{', line_starting);
      EmitText(std::move(text), pos_);
      size_t p = start + 2 + (has_mod ? 1 : 0);
      if (raw_body != std::string::npos) {
        SLUICE_RETURN_IF_ERROR(LexRaw(start, raw_body, &line_starting));
        continue;
      }
      if (kind == '#') {
        SLUICE_RETURN_IF_ERROR(LexComment(start, p, &line_starting));
        continue;
      }
      const bool block = kind == '%';
      tokens_.push_back({block ? TokenType::kBlockBegin : TokenType::kVarBegin, block ? "{%" : "{{",
                         LineAt(start)});
      pos_ = p;
      SLUICE_RETURN_IF_ERROR(LexTag(block, start, &line_starting));
    }
    tokens_.push_back({TokenType::kEof, "", LineAt(src_.size())});
    return std::move(tokens_);
  }

 private:
  int LineAt(size_t pos) {
    // Positions are requested in increasing order, so count incrementally.
    if (pos < line_pos_) {
      line_pos_ = 0;
      line_ = 1;
    }
    for (; line_pos_ < pos && line_pos_ < src_.size(); ++line_pos_) {
      if (src_[line_pos_] == '\n') ++line_;
    }
    return line_;
  }

  absl::Status Error(size_t pos, absl::string_view message) {
    return absl::InvalidArgumentError(absl::StrCat("line ", LineAt(pos), ": ", message));
  }

  size_t FindTagStart(size_t from) const {
    for (size_t i = src_.find('{', from); i != std::string::npos; i = src_.find('{', i + 1)) {
      if (i + 1 < src_.size() && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) {
        return i;
      }
    }
    return std::string::npos;
  }

  void EmitText(std::string text, size_t pos) {
    if (text.empty()) return;
    tokens_.push_back({TokenType::kText, std::move(text), LineAt(pos)});
  }

  // ApplyLeftStrip implements `{%-` (strip all trailing whitespace of the text) and
  // lstrip_blocks (strip spaces between the line start and a block/comment tag).
  void ApplyLeftStrip(std::string* text, char mod, bool block_or_comment, bool line_starting) {
    if (mod == '-') {
      size_t end = text->size();
      while (end > 0 && IsSpace((*text)[end - 1])) --end;
      text->resize(end);
      return;
    }
    if (mod == '+' || !options_.lstrip_blocks || !block_or_comment) return;
    const size_t nl = text->rfind('\n');
    const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
    if (l_pos == 0 && !line_starting) return;
    if (l_pos >= text->size()) return;
    for (size_t i = l_pos; i < text->size(); ++i) {
      if (!IsSpace((*text)[i])) return;
    }
    text->resize(l_pos);
  }

  // SkipSpaces returns the first non-whitespace position at or after `p`.
  size_t SkipSpaces(size_t p) const {
    while (p < src_.size() && IsSpace(src_[p])) ++p;
    return p;
  }

  // MatchBlockEnd matches `-%}\s*`, `+%}` or `%}\n?` at `p`; returns the end or npos.
  size_t MatchBlockEnd(size_t p) const {
    if (src_.compare(p, 3, "-%}") == 0) return SkipSpaces(p + 3);
    if (src_.compare(p, 3, "+%}") == 0) return p + 3;
    if (src_.compare(p, 2, "%}") == 0) {
      p += 2;
      if (options_.trim_blocks && p < src_.size() && src_[p] == '\n') ++p;
      return p;
    }
    return std::string::npos;
  }

  // MatchRawBegin matches `\s*raw\s*(-%}\s*|%})` at `p`; returns the end or npos.
  size_t MatchRawBegin(size_t p) const {
    p = SkipSpaces(p);
    if (src_.compare(p, 3, "raw") != 0) return std::string::npos;
    p += 3;
    if (p < src_.size() && IsNameChar(src_[p])) return std::string::npos;
    p = SkipSpaces(p);
    if (src_.compare(p, 3, "-%}") == 0) return SkipSpaces(p + 3);
    if (src_.compare(p, 2, "%}") == 0) return p + 2;
    return std::string::npos;
  }

  absl::Status LexRaw(size_t tag_start, size_t body_start, bool* line_starting) {
    const bool body_line_starting = body_start > 0 && src_[body_start - 1] == '\n';
    for (size_t i = src_.find("{%", body_start); i != std::string::npos;
         i = src_.find("{%", i + 2)) {
      size_t p = i + 2;
      const char mod = p < src_.size() && (src_[p] == '-' || src_[p] == '+') ? src_[p] : '\0';
      if (mod != '\0') ++p;
      p = SkipSpaces(p);
      if (src_.compare(p, 6, "endraw") != 0) continue;
      p = SkipSpaces(p + 6);
      const size_t end = MatchBlockEnd(p);
      if (end == std::string::npos) continue;
      std::string text = src_.substr(body_start, i - body_start);
      ApplyLeftStrip(&text, mod, true, body_line_starting);
      EmitText(std::move(text), body_start);
      *line_starting = end > 0 && src_[end - 1] == '\n';
      pos_ = end;
      return absl::OkStatus();
    }
    return Error(tag_start, "Missing end of raw directive");
  }

  absl::Status LexComment(size_t tag_start, size_t p, bool* line_starting) {
    const size_t close = src_.find("#}", p);
    if (close == std::string::npos) return Error(tag_start, "Missing end of comment tag");
    size_t end = close + 2;
    if (close > p && src_[close - 1] == '-') {
      end = SkipSpaces(end);
    } else if (!(close > p && src_[close - 1] == '+') && options_.trim_blocks &&
               end < src_.size() && src_[end] == '\n') {
      ++end;
    }
    *line_starting = end > 0 && src_[end - 1] == '\n';
    pos_ = end;
    return absl::OkStatus();
  }

  absl::Status LexTag(bool block, size_t tag_start, bool* line_starting) {
    std::vector<char> brackets;
    while (true) {
      pos_ = SkipSpaces(pos_);
      if (pos_ >= src_.size()) {
        return Error(tag_start, block ? "unexpected end of template, expected end of statement "
                                        "block ('%}')"
                                      : "unexpected end of template, expected end of print "
                                        "statement ('}}')");
      }
      if (brackets.empty()) {
        size_t end = std::string::npos;
        if (block) {
          end = MatchBlockEnd(pos_);
        } else if (src_.compare(pos_, 3, "-}}") == 0) {
          end = SkipSpaces(pos_ + 3);
        } else if (src_.compare(pos_, 2, "}}") == 0) {
          end = pos_ + 2;
        }
        if (end != std::string::npos) {
          tokens_.push_back({block ? TokenType::kBlockEnd : TokenType::kVarEnd, block ? "%}" : "}}",
                             LineAt(pos_)});
          *line_starting = end > 0 && src_[end - 1] == '\n';
          pos_ = end;
          return absl::OkStatus();
        }
      }
      const size_t start = pos_;
      const char c = src_[pos_];
      if (IsNameStart(c)) {
        while (pos_ < src_.size() && IsNameChar(src_[pos_])) ++pos_;
        tokens_.push_back({TokenType::kName, src_.substr(start, pos_ - start), LineAt(start)});
        continue;
      }
      if (IsDigit(c)) {
        SLUICE_RETURN_IF_ERROR(LexNumber());
        continue;
      }
      if (c == '\'' || c == '"') {
        size_t p = pos_ + 1;
        while (p < src_.size() && src_[p] != c) {
          if (src_[p] == '\\') ++p;
          ++p;
        }
        if (p >= src_.size()) return Error(start, "unexpected end of string");
        tokens_.push_back({TokenType::kString,
                           Unescape(absl::string_view(src_).substr(pos_ + 1, p - pos_ - 1)),
                           LineAt(start)});
        pos_ = p + 1;
        continue;
      }
      static constexpr const char* kTwoCharOps[] = {"//", "**", "==", "!=", "<=", ">="};
      bool matched = false;
      for (const char* op : kTwoCharOps) {
        if (src_.compare(pos_, 2, op) == 0) {
          tokens_.push_back({TokenType::kOp, op, LineAt(start)});
          pos_ += 2;
          matched = true;
          break;
        }
      }
      if (matched) continue;
      if (c == '\0' || std::strchr("+-*/%~<>=()[]{},.:|;", c) == nullptr) {
        // Quote the whole UTF-8 sequence so that the message stays valid UTF-8.
        const std::vector<uint32_t> cps = Utf8Decode(
            absl::string_view(src_).substr(pos_, std::min<size_t>(4, src_.size() - pos_)));
        std::string shown;
        if (!cps.empty() && !(cps[0] >= 0xDC80 && cps[0] <= 0xDCFF)) Utf8Append(cps[0], &shown);
        if (shown.empty() || cps[0] < 0x20) {
          shown = absl::StrCat("\\x", absl::Hex(static_cast<unsigned char>(c), absl::kZeroPad2));
        }
        return Error(start, absl::StrCat("unexpected char '", shown, "'"));
      }
      if (c == '(' || c == '[' || c == '{') {
        if (brackets.size() > 512) return Error(start, "brackets nested too deeply");
        brackets.push_back(c == '(' ? ')' : (c == '[' ? ']' : '}'));
      } else if (c == ')' || c == ']' || c == '}') {
        if (brackets.empty())
          return Error(start, absl::StrCat("unexpected '", std::string(1, c), "'"));
        if (brackets.back() != c) {
          return Error(start, absl::StrCat("unexpected '", std::string(1, c), "', expected '",
                                           std::string(1, brackets.back()), "'"));
        }
        brackets.pop_back();
      }
      tokens_.push_back({TokenType::kOp, std::string(1, c), LineAt(start)});
      ++pos_;
    }
  }

  absl::Status LexNumber() {
    const size_t start = pos_;
    auto digits = [&](std::string* out) {
      while (pos_ < src_.size() &&
             (IsDigit(src_[pos_]) || (src_[pos_] == '_' && pos_ + 1 < src_.size() &&
                                      IsDigit(src_[pos_ + 1]) && pos_ > start))) {
        if (src_[pos_] != '_') out->push_back(src_[pos_]);
        ++pos_;
      }
    };
    std::string text;
    digits(&text);
    bool is_float = false;
    // After a '.', `x.0.1` is two integer subscripts (Jinja's float rule has `(?<!\.)`).
    const bool after_dot =
        !tokens_.empty() && tokens_.back().type == TokenType::kOp && tokens_.back().value == ".";
    if (!after_dot && pos_ + 1 < src_.size() && src_[pos_] == '.' && IsDigit(src_[pos_ + 1])) {
      ++pos_;
      text.push_back('.');
      digits(&text);
      is_float = true;
    }
    if (!after_dot && pos_ + 1 < src_.size() && src_[pos_] == 'e') {
      size_t p = pos_ + 1;
      if (p < src_.size() && (src_[p] == '+' || src_[p] == '-')) ++p;
      if (p < src_.size() && IsDigit(src_[p])) {
        text.push_back('e');
        if (src_[pos_ + 1] == '-') text.push_back('-');
        pos_ = p;
        digits(&text);
        is_float = true;
      }
    }
    tokens_.push_back({is_float ? TokenType::kFloat : TokenType::kInt, text, LineAt(start)});
    return absl::OkStatus();
  }

  std::string src_;
  LexOptions options_;
  size_t pos_ = 0;
  size_t line_pos_ = 0;
  int line_ = 1;
  std::vector<Token> tokens_;
};

}  // namespace

absl::StatusOr<std::vector<Token>> Tokenize(const std::string& source, const LexOptions& options) {
  Lexer lexer(NormalizeNewlines(source, options.keep_trailing_newline), options);
  return lexer.Run();
}

}  // namespace sluice::jinja
