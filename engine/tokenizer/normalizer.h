// Normalizer: the `normalizer` stage of a HF tokenizer.json, applied to the text between added
// tokens before pre-tokenization (tokenizers' `normalizers/*.rs` semantics).
//
// Supported types: NFC, NFD, NFKC, NFKD, Lowercase, Replace {pattern: String|Regex, content},
// Prepend {prepend}, Strip {strip_left, strip_right}, StripAccents, and Sequence of these. Any
// other type is InvalidArgument naming it.
//
// Unicode normalization uses ICU, restricted to the characters assigned in Unicode 9.0: HF
// tokenizers normalizes with the `unicode-normalization-alignments` crate, whose tables are
// Unicode 9.0, so later characters (e.g. U+11938, or the combining marks of newer scripts) pass
// through it unnormalized; matching that keeps token ids identical to HF's.
#ifndef SLUICE_ENGINE_TOKENIZER_NORMALIZER_H_
#define SLUICE_ENGINE_TOKENIZER_NORMALIZER_H_

#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/tokenizer/bpe_regex.h"

namespace sluice {

class Normalizer {
 public:
  // FromJson builds the normalizer from tokenizer.json's "normalizer" value. Returns nullptr
  // for null (no normalization). Errors: InvalidArgument naming an unsupported type or a
  // malformed field.
  static absl::StatusOr<std::unique_ptr<Normalizer>> FromJson(const nlohmann::json& config);
  ~Normalizer();

  // Normalize returns the normalized `text`: a view of `text` itself when no step changes it
  // (e.g. NFC of ASCII, checked without copying), else a view of `*buffer`. Invalid UTF-8 is
  // kept byte-wise (never an error): only the well-formed stretches around it are normalized.
  // Thread-safe.
  std::string_view Normalize(std::string_view text, std::string* buffer) const;

 private:
  enum class Kind {
    kNfc,
    kNfd,
    kNfkc,
    kNfkd,
    kLowercase,
    kReplace,
    kPrepend,
    kStrip,
    kStripAccents
  };
  struct Step {
    Kind kind;
    std::string pattern;              // kReplace (literal) / kPrepend (the prefix)
    std::unique_ptr<BpeRegex> regex;  // kReplace with a Regex pattern
    std::string content;              // kReplace
    bool strip_left = false;          // kStrip
    bool strip_right = false;         // kStrip
  };

  Normalizer() = default;
  static absl::Status AddStep(const nlohmann::json& config, Normalizer* normalizer);
  // Apply runs one step; returns false (leaving `out` untouched) when it would not change `in`.
  static bool Apply(const Step& step, std::string_view in, std::string* out);

  std::vector<Step> steps_;
};

}  // namespace sluice

#endif  // SLUICE_ENGINE_TOKENIZER_NORMALIZER_H_
