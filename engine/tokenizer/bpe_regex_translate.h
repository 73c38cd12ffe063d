// TranslateOnigurumaPattern: rewrites a tokenizer.json split regex (written for Oniguruma, which
// HF tokenizers uses) so that PCRE2 10.42 matches exactly the same strings.
//
// Two differences matter for the Unicode classes these patterns use:
//   * `\s`: PCRE2 (UCP) also counts U+180E MONGOLIAN VOWEL SEPARATOR as white space; Oniguruma
//     follows the Unicode White_Space property, which dropped it in Unicode 6.3. `\s` / `\S`
//     become explicit White_Space classes.
//   * `\p{L}`, `\p{N}`: PCRE2 10.42 ships Unicode 14 tables, Oniguruma in tokenizers 0.23.2
//     Unicode 16; the letters and numbers assigned in Unicode 15.0-16.0 (DerivedGeneralCategory)
//     are added as explicit ranges.
// Both differences were found by probing every code point against tokenizers 0.23.2.
// Everything else (escapes, groups, other properties) is copied unchanged.
#ifndef SLUICE_ENGINE_TOKENIZER_BPE_REGEX_TRANSLATE_H_
#define SLUICE_ENGINE_TOKENIZER_BPE_REGEX_TRANSLATE_H_

#include <string>
#include <string_view>

namespace sluice {

std::string TranslateOnigurumaPattern(std::string_view pattern);

}  // namespace sluice

#endif  // SLUICE_ENGINE_TOKENIZER_BPE_REGEX_TRANSLATE_H_
