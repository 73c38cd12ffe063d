#include "services/api/message_fields.h"

#include <algorithm>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "services/api/openai_errors.h"

namespace sluice {
namespace {

using nlohmann::json;

constexpr const char* kMessageKeys[] = {"role",         "content",      "name",
                                        "tool_calls",   "tool_call_id", "reasoning_content"};
constexpr const char* kTemplateFields[] = {"tool_call_id", "reasoning_content"};

bool Present(const json& m, const char* key) {
  auto it = m.find(key);
  return it != m.end() && !it->is_null();
}

}  // namespace

absl::Status CheckMessageFields(const json& messages, bool allow_unknown,
                                std::vector<std::string>* unknown) {
  if (!messages.is_array()) return absl::OkStatus();
  for (size_t i = 0; i < messages.size(); ++i) {
    const json& m = messages[i];
    if (!m.is_object()) continue;
    for (auto it = m.begin(); it != m.end(); ++it) {
      if (std::find(std::begin(kMessageKeys), std::end(kMessageKeys), it.key()) !=
          std::end(kMessageKeys)) {
        continue;
      }
      const std::string field = absl::StrCat("messages[", i, "].", it.key());
      if (!allow_unknown) {
        return InvalidParam("messages",
                            absl::StrCat("Unrecognized request argument supplied: ", field));
      }
      unknown->push_back(field);
    }
    auto role_it = m.find("role");
    const std::string role =
        role_it != m.end() && role_it->is_string() ? role_it->get<std::string>() : "";
    if (!Present(m, "content") && !(role == "assistant" && Present(m, "tool_calls"))) {
      return InvalidParam("messages", absl::StrCat("messages[", i, "].content is required for a '",
                                                   role, "' message"));
    }
    for (const char* key : {"name", "tool_call_id", "reasoning_content"}) {
      if (Present(m, key) && !m[key].is_string()) {
        return InvalidParam("messages",
                            absl::StrCat("messages[", i, "].", key, " must be a string"));
      }
    }
  }
  return absl::OkStatus();
}

void AddTemplateFields(const json& messages, json* conversation) {
  for (size_t i = 0; i < messages.size() && i < conversation->size(); ++i) {
    const json& m = messages[i];
    if (!m.is_object()) continue;
    for (const char* key : kTemplateFields) {
      auto it = m.find(key);
      if (it != m.end() && it->is_string()) (*conversation)[i][key] = *it;
    }
  }
}

}  // namespace sluice
