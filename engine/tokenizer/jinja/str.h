// Python `str` methods on UTF-8 strings for the Jinja interpreter behind ChatTemplate.
//
// Indices and lengths are in code points, as in Python. Case mapping covers ASCII, Latin-1,
// Greek and Cyrillic letters (Python maps all of Unicode; other scripts pass through unchanged).
#ifndef SLUICE_ENGINE_TOKENIZER_JINJA_STR_H_
#define SLUICE_ENGINE_TOKENIZER_JINJA_STR_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace sluice::jinja {

// PyStrip is str.strip/lstrip/rstrip: removes code points in `chars` (null: whitespace).
std::string PyStrip(absl::string_view s, const std::string* chars, bool left, bool right);
// PySplit is str.split/rsplit (`reverse`) with `sep` (null: runs of whitespace) and `maxsplit`
// (<0: unlimited). `sep` must not be empty.
std::vector<std::string> PySplit(absl::string_view s, const std::string* sep, int64_t maxsplit,
                                 bool reverse);
// PySplitLines is str.splitlines() (line ends dropped).
std::vector<std::string> PySplitLines(absl::string_view s);
std::string PyUpper(absl::string_view s);
std::string PyLower(absl::string_view s);
std::string PySwapCase(absl::string_view s);
// PyTitle is str.title(): a cased letter after a cased letter is lowered, others uppered.
std::string PyTitle(absl::string_view s);
// PyCapitalize is str.capitalize(): first code point upper, the rest lower.
std::string PyCapitalize(absl::string_view s);
// JinjaTitle is Jinja's `title` filter: words start after '-', whitespace, '(', '{', '[', '<'.
std::string JinjaTitle(absl::string_view s);
// PyReplace is str.replace(old, new, count) (count < 0: all). Errors: InvalidArgument when the
// result would exceed kMaxValueBytes.
absl::StatusOr<std::string> PyReplace(absl::string_view s, absl::string_view old_str,
                                      absl::string_view new_str, int64_t count);
// PyCount is str.count(sub) (non-overlapping).
int64_t PyCount(absl::string_view s, absl::string_view sub);
// PyFind is str.find / str.rfind (`reverse`): code point index, or -1.
int64_t PyFind(absl::string_view s, absl::string_view sub, bool reverse);
// PyIsClass is str.isdigit/isalpha/isalnum/isspace/isupper/islower/isnumeric/isdecimal.
bool PyIsClass(absl::string_view s, absl::string_view method);

}  // namespace sluice::jinja

#endif  // SLUICE_ENGINE_TOKENIZER_JINJA_STR_H_
