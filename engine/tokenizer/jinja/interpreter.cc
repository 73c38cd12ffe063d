#include "engine/tokenizer/jinja/interpreter.h"

#include <algorithm>
#include <iterator>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/tokenizer/jinja/builtins.h"

namespace sluice::jinja {
namespace {

constexpr char kRaisedPayload[] = "sluice.jinja/raised";
constexpr char kLocatedPayload[] = "sluice.jinja/located";

// Locate prefixes "line N: " to a runtime error the first time it crosses a statement.
absl::Status Locate(absl::Status status, int line) {
  if (status.ok() || status.GetPayload(kRaisedPayload).has_value() ||
      status.GetPayload(kLocatedPayload).has_value()) {
    return status;
  }
  absl::Status located(status.code(), absl::StrCat("line ", line, ": ", status.message()));
  located.SetPayload(kLocatedPayload, absl::Cord("1"));
  return located;
}

}  // namespace

absl::Status RaisedError(absl::string_view message) {
  absl::Status status = absl::InvalidArgumentError(message);
  status.SetPayload(kRaisedPayload, absl::Cord("1"));
  return status;
}

absl::Status Interpreter::Append(std::string* out, absl::string_view text) {
  const int64_t size = static_cast<int64_t>(out->size() + text.size());
  SLUICE_RETURN_IF_ERROR(budget_.CheckOutput(size));
  // A block `set` captures into a string value, which kMaxValueBytes caps as well.
  if (size > static_cast<int64_t>(kMaxValueBytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("rendered output exceeds the limit of ", kMaxValueBytes, " bytes"));
  }
  SLUICE_RETURN_IF_ERROR(budget_.ChargeBytes(static_cast<int64_t>(text.size())));
  out->append(text.data(), text.size());
  return absl::OkStatus();
}

absl::StatusOr<std::string> Interpreter::Render(const Value& context) {
  globals_ = std::make_shared<Dict>();
  AddGlobals(globals_.get());
  root_ = std::make_shared<Frame>();
  if (context.is_dict()) {
    for (const auto& [key, value] : context.as_dict().entries()) root_->vars[key] = value;
  }
  budget_ = WorkBudget(budget_.limits());
  std::string out;
  Flow flow = Flow::kNormal;
  SLUICE_RETURN_IF_ERROR(ExecBody(template_.body, root_, &out, &flow));
  return out;
}

Value Interpreter::Lookup(const std::string& name, const FramePtr& frame) const {
  for (const Frame* f = frame.get(); f != nullptr; f = f->parent.get()) {
    auto it = f->vars.find(name);
    if (it != f->vars.end()) return it->second;
  }
  if (const Value* global = globals_->Get(name); global != nullptr) return *global;
  return Value::Undefined(absl::StrCat("'", name, "' is undefined"));
}

// ---------------------------------------------------------------------------------------------
// Statements

absl::Status Interpreter::ExecBody(const Body& body, const FramePtr& frame, std::string* out,
                                   Flow* flow) {
  for (const StmtPtr& stmt : body) {
    SLUICE_RETURN_IF_ERROR(Locate(ExecStmt(*stmt, frame, out, flow), stmt->line));
    if (*flow != Flow::kNormal) return absl::OkStatus();
  }
  return absl::OkStatus();
}

absl::Status Interpreter::ExecStmt(const Stmt& stmt, const FramePtr& frame, std::string* out,
                                   Flow* flow) {
  SLUICE_RETURN_IF_ERROR(budget_.ChargeOperations(1));
  switch (stmt.kind) {
    case StmtKind::kText:
      return Append(out, stmt.text);
    case StmtKind::kOutput: {
      SLUICE_ASSIGN_OR_RETURN(Value value, Eval(*stmt.expr, frame));
      return Append(out, ToStr(value));
    }
    case StmtKind::kIf:
      for (const auto& [cond, body] : stmt.branches) {
        bool take = true;
        if (cond != nullptr) {
          SLUICE_ASSIGN_OR_RETURN(Value value, Eval(*cond, frame));
          take = value.Truthy();
        }
        if (take) return ExecBody(body, frame, out, flow);
      }
      return absl::OkStatus();
    case StmtKind::kFor:
      return ExecFor(stmt, frame, out);
    case StmtKind::kSet: {
      SLUICE_ASSIGN_OR_RETURN(Value value, Eval(*stmt.expr, frame));
      return Assign(stmt, frame, std::move(value));
    }
    case StmtKind::kBlockSet: {
      std::string captured;
      Flow inner = Flow::kNormal;
      SLUICE_RETURN_IF_ERROR(ExecBody(stmt.body, frame, &captured, &inner));
      Value value = Value::String(std::move(captured));
      if (stmt.expr != nullptr) {
        SLUICE_ASSIGN_OR_RETURN(value, EvalFilter(*stmt.expr, frame, &value));
      }
      return Assign(stmt, frame, std::move(value));
    }
    case StmtKind::kFilterBlock: {
      std::string captured;
      Flow inner = Flow::kNormal;
      SLUICE_RETURN_IF_ERROR(ExecBody(stmt.body, frame, &captured, &inner));
      Value value = Value::String(std::move(captured));
      SLUICE_ASSIGN_OR_RETURN(value, EvalFilter(*stmt.expr, frame, &value));
      return Append(out, ToStr(value));
    }
    case StmtKind::kMacro:
      frame->vars[stmt.text] = MakeMacro(stmt, frame);
      return absl::OkStatus();
    case StmtKind::kCallBlock: {
      // `caller()` renders the call block's body (with the call block's params).
      std::weak_ptr<Frame> weak = frame;
      const Stmt* body_stmt = &stmt;
      Value caller = Value::MakeCallable(
          "caller", [this, weak, body_stmt](Interpreter&, const CallArgs& args) {
            return CallMacro(*body_stmt, weak, args, nullptr);
          });
      const Expr& call = *stmt.expr;
      SLUICE_ASSIGN_OR_RETURN(Value callee, Eval(*call.args[0], frame));
      SLUICE_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(call, 1, frame));
      args.keyword.emplace_back("caller", caller);
      SLUICE_ASSIGN_OR_RETURN(Value result, CallValue(callee, args));
      return Append(out, ToStr(result));
    }
    case StmtKind::kGeneration:
      return ExecBody(stmt.body, frame, out, flow);
    case StmtKind::kBreak:
      *flow = Flow::kBreak;
      return absl::OkStatus();
    case StmtKind::kContinue:
      *flow = Flow::kContinue;
      return absl::OkStatus();
  }
  return absl::OkStatus();
}

namespace {

// Unpack binds `targets` to `value` (tuple unpacking when `tuple`).
absl::Status Unpack(const std::vector<std::string>& targets, bool tuple, const Value& value,
                    absl::flat_hash_map<std::string, Value>* vars) {
  if (!tuple) {
    (*vars)[targets[0]] = value;
    return absl::OkStatus();
  }
  if (value.is_undefined()) return UndefinedError(value);
  if (!value.is_list() && !value.is_string() && !value.is_dict()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot unpack non-iterable ", value.TypeName(), " object"));
  }
  SLUICE_ASSIGN_OR_RETURN(List items, Iterate(value));
  if (items.size() > targets.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("too many values to unpack (expected ", targets.size(), ")"));
  }
  if (items.size() < targets.size()) {
    return absl::InvalidArgumentError(absl::StrCat("not enough values to unpack (expected ",
                                                   targets.size(), ", got ", items.size(), ")"));
  }
  for (size_t i = 0; i < targets.size(); ++i) (*vars)[targets[i]] = items[i];
  return absl::OkStatus();
}

}  // namespace

absl::Status Interpreter::Assign(const Stmt& stmt, const FramePtr& frame, Value value) {
  if (value.depth() > kMaxValueDepth) {
    return absl::InvalidArgumentError(
        absl::StrCat("value nested deeper than ", kMaxValueDepth, " levels"));
  }
  if (!stmt.attr.empty()) {
    // A namespace inside a namespace could form a reference cycle (leaked memory, endless
    // walks); chat templates never need one.
    if (value.has_namespace()) {
      return absl::InvalidArgumentError("a namespace cannot be stored in a namespace attribute");
    }
    Value target = Lookup(stmt.targets[0], frame);
    if (!target.is_namespace()) {
      return absl::InvalidArgumentError("cannot assign attribute on non-namespace object");
    }
    target.mutable_dict().Set(stmt.attr, std::move(value));
    return absl::OkStatus();
  }
  return Unpack(stmt.targets, stmt.targets_tuple, value, &frame->vars);
}

absl::Status Interpreter::ExecFor(const Stmt& stmt, const FramePtr& frame, std::string* out) {
  SLUICE_ASSIGN_OR_RETURN(Value iterable, Eval(*stmt.expr, frame));
  SLUICE_ASSIGN_OR_RETURN(List items, Iterate(iterable));
  SLUICE_RETURN_IF_ERROR(
      budget_.ChargeBytes(static_cast<int64_t>(items.size()) * kElementBytes));
  if (stmt.condition != nullptr) {
    List kept;
    for (Value& item : items) {
      SLUICE_RETURN_IF_ERROR(budget_.ChargeIterations(1));
      auto scope = std::make_shared<Frame>();
      scope->parent = frame;
      SLUICE_RETURN_IF_ERROR(Unpack(stmt.targets, stmt.targets_tuple, item, &scope->vars));
      SLUICE_ASSIGN_OR_RETURN(Value keep, Eval(*stmt.condition, scope));
      if (keep.Truthy()) kept.push_back(std::move(item));
    }
    items = std::move(kept);
  }
  if (items.empty()) {
    Flow flow = Flow::kNormal;
    return ExecBody(stmt.else_body, frame, out, &flow);
  }
  const int64_t length = static_cast<int64_t>(items.size());
  // Like Jinja's LoopContext, one `loop` object and one scope serve every iteration; their
  // entries are overwritten in place (far cheaper than rebuilding them per item).
  auto loop = std::make_shared<Dict>();
  auto cycle_index = std::make_shared<int64_t>(0);
  const char* const kKeys[] = {"index",  "index0", "revindex", "revindex0", "first",   "last",
                               "length", "depth",  "depth0",   "previtem",  "nextitem"};
  for (const char* key : kKeys) loop->Set(key, Value());
  loop->Set(
      "cycle",
      Value::MakeCallable(
          "cycle", [cycle_index](Interpreter&, const CallArgs& args) -> absl::StatusOr<Value> {
            if (args.positional.empty()) {
              return absl::InvalidArgumentError("no items for cycling given");
            }
            return args.positional[static_cast<size_t>(*cycle_index) % args.positional.size()];
          }));
  const Value loop_value = Value::MakeDict(loop);
  auto scope = std::make_shared<Frame>();
  scope->parent = frame;
  for (int64_t i = 0; i < length; ++i) {
    SLUICE_RETURN_IF_ERROR(budget_.ChargeIterations(1));
    *cycle_index = i;
    loop->SetAt(0, Value::Int(i + 1));
    loop->SetAt(1, Value::Int(i));
    loop->SetAt(2, Value::Int(length - i));
    loop->SetAt(3, Value::Int(length - i - 1));
    loop->SetAt(4, Value::Bool(i == 0));
    loop->SetAt(5, Value::Bool(i == length - 1));
    loop->SetAt(6, Value::Int(length));
    loop->SetAt(7, Value::Int(1));
    loop->SetAt(8, Value::Int(0));
    loop->SetAt(9, i > 0 ? items[i - 1] : Value::Undefined("there is no previous item"));
    loop->SetAt(10, i + 1 < length ? items[i + 1] : Value::Undefined("there is no next item"));
    scope->vars.clear();
    scope->vars["loop"] = loop_value;
    SLUICE_RETURN_IF_ERROR(Unpack(stmt.targets, stmt.targets_tuple, items[i], &scope->vars));
    Flow flow = Flow::kNormal;
    SLUICE_RETURN_IF_ERROR(ExecBody(stmt.body, scope, out, &flow));
    if (flow == Flow::kBreak) break;
  }
  return absl::OkStatus();
}

Value Interpreter::MakeMacro(const Stmt& macro, const FramePtr& frame) {
  // The closure holds the defining frame weakly: the frame owns the macro value, so a strong
  // reference would leak the cycle.
  std::weak_ptr<Frame> weak = frame;
  const Stmt* stmt = &macro;
  return Value::MakeCallable(macro.text, [weak, stmt](Interpreter& interp, const CallArgs& args) {
    const Value* caller = args.Kwarg("caller");
    return interp.CallMacro(*stmt, weak, args, caller);
  });
}

absl::StatusOr<Value> Interpreter::CallMacro(const Stmt& macro, const std::weak_ptr<Frame>& closure,
                                             const CallArgs& args, const Value* caller) {
  SLUICE_RETURN_IF_ERROR(budget_.ChargeOperations(1));
  FramePtr parent = closure.lock();
  if (parent == nullptr) parent = root_;
  auto scope = std::make_shared<Frame>();
  scope->parent = parent;
  if (args.positional.size() > macro.params.size()) {
    return absl::InvalidArgumentError(absl::StrCat("macro '", macro.text, "' takes not more than ",
                                                   macro.params.size(), " argument(s)"));
  }
  for (const auto& [key, value] : args.keyword) {
    if (key == "caller" && caller != nullptr) continue;
    bool known = false;
    for (const MacroParam& p : macro.params) known = known || p.name == key;
    if (!known) {
      return absl::InvalidArgumentError(
          absl::StrCat("macro '", macro.text, "' takes no keyword argument '", key, "'"));
    }
  }
  for (size_t i = 0; i < macro.params.size(); ++i) {
    const MacroParam& param = macro.params[i];
    if (i < args.positional.size()) {
      scope->vars[param.name] = args.positional[i];
    } else if (const Value* kw = args.Kwarg(param.name); kw != nullptr) {
      scope->vars[param.name] = *kw;
    } else if (param.default_value != nullptr) {
      SLUICE_ASSIGN_OR_RETURN(scope->vars[param.name], Eval(*param.default_value, scope));
    } else {
      scope->vars[param.name] =
          Value::Undefined(absl::StrCat("parameter '", param.name, "' was not provided"));
    }
  }
  if (caller != nullptr) scope->vars["caller"] = *caller;
  SLUICE_RETURN_IF_ERROR(budget_.EnterCall());
  std::string out;
  Flow flow = Flow::kNormal;
  absl::Status status = ExecBody(macro.body, scope, &out, &flow);
  budget_.ExitCall();
  SLUICE_RETURN_IF_ERROR(status);
  return Value::String(std::move(out));
}

absl::StatusOr<Value> Interpreter::CallValue(const Value& callee, const CallArgs& args) {
  if (callee.is_undefined()) return UndefinedError(callee);
  if (!callee.is_callable()) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", callee.TypeName(), "' object is not callable"));
  }
  return callee.as_callable().fn(*this, args);
}

// ---------------------------------------------------------------------------------------------
// Expressions

absl::StatusOr<CallArgs> Interpreter::EvalArgs(const Expr& expr, size_t first_arg,
                                               const FramePtr& frame) {
  CallArgs args;
  for (size_t i = first_arg; i < expr.args.size(); ++i) {
    SLUICE_ASSIGN_OR_RETURN(Value v, Eval(*expr.args[i], frame));
    args.positional.push_back(std::move(v));
  }
  for (const auto& [key, value_expr] : expr.kwargs) {
    SLUICE_ASSIGN_OR_RETURN(Value v, Eval(*value_expr, frame));
    args.keyword.emplace_back(key, std::move(v));
  }
  return args;
}

absl::StatusOr<Value> Interpreter::EvalFilter(const Expr& expr, const FramePtr& frame,
                                              const Value* input) {
  SLUICE_RETURN_IF_ERROR(budget_.ChargeOperations(1));
  Value operand;
  if (expr.args[0] != nullptr) {
    if (expr.args[0]->kind == ExprKind::kFilter) {
      SLUICE_ASSIGN_OR_RETURN(operand, EvalFilter(*expr.args[0], frame, input));
    } else {
      SLUICE_ASSIGN_OR_RETURN(operand, Eval(*expr.args[0], frame));
    }
  } else if (input != nullptr) {
    operand = *input;
  }
  SLUICE_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(expr, 1, frame));
  // Most filters walk their input (deep: tojson, sort, join, map, ...); these look at its
  // top level only, or not at all, and are used per message in loops.
  static constexpr absl::string_view kShallowFilters[] = {
      "attr", "batch", "count", "d", "default", "first", "items", "last", "length", "list",
      "reverse", "safe"};
  const bool shallow = std::find(std::begin(kShallowFilters), std::end(kShallowFilters),
                                 expr.name) != std::end(kShallowFilters);
  SLUICE_RETURN_IF_ERROR(
      budget_.ChargeBytes(shallow ? operand.ShallowWeight() : operand.weight()));
  for (const Value& v : args.positional) {
    SLUICE_RETURN_IF_ERROR(budget_.ChargeBytes(v.ShallowWeight()));
  }
  return Charged(ApplyFilter(*this, expr.name, operand, args));
}

absl::StatusOr<Value> Interpreter::Charged(absl::StatusOr<Value> result) {
  if (result.ok()) SLUICE_RETURN_IF_ERROR(budget_.ChargeBytes(result->ShallowWeight()));
  return result;
}

absl::Status Interpreter::ChargeArgs(const CallArgs& args) {
  for (const Value& v : args.positional) SLUICE_RETURN_IF_ERROR(budget_.ChargeBytes(v.weight()));
  for (const auto& [key, v] : args.keyword) {
    SLUICE_RETURN_IF_ERROR(budget_.ChargeBytes(v.weight()));
  }
  return absl::OkStatus();
}

absl::StatusOr<Value> Interpreter::Eval(const Expr& expr, const FramePtr& frame) {
  SLUICE_RETURN_IF_ERROR(budget_.ChargeOperations(1));
  switch (expr.kind) {
    case ExprKind::kLiteral:
      return expr.literal;
    case ExprKind::kName:
      return Lookup(expr.name, frame);
    case ExprKind::kList:
    case ExprKind::kTuple: {
      List items;
      for (const ExprPtr& arg : expr.args) {
        SLUICE_ASSIGN_OR_RETURN(Value v, Eval(*arg, frame));
        items.push_back(std::move(v));
      }
      return Charged(Value::MakeList(std::move(items), expr.kind == ExprKind::kTuple));
    }
    case ExprKind::kDict: {
      auto dict = std::make_shared<Dict>();
      for (size_t i = 0; i + 1 < expr.args.size(); i += 2) {
        SLUICE_ASSIGN_OR_RETURN(Value key, Eval(*expr.args[i], frame));
        SLUICE_ASSIGN_OR_RETURN(Value value, Eval(*expr.args[i + 1], frame));
        if (!key.is_string()) {
          return absl::InvalidArgumentError(
              absl::StrCat("dict keys must be strings, got ", key.TypeName()));
        }
        dict->Set(key.as_string(), std::move(value));
      }
      return Charged(Value::MakeDict(std::move(dict)));
    }
    case ExprKind::kGetAttr: {
      SLUICE_ASSIGN_OR_RETURN(Value obj, Eval(*expr.args[0], frame));
      SLUICE_ASSIGN_OR_RETURN(Value attr, GetAttribute(obj, expr.name));
      // A bound method (s.split, d.items, ...) walks its receiver when called.
      if (attr.is_callable()) SLUICE_RETURN_IF_ERROR(budget_.ChargeBytes(obj.weight()));
      return attr;
    }
    case ExprKind::kGetItem: {
      SLUICE_ASSIGN_OR_RETURN(Value obj, Eval(*expr.args[0], frame));
      SLUICE_ASSIGN_OR_RETURN(Value key, Eval(*expr.args[1], frame));
      return GetItem(obj, key);
    }
    case ExprKind::kSlice: {
      SLUICE_ASSIGN_OR_RETURN(Value obj, Eval(*expr.args[0], frame));
      Value parts[3] = {Value::None(), Value::None(), Value::None()};
      for (int i = 0; i < 3; ++i) {
        if (expr.args[i + 1] != nullptr) {
          SLUICE_ASSIGN_OR_RETURN(parts[i], Eval(*expr.args[i + 1], frame));
        }
      }
      SLUICE_RETURN_IF_ERROR(budget_.ChargeBytes(obj.ShallowWeight()));
      return Charged(SliceValue(obj, parts[0], parts[1], parts[2]));
    }
    case ExprKind::kCall: {
      SLUICE_ASSIGN_OR_RETURN(Value callee, Eval(*expr.args[0], frame));
      SLUICE_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(expr, 1, frame));
      return Charged(CallValue(callee, args));
    }
    case ExprKind::kFilter:
      return EvalFilter(expr, frame, nullptr);
    case ExprKind::kTest: {
      SLUICE_ASSIGN_OR_RETURN(Value operand, Eval(*expr.args[0], frame));
      SLUICE_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(expr, 1, frame));
      // Type tests look at the operand's kind; tests with arguments (==, in, ...) walk both.
      SLUICE_RETURN_IF_ERROR(budget_.ChargeBytes(args.positional.empty() && args.keyword.empty()
                                                     ? operand.ShallowWeight()
                                                     : operand.weight()));
      SLUICE_RETURN_IF_ERROR(ChargeArgs(args));
      SLUICE_ASSIGN_OR_RETURN(bool result, ApplyTest(*this, expr.name, operand, args));
      return Value::Bool(result != expr.negated);
    }
    case ExprKind::kUnary: {
      SLUICE_ASSIGN_OR_RETURN(Value operand, Eval(*expr.args[0], frame));
      if (expr.name == "not") return Value::Bool(!operand.Truthy());
      if (operand.is_undefined()) return UndefinedError(operand);
      if (operand.is_bool()) operand = Value::Int(operand.as_int());
      if (!operand.is_number()) {
        return absl::InvalidArgumentError(
            absl::StrCat("bad operand type for unary ", expr.name, ": '", operand.TypeName(), "'"));
      }
      if (expr.name == "+") return operand;
      if (operand.is_float()) return Value::Float(-operand.as_double());
      if (operand.as_int() == INT64_MIN) return Value::Float(-operand.as_double());
      return Value::Int(-operand.as_int());
    }
    case ExprKind::kBinary:
      return EvalBinary(expr, frame);
    case ExprKind::kCompare:
      return EvalCompare(expr, frame);
    case ExprKind::kCondExpr: {
      SLUICE_ASSIGN_OR_RETURN(Value cond, Eval(*expr.args[0], frame));
      if (cond.Truthy()) return Eval(*expr.args[1], frame);
      if (expr.args[2] == nullptr) {
        return Value::Undefined(
            "the inline if-expression evaluated to false and no else "
            "section was defined.");
      }
      return Eval(*expr.args[2], frame);
    }
  }
  return absl::InternalError("unknown expression kind");
}

absl::StatusOr<Value> Interpreter::EvalBinary(const Expr& expr, const FramePtr& frame) {
  SLUICE_ASSIGN_OR_RETURN(Value left, Eval(*expr.args[0], frame));
  if (expr.name == "and") {
    if (!left.Truthy()) return left;
    return Eval(*expr.args[1], frame);
  }
  if (expr.name == "or") {
    if (left.Truthy()) return left;
    return Eval(*expr.args[1], frame);
  }
  SLUICE_ASSIGN_OR_RETURN(Value right, Eval(*expr.args[1], frame));
  return Charged(BinaryOp(expr.name, left, right));
}

absl::StatusOr<Value> Interpreter::EvalCompare(const Expr& expr, const FramePtr& frame) {
  SLUICE_ASSIGN_OR_RETURN(Value left, Eval(*expr.args[0], frame));
  for (size_t i = 0; i < expr.ops.size(); ++i) {
    SLUICE_ASSIGN_OR_RETURN(Value right, Eval(*expr.args[i + 1], frame));
    // ==, < and `in` walk both operands (deep for lists and dicts).
    SLUICE_RETURN_IF_ERROR(budget_.ChargeBytes(left.weight()));
    SLUICE_RETURN_IF_ERROR(budget_.ChargeBytes(right.weight()));
    const std::string& op = expr.ops[i];
    bool result = false;
    if (op == "==") {
      result = Equals(left, right);
    } else if (op == "!=") {
      result = !Equals(left, right);
    } else if (op == "in" || op == "notin") {
      SLUICE_ASSIGN_OR_RETURN(bool in, Contains(right, left));
      result = (op == "in") == in;
    } else {
      if (left.is_undefined()) return UndefinedError(left);
      if (right.is_undefined()) return UndefinedError(right);
      auto cmp = Compare(left, right);
      if (!cmp.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("'", op, "' not supported between instances of '", left.TypeName(),
                         "' and '", right.TypeName(), "'"));
      }
      if (op == "<") result = *cmp < 0;
      if (op == "<=") result = *cmp <= 0;
      if (op == ">") result = *cmp > 0;
      if (op == ">=") result = *cmp >= 0;
    }
    if (!result) return Value::Bool(false);
    left = std::move(right);
  }
  return Value::Bool(true);
}

}  // namespace sluice::jinja
