#include "services/api/tool_calls/tool_call_syntax.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "services/api/tool_calls/json_scan.h"

namespace sluice::tools {

absl::StatusOr<std::shared_ptr<const ToolCallSyntax>> ToolCallSyntaxByName(absl::string_view name) {
  if (name == "hermes") return std::shared_ptr<const ToolCallSyntax>(MakeHermesSyntax());
  if (name == "llama3_json") return std::shared_ptr<const ToolCallSyntax>(MakeLlama3JsonSyntax());
  if (name == "deepseek_v3") return std::shared_ptr<const ToolCallSyntax>(MakeDeepSeekV3Syntax());
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown tool-call parser '", name, "' (use hermes, llama3_json or deepseek_v3)"));
}

std::shared_ptr<const ToolCallSyntax> DetectToolCallSyntax(absl::string_view source) {
  if (absl::StrContains(source, "<tool_call>")) return MakeHermesSyntax();
  if (absl::StrContains(source, "tool\xe2\x96\x81" "calls\xe2\x96\x81" "begin")) {
    return MakeDeepSeekV3Syntax();
  }
  // Llama 3.1+ templates describe calls as {"name": ..., "parameters": ...} and write
  // <|python_tag|> for built-in tools.
  if (absl::StrContains(source, "<|python_tag|>") ||
      absl::StrContains(source, "\"parameters\": dictionary")) {
    return MakeLlama3JsonSyntax();
  }
  return nullptr;
}

size_t HeldBackPrefix(absl::string_view text, absl::string_view marker) {
  const size_t longest = std::min(text.size(), marker.size() - 1);
  for (size_t n = longest; n > 0; --n) {
    if (text.substr(text.size() - n) == marker.substr(0, n)) return n;
  }
  return 0;
}

CallObjectScan ScanCallObject(absl::string_view text, size_t pos, bool final,
                              const std::vector<std::string>& arguments_keys) {
  CallObjectScan scan;
  if (pos >= text.size()) return scan;
  if (text[pos] != '{') {
    scan.invalid = true;
    return scan;
  }
  bool have_arguments = false;
  size_t p = pos + 1;
  while (true) {
    p = SkipJsonSpace(text, p);
    if (p >= text.size()) return scan;
    if (text[p] == '}') {
      if (!scan.draft.name_done || !have_arguments) {
        scan.invalid = true;
        return scan;
      }
      scan.draft.done = true;
      scan.end = p + 1;
      return scan;
    }
    std::string key;
    std::optional<size_t> after_key = ScanJsonString(text, p, &key);
    if (!after_key.has_value()) {
      if (text[p] != '"' || ScanJsonValue(text, p, false).has_value()) scan.invalid = true;
      return scan;
    }
    p = SkipJsonSpace(text, *after_key);
    if (p >= text.size()) return scan;
    if (text[p] != ':') {
      scan.invalid = true;
      return scan;
    }
    p = SkipJsonSpace(text, p + 1);
    if (p >= text.size()) return scan;
    const bool is_name = key == "name" && !scan.draft.name_done;
    const bool is_arguments =
        !have_arguments &&
        std::find(arguments_keys.begin(), arguments_keys.end(), key) != arguments_keys.end();
    std::optional<size_t> value_end = ScanJsonValue(text, p, final);
    if (is_name) {
      if (!value_end.has_value()) return scan;
      if (!ScanJsonString(text, p, &scan.draft.name).has_value()) {
        scan.invalid = true;
        return scan;
      }
      scan.draft.name_done = true;
    } else if (is_arguments) {
      // An object or array streams as it grows; a scalar only once whole.
      if (!value_end.has_value()) {
        if (text[p] == '{' || text[p] == '[') scan.draft.arguments = std::string(text.substr(p));
        return scan;
      }
      scan.draft.arguments = std::string(text.substr(p, *value_end - p));
      have_arguments = true;
    } else if (!value_end.has_value()) {
      return scan;
    }
    p = SkipJsonSpace(text, *value_end);
    if (p >= text.size()) return scan;
    if (text[p] == ',') {
      ++p;
    } else if (text[p] != '}') {
      scan.invalid = true;
      return scan;
    }
  }
}

}  // namespace sluice::tools
