#include "engine/tokenizer/replace_pattern.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/tokenizer/bpe_json_util.h"

namespace sluice {

absl::Status ParseReplacePattern(const nlohmann::json& config, std::string_view what,
                                 std::string* literal, std::unique_ptr<BpeRegex>* regex) {
  const nlohmann::json* pattern = bpe_json::Field(config, "pattern");
  const nlohmann::json* expr = pattern != nullptr ? bpe_json::Field(*pattern, "Regex") : nullptr;
  const nlohmann::json* text = pattern != nullptr ? bpe_json::Field(*pattern, "String") : nullptr;
  if (text != nullptr && text->is_string()) {
    *literal = text->get<std::string>();
    return absl::OkStatus();
  }
  if (expr != nullptr && expr->is_string()) {
    absl::StatusOr<std::unique_ptr<BpeRegex>> compiled =
        BpeRegex::Compile(expr->get<std::string>(), /*literal=*/false);
    if (!compiled.ok()) return compiled.status();
    *regex = *std::move(compiled);
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat(std::string(what), " needs a String or Regex pattern"));
}

}  // namespace sluice
