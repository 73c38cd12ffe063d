// BpeRegex: a compiled PCRE2 pattern (UTF + UCP, JIT when available) that enumerates the
// matches a HF `Split` pre-tokenizer splits on.
//
// HF tokenizers run these patterns with Oniguruma; PCRE2 has the same leftmost-first
// backtracking semantics, and TranslateOnigurumaPattern aligns the Unicode classes (\s, \p{L},
// \p{N}) with Oniguruma's.
// Invalid UTF-8 never fails a match: the pattern is compiled with PCRE2_MATCH_INVALID_UTF, so
// ill-formed bytes simply match nothing and end up in the gaps between matches.
#ifndef SLUICE_ENGINE_TOKENIZER_BPE_REGEX_H_
#define SLUICE_ENGINE_TOKENIZER_BPE_REGEX_H_

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"

namespace sluice {

// The GPT-2 pre-tokenization pattern (HF ByteLevel pre-tokenizer with use_regex=true).
inline constexpr std::string_view kGpt2SplitPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

class BpeRegex {
 public:
  // Compile compiles `pattern` (a regex, or a literal string when `literal`). Errors:
  // InvalidArgument with PCRE2's message and offset.
  static absl::StatusOr<std::unique_ptr<BpeRegex>> Compile(std::string_view pattern, bool literal);
  ~BpeRegex();
  BpeRegex(const BpeRegex&) = delete;
  BpeRegex& operator=(const BpeRegex&) = delete;

  // ForEachMatch calls `on_match(begin, end)` (byte offsets into `text`) for each successive
  // non-overlapping, non-empty match, left to right. Thread-safe (per-thread match data).
  void ForEachMatch(std::string_view text,
                    absl::FunctionRef<void(size_t begin, size_t end)> on_match) const;

  // MatchesAt reports whether the pattern matches at exactly `pos` (anchored there).
  bool MatchesAt(std::string_view text, size_t pos) const;

 private:
  BpeRegex() = default;

  void* code_ = nullptr;  // pcre2_code_8*, kept opaque so users need not include pcre2.h
  bool jit_ = false;
};

}  // namespace sluice

#endif  // SLUICE_ENGINE_TOKENIZER_BPE_REGEX_H_
