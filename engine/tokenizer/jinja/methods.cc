// Attribute/item access, slicing, operators, str/dict/list methods and global functions of the
// Jinja interpreter (declared in jinja/builtins.h).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <limits>
#include <string>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "engine/tokenizer/jinja/builtins.h"
#include "engine/tokenizer/jinja/interpreter.h"
#include "engine/tokenizer/jinja/str.h"

namespace sluice::jinja {
namespace {

// Jinja's sandbox refuses ranges above this many items (jinja2.sandbox.MAX_RANGE).
constexpr int64_t kMaxRange = 100000;

absl::Status TypeError(std::string message) {
  return absl::InvalidArgumentError(std::move(message));
}

absl::Status Unsafe(const std::string& name, const std::string& type) {
  return TypeError(
      absl::StrCat("access to attribute '", name, "' of '", type, "' object is unsafe."));
}

absl::Status CheckSize(size_t bytes) {
  if (bytes > kMaxValueBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("value exceeds the limit of ", kMaxValueBytes, " bytes"));
  }
  return absl::OkStatus();
}

// ArgString reads optional string argument `index`/`name` (None → nullopt).
absl::StatusOr<std::optional<std::string>> OptString(const CallArgs& args, size_t index,
                                                     absl::string_view name) {
  const Value* v = args.Arg(index, name);
  if (v == nullptr || v->is_none()) return std::optional<std::string>();
  if (!v->is_string()) {
    return TypeError(
        absl::StrCat("argument '", name, "' must be str or None, not ", v->TypeName()));
  }
  return std::optional<std::string>(v->as_string());
}

absl::StatusOr<std::string> ReqString(const CallArgs& args, size_t index, absl::string_view name) {
  const Value* v = args.Arg(index, name);
  if (v == nullptr) return TypeError(absl::StrCat("missing required argument '", name, "'"));
  if (!v->is_string()) {
    return TypeError(absl::StrCat("argument '", name, "' must be str, not ", v->TypeName()));
  }
  return v->as_string();
}

absl::StatusOr<int64_t> OptInt(const CallArgs& args, size_t index, absl::string_view name,
                               int64_t fallback) {
  const Value* v = args.Arg(index, name);
  if (v == nullptr || v->is_none()) return fallback;
  if (!v->is_int() && !v->is_bool()) {
    return TypeError(
        absl::StrCat("'", v->TypeName(), "' object cannot be interpreted as an integer"));
  }
  return v->as_int();
}

Value Method(const std::string& name, std::function<absl::StatusOr<Value>(const CallArgs&)> fn) {
  return Value::MakeCallable(
      name, [fn = std::move(fn)](Interpreter&, const CallArgs& args) { return fn(args); });
}

// PrefixMatch implements startswith/endswith with a str or tuple of str.
absl::StatusOr<Value> AffixMatch(const std::string& s, const CallArgs& args, bool prefix) {
  const Value* arg = args.Arg(0, "prefix");
  if (arg == nullptr) return TypeError("startswith/endswith takes at least 1 argument");
  std::vector<std::string> candidates;
  if (arg->is_string()) {
    candidates.push_back(arg->as_string());
  } else if (arg->is_list()) {
    for (const Value& v : arg->as_list()) {
      if (!v.is_string()) return TypeError("tuple for startswith/endswith must only contain str");
      candidates.push_back(v.as_string());
    }
  } else {
    return TypeError(absl::StrCat(
        "startswith/endswith first arg must be str or a tuple of str, not ", arg->TypeName()));
  }
  for (const std::string& c : candidates) {
    if (c.size() > s.size()) continue;
    if (prefix ? s.compare(0, c.size(), c) == 0
               : s.compare(s.size() - c.size(), c.size(), c) == 0) {
      return Value::Bool(true);
    }
  }
  return Value::Bool(false);
}

absl::StatusOr<Value> StrMethod(const std::string& s, const std::string& name) {
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const bool left = name != "rstrip";
    const bool right = name != "lstrip";
    return Method(name, [s, left, right](const CallArgs& args) -> absl::StatusOr<Value> {
      SLUICE_ASSIGN_OR_RETURN(auto chars, OptString(args, 0, "chars"));
      return Value::String(PyStrip(s, chars ? &*chars : nullptr, left, right));
    });
  }
  if (name == "startswith" || name == "endswith") {
    const bool prefix = name == "startswith";
    return Method(name, [s, prefix](const CallArgs& args) { return AffixMatch(s, args, prefix); });
  }
  if (name == "split" || name == "rsplit") {
    const bool reverse = name == "rsplit";
    return Method(name, [s, reverse](const CallArgs& args) -> absl::StatusOr<Value> {
      SLUICE_ASSIGN_OR_RETURN(auto sep, OptString(args, 0, "sep"));
      SLUICE_ASSIGN_OR_RETURN(int64_t maxsplit, OptInt(args, 1, "maxsplit", -1));
      if (sep && sep->empty()) return TypeError("empty separator");
      List parts;
      for (std::string& part : PySplit(s, sep ? &*sep : nullptr, maxsplit, reverse)) {
        parts.push_back(Value::String(std::move(part)));
      }
      return Value::MakeList(std::move(parts));
    });
  }
  if (name == "splitlines") {
    return Method(name, [s](const CallArgs& args) -> absl::StatusOr<Value> {
      List parts;
      for (std::string& part : PySplitLines(s)) parts.push_back(Value::String(std::move(part)));
      return Value::MakeList(std::move(parts));
    });
  }
  if (name == "upper" || name == "lower" || name == "title" || name == "capitalize" ||
      name == "swapcase") {
    return Method(name, [s, name](const CallArgs&) -> absl::StatusOr<Value> {
      if (name == "upper") return Value::String(PyUpper(s));
      if (name == "lower") return Value::String(PyLower(s));
      if (name == "title") return Value::String(PyTitle(s));
      if (name == "swapcase") return Value::String(PySwapCase(s));
      return Value::String(PyCapitalize(s));
    });
  }
  if (name == "replace") {
    return Method(name, [s](const CallArgs& args) -> absl::StatusOr<Value> {
      SLUICE_ASSIGN_OR_RETURN(std::string old_str, ReqString(args, 0, "old"));
      SLUICE_ASSIGN_OR_RETURN(std::string new_str, ReqString(args, 1, "new"));
      SLUICE_ASSIGN_OR_RETURN(int64_t count, OptInt(args, 2, "count", -1));
      SLUICE_ASSIGN_OR_RETURN(std::string out, PyReplace(s, old_str, new_str, count));
      return Value::String(std::move(out));
    });
  }
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex" || name == "count") {
    return Method(name, [s, name](const CallArgs& args) -> absl::StatusOr<Value> {
      SLUICE_ASSIGN_OR_RETURN(std::string sub, ReqString(args, 0, "sub"));
      if (name == "count") return Value::Int(PyCount(s, sub));
      const bool reverse = name[0] == 'r';
      const int64_t pos = PyFind(s, sub, reverse);
      if (pos < 0 && (name == "index" || name == "rindex")) return TypeError("substring not found");
      return Value::Int(pos);
    });
  }
  if (name == "join") {
    return Method(name, [s](const CallArgs& args) -> absl::StatusOr<Value> {
      const Value* it = args.Arg(0, "iterable");
      if (it == nullptr) return TypeError("join() takes exactly one argument");
      SLUICE_ASSIGN_OR_RETURN(List items, Iterate(*it));
      std::string out;
      for (size_t i = 0; i < items.size(); ++i) {
        if (!items[i].is_string()) {
          return TypeError(absl::StrCat("sequence item ", i, ": expected str instance, ",
                                        items[i].TypeName(), " found"));
        }
        if (i > 0) out += s;
        out += items[i].as_string();
        SLUICE_RETURN_IF_ERROR(CheckSize(out.size()));
      }
      return Value::String(std::move(out));
    });
  }
  if (name == "isdigit" || name == "isalpha" || name == "isalnum" || name == "isspace" ||
      name == "isupper" || name == "islower" || name == "isnumeric" || name == "isdecimal") {
    return Method(name, [s, name](const CallArgs&) -> absl::StatusOr<Value> {
      return Value::Bool(PyIsClass(s, name));
    });
  }
  return Value::Undefined(absl::StrCat("'str object' has no attribute '", name, "'"));
}

absl::StatusOr<Value> DictMethod(const Value& obj, const std::string& name, bool* found) {
  *found = true;
  if (name == "get") {
    return Method(name, [obj](const CallArgs& args) -> absl::StatusOr<Value> {
      const Value* key = args.Arg(0, "key");
      if (key == nullptr) return TypeError("get expected at least 1 argument, got 0");
      const Value* fallback = args.Arg(1, "default");
      if (key->is_string()) {
        if (const Value* v = obj.as_dict().Get(key->as_string()); v != nullptr) return *v;
      }
      return fallback != nullptr ? *fallback : Value::None();
    });
  }
  if (name == "items" || name == "keys" || name == "values") {
    return Method(name, [obj, name](const CallArgs&) -> absl::StatusOr<Value> {
      List out;
      for (const auto& [key, value] : obj.as_dict().entries()) {
        if (name == "items") {
          out.push_back(Value::MakeList({Value::String(key), value}, /*is_tuple=*/true));
        } else if (name == "keys") {
          out.push_back(Value::String(key));
        } else {
          out.push_back(value);
        }
      }
      return Value::MakeList(std::move(out));
    });
  }
  if (name == "copy") {
    return Method(name, [obj](const CallArgs&) -> absl::StatusOr<Value> {
      return Value::MakeDict(std::make_shared<Dict>(obj.as_dict()));
    });
  }
  if (name == "pop" || name == "popitem" || name == "setdefault" || name == "update" ||
      name == "clear") {
    return Unsafe(name, "dict");
  }
  *found = false;
  return Value();
}

absl::StatusOr<Value> ListMethod(const Value& obj, const std::string& name) {
  if (name == "index" || name == "count") {
    return Method(name, [obj, name](const CallArgs& args) -> absl::StatusOr<Value> {
      const Value* x = args.Arg(0, "value");
      if (x == nullptr) return TypeError(absl::StrCat(name, "() takes exactly one argument"));
      int64_t count = 0;
      const List& items = obj.as_list();
      for (size_t i = 0; i < items.size(); ++i) {
        if (!Equals(items[i], *x)) continue;
        if (name == "index") return Value::Int(static_cast<int64_t>(i));
        ++count;
      }
      if (name == "index") return TypeError(absl::StrCat(Repr(*x), " is not in list"));
      return Value::Int(count);
    });
  }
  if (!obj.is_tuple() &&
      (name == "append" || name == "extend" || name == "insert" || name == "pop" ||
       name == "remove" || name == "reverse" || name == "sort" || name == "clear")) {
    return Unsafe(name, "list");
  }
  return Value::Undefined(
      absl::StrCat("'", obj.TypeName(), " object' has no attribute '", name, "'"));
}

std::string ObjectTypeRepr(const Value& obj) {
  if (obj.is_none()) return "None";
  return absl::StrCat(obj.TypeName(), " object");
}

}  // namespace

absl::Status UndefinedError(const Value& undefined) {
  return absl::InvalidArgumentError(undefined.undefined_hint().empty()
                                        ? std::string("value is undefined")
                                        : undefined.undefined_hint());
}

absl::StatusOr<Value> GetAttribute(const Value& obj, const std::string& name) {
  switch (obj.kind()) {
    case Value::Kind::kUndefined:
      return UndefinedError(obj);
    case Value::Kind::kString:
      return StrMethod(obj.as_string(), name);
    case Value::Kind::kDict: {
      if (!obj.is_namespace()) {
        bool found = false;
        SLUICE_ASSIGN_OR_RETURN(Value method, DictMethod(obj, name, &found));
        if (found) return method;
      }
      if (const Value* v = obj.as_dict().Get(name); v != nullptr) return *v;
      return Value::Undefined(
          absl::StrCat("'", ObjectTypeRepr(obj), "' has no attribute '", name, "'"));
    }
    case Value::Kind::kList:
      return ListMethod(obj, name);
    default:
      return Value::Undefined(
          absl::StrCat("'", ObjectTypeRepr(obj), "' has no attribute '", name, "'"));
  }
}

absl::StatusOr<Value> GetItem(const Value& obj, const Value& key) {
  if (obj.is_undefined()) return UndefinedError(obj);
  auto missing = [&]() {
    return Value::Undefined(
        absl::StrCat("'", ObjectTypeRepr(obj), "' has no attribute ", Repr(key)));
  };
  if (obj.is_dict()) {
    if (key.is_string()) {
      if (const Value* v = obj.as_dict().Get(key.as_string()); v != nullptr) return *v;
      return GetAttribute(obj, key.as_string());
    }
    return missing();
  }
  if (obj.is_list() || obj.is_string()) {
    if (key.is_int() || key.is_bool()) {
      int64_t index = key.as_int();
      if (obj.is_list()) {
        const int64_t n = static_cast<int64_t>(obj.as_list().size());
        if (index < 0) index += n;
        if (index < 0 || index >= n) return missing();
        return obj.as_list()[static_cast<size_t>(index)];
      }
      const std::vector<uint32_t> cps = Utf8Decode(obj.as_string());
      const int64_t n = static_cast<int64_t>(cps.size());
      if (index < 0) index += n;
      if (index < 0 || index >= n) return missing();
      return Value::String(
          Utf8Encode(cps, static_cast<size_t>(index), static_cast<size_t>(index) + 1));
    }
    if (key.is_string()) return GetAttribute(obj, key.as_string());
  }
  return missing();
}

absl::StatusOr<Value> SliceValue(const Value& obj, const Value& start, const Value& stop,
                                 const Value& step) {
  if (obj.is_undefined()) return UndefinedError(obj);
  for (const Value* v : {&start, &stop, &step}) {
    if (!v->is_none() && !v->is_int() && !v->is_bool()) {
      return TypeError("slice indices must be integers or None or have an __index__ method");
    }
  }
  const int64_t st = step.is_none() ? 1 : step.as_int();
  if (st == 0) return TypeError("slice step cannot be zero");
  std::vector<uint32_t> cps;
  int64_t n = 0;
  if (obj.is_string()) {
    cps = Utf8Decode(obj.as_string());
    n = static_cast<int64_t>(cps.size());
  } else if (obj.is_list()) {
    n = static_cast<int64_t>(obj.as_list().size());
  } else {
    return TypeError(absl::StrCat("'", obj.TypeName(), "' object is not subscriptable"));
  }
  // CPython PySlice_AdjustIndices.
  auto adjust = [&](const Value& v, int64_t fallback) {
    if (v.is_none()) return fallback;
    int64_t i = v.as_int();
    if (i < 0) {
      i += n;
      if (i < 0) i = st < 0 ? -1 : 0;
    } else if (i >= n) {
      i = st < 0 ? n - 1 : n;
    }
    return i;
  };
  const int64_t lo = adjust(start, st < 0 ? n - 1 : 0);
  const int64_t hi = adjust(stop, st < 0 ? -1 : n);
  std::vector<int64_t> indices;
  if (st > 0) {
    for (int64_t i = lo; i < hi; i += st) indices.push_back(i);
  } else {
    for (int64_t i = lo; i > hi; i += st) indices.push_back(i);
  }
  if (obj.is_string()) {
    std::string out;
    for (int64_t i : indices) Utf8Append(cps[static_cast<size_t>(i)], &out);
    return Value::String(std::move(out));
  }
  List out;
  out.reserve(indices.size());
  for (int64_t i : indices) out.push_back(obj.as_list()[static_cast<size_t>(i)]);
  return Value::MakeList(std::move(out), obj.is_tuple());
}

absl::StatusOr<List> Iterate(const Value& value) {
  switch (value.kind()) {
    case Value::Kind::kUndefined:
      return List();
    case Value::Kind::kList:
      return value.as_list();
    case Value::Kind::kDict: {
      if (value.is_namespace()) break;
      List keys;
      for (const auto& [key, item] : value.as_dict().entries()) keys.push_back(Value::String(key));
      return keys;
    }
    case Value::Kind::kString: {
      List chars;
      for (uint32_t cp : Utf8Decode(value.as_string())) {
        std::string c;
        Utf8Append(cp, &c);
        chars.push_back(Value::String(std::move(c)));
      }
      return chars;
    }
    default:
      break;
  }
  return TypeError(absl::StrCat("'", value.TypeName(), "' object is not iterable"));
}

absl::StatusOr<bool> Contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Value::Kind::kUndefined:
      return false;
    case Value::Kind::kString:
      if (!item.is_string()) {
        return TypeError(
            absl::StrCat("'in <string>' requires string as left operand, not ", item.TypeName()));
      }
      return container.as_string().find(item.as_string()) != std::string::npos;
    case Value::Kind::kList:
      for (const Value& v : container.as_list()) {
        if (Equals(v, item)) return true;
      }
      return false;
    case Value::Kind::kDict:
      if (item.is_list() && !item.is_tuple()) return TypeError("unhashable type: 'list'");
      if (item.is_dict()) return TypeError("unhashable type: 'dict'");
      return item.is_string() && container.as_dict().Contains(item.as_string());
    default:
      return TypeError(
          absl::StrCat("argument of type '", container.TypeName(), "' is not iterable"));
  }
}

namespace {

absl::StatusOr<Value> IntResult(__int128 v) {
  if (v > std::numeric_limits<int64_t>::max() || v < std::numeric_limits<int64_t>::min()) {
    return Value::Float(static_cast<double>(v));  // Python would grow a big int
  }
  return Value::Int(static_cast<int64_t>(v));
}

absl::Status OperandError(absl::string_view op, const Value& a, const Value& b) {
  if (op == "+" && (a.is_string() || a.is_list())) {
    return TypeError(absl::StrCat("can only concatenate ", a.TypeName(), " (not \"", b.TypeName(),
                                  "\") to ", a.TypeName()));
  }
  return TypeError(absl::StrCat("unsupported operand type(s) for ", op, ": '", a.TypeName(),
                                "' and '", b.TypeName(), "'"));
}

absl::StatusOr<Value> Repeat(const Value& seq, int64_t times) {
  if (times < 0) times = 0;
  if (seq.is_string()) {
    const size_t unit = seq.as_string().size();
    if (unit > 0 && static_cast<uint64_t>(times) > kMaxValueBytes / unit) {
      return CheckSize(kMaxValueBytes + 1);
    }
    std::string out;
    out.reserve(unit * static_cast<size_t>(times));
    for (int64_t i = 0; i < times; ++i) out += seq.as_string();
    return Value::String(std::move(out));
  }
  const size_t unit = seq.as_list().size();
  if (unit > 0 && static_cast<uint64_t>(times) > kMaxValueBytes / 16 / unit) {
    return CheckSize(kMaxValueBytes + 1);
  }
  List out;
  for (int64_t i = 0; i < times; ++i) {
    out.insert(out.end(), seq.as_list().begin(), seq.as_list().end());
  }
  return Value::MakeList(std::move(out), seq.is_tuple());
}

// PercentFormat is Python's printf-style `fmt % args` for the conversions templates use:
// %s %r %d %i %f %e %g %x %o %c %% with flags (-, 0, +, space), width and precision, and
// %(name)s with a dict argument.
absl::StatusOr<Value> PercentFormat(const std::string& fmt, const Value& args) {
  std::vector<Value> positional;
  const bool mapping = args.is_dict() && !args.is_namespace();
  if (args.is_tuple()) {
    positional = args.as_list();
  } else {
    positional.push_back(args);
  }
  size_t next = 0;
  std::string out;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out.push_back(fmt[i]);
      continue;
    }
    if (++i >= fmt.size()) return TypeError("incomplete format");
    const Value* arg = nullptr;
    if (fmt[i] == '(') {
      const size_t close = fmt.find(')', i);
      if (close == std::string::npos || !mapping) return TypeError("format requires a mapping");
      arg = args.as_dict().Get(fmt.substr(i + 1, close - i - 1));
      if (arg == nullptr)
        return TypeError(absl::StrCat("KeyError: '", fmt.substr(i + 1, close - i - 1), "'"));
      i = close + 1;
    }
    std::string flags;
    while (i < fmt.size() && std::strchr("-+ 0#", fmt[i]) != nullptr) flags.push_back(fmt[i++]);
    std::string width;
    while (i < fmt.size() && absl::ascii_isdigit(fmt[i])) width.push_back(fmt[i++]);
    std::string precision;
    if (i < fmt.size() && fmt[i] == '.') {
      precision = ".";
      ++i;
      while (i < fmt.size() && absl::ascii_isdigit(fmt[i])) precision.push_back(fmt[i++]);
    }
    if (i >= fmt.size()) return TypeError("incomplete format");
    const char conv = fmt[i];
    if (conv == '%') {
      out.push_back('%');
      continue;
    }
    if (arg == nullptr) {
      if (next >= positional.size()) return TypeError("not enough arguments for format string");
      arg = &positional[next++];
    }
    if (arg->is_undefined()) return UndefinedError(*arg);
    if (width.size() > 4 || precision.size() > 4) return TypeError("format width too large");
    const std::string spec = absl::StrCat("%", flags, width, precision);
    char buf[512];
    switch (conv) {
      case 's':
      case 'r': {
        std::string text = conv == 's' ? ToStr(*arg) : Repr(*arg);
        if (precision.size() > 1) text = text.substr(0, std::stoul(precision.substr(1)));
        const size_t w = width.empty() ? 0 : std::stoul(width);
        const size_t len = Utf8Length(text);
        if (len < w) {
          const std::string pad(w - len, ' ');
          text = flags.find('-') != std::string::npos ? text + pad : pad + text;
        }
        out += text;
        break;
      }
      case 'd':
      case 'i':
      case 'x':
      case 'X':
      case 'o':
      case 'c': {
        if (!arg->is_number() && !arg->is_bool()) {
          return TypeError(absl::StrCat("%", std::string(1, conv),
                                        " format: a number is required, not ", arg->TypeName()));
        }
        const long long v =
            arg->is_float() ? static_cast<long long>(arg->as_double()) : arg->as_int();
        if (conv == 'c') {
          Utf8Append(static_cast<uint32_t>(v), &out);
          break;
        }
        const char c = conv == 'i' ? 'd' : conv;
        std::snprintf(buf, sizeof(buf), (spec + "ll" + std::string(1, c)).c_str(), v);
        out += buf;
        break;
      }
      case 'f':
      case 'F':
      case 'e':
      case 'E':
      case 'g':
      case 'G': {
        if (!arg->is_number() && !arg->is_bool()) {
          return TypeError(absl::StrCat("must be real number, not ", arg->TypeName()));
        }
        std::snprintf(buf, sizeof(buf), (spec + std::string(1, conv)).c_str(), arg->as_double());
        out += buf;
        break;
      }
      default:
        return TypeError(absl::StrCat("unsupported format character '", std::string(1, conv), "'"));
    }
    SLUICE_RETURN_IF_ERROR(CheckSize(out.size()));
  }
  if (!mapping && next < positional.size() && args.is_tuple()) {
    return TypeError("not all arguments converted during string formatting");
  }
  return Value::String(std::move(out));
}

}  // namespace

absl::StatusOr<Value> BinaryOp(absl::string_view op, const Value& a, const Value& b) {
  if (op == "~") {
    std::string out = ToStr(a);
    out += ToStr(b);
    SLUICE_RETURN_IF_ERROR(CheckSize(out.size()));
    return Value::String(std::move(out));
  }
  if (a.is_undefined()) return UndefinedError(a);
  if (b.is_undefined()) return UndefinedError(b);
  const bool a_num = a.is_number() || a.is_bool();
  const bool b_num = b.is_number() || b.is_bool();
  if (a_num && b_num) {
    const bool is_float = a.is_float() || b.is_float();
    const double x = a.as_double();
    const double y = b.as_double();
    if (op == "+")
      return is_float ? Value::Float(x + y) : IntResult(__int128(a.as_int()) + b.as_int());
    if (op == "-")
      return is_float ? Value::Float(x - y) : IntResult(__int128(a.as_int()) - b.as_int());
    if (op == "*")
      return is_float ? Value::Float(x * y) : IntResult(__int128(a.as_int()) * b.as_int());
    if (op == "/") {
      if (y == 0) return TypeError("division by zero");
      return Value::Float(x / y);
    }
    if (op == "//" || op == "%") {
      if (y == 0) {
        if (is_float) return TypeError(op == "%" ? "float modulo" : "float floor division by zero");
        return TypeError(op == "%" ? "integer modulo by zero"
                                   : "integer division or modulo by zero");
      }
      if (is_float) {
        // CPython float_divmod.
        double mod = std::fmod(x, y);
        double div = (x - mod) / y;
        if (mod != 0) {
          if ((y < 0) != (mod < 0)) {
            mod += y;
            div -= 1.0;
          }
        } else {
          mod = std::copysign(0.0, y);
        }
        double floordiv = 0;
        if (div != 0) {
          floordiv = std::floor(div);
          if (div - floordiv > 0.5) floordiv += 1.0;
        } else {
          floordiv = std::copysign(0.0, x / y);
        }
        return Value::Float(op == "%" ? mod : floordiv);
      }
      const int64_t p = a.as_int();
      const int64_t q = b.as_int();
      if (p == std::numeric_limits<int64_t>::min() && q == -1) {
        return op == "%" ? Value::Int(0) : Value::Float(-static_cast<double>(p));
      }
      int64_t div = p / q;
      int64_t mod = p % q;
      if (mod != 0 && ((mod < 0) != (q < 0))) {
        mod += q;
        --div;
      }
      return Value::Int(op == "%" ? mod : div);
    }
    if (op == "**") {
      if (!is_float && b.as_int() >= 0) {
        __int128 result = 1;
        __int128 base = a.as_int();
        for (int64_t e = b.as_int(); e > 0; --e) {
          result *= base;
          if (result > std::numeric_limits<int64_t>::max() ||
              result < std::numeric_limits<int64_t>::min()) {
            return Value::Float(std::pow(x, y));
          }
          if (result == 0 || result == 1) break;
        }
        return Value::Int(static_cast<int64_t>(result));
      }
      if (x == 0 && y < 0) return TypeError("0.0 cannot be raised to a negative power");
      return Value::Float(std::pow(x, y));
    }
  }
  if (op == "+") {
    if (a.is_string() && b.is_string()) {
      SLUICE_RETURN_IF_ERROR(CheckSize(a.as_string().size() + b.as_string().size()));
      return Value::String(a.as_string() + b.as_string());
    }
    if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
      SLUICE_RETURN_IF_ERROR(CheckSize((a.as_list().size() + b.as_list().size()) * 16));
      List out = a.as_list();
      out.insert(out.end(), b.as_list().begin(), b.as_list().end());
      return Value::MakeList(std::move(out), a.is_tuple());
    }
  }
  if (op == "*") {
    if ((a.is_string() || a.is_list()) && (b.is_int() || b.is_bool())) return Repeat(a, b.as_int());
    if ((b.is_string() || b.is_list()) && (a.is_int() || a.is_bool())) return Repeat(b, a.as_int());
  }
  if (op == "%" && a.is_string()) return PercentFormat(a.as_string(), b);
  return OperandError(op, a, b);
}

// ---------------------------------------------------------------------------------------------
// Globals

void AddGlobals(Dict* globals) {
  globals->Set(
      "range",
      Value::MakeCallable(
          "range", [](Interpreter& interp, const CallArgs& args) -> absl::StatusOr<Value> {
            if (args.positional.empty() || args.positional.size() > 3) {
              return TypeError("range expected 1 to 3 arguments");
            }
            int64_t bounds[3] = {0, 0, 1};
            for (size_t i = 0; i < args.positional.size(); ++i) {
              const Value& v = args.positional[i];
              if (!v.is_int() && !v.is_bool()) {
                return TypeError(absl::StrCat("'", v.TypeName(),
                                              "' object cannot be interpreted as an integer"));
              }
            }
            if (args.positional.size() == 1) {
              bounds[1] = args.positional[0].as_int();
            } else {
              bounds[0] = args.positional[0].as_int();
              bounds[1] = args.positional[1].as_int();
              if (args.positional.size() == 3) bounds[2] = args.positional[2].as_int();
            }
            if (bounds[2] == 0) return TypeError("range() arg 3 must not be zero");
            const __int128 span = __int128(bounds[1]) - bounds[0];
            __int128 count = 0;
            if ((bounds[2] > 0 && span > 0) || (bounds[2] < 0 && span < 0)) {
              const __int128 step = bounds[2];
              count = (span + step - (step > 0 ? 1 : -1)) / step;
            }
            if (count > kMaxRange) {
              return TypeError(
                  absl::StrCat("Range too big. The sandbox blocks ranges larger than MAX_RANGE (",
                               kMaxRange, ")."));
            }
            SLUICE_RETURN_IF_ERROR(interp.ChargeIterations(static_cast<int64_t>(count)));
            List out;
            out.reserve(static_cast<size_t>(count));
            for (int64_t i = 0; i < static_cast<int64_t>(count); ++i) {
              out.push_back(Value::Int(bounds[0] + i * bounds[2]));
            }
            return Value::MakeList(std::move(out));
          }));
  auto make_dict = [](const CallArgs& args, bool is_namespace) -> absl::StatusOr<Value> {
    auto dict = std::make_shared<Dict>();
    if (args.positional.size() > 1) return TypeError("expected at most 1 positional argument");
    if (!args.positional.empty()) {
      const Value& init = args.positional[0];
      if (init.is_dict()) {
        for (const auto& [key, value] : init.as_dict().entries()) dict->Set(key, value);
      } else if (init.is_list()) {
        for (const Value& pair : init.as_list()) {
          if (!pair.is_list() || pair.as_list().size() != 2 || !pair.as_list()[0].is_string()) {
            return TypeError("dictionary update sequence element must be a (str, value) pair");
          }
          dict->Set(pair.as_list()[0].as_string(), pair.as_list()[1]);
        }
      } else if (!init.is_undefined() && !init.is_none()) {
        return TypeError(absl::StrCat("'", init.TypeName(), "' object is not iterable"));
      }
    }
    for (const auto& [key, value] : args.keyword) dict->Set(key, value);
    return Value::MakeDict(std::move(dict), is_namespace);
  };
  globals->Set("namespace",
               Value::MakeCallable("namespace", [make_dict](Interpreter&, const CallArgs& args) {
                 return make_dict(args, true);
               }));
  globals->Set("dict", Value::MakeCallable("dict", [make_dict](Interpreter&, const CallArgs& args) {
                 return make_dict(args, false);
               }));
  globals->Set(
      "raise_exception",
      Value::MakeCallable("raise_exception",
                          [](Interpreter&, const CallArgs& args) -> absl::StatusOr<Value> {
                            const Value* msg = args.Arg(0, "message");
                            return RaisedError(msg == nullptr ? std::string() : ToStr(*msg));
                          }));
  globals->Set("strftime_now",
               Value::MakeCallable(
                   "strftime_now", [](Interpreter&, const CallArgs& args) -> absl::StatusOr<Value> {
                     const Value* fmt = args.Arg(0, "format");
                     if (fmt == nullptr || !fmt->is_string()) {
                       return TypeError("strftime_now expects a format string");
                     }
                     const std::time_t now = std::time(nullptr);
                     std::tm local{};
                     localtime_r(&now, &local);
                     char buf[512];
                     const size_t n =
                         std::strftime(buf, sizeof(buf), fmt->as_string().c_str(), &local);
                     return Value::String(std::string(buf, n));
                   }));
}

}  // namespace sluice::jinja
