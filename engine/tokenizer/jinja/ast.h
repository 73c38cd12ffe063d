// Syntax tree of the Jinja interpreter behind ChatTemplate (built by jinja/parser, walked by
// jinja/interpreter). Nodes own their children; a parsed Template is immutable and may be
// rendered concurrently from several threads.
#ifndef SLUICE_ENGINE_TOKENIZER_JINJA_AST_H_
#define SLUICE_ENGINE_TOKENIZER_JINJA_AST_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/tokenizer/jinja/value.h"

namespace sluice::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

enum class ExprKind {
  kLiteral,   // literal
  kName,      // name
  kList,      // [args...]
  kTuple,     // (args...)
  kDict,      // {args[0]: args[1], ...} (alternating keys and values)
  kGetAttr,   // args[0].name
  kGetItem,   // args[0][args[1]]
  kSlice,     // args[0][args[1]:args[2]:args[3]] (null parts omitted)
  kCall,      // args[0](args[1:]..., kwargs)
  kFilter,    // args[0] | name(args[1:]..., kwargs); args[0] null in a `{% filter %}`/block set
  kTest,      // args[0] is [not] name(args[1:]..., kwargs)
  kUnary,     // name ("-", "+", "not") args[0]
  kBinary,    // args[0] name args[1] for + - * / // % ** ~ and or
  kCompare,   // args[0] ops[0] args[1] ops[1] args[2] ... (== != < <= > >= in notin)
  kCondExpr,  // args[1] if args[0] else args[2] (args[2] may be null)
};

struct Expr {
  ExprKind kind;
  int line = 0;
  int depth = 1;  // height of this subtree (bounded by the parser)
  std::string name;
  Value literal;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;
  bool negated = false;
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

enum class StmtKind {
  kText,        // text
  kOutput,      // {{ expr }}
  kIf,          // branches: (cond or null for else, body)
  kFor,         // for targets in expr [if cond]: body [else: else_body]
  kSet,         // set targets = expr; or set targets[0].attr = expr (namespace)
  kBlockSet,    // set targets[0] [| filter] %} body {% endset
  kMacro,       // macro name(params) body
  kGeneration,  // {% generation %} body {% endgeneration %}
  kBreak,
  kContinue,
  kCallBlock,    // {% call macro(args) %} body {% endcall %}: expr is the call, body is caller()
  kFilterBlock,  // {% filter f %} body {% endfilter %}: expr is the filter chain
};

struct MacroParam {
  std::string name;
  ExprPtr default_value;  // may be null
};

struct Stmt {
  StmtKind kind;
  int line = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr condition;
  std::vector<std::string> targets;
  std::string attr;  // namespace attribute for `set ns.attr = ...`
  bool targets_tuple = false;
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body body;
  Body else_body;
  std::vector<MacroParam> params;
};

// Template is the parsed form of one template source.
struct Template {
  Body body;
};

}  // namespace sluice::jinja

#endif  // SLUICE_ENGINE_TOKENIZER_JINJA_AST_H_
