// Builtins of the Jinja interpreter behind ChatTemplate: filters and tests
// (jinja/filters.cc), attribute/item access, slicing, str/dict/list methods, operators and
// global functions (jinja/methods.cc). Semantics follow Jinja2 3.1.6 running in Hugging Face's
// ImmutableSandboxedEnvironment (mutating methods such as `list.append` are refused) and Python
// 3.12 builtins; `tojson` is HF's `json.dumps(x, ensure_ascii=False, indent=..., ...)`.
#ifndef SLUICE_ENGINE_TOKENIZER_JINJA_BUILTINS_H_
#define SLUICE_ENGINE_TOKENIZER_JINJA_BUILTINS_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/tokenizer/jinja/value.h"

namespace sluice::jinja {

class Interpreter;

// HasFilter / HasTest: whether a filter / test of that name exists (checked at parse time).
bool HasFilter(absl::string_view name);
bool HasTest(absl::string_view name);

// ApplyFilter evaluates `input | name(args)`. Errors: InvalidArgument on type errors.
absl::StatusOr<Value> ApplyFilter(Interpreter& interp, absl::string_view name, const Value& input,
                                  const CallArgs& args);
// ApplyTest evaluates `input is name(args)`.
absl::StatusOr<bool> ApplyTest(Interpreter& interp, absl::string_view name, const Value& input,
                               const CallArgs& args);

// GetAttribute is Jinja's `obj.name`: a bound method of str/dict/list, a dict key or namespace
// attribute, else undefined. Errors: InvalidArgument when `obj` is undefined.
absl::StatusOr<Value> GetAttribute(const Value& obj, const std::string& name);
// GetItem is Jinja's `obj[key]`: dict key (falling back to attributes), list/str index
// (negative from the end), else undefined. Errors: InvalidArgument when `obj` is undefined.
absl::StatusOr<Value> GetItem(const Value& obj, const Value& key);
// SliceValue is Python `obj[start:stop:step]` on str (code points), list and tuple.
// Errors: InvalidArgument for other types, a zero step or non-integer bounds.
absl::StatusOr<Value> SliceValue(const Value& obj, const Value& start, const Value& stop,
                                 const Value& step);

// BinaryOp evaluates `a op b` for op in + - * / // % ** ~. Errors: InvalidArgument for
// unsupported operand types, division by zero, undefined operands, results over kMaxValueBytes.
absl::StatusOr<Value> BinaryOp(absl::string_view op, const Value& a, const Value& b);
// Contains is Python `item in container`. Errors: InvalidArgument for non-containers.
absl::StatusOr<bool> Contains(const Value& container, const Value& item);
// Iterate lists the items a `for` loop visits: list items, dict keys, str characters; an
// undefined value is empty. Errors: InvalidArgument for non-iterables.
absl::StatusOr<List> Iterate(const Value& value);
// UndefinedError is the error raised when an undefined value is used.
absl::Status UndefinedError(const Value& undefined);

// AddGlobals defines range, namespace, dict, raise_exception and strftime_now in `globals`.
void AddGlobals(Dict* globals);

}  // namespace sluice::jinja

#endif  // SLUICE_ENGINE_TOKENIZER_JINJA_BUILTINS_H_
