// Escape decoding and UTF-8 encoding shared by the grammar text parsers (GBNF, regex).
#ifndef SLUICE_ENGINE_GRAMMAR_TEXT_ESCAPES_H_
#define SLUICE_ENGINE_GRAMMAR_TEXT_ESCAPES_H_

#include <cstddef>
#include <string>
#include "absl/strings/string_view.h"
#include <utility>

#include "absl/status/statusor.h"
#include "engine/tokenizer/byte_level.h"

namespace sluice::grammar {

// DecodeEscapedChar reads one code point from the start of `text` (non-empty): a UTF-8
// character, or a backslash escape \n \r \t \f \v \0 \xHH \uHHHH \UHHHHHHHH \<punctuation>.
// Returns the code point and the bytes consumed. Errors: InvalidArgument (bad UTF-8, a bad
// or unknown escape, a surrogate).
absl::StatusOr<std::pair<char32_t, size_t>> DecodeEscapedChar(absl::string_view text);

// DecodeUtf8Char reads one UTF-8 character; length 0 when invalid.
std::pair<char32_t, size_t> DecodeUtf8Char(absl::string_view text);

// AppendCodepoint appends the UTF-8 encoding of `cp` (a Unicode scalar value).
inline void AppendCodepoint(char32_t cp, std::string* out) { byte_level::AppendUtf8(cp, out); }

}  // namespace sluice::grammar

#endif  // SLUICE_ENGINE_GRAMMAR_TEXT_ESCAPES_H_
