// Lexer of the Jinja interpreter behind ChatTemplate.
//
// Splits template source into text and tag tokens the way Jinja2 3.1's lexer does with
// Hugging Face's environment options (`trim_blocks=True`, `lstrip_blocks=True`,
// `keep_trailing_newline=False`): newlines are normalised to "\n", one trailing newline is
// dropped, `{%-`/`-%}` (and `{{-`, `{#-`...) strip adjacent whitespace, `{%+` disables
// lstrip_blocks, `+%}` disables trim_blocks, `{% raw %}` bodies become text.
#ifndef SLUICE_ENGINE_TOKENIZER_JINJA_LEXER_H_
#define SLUICE_ENGINE_TOKENIZER_JINJA_LEXER_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace sluice::jinja {

enum class TokenType {
  kText,        // literal template text (value = the text)
  kVarBegin,    // {{
  kVarEnd,      // }}
  kBlockBegin,  // {%
  kBlockEnd,    // %}
  kName,        // identifier or keyword
  kString,      // string literal (value = unescaped contents)
  kInt,         // integer literal (value = digits without '_')
  kFloat,       // float literal
  kOp,          // operator or punctuation (value = the operator text)
  kEof,
};

struct Token {
  TokenType type;
  std::string value;
  int line;  // 1-based line of the token start
};

// LexOptions are the Jinja Environment options that change lexing.
struct LexOptions {
  bool trim_blocks = true;
  bool lstrip_blocks = true;
  bool keep_trailing_newline = false;
};

// Tokenize lexes `source`. Errors: InvalidArgument "line N: ..." for unterminated tags,
// comments or strings and unexpected characters.
absl::StatusOr<std::vector<Token>> Tokenize(const std::string& source,
                                            const LexOptions& options = {});

}  // namespace sluice::jinja

#endif  // SLUICE_ENGINE_TOKENIZER_JINJA_LEXER_H_
