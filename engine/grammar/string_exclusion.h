// Set difference of a string language and a finite set of strings, and the JSON spellings of
// a string language: how the keys of additional properties leave out the declared property
// names (a declared name given again as an additional key would repeat the key, and JSON
// parsers keep the last value, which the declared schema never checked).
//
// Both work on expressions over code points (the decoded string, before JSON escaping):
// literals, character classes, sequences, choices and repeats; no rule references or tokens.
#ifndef SLUICE_ENGINE_GRAMMAR_STRING_EXCLUSION_H_
#define SLUICE_ENGINE_GRAMMAR_STRING_EXCLUSION_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/grammar/grammar.h"

namespace sluice::grammar {

// ExcludeStrings: the strings of `e` except `excluded` (UTF-8). Built along the prefix tree
// of `excluded` with Brzozowski derivatives of `e`: a string leaves the tree at its first
// character that no excluded string continues with, and from there matches what is left of
// `e`. The result matches nothing when every string of `e` is excluded (IsNothing).
// Errors: InvalidArgument when `e` has a rule reference or token; ResourceExhausted when the
// result would pass `max_nodes` expression nodes.
absl::StatusOr<Expr> ExcludeStrings(const Expr& e, const std::vector<std::string>& excluded,
                                    int64_t max_nodes = 200000);

// IsNothing: `e` is a choice of no alternatives (matches no string).
bool IsNothing(const Expr& e);

// JsonSpellings: a JSON string body (without quotes) that spells the strings of `e` in every
// way JSON allows: each character as itself where it may stand unescaped, as a short escape
// (\" \\ \/ \b \f \n \r \t) and as \uXXXX in either case of hex digit (a surrogate pair past
// U+FFFF), so that no spelling of an excluded string slips through. A class of all scalar
// values spells as JsonCharExpr does.
Expr JsonSpellings(const Expr& e);

// JsonCharExpr: one character of a JSON string body in any spelling, never an unpaired
// surrogate (a surrogate pair's two escapes count as one character).
Expr JsonCharExpr();

}  // namespace sluice::grammar

#endif  // SLUICE_ENGINE_GRAMMAR_STRING_EXCLUSION_H_
