#include "engine/tokenizer/bpe_regex_translate.h"

namespace sluice {
namespace {

// Unicode White_Space (PropList.txt), as PCRE2 class items.
constexpr std::string_view kWhiteSpace =
    R"(\t\n\x{0B}\f\r\x{20}\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F})"
    R"(\x{205F}\x{3000})";

// Code points with General_Category L* assigned in Unicode 15.0-16.0.
constexpr std::string_view kLettersSince15 =
    R"(\x{1C89}-\x{1C8A}\x{A7CB}-\x{A7CD}\x{A7DA}-\x{A7DC}\x{105C0}-\x{105F3})"
    R"(\x{10D4A}-\x{10D65}\x{10D6F}-\x{10D85}\x{10EC2}-\x{10EC4}\x{1123F}-\x{11240})"
    R"(\x{11380}-\x{11389}\x{1138B}\x{1138E}\x{11390}-\x{113B5}\x{113B7}\x{113D1}\x{113D3})"
    R"(\x{11BC0}-\x{11BE0}\x{11F02}\x{11F04}-\x{11F10}\x{11F12}-\x{11F33}\x{1342F})"
    R"(\x{13441}-\x{13446}\x{13460}-\x{143FA}\x{16100}-\x{1611D}\x{16D40}-\x{16D6C}\x{18CFF})"
    R"(\x{1B132}\x{1B155}\x{1DF25}-\x{1DF2A}\x{1E030}-\x{1E06D}\x{1E4D0}-\x{1E4EB})"
    R"(\x{1E5D0}-\x{1E5ED}\x{1E5F0}\x{2B739}\x{2EBF0}-\x{2EE5D}\x{31350}-\x{323AF})";

// Code points with General_Category N* assigned in Unicode 15.0-16.0.
constexpr std::string_view kNumbersSince15 =
    R"(\x{10D40}-\x{10D49}\x{116D0}-\x{116E3}\x{11BF0}-\x{11BF9}\x{11F50}-\x{11F59})"
    R"(\x{16130}-\x{16139}\x{16D70}-\x{16D79}\x{1CCF0}-\x{1CCF9}\x{1D2C0}-\x{1D2D3})"
    R"(\x{1E4F0}-\x{1E4F9}\x{1E5F1}-\x{1E5FA})";

// Appends `items` (class contents) either inside the current class or as a class of its own.
void AppendClass(std::string_view items, bool in_class, bool negate, std::string* out) {
  if (in_class) {
    out->append(items);
    return;
  }
  out->append(negate ? "[^" : "[");
  out->append(items);
  out->push_back(']');
}

}  // namespace

std::string TranslateOnigurumaPattern(std::string_view pattern) {
  std::string out;
  out.reserve(pattern.size() * 2);
  bool in_class = false;
  size_t i = 0;
  while (i < pattern.size()) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char d = pattern[i + 1];
      if (d == 's' || (d == 'S' && !in_class)) {
        AppendClass(kWhiteSpace, in_class, d == 'S', &out);
        i += 2;
        continue;
      }
      const std::string_view property = pattern.substr(i + 2, 3);
      if ((d == 'p' || d == 'P') && (property == "{L}" || property == "{N}")) {
        const bool letters = pattern[i + 3] == 'L';
        const bool negate = d == 'P';
        if (!(negate && in_class)) {  // a negated property inside a class is left alone
          std::string items = letters ? "\\p{L}" : "\\p{N}";
          items.append(letters ? kLettersSince15 : kNumbersSince15);
          AppendClass(items, in_class, negate, &out);
          i += 5;
          continue;
        }
      }
      out.append(pattern.substr(i, 2));  // any other escape, including "\\" and "\]"
      i += 2;
      continue;
    }
    if (c == '[' && !in_class) {
      in_class = true;
      out.push_back(c);
      ++i;
      if (i < pattern.size() && pattern[i] == '^') out.push_back(pattern[i++]);
      if (i < pattern.size() && pattern[i] == ']') out.push_back(pattern[i++]);  // literal ]
      continue;
    }
    if (c == '[' && in_class && i + 1 < pattern.size() && pattern[i + 1] == ':') {
      const size_t close = pattern.find(":]", i + 2);  // POSIX class such as [:alpha:]
      if (close != std::string_view::npos) {
        out.append(pattern.substr(i, close + 2 - i));
        i = close + 2;
        continue;
      }
    }
    if (c == ']' && in_class) in_class = false;
    out.push_back(c);
    ++i;
  }
  return out;
}

}  // namespace sluice
