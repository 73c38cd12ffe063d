// RegexToExpr: a PCRE-style regular expression to a grammar expression matching the same
// strings in full (the pattern is implicitly anchored at both ends, as vLLM's guided_regex and
// JSON Schema's `pattern` in our use are).
//
// Supported: literals and escapes (\n \t \xHH \uHHHH, escaped punctuation), `.` (any code point
// but \n), classes [...] / [^...] with ranges and \d \w \s \D \W \S, groups ( ), (?: ),
// (?<name> ), (?P<name> ), alternation |, quantifiers * + ? {n} {n,} {n,m} (lazy `?` suffix
// accepted: it does not change which strings match), ^ at the start and $ at the end.
// Refused with InvalidArgument naming the construct: backreferences (\1, \k<name>),
// lookahead/lookbehind, atomic groups, possessive quantifiers, word boundaries (\b \B), inline
// flags ((?i)), Unicode properties (\p{..}), anchors elsewhere.
#ifndef SLUICE_ENGINE_GRAMMAR_REGEX_TO_GRAMMAR_H_
#define SLUICE_ENGINE_GRAMMAR_REGEX_TO_GRAMMAR_H_

#include "absl/strings/string_view.h"
#include <vector>

#include "absl/status/statusor.h"
#include "engine/grammar/grammar.h"

namespace sluice::grammar {

absl::StatusOr<Expr> RegexToExpr(absl::string_view pattern);

// RegexToGrammar: a grammar whose root is RegexToExpr(pattern).
absl::StatusOr<Grammar> RegexToGrammar(absl::string_view pattern);

// NormalizeRanges sorts and merges ranges; ComplementRanges gives the Unicode scalar values
// outside `ranges` (surrogates excluded).
std::vector<CodepointRange> NormalizeRanges(std::vector<CodepointRange> ranges);
std::vector<CodepointRange> ComplementRanges(const std::vector<CodepointRange>& ranges);

}  // namespace sluice::grammar

#endif  // SLUICE_ENGINE_GRAMMAR_REGEX_TO_GRAMMAR_H_
