// Parser of the Jinja interpreter behind ChatTemplate: tokens (jinja/lexer) → syntax tree
// (jinja/ast), following the grammar and operator precedence of Jinja2 3.1's parser.
#ifndef SLUICE_ENGINE_TOKENIZER_JINJA_PARSER_H_
#define SLUICE_ENGINE_TOKENIZER_JINJA_PARSER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/tokenizer/jinja/ast.h"

namespace sluice::jinja {

// ParseTemplate lexes and parses `source`. Errors: InvalidArgument "line N: ..." for syntax
// errors, unknown tags, unknown filters/tests (Jinja reports those at compile time too),
// `break`/`continue` outside a loop, and nesting deeper than 128 levels.
absl::StatusOr<std::unique_ptr<Template>> ParseTemplate(const std::string& source);

}  // namespace sluice::jinja

#endif  // SLUICE_ENGINE_TOKENIZER_JINJA_PARSER_H_
