#include "engine/grammar/text_escapes.h"

#include <cctype>

#include "absl/strings/str_cat.h"

namespace sluice::grammar {

std::pair<char32_t, size_t> DecodeUtf8Char(absl::string_view text) {
  const auto b = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  const unsigned char c = b(0);
  if (c < 0x80) return {c, 1};
  size_t len = 0;
  char32_t cp = 0;
  if ((c & 0xE0) == 0xC0 && c >= 0xC2) {
    len = 2;
    cp = c & 0x1F;
  } else if ((c & 0xF0) == 0xE0) {
    len = 3;
    cp = c & 0x0F;
  } else if ((c & 0xF8) == 0xF0 && c <= 0xF4) {
    len = 4;
    cp = c & 0x07;
  } else {
    return {0, 0};
  }
  if (text.size() < len) return {0, 0};
  for (size_t i = 1; i < len; ++i) {
    if ((b(i) & 0xC0) != 0x80) return {0, 0};
    cp = (cp << 6) | (b(i) & 0x3F);
  }
  const char32_t min_for_len[] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < min_for_len[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return {0, 0};
  return {cp, len};
}

absl::StatusOr<std::pair<char32_t, size_t>> DecodeEscapedChar(absl::string_view text) {
  if (text[0] != '\\') {
    auto [cp, len] = DecodeUtf8Char(text);
    if (len == 0) return absl::InvalidArgumentError("invalid UTF-8");
    return std::make_pair(cp, len);
  }
  if (text.size() < 2) return absl::InvalidArgumentError("dangling backslash");
  const char e = text[1];
  auto hex = [&](size_t digits) -> absl::StatusOr<std::pair<char32_t, size_t>> {
    if (text.size() < 2 + digits) return absl::InvalidArgumentError("short hex escape");
    char32_t v = 0;
    for (size_t i = 0; i < digits; ++i) {
      const char h = text[2 + i];
      if (!std::isxdigit(static_cast<unsigned char>(h))) {
        return absl::InvalidArgumentError("bad hex digit in escape");
      }
      v = v * 16 + static_cast<char32_t>(std::isdigit(static_cast<unsigned char>(h))
                                             ? h - '0'
                                             : (std::tolower(h) - 'a' + 10));
    }
    if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) {
      return absl::InvalidArgumentError("escape is not a Unicode scalar value");
    }
    return std::make_pair(v, 2 + digits);
  };
  switch (e) {
    case 'n': return std::make_pair(char32_t{'\n'}, size_t{2});
    case 'r': return std::make_pair(char32_t{'\r'}, size_t{2});
    case 't': return std::make_pair(char32_t{'\t'}, size_t{2});
    case 'f': return std::make_pair(char32_t{'\f'}, size_t{2});
    case 'v': return std::make_pair(char32_t{'\v'}, size_t{2});
    case '0': return std::make_pair(char32_t{0}, size_t{2});
    case 'x': return hex(2);
    case 'u': return hex(4);
    case 'U': return hex(8);
    default:
      if (std::ispunct(static_cast<unsigned char>(e)) || e == ' ') {
        return std::make_pair(static_cast<char32_t>(e), size_t{2});
      }
      return absl::InvalidArgumentError(absl::StrCat("unknown escape '\\", std::string(1, e), "'"));
  }
}

}  // namespace sluice::grammar
