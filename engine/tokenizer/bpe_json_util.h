// Non-throwing accessors for tokenizer.json fields (nlohmann::json throws on type mismatch;
// these return a default or an InvalidArgument status instead).
#ifndef SLUICE_ENGINE_TOKENIZER_BPE_JSON_UTIL_H_
#define SLUICE_ENGINE_TOKENIZER_BPE_JSON_UTIL_H_

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace sluice::bpe_json {

// Field returns `object[key]`, or nullptr when `object` is not an object or lacks `key`.
inline const nlohmann::json* Field(const nlohmann::json& object, std::string_view key) {
  if (!object.is_object()) return nullptr;
  const auto it = object.find(key);
  return it == object.end() ? nullptr : &*it;
}

// Bool returns the boolean `object[key]`, or `fallback` when absent, null or not a boolean.
inline bool Bool(const nlohmann::json& object, std::string_view key, bool fallback) {
  const nlohmann::json* v = Field(object, key);
  return v != nullptr && v->is_boolean() ? v->get<bool>() : fallback;
}

// String returns the string `object[key]`; InvalidArgument naming `what` when it is missing or
// not a string.
inline absl::StatusOr<std::string> String(const nlohmann::json& object, std::string_view key,
                                          std::string_view what) {
  const nlohmann::json* v = Field(object, key);
  if (v == nullptr || !v->is_string()) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(what), ": field '", std::string(key),
                                                   "' is missing or not a string"));
  }
  return v->get<std::string>();
}

// Type returns `object["type"]` as a string, or "" when absent.
inline std::string Type(const nlohmann::json& object) {
  const nlohmann::json* v = Field(object, "type");
  return v != nullptr && v->is_string() ? v->get<std::string>() : std::string();
}

}  // namespace sluice::bpe_json

#endif  // SLUICE_ENGINE_TOKENIZER_BPE_JSON_UTIL_H_
