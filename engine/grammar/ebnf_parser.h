// ParseEbnf: GBNF-style grammar text (llama.cpp's GBNF, which vLLM/xgrammar also accept) to a
// Grammar.
//
//   root   ::= object            # a comment
//   object ::= "{" ws (pair ("," ws pair)*)? "}"
//   pair   ::= [a-z]+ ":" ws value
//
// Terms: "literal" (escapes \n \r \t \\ \" \xHH \uHHHH \UHHHHHHHH), [class] / [^class] with
// ranges and the same escapes, `.` (any code point), rule names ([A-Za-z0-9_-]+), ( groups ),
// whole-token terminals as llama.cpp writes them: <content> (the token whose text is content,
// e.g. <think> or <｜tool▁sep｜>) and <[id]> (token id),
// postfix * + ? {m} {m,} {m,n}; `|` separates alternatives. A rule ends where the next
// `name ::=` begins, so bodies may span lines.
#ifndef SLUICE_ENGINE_GRAMMAR_EBNF_PARSER_H_
#define SLUICE_ENGINE_GRAMMAR_EBNF_PARSER_H_

#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"
#include "engine/grammar/grammar.h"

namespace sluice::grammar {

// ParseEbnf parses `text`; the start rule is `root_rule`. Errors: InvalidArgument naming the
// line and column of a syntax error, an undefined rule, a duplicate rule or a missing root.
absl::StatusOr<Grammar> ParseEbnf(absl::string_view text, absl::string_view root_rule = "root");

}  // namespace sluice::grammar

#endif  // SLUICE_ENGINE_GRAMMAR_EBNF_PARSER_H_
