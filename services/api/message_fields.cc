#include "services/api/message_fields.h"

#include <string_view>

#include "absl/strings/str_cat.h"
#include "services/api/openai_errors.h"
#include "services/api/openai_fields.h"

namespace sluice {
namespace {

using nlohmann::json;

constexpr std::string_view kMessageKeys[] = {"role",       "content",      "name",
                                             "tool_calls", "tool_call_id", "reasoning_content"};
constexpr const char* kTemplateFields[] = {"tool_call_id", "reasoning_content"};

bool Present(const json& m, const char* key) {
  auto it = m.find(key);
  return it != m.end() && !it->is_null();
}

// CheckContentParts applies the key rule to the parts of a list content: text parts {type,
// text}, image_url parts {type, image_url: {url, detail}}, Hugging Face image parts {type,
// image, url}. Other part types are refused by the message parser.
absl::Status CheckContentParts(const json& content, size_t i, bool allow_unknown,
                               std::vector<std::string>* unknown) {
  static constexpr std::string_view kTextKeys[] = {"type", "text"};
  static constexpr std::string_view kImageUrlKeys[] = {"type", "image_url"};
  static constexpr std::string_view kImageUrlObjectKeys[] = {"url", "detail"};
  static constexpr std::string_view kImageKeys[] = {"type", "image", "url"};
  for (size_t j = 0; j < content.size(); ++j) {
    const json& part = content[j];
    auto type = part.is_object() ? part.find("type") : part.end();
    if (!part.is_object() || type == part.end() || !type->is_string()) continue;
    const std::string path = absl::StrCat("messages[", i, "].content[", j, "]");
    absl::Span<const std::string_view> known;
    if (*type == "text") {
      known = kTextKeys;
    } else if (*type == "image_url") {
      known = kImageUrlKeys;
    } else if (*type == "image") {
      known = kImageKeys;
    } else {
      continue;
    }
    if (absl::Status s = CheckKnownKeys(part, known, "messages", path, allow_unknown, unknown);
        !s.ok()) {
      return s;
    }
    if (auto url = part.find("image_url"); *type == "image_url" && url != part.end()) {
      if (absl::Status s = CheckKnownKeys(*url, kImageUrlObjectKeys, "messages",
                                          absl::StrCat(path, ".image_url"), allow_unknown,
                                          unknown);
          !s.ok()) {
        return s;
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckMessageFields(const json& messages, bool allow_unknown,
                                std::vector<std::string>* unknown) {
  if (!messages.is_array()) return absl::OkStatus();
  for (size_t i = 0; i < messages.size(); ++i) {
    const json& m = messages[i];
    if (!m.is_object()) continue;
    if (absl::Status s = CheckKnownKeys(m, kMessageKeys, "messages",
                                        absl::StrCat("messages[", i, "]"), allow_unknown, unknown);
        !s.ok()) {
      return s;
    }
    if (auto content = m.find("content"); content != m.end() && content->is_array()) {
      if (absl::Status s = CheckContentParts(*content, i, allow_unknown, unknown); !s.ok()) {
        return s;
      }
    }
    auto role_it = m.find("role");
    if (role_it == m.end() || !role_it->is_string()) continue;  // the message parser's error
    const std::string role = role_it->get<std::string>();
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
