#include "services/api/tool_calls/json_scan.h"

#include "nlohmann/json.hpp"

namespace sluice::tools {

size_t SkipJsonSpace(absl::string_view text, size_t pos) {
  while (pos < text.size() &&
         (text[pos] == ' ' || text[pos] == '\n' || text[pos] == '\r' || text[pos] == '\t')) {
    ++pos;
  }
  return pos;
}

std::optional<size_t> ScanJsonValue(absl::string_view text, size_t pos, bool final) {
  if (pos >= text.size()) return std::nullopt;
  const char first = text[pos];
  if (first != '{' && first != '[' && first != '"') {
    // Number or literal: it ends at the first byte that cannot continue it.
    size_t end = pos;
    while (end < text.size() && text[end] != ',' && text[end] != '}' && text[end] != ']' &&
           text[end] != ' ' && text[end] != '\n' && text[end] != '\r' && text[end] != '\t') {
      ++end;
    }
    if (end == text.size() && !final) return std::nullopt;
    return end;
  }
  int depth = 0;
  bool in_string = false;
  for (size_t i = pos; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;  // the escaped byte
      } else if (c == '"') {
        in_string = false;
        if (depth == 0) return i + 1;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      ++depth;
    } else if (c == '}' || c == ']') {
      if (--depth == 0) return i + 1;
    }
  }
  return std::nullopt;
}

std::optional<size_t> ScanJsonString(absl::string_view text, size_t pos, std::string* out) {
  if (pos >= text.size() || text[pos] != '"') return std::nullopt;
  std::optional<size_t> end = ScanJsonValue(text, pos, /*final=*/false);
  if (!end.has_value()) return std::nullopt;
  nlohmann::json value = nlohmann::json::parse(text.substr(pos, *end - pos), nullptr,
                                               /*allow_exceptions=*/false);
  if (value.is_discarded() || !value.is_string()) return std::nullopt;
  *out = value.get<std::string>();
  return end;
}

}  // namespace sluice::tools
