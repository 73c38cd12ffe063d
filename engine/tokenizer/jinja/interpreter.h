// Tree-walking evaluator of the Jinja interpreter behind ChatTemplate.
//
// Scoping follows Jinja2: `for` iterations and macro calls open a scope (assignments inside do
// not leak out; `namespace()` objects are the way out), `if` does not. Resource limits make a
// hostile template fail with InvalidArgument instead of hanging or exhausting memory: the output
// and every string/list value are capped at kMaxValueBytes, loop iterations per render at
// kMaxLoopIterations, and macro recursion at kMaxCallDepth.
#ifndef SLUICE_ENGINE_TOKENIZER_JINJA_INTERPRETER_H_
#define SLUICE_ENGINE_TOKENIZER_JINJA_INTERPRETER_H_

#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/tokenizer/jinja/ast.h"
#include "engine/tokenizer/jinja/value.h"

namespace sluice::jinja {

inline constexpr int64_t kMaxLoopIterations = 1'000'000;
inline constexpr int kMaxCallDepth = 64;

// RaisedError builds the status of `raise_exception(message)`: InvalidArgument whose message is
// exactly `message` (no line prefix is ever added to it).
absl::Status RaisedError(absl::string_view message);

// Interpreter renders one parsed Template. One Interpreter per render call (not thread-safe);
// the Template may be shared.
class Interpreter {
 public:
  explicit Interpreter(const Template& tmpl) : template_(tmpl) {}

  // Render evaluates the template with `context` (a dict Value) as the global variables; the
  // builtin globals (range, namespace, dict, raise_exception, strftime_now) are visible unless
  // `context` overrides them. Errors: InvalidArgument "line N: ..." for runtime errors,
  // RaisedError for raise_exception.
  absl::StatusOr<std::string> Render(const Value& context);

  // CallValue invokes a callable Value. Errors: InvalidArgument when `callee` is not callable.
  absl::StatusOr<Value> CallValue(const Value& callee, const CallArgs& args);

  // ChargeIterations counts `n` loop iterations against kMaxLoopIterations.
  absl::Status ChargeIterations(int64_t n);

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

  static absl::Status Append(std::string* out, absl::string_view text);

  const Template& template_;
  FramePtr root_;
  std::shared_ptr<Dict> globals_;
  int64_t iterations_ = 0;
  int call_depth_ = 0;
};

}  // namespace sluice::jinja

#endif  // SLUICE_ENGINE_TOKENIZER_JINJA_INTERPRETER_H_
