#include "engine/tokenizer/jinja/parser.h"

#include <algorithm>
#include <cstdlib>
#include <initializer_list>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"
#include "engine/tokenizer/jinja/builtins.h"
#include "engine/tokenizer/jinja/lexer.h"

namespace sluice::jinja {
namespace {

constexpr int kMaxDepth = 128;
// Height limit of one expression tree: evaluation and destruction recurse over it, and loops
// such as `a + b + ...` or `x|f|f|...` build deep trees without deep parser recursion.
constexpr int kMaxExprHeight = 200;

std::string Describe(const Token& token) {
  switch (token.type) {
    case TokenType::kText:
      return "template data";
    case TokenType::kVarBegin:
      return "begin of print statement";
    case TokenType::kVarEnd:
      return "end of print statement";
    case TokenType::kBlockBegin:
      return "begin of statement block";
    case TokenType::kBlockEnd:
      return "end of statement block";
    case TokenType::kEof:
      return "end of template";
    case TokenType::kString:
      return "string";
    case TokenType::kInt:
    case TokenType::kFloat:
      return token.value;
    default:
      return token.value;
  }
}

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  absl::StatusOr<std::unique_ptr<Template>> Run() {
    auto tmpl = std::make_unique<Template>();
    std::string end;
    SLUICE_RETURN_IF_ERROR(SubParse(&tmpl->body, {}, &end));
    return tmpl;
  }

 private:
  // --- token helpers -------------------------------------------------------------------------
  const Token& Cur() const { return tokens_[pos_]; }
  const Token& Peek(size_t ahead = 1) const {
    return tokens_[std::min(pos_ + ahead, tokens_.size() - 1)];
  }
  void Next() {
    if (pos_ + 1 < tokens_.size()) ++pos_;
  }
  bool IsOp(absl::string_view op) const {
    return Cur().type == TokenType::kOp && Cur().value == op;
  }
  bool IsName(absl::string_view name) const {
    return Cur().type == TokenType::kName && Cur().value == name;
  }
  bool SkipOp(absl::string_view op) {
    if (!IsOp(op)) return false;
    Next();
    return true;
  }
  bool SkipName(absl::string_view name) {
    if (!IsName(name)) return false;
    Next();
    return true;
  }
  absl::Status Error(absl::string_view message) const {
    return absl::InvalidArgumentError(absl::StrCat("line ", Cur().line, ": ", message));
  }
  absl::Status Unexpected(absl::string_view expected) const {
    return Error(absl::StrCat("unexpected '", Describe(Cur()), "', expected '", expected, "'"));
  }
  absl::Status ExpectOp(absl::string_view op) {
    if (!SkipOp(op)) return Unexpected(op);
    return absl::OkStatus();
  }
  absl::Status ExpectBlockEnd() {
    if (Cur().type != TokenType::kBlockEnd) return Unexpected("end of statement block");
    Next();
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> ExpectName() {
    if (Cur().type != TokenType::kName) {
      return Error(absl::StrCat("expected name, got '", Describe(Cur()), "'"));
    }
    std::string name = Cur().value;
    Next();
    return name;
  }

  ExprPtr MakeExpr(ExprKind kind, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line;
    return e;
  }

  // Sealed records the height of a completed node. Errors: "expression nested too deeply".
  absl::StatusOr<ExprPtr> Sealed(ExprPtr e) {
    int height = 0;
    for (const ExprPtr& arg : e->args) {
      if (arg != nullptr) height = std::max(height, arg->depth);
    }
    for (const auto& [key, value] : e->kwargs) height = std::max(height, value->depth);
    e->depth = height + 1;
    if (e->depth > kMaxExprHeight) {
      return absl::InvalidArgumentError(
          absl::StrCat("line ", e->line, ": expression nested too deeply"));
    }
    return e;
  }

  // Depth guards recursion of the recursive-descent parser.
  struct DepthGuard {
    explicit DepthGuard(int* depth) : depth(depth) { ++*depth; }
    ~DepthGuard() { --*depth; }
    int* depth;
  };

  // --- statements ----------------------------------------------------------------------------

  // SubParse parses nodes into `body` until a block tag named in `end_names` (consumed up to and
  // including its name; stored in `found_end`) or the end of the template.
  absl::Status SubParse(Body* body, std::initializer_list<absl::string_view> end_names,
                        std::string* found_end) {
    DepthGuard guard(&depth_);
    if (depth_ > kMaxDepth) return Error("template nested too deeply");
    while (true) {
      const Token& token = Cur();
      switch (token.type) {
        case TokenType::kText: {
          auto stmt = std::make_unique<Stmt>();
          stmt->kind = StmtKind::kText;
          stmt->line = token.line;
          stmt->text = token.value;
          body->push_back(std::move(stmt));
          Next();
          break;
        }
        case TokenType::kVarBegin: {
          auto stmt = std::make_unique<Stmt>();
          stmt->kind = StmtKind::kOutput;
          stmt->line = token.line;
          Next();
          SLUICE_ASSIGN_OR_RETURN(stmt->expr, ParseTuple(true, false));
          if (Cur().type != TokenType::kVarEnd) return Unexpected("end of print statement");
          Next();
          body->push_back(std::move(stmt));
          break;
        }
        case TokenType::kBlockBegin: {
          Next();
          if (Cur().type != TokenType::kName) return Error("tag name expected");
          for (absl::string_view end : end_names) {
            if (Cur().value == end) {
              *found_end = Cur().value;
              Next();
              return absl::OkStatus();
            }
          }
          SLUICE_ASSIGN_OR_RETURN(StmtPtr stmt, ParseStatement());
          if (stmt != nullptr) body->push_back(std::move(stmt));
          break;
        }
        case TokenType::kEof: {
          if (end_names.size() == 0) return absl::OkStatus();
          std::vector<std::string> quoted;
          for (absl::string_view end : end_names) quoted.push_back(absl::StrCat("'", end, "'"));
          return Error(
              absl::StrCat("Unexpected end of template. Jinja was looking for the following tags: ",
                           absl::StrJoin(quoted, " or "), "."));
        }
        default:
          return Error(absl::StrCat("unexpected '", Describe(token), "'"));
      }
    }
  }

  absl::StatusOr<StmtPtr> ParseStatement() {
    const int line = Cur().line;
    const std::string tag = Cur().value;
    auto stmt = std::make_unique<Stmt>();
    stmt->line = line;
    Next();
    std::string end;
    if (tag == "for") {
      stmt->kind = StmtKind::kFor;
      SLUICE_RETURN_IF_ERROR(ParseTargets(stmt.get(), false));
      if (!SkipName("in")) return Unexpected("in");
      SLUICE_ASSIGN_OR_RETURN(stmt->expr, ParseTuple(false, false));
      if (SkipName("if")) {
        SLUICE_ASSIGN_OR_RETURN(stmt->condition, ParseExpression(true));
      }
      if (IsName("recursive")) return Error("recursive loops are not supported");
      SLUICE_RETURN_IF_ERROR(ExpectBlockEnd());
      ++loop_depth_;
      SLUICE_RETURN_IF_ERROR(SubParse(&stmt->body, {"endfor", "else"}, &end));
      --loop_depth_;
      SLUICE_RETURN_IF_ERROR(ExpectBlockEnd());
      if (end == "else") {
        SLUICE_RETURN_IF_ERROR(SubParse(&stmt->else_body, {"endfor"}, &end));
        SLUICE_RETURN_IF_ERROR(ExpectBlockEnd());
      }
      return stmt;
    }
    if (tag == "if") {
      stmt->kind = StmtKind::kIf;
      while (true) {
        SLUICE_ASSIGN_OR_RETURN(ExprPtr cond, ParseTuple(false, false));
        SLUICE_RETURN_IF_ERROR(ExpectBlockEnd());
        Body body;
        SLUICE_RETURN_IF_ERROR(SubParse(&body, {"elif", "else", "endif"}, &end));
        stmt->branches.emplace_back(std::move(cond), std::move(body));
        if (end == "elif") continue;
        SLUICE_RETURN_IF_ERROR(ExpectBlockEnd());
        if (end == "else") {
          Body else_body;
          SLUICE_RETURN_IF_ERROR(SubParse(&else_body, {"endif"}, &end));
          SLUICE_RETURN_IF_ERROR(ExpectBlockEnd());
          stmt->branches.emplace_back(nullptr, std::move(else_body));
        }
        return stmt;
      }
    }
    if (tag == "set") {
      SLUICE_RETURN_IF_ERROR(ParseTargets(stmt.get(), true));
      if (SkipOp("=")) {
        stmt->kind = StmtKind::kSet;
        SLUICE_ASSIGN_OR_RETURN(stmt->expr, ParseTuple(true, false));
        SLUICE_RETURN_IF_ERROR(ExpectBlockEnd());
        return stmt;
      }
      if (stmt->targets_tuple || !stmt->attr.empty()) return Unexpected("=");
      stmt->kind = StmtKind::kBlockSet;
      if (IsOp("|")) {
        SLUICE_ASSIGN_OR_RETURN(stmt->expr, ParseFilterChain(nullptr));
      }
      SLUICE_RETURN_IF_ERROR(ExpectBlockEnd());
      SLUICE_RETURN_IF_ERROR(SubParse(&stmt->body, {"endset"}, &end));
      SLUICE_RETURN_IF_ERROR(ExpectBlockEnd());
      return stmt;
    }
    if (tag == "macro") {
      stmt->kind = StmtKind::kMacro;
      SLUICE_ASSIGN_OR_RETURN(stmt->text, ExpectName());
      SLUICE_RETURN_IF_ERROR(ParseParams(stmt.get()));
      SLUICE_RETURN_IF_ERROR(ExpectBlockEnd());
      const int saved_loop_depth = loop_depth_;
      loop_depth_ = 0;
      SLUICE_RETURN_IF_ERROR(SubParse(&stmt->body, {"endmacro"}, &end));
      loop_depth_ = saved_loop_depth;
      if (Cur().type == TokenType::kName) Next();  // optional `{% endmacro name %}`
      SLUICE_RETURN_IF_ERROR(ExpectBlockEnd());
      return stmt;
    }
    if (tag == "call") {
      stmt->kind = StmtKind::kCallBlock;
      if (IsOp("(")) SLUICE_RETURN_IF_ERROR(ParseParams(stmt.get()));
      SLUICE_ASSIGN_OR_RETURN(stmt->expr, ParseExpression(true));
      if (stmt->expr->kind != ExprKind::kCall) return Error("expected call");
      SLUICE_RETURN_IF_ERROR(ExpectBlockEnd());
      const int saved_loop_depth = loop_depth_;
      loop_depth_ = 0;
      SLUICE_RETURN_IF_ERROR(SubParse(&stmt->body, {"endcall"}, &end));
      loop_depth_ = saved_loop_depth;
      SLUICE_RETURN_IF_ERROR(ExpectBlockEnd());
      return stmt;
    }
    if (tag == "filter") {
      stmt->kind = StmtKind::kFilterBlock;
      SLUICE_ASSIGN_OR_RETURN(stmt->expr, ParseFilterChain(nullptr, /*leading_pipe=*/false));
      SLUICE_RETURN_IF_ERROR(ExpectBlockEnd());
      SLUICE_RETURN_IF_ERROR(SubParse(&stmt->body, {"endfilter"}, &end));
      SLUICE_RETURN_IF_ERROR(ExpectBlockEnd());
      return stmt;
    }
    if (tag == "generation") {
      stmt->kind = StmtKind::kGeneration;
      SLUICE_RETURN_IF_ERROR(ExpectBlockEnd());
      SLUICE_RETURN_IF_ERROR(SubParse(&stmt->body, {"endgeneration"}, &end));
      SLUICE_RETURN_IF_ERROR(ExpectBlockEnd());
      return stmt;
    }
    if (tag == "break" || tag == "continue") {
      if (loop_depth_ == 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("line ", line, ": '", tag, "' outside of a for loop"));
      }
      stmt->kind = tag == "break" ? StmtKind::kBreak : StmtKind::kContinue;
      SLUICE_RETURN_IF_ERROR(ExpectBlockEnd());
      return stmt;
    }
    return absl::InvalidArgumentError(
        absl::StrCat("line ", line, ": Encountered unknown tag '", tag, "'."));
  }

  // ParseTargets parses `name`, `a, b`, `(a, b)` or (when `allow_namespace`) `ns.attr`.
  absl::Status ParseTargets(Stmt* stmt, bool allow_namespace) {
    if (allow_namespace && Cur().type == TokenType::kName && Peek().type == TokenType::kOp &&
        Peek().value == ".") {
      stmt->targets.push_back(Cur().value);
      Next();
      Next();
      SLUICE_ASSIGN_OR_RETURN(stmt->attr, ExpectName());
      return absl::OkStatus();
    }
    const bool paren = SkipOp("(");
    while (true) {
      SLUICE_ASSIGN_OR_RETURN(std::string name, ExpectName());
      stmt->targets.push_back(std::move(name));
      if (!SkipOp(",")) break;
      stmt->targets_tuple = true;
      if (paren && IsOp(")")) break;
      if (!paren && Cur().type != TokenType::kName) break;
    }
    if (paren) {
      SLUICE_RETURN_IF_ERROR(ExpectOp(")"));
      stmt->targets_tuple = true;
    }
    return absl::OkStatus();
  }

  absl::Status ParseParams(Stmt* stmt) {
    SLUICE_RETURN_IF_ERROR(ExpectOp("("));
    while (!IsOp(")")) {
      if (!stmt->params.empty()) SLUICE_RETURN_IF_ERROR(ExpectOp(","));
      if (IsOp(")")) break;
      MacroParam param;
      SLUICE_ASSIGN_OR_RETURN(param.name, ExpectName());
      if (SkipOp("=")) {
        SLUICE_ASSIGN_OR_RETURN(param.default_value, ParseExpression(true));
      } else {
        for (const auto& p : stmt->params) {
          if (p.default_value != nullptr)
            return Error("non-default argument follows default argument");
        }
      }
      stmt->params.push_back(std::move(param));
    }
    Next();
    return absl::OkStatus();
  }

  // --- expressions ---------------------------------------------------------------------------

  bool IsTupleEnd() const {
    const Token& t = Cur();
    return t.type == TokenType::kVarEnd || t.type == TokenType::kBlockEnd ||
           t.type == TokenType::kEof || (t.type == TokenType::kOp && t.value == ")");
  }

  // ParseTuple parses `a` or `a, b, ...` (a tuple). `explicit_parens` allows `()`.
  absl::StatusOr<ExprPtr> ParseTuple(bool with_condexpr, bool explicit_parens) {
    const int line = Cur().line;
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) SLUICE_RETURN_IF_ERROR(ExpectOp(","));
      if (IsTupleEnd()) break;
      ExprPtr item;
      if (with_condexpr) {
        SLUICE_ASSIGN_OR_RETURN(item, ParseExpression(true));
      } else {
        SLUICE_ASSIGN_OR_RETURN(item, ParseOr());
      }
      items.push_back(std::move(item));
      if (IsOp(",")) {
        is_tuple = true;
      } else {
        break;
      }
    }
    if (!is_tuple) {
      if (!items.empty()) return std::move(items[0]);
      if (!explicit_parens) {
        return Error(absl::StrCat("Expected an expression, got '", Describe(Cur()), "'"));
      }
    }
    auto tuple = MakeExpr(ExprKind::kTuple, line);
    tuple->args = std::move(items);
    return Sealed(std::move(tuple));
  }

  absl::StatusOr<ExprPtr> ParseExpression(bool with_condexpr) {
    DepthGuard guard(&depth_);
    if (depth_ > kMaxDepth) return Error("expression nested too deeply");
    if (!with_condexpr) return ParseOr();
    SLUICE_ASSIGN_OR_RETURN(ExprPtr expr, ParseOr());
    while (IsName("if")) {
      const int line = Cur().line;
      Next();
      auto cond = MakeExpr(ExprKind::kCondExpr, line);
      SLUICE_ASSIGN_OR_RETURN(ExprPtr test, ParseOr());
      ExprPtr otherwise;
      if (SkipName("else")) {
        SLUICE_ASSIGN_OR_RETURN(otherwise, ParseExpression(true));
      }
      cond->args.push_back(std::move(test));
      cond->args.push_back(std::move(expr));
      cond->args.push_back(std::move(otherwise));
      SLUICE_ASSIGN_OR_RETURN(expr, Sealed(std::move(cond)));
    }
    return expr;
  }

  absl::StatusOr<ExprPtr> ParseBinaryChain(absl::StatusOr<ExprPtr> (Parser::*next)(),
                                           std::initializer_list<absl::string_view> ops,
                                           bool name_ops) {
    SLUICE_ASSIGN_OR_RETURN(ExprPtr left, (this->*next)());
    while (true) {
      std::string op;
      for (absl::string_view candidate : ops) {
        if (name_ops ? IsName(candidate) : IsOp(candidate)) op = std::string(candidate);
      }
      if (op.empty()) return left;
      const int line = Cur().line;
      Next();
      SLUICE_ASSIGN_OR_RETURN(ExprPtr right, (this->*next)());
      auto bin = MakeExpr(ExprKind::kBinary, line);
      bin->name = op;
      bin->args.push_back(std::move(left));
      bin->args.push_back(std::move(right));
      SLUICE_ASSIGN_OR_RETURN(left, Sealed(std::move(bin)));
    }
  }

  absl::StatusOr<ExprPtr> ParseOr() { return ParseBinaryChain(&Parser::ParseAnd, {"or"}, true); }
  absl::StatusOr<ExprPtr> ParseAnd() { return ParseBinaryChain(&Parser::ParseNot, {"and"}, true); }

  absl::StatusOr<ExprPtr> ParseNot() {
    if (IsName("not")) {
      DepthGuard guard(&depth_);
      if (depth_ > kMaxDepth) return Error("expression nested too deeply");
      const int line = Cur().line;
      Next();
      auto e = MakeExpr(ExprKind::kUnary, line);
      e->name = "not";
      SLUICE_ASSIGN_OR_RETURN(ExprPtr operand, ParseNot());
      e->args.push_back(std::move(operand));
      return Sealed(std::move(e));
    }
    return ParseCompare();
  }

  absl::StatusOr<ExprPtr> ParseCompare() {
    const int line = Cur().line;
    SLUICE_ASSIGN_OR_RETURN(ExprPtr first, ParseMath1());
    ExprPtr cmp;
    while (true) {
      std::string op;
      if (Cur().type == TokenType::kOp &&
          (Cur().value == "==" || Cur().value == "!=" || Cur().value == "<" ||
           Cur().value == "<=" || Cur().value == ">" || Cur().value == ">=")) {
        op = Cur().value;
        Next();
      } else if (IsName("in")) {
        op = "in";
        Next();
      } else if (IsName("not") && Peek().type == TokenType::kName && Peek().value == "in") {
        op = "notin";
        Next();
        Next();
      } else {
        break;
      }
      if (cmp == nullptr) {
        cmp = MakeExpr(ExprKind::kCompare, line);
        cmp->args.push_back(std::move(first));
      }
      SLUICE_ASSIGN_OR_RETURN(ExprPtr operand, ParseMath1());
      cmp->ops.push_back(op);
      cmp->args.push_back(std::move(operand));
    }
    if (cmp == nullptr) return first;
    return Sealed(std::move(cmp));
  }

  absl::StatusOr<ExprPtr> ParseMath1() {
    return ParseBinaryChain(&Parser::ParseConcat, {"+", "-"}, false);
  }
  absl::StatusOr<ExprPtr> ParseConcat() {
    return ParseBinaryChain(&Parser::ParseMath2, {"~"}, false);
  }
  absl::StatusOr<ExprPtr> ParseMath2() {
    return ParseBinaryChain(&Parser::ParsePow, {"*", "/", "//", "%"}, false);
  }
  absl::StatusOr<ExprPtr> ParsePow() {
    return ParseBinaryChain(&Parser::ParseUnaryWithFilter, {"**"}, false);
  }
  absl::StatusOr<ExprPtr> ParseUnaryWithFilter() { return ParseUnary(true); }

  absl::StatusOr<ExprPtr> ParseUnary(bool with_filter) {
    DepthGuard guard(&depth_);
    if (depth_ > kMaxDepth) return Error("expression nested too deeply");
    ExprPtr node;
    if (IsOp("-") || IsOp("+")) {
      auto e = MakeExpr(ExprKind::kUnary, Cur().line);
      e->name = Cur().value;
      Next();
      SLUICE_ASSIGN_OR_RETURN(ExprPtr operand, ParseUnary(false));
      e->args.push_back(std::move(operand));
      SLUICE_ASSIGN_OR_RETURN(node, Sealed(std::move(e)));
    } else {
      SLUICE_ASSIGN_OR_RETURN(node, ParsePrimary());
    }
    SLUICE_ASSIGN_OR_RETURN(node, ParsePostfix(std::move(node)));
    if (with_filter) {
      SLUICE_ASSIGN_OR_RETURN(node, ParseFilterExpr(std::move(node)));
    }
    return node;
  }

  absl::StatusOr<ExprPtr> ParsePrimary() {
    const Token& token = Cur();
    const int line = token.line;
    switch (token.type) {
      case TokenType::kName: {
        auto e = MakeExpr(ExprKind::kLiteral, line);
        if (token.value == "true" || token.value == "True") {
          e->literal = Value::Bool(true);
        } else if (token.value == "false" || token.value == "False") {
          e->literal = Value::Bool(false);
        } else if (token.value == "none" || token.value == "None") {
          e->literal = Value::None();
        } else {
          e->kind = ExprKind::kName;
          e->name = token.value;
        }
        Next();
        return e;
      }
      case TokenType::kString: {
        std::string s;
        while (Cur().type == TokenType::kString) {
          s += Cur().value;
          Next();
        }
        auto e = MakeExpr(ExprKind::kLiteral, line);
        e->literal = Value::String(std::move(s));
        return e;
      }
      case TokenType::kInt: {
        auto e = MakeExpr(ExprKind::kLiteral, line);
        int64_t v = 0;
        if (!absl::SimpleAtoi(token.value, &v)) {
          double d = 0;
          if (!absl::SimpleAtod(token.value, &d)) return Error("invalid integer literal");
          e->literal = Value::Float(d);  // beyond int64: degrade to float
        } else {
          e->literal = Value::Int(v);
        }
        Next();
        return e;
      }
      case TokenType::kFloat: {
        auto e = MakeExpr(ExprKind::kLiteral, line);
        e->literal = Value::Float(std::strtod(token.value.c_str(), nullptr));
        Next();
        return e;
      }
      case TokenType::kOp:
        if (token.value == "(") {
          Next();
          SLUICE_ASSIGN_OR_RETURN(ExprPtr inner, ParseTuple(true, true));
          SLUICE_RETURN_IF_ERROR(ExpectOp(")"));
          return inner;
        }
        if (token.value == "[") {
          Next();
          auto e = MakeExpr(ExprKind::kList, line);
          while (!IsOp("]")) {
            if (!e->args.empty()) SLUICE_RETURN_IF_ERROR(ExpectOp(","));
            if (IsOp("]")) break;
            SLUICE_ASSIGN_OR_RETURN(ExprPtr item, ParseExpression(true));
            e->args.push_back(std::move(item));
          }
          Next();
          return Sealed(std::move(e));
        }
        if (token.value == "{") {
          Next();
          auto e = MakeExpr(ExprKind::kDict, line);
          while (!IsOp("}")) {
            if (!e->args.empty()) SLUICE_RETURN_IF_ERROR(ExpectOp(","));
            if (IsOp("}")) break;
            SLUICE_ASSIGN_OR_RETURN(ExprPtr key, ParseExpression(true));
            SLUICE_RETURN_IF_ERROR(ExpectOp(":"));
            SLUICE_ASSIGN_OR_RETURN(ExprPtr value, ParseExpression(true));
            e->args.push_back(std::move(key));
            e->args.push_back(std::move(value));
          }
          Next();
          return Sealed(std::move(e));
        }
        break;
      default:
        break;
    }
    return Error(absl::StrCat("unexpected '", Describe(token), "'"));
  }

  absl::StatusOr<ExprPtr> ParsePostfix(ExprPtr node) {
    while (true) {
      if (IsOp(".") || IsOp("[")) {
        SLUICE_ASSIGN_OR_RETURN(node, ParseSubscript(std::move(node)));
      } else if (IsOp("(")) {
        SLUICE_ASSIGN_OR_RETURN(node, ParseCall(std::move(node)));
      } else {
        return node;
      }
    }
  }

  absl::StatusOr<ExprPtr> ParseFilterExpr(ExprPtr node) {
    while (true) {
      if (IsOp("|")) {
        SLUICE_ASSIGN_OR_RETURN(node, ParseFilterChain(std::move(node)));
      } else if (IsName("is")) {
        SLUICE_ASSIGN_OR_RETURN(node, ParseTest(std::move(node)));
      } else if (IsOp("(")) {
        SLUICE_ASSIGN_OR_RETURN(node, ParseCall(std::move(node)));
      } else {
        return node;
      }
    }
  }

  absl::StatusOr<ExprPtr> ParseSubscript(ExprPtr node) {
    const int line = Cur().line;
    if (SkipOp(".")) {
      if (Cur().type == TokenType::kName) {
        auto e = MakeExpr(ExprKind::kGetAttr, line);
        e->name = Cur().value;
        e->args.push_back(std::move(node));
        Next();
        return Sealed(std::move(e));
      }
      if (Cur().type == TokenType::kInt) {
        auto e = MakeExpr(ExprKind::kGetItem, line);
        e->args.push_back(std::move(node));
        auto index = MakeExpr(ExprKind::kLiteral, line);
        int64_t v = 0;
        if (!absl::SimpleAtoi(Cur().value, &v)) return Error("invalid index");
        index->literal = Value::Int(v);
        e->args.push_back(std::move(index));
        Next();
        return Sealed(std::move(e));
      }
      return Error(absl::StrCat("expected name or number, got '", Describe(Cur()), "'"));
    }
    SLUICE_RETURN_IF_ERROR(ExpectOp("["));
    // Subscript: expr | [lo]:[hi][:[step]]
    std::vector<ExprPtr> parts;
    bool is_slice = false;
    if (!IsOp(":")) {
      SLUICE_ASSIGN_OR_RETURN(ExprPtr first, ParseExpression(true));
      parts.push_back(std::move(first));
    } else {
      parts.push_back(nullptr);
    }
    if (SkipOp(":")) {
      is_slice = true;
      if (!IsOp("]") && !IsOp(":")) {
        SLUICE_ASSIGN_OR_RETURN(ExprPtr hi, ParseExpression(true));
        parts.push_back(std::move(hi));
      } else {
        parts.push_back(nullptr);
      }
      if (SkipOp(":") && !IsOp("]")) {
        SLUICE_ASSIGN_OR_RETURN(ExprPtr step, ParseExpression(true));
        parts.push_back(std::move(step));
      } else {
        parts.push_back(nullptr);
      }
    }
    SLUICE_RETURN_IF_ERROR(ExpectOp("]"));
    auto e = MakeExpr(is_slice ? ExprKind::kSlice : ExprKind::kGetItem, line);
    e->args.push_back(std::move(node));
    for (auto& part : parts) e->args.push_back(std::move(part));
    return Sealed(std::move(e));
  }

  // ParseCallArgs parses `(a, b, k=v)` into `e->args` (after existing args) and `e->kwargs`.
  absl::Status ParseCallArgs(Expr* e) {
    SLUICE_RETURN_IF_ERROR(ExpectOp("("));
    bool first = true;
    while (!IsOp(")")) {
      if (!first) SLUICE_RETURN_IF_ERROR(ExpectOp(","));
      first = false;
      if (IsOp(")")) break;
      if (IsOp("*") || IsOp("**")) return Error("*args and **kwargs are not supported");
      if (Cur().type == TokenType::kName && Peek().type == TokenType::kOp && Peek().value == "=") {
        std::string key = Cur().value;
        Next();
        Next();
        SLUICE_ASSIGN_OR_RETURN(ExprPtr value, ParseExpression(true));
        e->kwargs.emplace_back(std::move(key), std::move(value));
      } else {
        if (!e->kwargs.empty()) return Error("Invalid argument syntax: positional after keyword");
        SLUICE_ASSIGN_OR_RETURN(ExprPtr value, ParseExpression(true));
        e->args.push_back(std::move(value));
      }
    }
    Next();
    return absl::OkStatus();
  }

  absl::StatusOr<ExprPtr> ParseCall(ExprPtr callee) {
    auto e = MakeExpr(ExprKind::kCall, Cur().line);
    e->args.push_back(std::move(callee));
    SLUICE_RETURN_IF_ERROR(ParseCallArgs(e.get()));
    return Sealed(std::move(e));
  }

  absl::StatusOr<std::string> ParseDottedName() {
    SLUICE_ASSIGN_OR_RETURN(std::string name, ExpectName());
    while (IsOp(".")) {
      Next();
      SLUICE_ASSIGN_OR_RETURN(std::string part, ExpectName());
      absl::StrAppend(&name, ".", part);
    }
    return name;
  }

  // ParseFilterChain parses `| f(args) | g ...` applied to `node` (null: the block body).
  absl::StatusOr<ExprPtr> ParseFilterChain(ExprPtr node, bool leading_pipe = true) {
    bool first = true;
    while (first ? (!leading_pipe || IsOp("|")) : IsOp("|")) {
      if (leading_pipe || !first) Next();
      first = false;
      const int line = Cur().line;
      SLUICE_ASSIGN_OR_RETURN(std::string name, ParseDottedName());
      if (!HasFilter(name)) {
        return absl::InvalidArgumentError(
            absl::StrCat("line ", line, ": No filter named '", name, "'."));
      }
      auto e = MakeExpr(ExprKind::kFilter, line);
      e->name = std::move(name);
      e->args.push_back(std::move(node));
      if (IsOp("(")) SLUICE_RETURN_IF_ERROR(ParseCallArgs(e.get()));
      SLUICE_ASSIGN_OR_RETURN(node, Sealed(std::move(e)));
    }
    return node;
  }

  absl::StatusOr<ExprPtr> ParseTest(ExprPtr node) {
    const int line = Cur().line;
    Next();  // `is`
    auto e = MakeExpr(ExprKind::kTest, line);
    e->negated = SkipName("not");
    SLUICE_ASSIGN_OR_RETURN(e->name, ParseDottedName());
    if (!HasTest(e->name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("line ", line, ": No test named '", e->name, "'."));
    }
    e->args.push_back(std::move(node));
    const Token& t = Cur();
    if (IsOp("(")) {
      SLUICE_RETURN_IF_ERROR(ParseCallArgs(e.get()));
    } else if ((t.type == TokenType::kName && t.value != "else" && t.value != "or" &&
                t.value != "and" && t.value != "if") ||
               t.type == TokenType::kString || t.type == TokenType::kInt ||
               t.type == TokenType::kFloat || IsOp("[") || IsOp("{")) {
      if (IsName("is")) return Error("You cannot chain multiple tests with is");
      SLUICE_ASSIGN_OR_RETURN(ExprPtr arg, ParsePrimary());
      SLUICE_ASSIGN_OR_RETURN(arg, ParsePostfix(std::move(arg)));
      e->args.push_back(std::move(arg));
    }
    return Sealed(std::move(e));
  }

  std::vector<Token> tokens_;
  size_t pos_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Template>> ParseTemplate(const std::string& source) {
  SLUICE_ASSIGN_OR_RETURN(std::vector<Token> tokens, Tokenize(source));
  Parser parser(std::move(tokens));
  return parser.Run();
}

}  // namespace sluice::jinja
