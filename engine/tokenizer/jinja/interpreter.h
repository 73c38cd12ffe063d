// Tree-walking evaluator of the Jinja interpreter behind ChatTemplate.
//
// Scoping follows Jinja2: `for` iterations and macro calls open a scope (assignments inside do
// not leak out; `namespace()` objects are the way out), `if` does not. Resource limits make a
// hostile template fail with InvalidArgument instead of hanging or exhausting memory: every
// string/list value is capped at kMaxValueBytes, and each render has a work budget
// (RenderLimits, jinja/budget.h: operations, bytes of work, loop iterations, macro depth, output
// bytes, cancellation and a deadline) chosen by the caller.
#ifndef SLUICE_ENGINE_TOKENIZER_JINJA_INTERPRETER_H_
#define SLUICE_ENGINE_TOKENIZER_JINJA_INTERPRETER_H_

#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/tokenizer/jinja/ast.h"
#include "engine/tokenizer/jinja/budget.h"
#include "engine/tokenizer/jinja/value.h"

namespace sluice::jinja {

// RaisedError builds the status of `raise_exception(message)`: InvalidArgument whose message is
// exactly `message` (no line prefix is ever added to it).
absl::Status RaisedError(absl::string_view message);

// Interpreter renders one parsed Template. One Interpreter per render call (not thread-safe);
// the Template may be shared.
class Interpreter {
 public:
  explicit Interpreter(const Template& tmpl, const RenderLimits& limits = RenderLimits())
      : template_(tmpl), budget_(limits) {}

  // Render evaluates the template with `context` (a dict Value) as the global variables; the
  // builtin globals (range, namespace, dict, raise_exception, strftime_now) are visible unless
  // `context` overrides them. Errors: InvalidArgument "line N: ..." for runtime errors,
  // RaisedError for raise_exception, InvalidArgument naming the limit when the budget is spent,
  // Cancelled / DeadlineExceeded when the render was cancelled or passed its deadline.
  absl::StatusOr<std::string> Render(const Value& context);

  // CallValue invokes a callable Value. Errors: InvalidArgument when `callee` is not callable.
  absl::StatusOr<Value> CallValue(const Value& callee, const CallArgs& args);

  // ChargeIterations / ChargeBytes count builtins' work against the render's budget.
  absl::Status ChargeIterations(int64_t n) { return budget_.ChargeIterations(n); }
  absl::Status ChargeBytes(int64_t n) { return budget_.ChargeBytes(n); }

 private:
  struct Frame {
    absl::flat_hash_map<std::string, Value> vars;
    std::shared_ptr<Frame> parent;
  };
  using FramePtr = std::shared_ptr<Frame>;
  enum class Flow { kNormal, kBreak, kContinue };

  absl::Status ExecBody(const Body& body, const FramePtr& frame, std::string* out, Flow* flow);
  absl::Status ExecStmt(const Stmt& stmt, const FramePtr& frame, std::string* out, Flow* flow);
  absl::Status ExecFor(const Stmt& stmt, const FramePtr& frame, std::string* out);
  absl::Status Assign(const Stmt& stmt, const FramePtr& frame, Value value);
  absl::StatusOr<Value> CallMacro(const Stmt& macro, const std::weak_ptr<Frame>& closure,
                                  const CallArgs& args, const Value* caller);
  Value MakeMacro(const Stmt& macro, const FramePtr& frame);

  absl::StatusOr<Value> Eval(const Expr& expr, const FramePtr& frame);
  absl::StatusOr<Value> EvalBinary(const Expr& expr, const FramePtr& frame);
  absl::StatusOr<Value> EvalCompare(const Expr& expr, const FramePtr& frame);
  absl::StatusOr<CallArgs> EvalArgs(const Expr& expr, size_t first_arg, const FramePtr& frame);
  absl::StatusOr<Value> EvalFilter(const Expr& expr, const FramePtr& frame, const Value* input);
  Value Lookup(const std::string& name, const FramePtr& frame) const;
  // Charged charges a builtin's result (its shallow weight) to the budget.
  absl::StatusOr<Value> Charged(absl::StatusOr<Value> result);
  // ChargeArgs charges the deep weight of every argument.
  absl::Status ChargeArgs(const CallArgs& args);

  absl::Status Append(std::string* out, absl::string_view text);

  const Template& template_;
  FramePtr root_;
  std::shared_ptr<Dict> globals_;
  WorkBudget budget_;
};

}  // namespace sluice::jinja

#endif  // SLUICE_ENGINE_TOKENIZER_JINJA_INTERPRETER_H_
