// The `pattern` of a tokenizer.json Replace normalizer or decoder: {"String": literal} or
// {"Regex": expression}.
#ifndef SLUICE_ENGINE_TOKENIZER_REPLACE_PATTERN_H_
#define SLUICE_ENGINE_TOKENIZER_REPLACE_PATTERN_H_

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "engine/tokenizer/bpe_regex.h"
#include "nlohmann/json.hpp"

namespace sluice {

// ParseReplacePattern reads config["pattern"] into `literal` (String) or `regex` (Regex).
// Errors: InvalidArgument "<what> needs a String or Regex pattern", or the regex's compile error.
absl::Status ParseReplacePattern(const nlohmann::json& config, std::string_view what,
                                 std::string* literal, std::unique_ptr<BpeRegex>* regex);

}  // namespace sluice

#endif  // SLUICE_ENGINE_TOKENIZER_REPLACE_PATTERN_H_
