// Parsing untrusted JSON text (request bodies, schemas inside them) with a nesting limit.
//
// nlohmann's parser is iterative, but copying, comparing and dumping a parsed value recurse
// once per level: a 100,000-level `[[[...]]]` in an 8 MiB body overflowed the stack of the
// thread that handled the request (fuzz finding). Values nested deeper than `max_depth` are
// refused while parsing, before any recursive operation sees them.
#ifndef SLUICE_COMMON_JSON_PARSE_H_
#define SLUICE_COMMON_JSON_PARSE_H_

#include <string_view>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace sluice {

// kMaxJsonDepth: the nesting accepted from clients (an object or array at the top is depth 1).
inline constexpr int kMaxJsonDepth = 128;

// ParseJsonLimited parses `text`. Errors: InvalidArgument "not valid JSON" or "nested deeper
// than N levels". Never throws.
template <typename Json = nlohmann::json>
absl::StatusOr<Json> ParseJsonLimited(std::string_view text, int max_depth = kMaxJsonDepth) {
  bool too_deep = false;
  // `depth` counts the containers around a value: 0 for the top-level value itself.
  auto limit = [&](int depth, nlohmann::json::parse_event_t event, Json&) {
    if ((event == nlohmann::json::parse_event_t::object_start ||
         event == nlohmann::json::parse_event_t::array_start) &&
        depth >= max_depth) {
      too_deep = true;
      return false;  // skipped: nothing below it is built
    }
    return true;
  };
  Json parsed = Json::parse(text.begin(), text.end(), limit, /*allow_exceptions=*/false);
  if (too_deep) {
    return absl::InvalidArgumentError(absl::StrCat("nested deeper than ", max_depth, " levels"));
  }
  if (parsed.is_discarded()) return absl::InvalidArgumentError("not valid JSON");
  return parsed;
}

}  // namespace sluice

#endif  // SLUICE_COMMON_JSON_PARSE_H_
