#include "services/api/auth/api_key_store.h"

#include <cmath>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace sluice {
namespace {

using nlohmann::json;

absl::Status FieldError(size_t index, const std::string& field, const std::string& what) {
  return absl::InvalidArgumentError(
      absl::StrCat("api keys: keys[", index, "].", field, " ", what));
}

bool IsHex64(const std::string& s) {
  if (s.size() != 64) return false;
  for (char c : s) {
    if (!absl::ascii_isxdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<std::vector<ApiKey>> ParseApiKeysJson(std::string_view text) {
  json root = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return absl::InvalidArgumentError("api keys: not valid JSON");
  if (!root.is_object() || !root.contains("keys") || !root["keys"].is_array()) {
    return absl::InvalidArgumentError("api keys: expected an object {\"keys\": [...]}");
  }
  for (const auto& [field, unused] : root.items()) {
    if (field != "keys") {
      return absl::InvalidArgumentError(absl::StrCat("api keys: unknown field '", field, "'"));
    }
  }
  static const std::set<std::string> kFields = {"sha256", "name", "tenant", "requests_per_second",
                                                "tokens_per_minute", "max_concurrent_requests"};
  std::vector<ApiKey> keys;
  std::set<std::string> seen;
  const json& entries = root["keys"];
  for (size_t i = 0; i < entries.size(); ++i) {
    const json& e = entries[i];
    if (!e.is_object()) return FieldError(i, "", "is not an object");
    for (const auto& [field, unused] : e.items()) {
      if (kFields.count(field) == 0) return FieldError(i, field, "is not a known field");
    }
    ApiKey key;
    if (!e.contains("sha256") || !e["sha256"].is_string() ||
        !IsHex64(e["sha256"].get<std::string>())) {
      return FieldError(i, "sha256", "must be 64 hex digits (the key's SHA-256)");
    }
    key.sha256 = absl::AsciiStrToLower(e["sha256"].get<std::string>());
    if (!seen.insert(key.sha256).second) return FieldError(i, "sha256", "is listed twice");
    for (const char* field : {"name", "tenant"}) {
      if (!e.contains(field)) continue;
      if (!e[field].is_string() || e[field].get<std::string>().size() > 256) {
        return FieldError(i, field, "must be a string of at most 256 bytes");
      }
    }
    key.name = e.value("name", key.sha256.substr(0, 8));
    key.tenant = e.value("tenant", "");
    if (e.contains("requests_per_second")) {
      const json& v = e["requests_per_second"];
      if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < 0) {
        return FieldError(i, "requests_per_second", "must be a number >= 0");
      }
      key.limits.requests_per_second = v.get<double>();
    }
    if (e.contains("tokens_per_minute")) {
      const json& v = e["tokens_per_minute"];
      if (!v.is_number_integer() || v.get<int64_t>() < 0) {
        return FieldError(i, "tokens_per_minute", "must be an integer >= 0");
      }
      key.limits.tokens_per_minute = v.get<int64_t>();
    }
    if (e.contains("max_concurrent_requests")) {
      const json& v = e["max_concurrent_requests"];
      if (!v.is_number_integer() || v.get<int64_t>() < 0 ||
          v.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
        return FieldError(i, "max_concurrent_requests", "must be an integer >= 0");
      }
      key.limits.max_concurrent_requests = v.get<int32_t>();
    }
    keys.push_back(std::move(key));
  }
  return keys;
}

absl::StatusOr<std::vector<ApiKey>> LoadApiKeysFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read api keys file '", path, "'"));
  std::ostringstream text;
  text << in.rdbuf();
  absl::StatusOr<std::vector<ApiKey>> keys = ParseApiKeysJson(text.str());
  if (!keys.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", keys.status().message()));
  }
  return keys;
}

void ApiKeyStore::Replace(std::vector<ApiKey> keys) {
  auto map = std::make_shared<KeyMap>();
  for (ApiKey& key : keys) {
    std::string digest = key.sha256;
    map->emplace(std::move(digest), std::make_shared<const ApiKey>(std::move(key)));
  }
  std::lock_guard<std::mutex> lock(mu_);
  keys_ = std::move(map);
}

std::shared_ptr<const ApiKey> ApiKeyStore::Find(const std::string& sha256) const {
  std::shared_ptr<const KeyMap> keys;
  {
    std::lock_guard<std::mutex> lock(mu_);
    keys = keys_;
  }
  auto it = keys->find(sha256);
  return it == keys->end() ? nullptr : it->second;
}

size_t ApiKeyStore::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return keys_->size();
}

}  // namespace sluice
