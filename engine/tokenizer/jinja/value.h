// Value model of the Jinja interpreter behind ChatTemplate.
//
// A `jinja::Value` is one Python-like value: undefined, None, bool, int (int64), float (double),
// str (UTF-8 bytes), list/tuple (shared, immutable once built), dict (insertion-ordered string
// keys, shared), namespace (a mutable dict), or a callable (macro, builtin, bound method).
// Containers are reference-counted so copying a Value is cheap. Printing follows Python's
// `str()`/`repr()` and JSON output follows Python's `json.dumps` (the reference is CPython 3.12
// and Jinja2 3.1.6, which Hugging Face `apply_chat_template` uses).
#ifndef SLUICE_ENGINE_TOKENIZER_JINJA_VALUE_H_
#define SLUICE_ENGINE_TOKENIZER_JINJA_VALUE_H_

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace sluice::jinja {

// kMaxValueBytes caps every string, list and rendered output the interpreter builds (16 MiB),
// so a hostile template cannot exhaust memory.
inline constexpr size_t kMaxValueBytes = size_t{16} << 20;
// kMaxValueDepth caps the nesting of lists/dicts a template may store in a variable (and of the
// JSON context), so recursive walks over values and their destruction stay shallow.
inline constexpr int kMaxValueDepth = 256;
// kElementBytes is what one list element or dict entry counts against a render's work budget
// (jinja/budget.h): about the memory a Value takes.
inline constexpr int64_t kElementBytes = 64;

class Value;
class Interpreter;

using List = std::vector<Value>;

// Dict is an insertion-ordered map from string keys to values (Python dict semantics).
class Dict {
 public:
  // Get returns the value of `key`, or nullptr when absent.
  const Value* Get(absl::string_view key) const;
  // Set inserts or replaces `key` (an existing key keeps its position).
  void Set(const std::string& key, Value value);
  // SetAt replaces the value of the `index`-th entry (index < size()).
  void SetAt(size_t index, Value value);
  bool Contains(absl::string_view key) const { return index_.contains(key); }
  // Defined below Value: clang instantiates the constexpr vector<pair<..., Value>>::size here,
  // where Value is still incomplete.
  size_t size() const;
  const std::vector<std::pair<std::string, Value>>& entries() const { return entries_; }

 private:
  std::vector<std::pair<std::string, Value>> entries_;
  absl::flat_hash_map<std::string, size_t> index_;
};

// CallArgs: evaluated positional and keyword arguments of one call.
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
  // Kwarg returns the keyword argument `name`, or nullptr.
  const Value* Kwarg(absl::string_view name) const;
  // Arg returns positional `index`, else keyword `name`, else nullptr.
  const Value* Arg(size_t index, absl::string_view name) const;
};

// Callable is a function value: a macro, a global (range, namespace, raise_exception...) or a
// method bound to its receiver (e.g. `s.strip`).
struct Callable {
  std::string name;
  std::function<absl::StatusOr<Value>(Interpreter&, const CallArgs&)> fn;
};

class Value {
 public:
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kCallable };

  // Value() is Jinja's `Undefined`; `undefined_hint` names what was missing, for errors.
  Value() = default;
  static Value Undefined(std::string hint);
  static Value None();
  static Value Bool(bool b);
  static Value Int(int64_t i);
  static Value Float(double f);
  static Value String(std::string s);
  static Value MakeList(List items, bool is_tuple = false);
  static Value MakeDict(std::shared_ptr<Dict> dict, bool is_namespace = false);
  static Value MakeCallable(std::string name,
                            std::function<absl::StatusOr<Value>(Interpreter&, const CallArgs&)> fn);

  // FromJson converts parsed JSON (nlohmann::json or ordered_json; object keys keep the
  // container's iteration order).
  template <typename Json>
  static Value FromJson(const Json& json);
  // JsonDepth is the nesting height of `json`, counting at most `limit` + 1 levels (so the walk
  // itself stays shallow).
  template <typename Json>
  static int JsonDepth(const Json& json, int limit);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_int() const { return kind_ == Kind::kInt; }
  bool is_float() const { return kind_ == Kind::kFloat; }
  bool is_number() const { return kind_ == Kind::kInt || kind_ == Kind::kFloat; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_tuple() const { return kind_ == Kind::kList && is_tuple_; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_namespace() const { return kind_ == Kind::kDict && is_namespace_; }
  bool is_callable() const { return kind_ == Kind::kCallable; }

  bool as_bool() const { return b_; }
  int64_t as_int() const { return kind_ == Kind::kBool ? (b_ ? 1 : 0) : i_; }
  // as_double converts int, bool and float.
  double as_double() const;
  const std::string& as_string() const { return *s_; }
  const List& as_list() const { return *list_; }
  const Dict& as_dict() const { return *dict_; }
  // mutable_dict is the shared dict (namespace assignment writes through it).
  Dict& mutable_dict() const { return *dict_; }
  const Callable& as_callable() const { return *callable_; }
  const std::string& undefined_hint() const { return hint_; }
  // depth is the nesting height: 0 for scalars, 1 + the deepest element for lists and dicts
  // (a namespace counts 1; its attributes are checked when assigned).
  int depth() const { return depth_; }
  // has_namespace is whether this value is or (transitively) contains a namespace.
  bool has_namespace() const { return has_namespace_; }
  // weight is the work a deep walk over the value does (render budget, jinja/budget.h): string
  // bytes, plus kElementBytes per list element or dict entry, summed over nested values (a
  // shared sub-list counts once per reference, as a walk visits it), saturating at 2^62.
  // A namespace counts its entries at creation only.
  int64_t weight() const { return weight_; }
  // ShallowWeight is the work of building the value itself: string bytes, or kElementBytes per
  // list element or dict entry (not their contents, which are shared).
  int64_t ShallowWeight() const;

  // Truthy is Python's bool(): false for undefined, None, False, 0, 0.0, "", [], {}.
  bool Truthy() const;
  // TypeName is the Python type name used in error messages ("str", "int", "dict", ...).
  std::string TypeName() const;

 private:
  Kind kind_ = Kind::kUndefined;
  bool b_ = false;
  bool is_tuple_ = false;
  bool is_namespace_ = false;
  bool has_namespace_ = false;
  int depth_ = 0;
  int64_t weight_ = 0;
  int64_t i_ = 0;
  double f_ = 0;
  std::shared_ptr<const std::string> s_;
  std::shared_ptr<const List> list_;
  std::shared_ptr<Dict> dict_;
  std::shared_ptr<const Callable> callable_;
  std::string hint_;
};

// ToStr is Python `str(value)` as Jinja prints it: undefined → "", None → "None",
// True → "True", floats in shortest repr, lists/dicts in Python repr.
std::string ToStr(const Value& value);
// Repr is Python `repr(value)` (strings quoted the way CPython chooses quotes).
std::string Repr(const Value& value);
// FormatFloat is Python `repr(float)`: shortest round-trip digits, exponent form outside
// [1e-4, 1e16), "inf"/"nan".
std::string FormatFloat(double value);

// JsonOptions mirror Python `json.dumps` keyword arguments as HF's `tojson` passes them.
struct JsonOptions {
  // indent: <0 → single line; >=0 → pretty-printed with that many spaces (indent_str wins).
  int indent = -1;
  std::optional<std::string> indent_str;
  bool sort_keys = false;
  bool ensure_ascii = false;
  std::optional<std::string> item_separator;  // default ", " (or "," when indenting)
  std::optional<std::string> key_separator;   // default ": "
};
// ToJson is Python `json.dumps(value, **options)`. Errors: InvalidArgument for values JSON cannot
// represent (undefined, callables) or output beyond kMaxValueBytes.
absl::StatusOr<std::string> ToJson(const Value& value, const JsonOptions& options);

// Equals is Python `==` (1 == 1.0 == True; deep for lists/dicts; undefined equals undefined).
bool Equals(const Value& a, const Value& b);
// Compare is Python `<` ordering: returns <0, 0, >0. Errors: InvalidArgument for unorderable
// types (e.g. str < int).
absl::StatusOr<int> Compare(const Value& a, const Value& b);

// Utf8Decode splits UTF-8 into code points (invalid bytes become U+FFFD-free raw bytes mapped to
// their byte value, so Encode(Decode(s)) == s for any input).
std::vector<uint32_t> Utf8Decode(absl::string_view s);
// Utf8Encode appends code point `cp` to `out`.
void Utf8Append(uint32_t cp, std::string* out);
std::string Utf8Encode(const std::vector<uint32_t>& cps, size_t begin, size_t end);
// Utf8Length is the number of code points (Python len(str)).
size_t Utf8Length(absl::string_view s);

// IsPySpace is Python str.isspace() for one code point (ASCII and common Unicode spaces).
bool IsPySpace(uint32_t cp);

inline size_t Dict::size() const { return entries_.size(); }

template <typename Json>
int Value::JsonDepth(const Json& json, int limit) {
  if (!json.is_structured()) return 0;
  if (limit <= 0) return 1;
  int deepest = 0;
  for (const auto& item : json) deepest = std::max(deepest, JsonDepth(item, limit - 1));
  return deepest + 1;
}

template <typename Json>
Value Value::FromJson(const Json& json) {
  switch (json.type()) {
    case nlohmann::json::value_t::null:
    case nlohmann::json::value_t::discarded:
      return None();
    case nlohmann::json::value_t::boolean:
      return Bool(json.template get<bool>());
    case nlohmann::json::value_t::number_integer:
      return Int(json.template get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: {
      uint64_t u = json.template get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return Float(static_cast<double>(u));
      return Int(static_cast<int64_t>(u));
    }
    case nlohmann::json::value_t::number_float:
      return Float(json.template get<double>());
    case nlohmann::json::value_t::string:
      return String(json.template get<std::string>());
    case nlohmann::json::value_t::array: {
      List items;
      items.reserve(json.size());
      for (const auto& item : json) items.push_back(FromJson(item));
      return MakeList(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      auto dict = std::make_shared<Dict>();
      for (auto it = json.begin(); it != json.end(); ++it)
        dict->Set(it.key(), FromJson(it.value()));
      return MakeDict(std::move(dict));
    }
    case nlohmann::json::value_t::binary:
      return None();
  }
  return None();
}

}  // namespace sluice::jinja

#endif  // SLUICE_ENGINE_TOKENIZER_JINJA_VALUE_H_
