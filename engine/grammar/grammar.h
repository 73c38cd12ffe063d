// Grammar: the intermediate form every structured-output source compiles to (GBNF text,
// regular expressions, JSON Schema, choice lists): named rules whose bodies are expression
// trees over UTF-8 literals, code-point classes, rule references, sequences, alternations and
// bounded/unbounded repetitions, and whole-token terminals (special tokens, which no byte
// string spells). Byte-level automata are built from it (pda.h).
#ifndef SLUICE_ENGINE_GRAMMAR_GRAMMAR_H_
#define SLUICE_ENGINE_GRAMMAR_GRAMMAR_H_

#include <cstdint>
#include <optional>
#include <string>
#include "absl/strings/string_view.h"
#include <utility>
#include <vector>

namespace sluice::grammar {

// CodepointRange is an inclusive range of Unicode scalar values.
struct CodepointRange {
  char32_t lo = 0;
  char32_t hi = 0;
};

enum class ExprKind {
  kEmpty,      // matches ""
  kLiteral,    // `text`: UTF-8 bytes matched exactly
  kCharClass,  // one code point in `ranges` (or, `negated`, outside them)
  kRuleRef,    // the rule `rule`
  kSequence,   // children in order
  kChoice,     // one of children
  kRepeat,     // children[0] repeated min_count..max_count times (max_count < 0: unbounded)
  kToken,      // one vocabulary token as a whole (a special token such as DeepSeek's
               // <｜tool▁calls▁begin｜>): `text` is its content, or with token_id >= 0 the id
};

// Expr is a node of a rule body. Build with the helpers below.
struct Expr {
  ExprKind kind = ExprKind::kEmpty;
  std::string text;
  std::vector<CodepointRange> ranges;
  bool negated = false;
  int32_t rule = -1;
  int32_t min_count = 0;
  int32_t max_count = -1;
  int32_t token_id = -1;
  std::vector<Expr> children;
};

Expr Empty();
Expr Literal(absl::string_view utf8);
Expr CharClass(std::vector<CodepointRange> ranges, bool negated = false);
Expr RuleRef(int32_t rule);
Expr Sequence(std::vector<Expr> children);  // one child: returned as is
Expr Choice(std::vector<Expr> children);    // one child: returned as is
Expr Repeat(Expr child, int32_t min_count, int32_t max_count);
// Token matches the vocabulary token whose content is `content` (written `<...>`: it starts
// with '<', ends with '>' and has no other '>'), never its bytes spelled by other tokens.
// TokenById matches token `id` (written `<[id]>`). Both are resolved against the vocabulary
// when the grammar is compiled (CompiledGrammar::Create).
Expr Token(absl::string_view content);
Expr TokenById(int32_t id);
// IsTokenText: `content` can be written as a token terminal (see Token).
bool IsTokenText(absl::string_view content);
inline Expr Star(Expr child) { return Repeat(std::move(child), 0, -1); }
inline Expr Plus(Expr child) { return Repeat(std::move(child), 1, -1); }
inline Expr Optional(Expr child) { return Repeat(std::move(child), 0, 1); }

struct Rule {
  std::string name;
  Expr body;
  // What errors call the rule when its name is the compiler's own (e.g. "JSON Schema $ref
  // '#/$defs/node'" for the rule a schema's reference became); empty: "grammar rule 'NAME'".
  std::string origin;
};

// Grammar: rules by index; `root` is where matching starts. Rule names are unique.
class Grammar {
 public:
  // AddRule appends a rule named `name` (made unique with a numeric suffix if taken) and
  // returns its index; its body may be set later (for recursion).
  int32_t AddRule(std::string name, Expr body = Empty());
  std::optional<int32_t> FindRule(absl::string_view name) const;
  Rule& rule(int32_t i) { return rules_[i]; }
  const Rule& rule(int32_t i) const { return rules_[i]; }
  int32_t num_rules() const { return static_cast<int32_t>(rules_.size()); }
  int32_t root() const { return root_; }
  void set_root(int32_t root) { root_ = root; }

  // ToString prints the grammar in GBNF form (root first), e.g. for logs and tests.
  std::string ToString() const;

 private:
  std::vector<Rule> rules_;
  int32_t root_ = 0;
};

// ExprEquals: the same tree (kinds, texts, ranges, counts, rules and children alike).
bool ExprEquals(const Expr& a, const Expr& b);

// ExprToString prints one expression in GBNF syntax.
std::string ExprToString(const Grammar& grammar, const Expr& expr);

}  // namespace sluice::grammar

#endif  // SLUICE_ENGINE_GRAMMAR_GRAMMAR_H_
