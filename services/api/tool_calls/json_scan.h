// Scanning JSON text that may still be arriving (a streamed tool call): where a value ends, if
// it has ended yet. Used by the tool-call parsers; values are validated with nlohmann::json
// once complete.
#ifndef SLUICE_SERVICES_API_TOOL_CALLS_JSON_SCAN_H_
#define SLUICE_SERVICES_API_TOOL_CALLS_JSON_SCAN_H_

#include <cstddef>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace sluice::tools {

// SkipJsonSpace returns the first position at or after `pos` that is not JSON whitespace.
size_t SkipJsonSpace(absl::string_view text, size_t pos);

// ScanJsonValue finds the end (one past the last byte) of the JSON value starting at `pos`
// (no leading whitespace). nullopt: the value is not complete in `text` yet. A bare number
// or literal at the end of the text counts as complete only when `final`. Structure is
// tracked (brackets, strings, escapes), not validated.
std::optional<size_t> ScanJsonValue(absl::string_view text, size_t pos, bool final);

// ScanJsonString decodes the JSON string starting at `pos` (at its opening quote) into `out`
// and returns the position after its closing quote; nullopt: not closed yet or not a valid
// string (then `out` is unspecified).
std::optional<size_t> ScanJsonString(absl::string_view text, size_t pos, std::string* out);

}  // namespace sluice::tools

#endif  // SLUICE_SERVICES_API_TOOL_CALLS_JSON_SCAN_H_
