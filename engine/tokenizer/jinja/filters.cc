// Filters and tests of the Jinja interpreter (declared in jinja/builtins.h). Where Jinja returns
// a lazy iterator (map, select, reverse, ...) these return a list, which prints differently but
// behaves the same under `|list`, `|join`, `for` and every other filter.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "engine/tokenizer/jinja/builtins.h"
#include "engine/tokenizer/jinja/interpreter.h"
#include "engine/tokenizer/jinja/str.h"

namespace sluice::jinja {
namespace {

using FilterFn = std::function<absl::StatusOr<Value>(Interpreter&, const Value&, const CallArgs&)>;
using TestFn = std::function<absl::StatusOr<bool>(Interpreter&, const Value&, const CallArgs&)>;

absl::Status TypeError(std::string message) {
  return absl::InvalidArgumentError(std::move(message));
}

absl::Status CheckSize(size_t bytes) {
  if (bytes > kMaxValueBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("value exceeds the limit of ", kMaxValueBytes, " bytes"));
  }
  return absl::OkStatus();
}

// SoftStr is Jinja's soft_str: str(value), "" for undefined.
std::string SoftStr(const Value& v) { return ToStr(v); }

bool BoolArg(const CallArgs& args, size_t index, absl::string_view name, bool fallback) {
  const Value* v = args.Arg(index, name);
  return v == nullptr ? fallback : v->Truthy();
}

// CallArgs without the first `n` positional arguments (for map/select pass-through).
CallArgs DropPositional(const CallArgs& args, size_t n) {
  CallArgs rest;
  for (size_t i = n; i < args.positional.size(); ++i) rest.positional.push_back(args.positional[i]);
  rest.keyword = args.keyword;
  return rest;
}

Value IgnoreCase(const Value& v) {
  return v.is_string() ? Value::String(PyLower(v.as_string())) : v;
}

// Attribute implements Jinja's make_attrgetter: "a.b.0" looks up item by item (ints as indexes).
absl::StatusOr<Value> Attribute(const Value& item, const Value& attribute) {
  if (attribute.is_int()) return GetItem(item, attribute);
  if (!attribute.is_string()) return item;
  Value current = item;
  for (absl::string_view part : absl::StrSplit(attribute.as_string(), '.')) {
    int64_t index = 0;
    Value key =
        absl::SimpleAtoi(part, &index) ? Value::Int(index) : Value::String(std::string(part));
    SLUICE_ASSIGN_OR_RETURN(current, GetItem(current, key));
  }
  return current;
}

absl::StatusOr<Value> Length(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return Value::Int(0);
    case Value::Kind::kString:
      return Value::Int(static_cast<int64_t>(Utf8Length(v.as_string())));
    case Value::Kind::kList:
      return Value::Int(static_cast<int64_t>(v.as_list().size()));
    case Value::Kind::kDict:
      if (!v.is_namespace()) return Value::Int(static_cast<int64_t>(v.as_dict().size()));
      break;
    default:
      break;
  }
  return TypeError(absl::StrCat("object of type '", v.TypeName(), "' has no len()"));
}

// ParsePyFloat is Python float(str). Returns false on a ValueError.
bool ParsePyFloat(const std::string& text, double* out) {
  std::string s(absl::StripAsciiWhitespace(text));
  std::string lower = absl::AsciiStrToLower(s);
  std::string body = lower;
  if (!body.empty() && (body[0] == '+' || body[0] == '-')) body = body.substr(1);
  if (body == "inf" || body == "infinity" || body == "nan") {
    *out = body == "nan" ? NAN : INFINITY;
    if (lower[0] == '-') *out = -*out;
    return true;
  }
  std::string cleaned;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '_') {
      if (i == 0 || i + 1 >= s.size() || !absl::ascii_isdigit(s[i - 1]) ||
          !absl::ascii_isdigit(s[i + 1])) {
        return false;
      }
      continue;
    }
    if (!absl::ascii_isdigit(c) && c != '.' && c != 'e' && c != 'E' && c != '+' && c != '-') {
      return false;
    }
    cleaned.push_back(c);
  }
  if (cleaned.empty()) return false;
  char* end = nullptr;
  *out = std::strtod(cleaned.c_str(), &end);
  return end == cleaned.c_str() + cleaned.size();
}

// ParsePyInt is Python int(str, 10). Returns false on a ValueError.
bool ParsePyInt(const std::string& text, int64_t* out) {
  std::string s(absl::StripAsciiWhitespace(text));
  std::string cleaned;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '_') {
      if (i == 0 || i + 1 >= s.size() || !absl::ascii_isdigit(s[i - 1]) ||
          !absl::ascii_isdigit(s[i + 1])) {
        return false;
      }
      continue;
    }
    cleaned.push_back(s[i]);
  }
  if (cleaned.empty()) return false;
  size_t digits_start = (cleaned[0] == '+' || cleaned[0] == '-') ? 1 : 0;
  if (digits_start >= cleaned.size()) return false;
  for (size_t i = digits_start; i < cleaned.size(); ++i) {
    if (!absl::ascii_isdigit(cleaned[i])) return false;
  }
  if (cleaned[0] == '+') cleaned.erase(0, 1);
  return absl::SimpleAtoi(cleaned, out);
}

absl::StatusOr<Value> SortList(List items, bool reverse, bool case_sensitive,
                               const Value* attribute) {
  std::vector<std::pair<Value, Value>> keyed;
  keyed.reserve(items.size());
  for (Value& item : items) {
    Value key = item;
    if (attribute != nullptr && !attribute->is_none()) {
      SLUICE_ASSIGN_OR_RETURN(key, Attribute(item, *attribute));
    }
    if (!case_sensitive) key = IgnoreCase(key);
    keyed.emplace_back(std::move(key), std::move(item));
  }
  absl::Status error;
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& a, const auto& b) {
    if (!error.ok()) return false;
    auto cmp = reverse ? Compare(b.first, a.first) : Compare(a.first, b.first);
    if (!cmp.ok()) {
      error = cmp.status();
      return false;
    }
    return *cmp < 0;
  });
  SLUICE_RETURN_IF_ERROR(error);
  List out;
  out.reserve(keyed.size());
  for (auto& [key, item] : keyed) out.push_back(std::move(item));
  return Value::MakeList(std::move(out));
}

absl::StatusOr<Value> MinMax(const Value& input, const CallArgs& args, bool want_max) {
  SLUICE_ASSIGN_OR_RETURN(List items, Iterate(input));
  const bool case_sensitive = BoolArg(args, 0, "case_sensitive", false);
  const Value* attribute = args.Arg(1, "attribute");
  if (items.empty()) return Value::Undefined("No aggregated item, sequence was empty.");
  Value best;
  Value best_key;
  for (size_t i = 0; i < items.size(); ++i) {
    Value key = items[i];
    if (attribute != nullptr && !attribute->is_none()) {
      SLUICE_ASSIGN_OR_RETURN(key, Attribute(items[i], *attribute));
    }
    if (!case_sensitive) key = IgnoreCase(key);
    if (i == 0) {
      best = items[i];
      best_key = key;
      continue;
    }
    SLUICE_ASSIGN_OR_RETURN(int cmp, Compare(key, best_key));
    if (want_max ? cmp > 0 : cmp < 0) {
      best = items[i];
      best_key = key;
    }
  }
  return best;
}

// SelectOrReject implements select/reject/selectattr/rejectattr.
absl::StatusOr<Value> SelectOrReject(Interpreter& interp, const Value& input, const CallArgs& args,
                                     bool by_attr, bool keep_when) {
  SLUICE_ASSIGN_OR_RETURN(List items, Iterate(input));
  size_t next = 0;
  Value attribute;
  if (by_attr) {
    if (args.positional.empty()) return TypeError("selectattr/rejectattr need an attribute");
    attribute = args.positional[next++];
  }
  std::string test;
  if (next < args.positional.size()) {
    if (!args.positional[next].is_string()) return TypeError("test name must be a string");
    test = args.positional[next++].as_string();
    if (!HasTest(test)) return TypeError(absl::StrCat("No test named '", test, "'."));
  }
  CallArgs test_args = DropPositional(args, next);
  List out;
  for (Value& item : items) {
    Value subject = item;
    if (by_attr) {
      SLUICE_ASSIGN_OR_RETURN(subject, Attribute(item, attribute));
    }
    bool passed = false;
    if (test.empty()) {
      passed = subject.Truthy();
    } else {
      SLUICE_ASSIGN_OR_RETURN(passed, ApplyTest(interp, test, subject, test_args));
    }
    if (passed == keep_when) out.push_back(std::move(item));
  }
  return Value::MakeList(std::move(out));
}

absl::StatusOr<Value> ToJsonFilter(const Value& input, const CallArgs& args) {
  // HF's tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False).
  JsonOptions options;
  if (const Value* v = args.Arg(0, "ensure_ascii"); v != nullptr)
    options.ensure_ascii = v->Truthy();
  if (const Value* v = args.Arg(1, "indent"); v != nullptr && !v->is_none()) {
    if (v->is_string()) {
      options.indent_str = v->as_string();
    } else if (v->is_int()) {
      options.indent = static_cast<int>(std::clamp<int64_t>(v->as_int(), 0, 64));
    } else {
      return TypeError("tojson: indent must be an int or a string");
    }
  }
  if (const Value* v = args.Arg(2, "separators"); v != nullptr && !v->is_none()) {
    if (!v->is_list() || v->as_list().size() != 2 || !v->as_list()[0].is_string() ||
        !v->as_list()[1].is_string()) {
      return TypeError("tojson: separators must be a (item_separator, key_separator) pair");
    }
    options.item_separator = v->as_list()[0].as_string();
    options.key_separator = v->as_list()[1].as_string();
  }
  if (const Value* v = args.Arg(3, "sort_keys"); v != nullptr) options.sort_keys = v->Truthy();
  SLUICE_ASSIGN_OR_RETURN(std::string json, ToJson(input, options));
  return Value::String(std::move(json));
}

absl::StatusOr<Value> RoundFilter(const Value& input, const CallArgs& args) {
  const Value* p = args.Arg(0, "precision");
  const int64_t precision = p == nullptr ? 0 : p->as_int();
  const Value* m = args.Arg(1, "method");
  const std::string method = m == nullptr ? "common" : SoftStr(*m);
  if (method != "common" && method != "ceil" && method != "floor") {
    return TypeError("method must be common, ceil or floor");
  }
  if (input.is_undefined()) return UndefinedError(input);
  if (!input.is_number() && !input.is_bool()) {
    return TypeError(absl::StrCat("type ", input.TypeName(), " doesn't define __round__ method"));
  }
  if (method == "common") {
    if (!input.is_float()) return Value::Int(input.as_int());
    const double x = input.as_double();
    if (!std::isfinite(x)) return input;
    if (precision < 0 || precision > 300) {
      const double scale = std::pow(10.0, static_cast<double>(precision));
      return Value::Float(std::nearbyint(x * scale) / scale);
    }
    // printf rounds the exact binary value half-to-even, as Python's round() does.
    char buf[512];
    std::snprintf(buf, sizeof(buf), "%.*f", static_cast<int>(precision), x);
    return Value::Float(std::strtod(buf, nullptr));
  }
  const double scale = std::pow(10.0, static_cast<double>(precision));
  const double scaled = input.as_double() * scale;
  return Value::Float((method == "ceil" ? std::ceil(scaled) : std::floor(scaled)) / scale);
}

std::string HtmlEscape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out.push_back(c);
    }
  }
  return out;
}

absl::StatusOr<Value> IndentFilter(const Value& input, const CallArgs& args) {
  std::string indention = "    ";
  if (const Value* w = args.Arg(0, "width"); w != nullptr) {
    if (w->is_string()) {
      indention = w->as_string();
    } else if (w->is_int()) {
      indention.assign(static_cast<size_t>(std::clamp<int64_t>(w->as_int(), 0, 256)), ' ');
    } else {
      return TypeError("indent: width must be an int or a string");
    }
  }
  const bool first = BoolArg(args, 1, "first", false);
  const bool blank = BoolArg(args, 2, "blank", false);
  std::vector<std::string> lines = PySplitLines(SoftStr(input) + "\n");
  std::string rv;
  if (blank) {
    for (size_t i = 0; i < lines.size(); ++i) {
      if (i > 0) rv += "\n" + indention;
      rv += lines[i];
    }
  } else {
    rv = lines.empty() ? std::string() : lines[0];
    for (size_t i = 1; i < lines.size(); ++i) {
      rv += "\n";
      if (!lines[i].empty()) rv += indention;
      rv += lines[i];
    }
  }
  if (first) rv = indention + rv;
  SLUICE_RETURN_IF_ERROR(CheckSize(rv.size()));
  return Value::String(std::move(rv));
}

absl::StatusOr<Value> MapFilter(Interpreter& interp, const Value& input, const CallArgs& args) {
  SLUICE_ASSIGN_OR_RETURN(List items, Iterate(input));
  List out;
  out.reserve(items.size());
  if (args.positional.empty()) {
    const Value* attribute = args.Kwarg("attribute");
    if (attribute == nullptr) return TypeError("map requires a filter name or attribute=");
    const Value* fallback = args.Kwarg("default");
    for (const Value& item : items) {
      SLUICE_ASSIGN_OR_RETURN(Value v, Attribute(item, *attribute));
      if (v.is_undefined() && fallback != nullptr) v = *fallback;
      out.push_back(std::move(v));
    }
    return Value::MakeList(std::move(out));
  }
  if (!args.positional[0].is_string()) return TypeError("map: filter name must be a string");
  const std::string name = args.positional[0].as_string();
  if (!HasFilter(name)) return TypeError(absl::StrCat("No filter named '", name, "'."));
  CallArgs rest = DropPositional(args, 1);
  for (const Value& item : items) {
    SLUICE_ASSIGN_OR_RETURN(Value v, ApplyFilter(interp, name, item, rest));
    out.push_back(std::move(v));
  }
  return Value::MakeList(std::move(out));
}

const absl::flat_hash_map<std::string, FilterFn>& Filters() {
  static const auto* filters = [] {
    auto* m = new absl::flat_hash_map<std::string, FilterFn>();
    auto& f = *m;
    f["abs"] = [](Interpreter&, const Value& v, const CallArgs&) -> absl::StatusOr<Value> {
      if (v.is_undefined()) return UndefinedError(v);
      if (v.is_float()) return Value::Float(std::fabs(v.as_double()));
      if (v.is_int() || v.is_bool()) {
        if (v.as_int() == INT64_MIN) return Value::Float(-v.as_double());
        return Value::Int(v.as_int() < 0 ? -v.as_int() : v.as_int());
      }
      return TypeError(absl::StrCat("bad operand type for abs(): '", v.TypeName(), "'"));
    };
    f["attr"] = [](Interpreter&, const Value& v, const CallArgs& a) -> absl::StatusOr<Value> {
      const Value* name = a.Arg(0, "name");
      if (name == nullptr || !name->is_string()) return TypeError("attr expects a name");
      return GetAttribute(v, name->as_string());
    };
    f["batch"] = [](Interpreter&, const Value& v, const CallArgs& a) -> absl::StatusOr<Value> {
      SLUICE_ASSIGN_OR_RETURN(List items, Iterate(v));
      const Value* count = a.Arg(0, "linecount");
      if (count == nullptr || !count->is_int() || count->as_int() <= 0) {
        return TypeError("batch: linecount must be a positive int");
      }
      const Value* fill = a.Arg(1, "fill_with");
      const size_t n = static_cast<size_t>(count->as_int());
      List out;
      for (size_t i = 0; i < items.size(); i += n) {
        List row(items.begin() + i, items.begin() + std::min(items.size(), i + n));
        if (fill != nullptr && !fill->is_none()) {
          while (row.size() < n) row.push_back(*fill);
        }
        out.push_back(Value::MakeList(std::move(row)));
      }
      return Value::MakeList(std::move(out));
    };
    f["capitalize"] = [](Interpreter&, const Value& v, const CallArgs&) -> absl::StatusOr<Value> {
      return Value::String(PyCapitalize(SoftStr(v)));
    };
    f["center"] = [](Interpreter&, const Value& v, const CallArgs& a) -> absl::StatusOr<Value> {
      const std::string s = SoftStr(v);
      const Value* w = a.Arg(0, "width");
      const int64_t width = w == nullptr ? 80 : std::min<int64_t>(w->as_int(), 1 << 20);
      const int64_t len = static_cast<int64_t>(Utf8Length(s));
      if (width <= len) return Value::String(s);
      const int64_t marg = width - len;
      const int64_t left = marg / 2 + (marg & width & 1);
      return Value::String(std::string(static_cast<size_t>(left), ' ') + s +
                           std::string(static_cast<size_t>(marg - left), ' '));
    };
    f["count"] = [](Interpreter&, const Value& v, const CallArgs&) { return Length(v); };
    f["length"] = f["count"];
    f["default"] = [](Interpreter&, const Value& v, const CallArgs& a) -> absl::StatusOr<Value> {
      const Value* fallback = a.Arg(0, "default_value");
      const bool boolean = BoolArg(a, 1, "boolean", false);
      if (v.is_undefined() || (boolean && !v.Truthy())) {
        return fallback != nullptr ? *fallback : Value::String("");
      }
      return v;
    };
    f["d"] = f["default"];
    f["dictsort"] = [](Interpreter&, const Value& v, const CallArgs& a) -> absl::StatusOr<Value> {
      if (!v.is_dict()) return TypeError("dictsort expects a mapping");
      const bool case_sensitive = BoolArg(a, 0, "case_sensitive", false);
      const Value* by = a.Arg(1, "by");
      const bool by_value = by != nullptr && by->is_string() && by->as_string() == "value";
      const bool reverse = BoolArg(a, 2, "reverse", false);
      List pairs;
      for (const auto& [key, item] : v.as_dict().entries()) {
        pairs.push_back(Value::MakeList({Value::String(key), item}, true));
      }
      const Value index = Value::Int(by_value ? 1 : 0);
      SLUICE_ASSIGN_OR_RETURN(Value sorted,
                              SortList(std::move(pairs), reverse, case_sensitive, &index));
      return sorted;
    };
    f["escape"] = [](Interpreter&, const Value& v, const CallArgs&) -> absl::StatusOr<Value> {
      return Value::String(HtmlEscape(SoftStr(v)));
    };
    f["e"] = f["escape"];
    f["forceescape"] = f["escape"];
    f["first"] = [](Interpreter&, const Value& v, const CallArgs&) -> absl::StatusOr<Value> {
      SLUICE_ASSIGN_OR_RETURN(List items, Iterate(v));
      if (items.empty()) return Value::Undefined("No first item, sequence was empty.");
      return items.front();
    };
    f["last"] = [](Interpreter&, const Value& v, const CallArgs&) -> absl::StatusOr<Value> {
      SLUICE_ASSIGN_OR_RETURN(List items, Iterate(v));
      if (items.empty()) return Value::Undefined("No last item, sequence was empty.");
      return items.back();
    };
    f["float"] = [](Interpreter&, const Value& v, const CallArgs& a) -> absl::StatusOr<Value> {
      const Value* fallback = a.Arg(0, "default");
      const Value def = fallback != nullptr ? *fallback : Value::Float(0.0);
      if (v.is_number() || v.is_bool()) return Value::Float(v.as_double());
      double d = 0;
      if (v.is_string() && ParsePyFloat(v.as_string(), &d)) return Value::Float(d);
      return def;
    };
    f["int"] = [](Interpreter&, const Value& v, const CallArgs& a) -> absl::StatusOr<Value> {
      const Value* fallback = a.Arg(0, "default");
      const Value def = fallback != nullptr ? *fallback : Value::Int(0);
      if (v.is_int() || v.is_bool()) return Value::Int(v.as_int());
      double d = 0;
      if (v.is_float()) {
        d = v.as_double();
      } else if (v.is_string()) {
        int64_t i = 0;
        if (ParsePyInt(v.as_string(), &i)) return Value::Int(i);
        if (!ParsePyFloat(v.as_string(), &d)) return def;
      } else {
        return def;
      }
      if (!std::isfinite(d) || std::fabs(d) >= 9.2e18) return def;
      return Value::Int(static_cast<int64_t>(d));
    };
    f["indent"] = [](Interpreter&, const Value& v, const CallArgs& a) {
      return IndentFilter(v, a);
    };
    f["items"] = [](Interpreter&, const Value& v, const CallArgs&) -> absl::StatusOr<Value> {
      if (v.is_undefined()) return Value::MakeList({});
      if (!v.is_dict()) return TypeError("Can only get item pairs from a mapping.");
      List out;
      for (const auto& [key, item] : v.as_dict().entries()) {
        out.push_back(Value::MakeList({Value::String(key), item}, true));
      }
      return Value::MakeList(std::move(out));
    };
    f["join"] = [](Interpreter&, const Value& v, const CallArgs& a) -> absl::StatusOr<Value> {
      SLUICE_ASSIGN_OR_RETURN(List items, Iterate(v));
      const Value* sep_value = a.Arg(0, "d");
      const std::string sep = sep_value == nullptr ? "" : SoftStr(*sep_value);
      const Value* attribute = a.Arg(1, "attribute");
      std::string out;
      for (size_t i = 0; i < items.size(); ++i) {
        Value item = items[i];
        if (attribute != nullptr && !attribute->is_none()) {
          SLUICE_ASSIGN_OR_RETURN(item, Attribute(item, *attribute));
        }
        if (i > 0) out += sep;
        out += SoftStr(item);
        SLUICE_RETURN_IF_ERROR(CheckSize(out.size()));
      }
      return Value::String(std::move(out));
    };
    f["list"] = [](Interpreter&, const Value& v, const CallArgs&) -> absl::StatusOr<Value> {
      SLUICE_ASSIGN_OR_RETURN(List items, Iterate(v));
      return Value::MakeList(std::move(items));
    };
    f["lower"] = [](Interpreter&, const Value& v, const CallArgs&) -> absl::StatusOr<Value> {
      return Value::String(PyLower(SoftStr(v)));
    };
    f["upper"] = [](Interpreter&, const Value& v, const CallArgs&) -> absl::StatusOr<Value> {
      return Value::String(PyUpper(SoftStr(v)));
    };
    f["title"] = [](Interpreter&, const Value& v, const CallArgs&) -> absl::StatusOr<Value> {
      return Value::String(JinjaTitle(SoftStr(v)));
    };
    f["map"] = MapFilter;
    f["max"] = [](Interpreter&, const Value& v, const CallArgs& a) { return MinMax(v, a, true); };
    f["min"] = [](Interpreter&, const Value& v, const CallArgs& a) { return MinMax(v, a, false); };
    f["reject"] = [](Interpreter& i, const Value& v, const CallArgs& a) {
      return SelectOrReject(i, v, a, false, false);
    };
    f["rejectattr"] = [](Interpreter& i, const Value& v, const CallArgs& a) {
      return SelectOrReject(i, v, a, true, false);
    };
    f["select"] = [](Interpreter& i, const Value& v, const CallArgs& a) {
      return SelectOrReject(i, v, a, false, true);
    };
    f["selectattr"] = [](Interpreter& i, const Value& v, const CallArgs& a) {
      return SelectOrReject(i, v, a, true, true);
    };
    f["replace"] = [](Interpreter&, const Value& v, const CallArgs& a) -> absl::StatusOr<Value> {
      const Value* old_v = a.Arg(0, "old");
      const Value* new_v = a.Arg(1, "new");
      if (old_v == nullptr || new_v == nullptr) return TypeError("replace expects old and new");
      const Value* count = a.Arg(2, "count");
      const int64_t n = count == nullptr || count->is_none() ? -1 : count->as_int();
      SLUICE_ASSIGN_OR_RETURN(std::string out,
                              PyReplace(SoftStr(v), SoftStr(*old_v), SoftStr(*new_v), n));
      return Value::String(std::move(out));
    };
    f["reverse"] = [](Interpreter&, const Value& v, const CallArgs&) -> absl::StatusOr<Value> {
      if (v.is_string()) {
        std::vector<uint32_t> cps = Utf8Decode(v.as_string());
        std::reverse(cps.begin(), cps.end());
        return Value::String(Utf8Encode(cps, 0, cps.size()));
      }
      SLUICE_ASSIGN_OR_RETURN(List items, Iterate(v));
      std::reverse(items.begin(), items.end());
      return Value::MakeList(std::move(items));
    };
    f["round"] = [](Interpreter&, const Value& v, const CallArgs& a) { return RoundFilter(v, a); };
    f["safe"] = [](Interpreter&, const Value& v, const CallArgs&) -> absl::StatusOr<Value> {
      return v;
    };
    f["sort"] = [](Interpreter&, const Value& v, const CallArgs& a) -> absl::StatusOr<Value> {
      SLUICE_ASSIGN_OR_RETURN(List items, Iterate(v));
      return SortList(std::move(items), BoolArg(a, 0, "reverse", false),
                      BoolArg(a, 1, "case_sensitive", false), a.Arg(2, "attribute"));
    };
    f["string"] = [](Interpreter&, const Value& v, const CallArgs&) -> absl::StatusOr<Value> {
      return Value::String(SoftStr(v));
    };
    f["sum"] = [](Interpreter& interp, const Value& v,
                  const CallArgs& a) -> absl::StatusOr<Value> {
      SLUICE_ASSIGN_OR_RETURN(List items, Iterate(v));
      const Value* attribute = a.Arg(0, "attribute");
      const Value* start = a.Arg(1, "start");
      Value total = start != nullptr ? *start : Value::Int(0);
      for (const Value& item : items) {
        Value x = item;
        if (attribute != nullptr && !attribute->is_none()) {
          SLUICE_ASSIGN_OR_RETURN(x, Attribute(item, *attribute));
        }
        SLUICE_ASSIGN_OR_RETURN(total, BinaryOp("+", total, x));
        // Summing strings or lists copies the running total every step (quadratic).
        SLUICE_RETURN_IF_ERROR(interp.ChargeBytes(total.ShallowWeight()));
      }
      return total;
    };
    f["tojson"] = [](Interpreter&, const Value& v, const CallArgs& a) {
      return ToJsonFilter(v, a);
    };
    f["trim"] = [](Interpreter&, const Value& v, const CallArgs& a) -> absl::StatusOr<Value> {
      const Value* chars = a.Arg(0, "chars");
      if (chars != nullptr && !chars->is_none()) {
        const std::string set = SoftStr(*chars);
        return Value::String(PyStrip(SoftStr(v), &set, true, true));
      }
      return Value::String(PyStrip(SoftStr(v), nullptr, true, true));
    };
    f["unique"] = [](Interpreter&, const Value& v, const CallArgs& a) -> absl::StatusOr<Value> {
      SLUICE_ASSIGN_OR_RETURN(List items, Iterate(v));
      const bool case_sensitive = BoolArg(a, 0, "case_sensitive", false);
      const Value* attribute = a.Arg(1, "attribute");
      absl::flat_hash_set<std::string> seen;
      List out;
      for (const Value& item : items) {
        Value key = item;
        if (attribute != nullptr && !attribute->is_none()) {
          SLUICE_ASSIGN_OR_RETURN(key, Attribute(item, *attribute));
        }
        if (!case_sensitive) key = IgnoreCase(key);
        // Python hashes 1, 1.0 and True alike.
        if (key.is_bool() || (key.is_float() && key.as_double() == std::floor(key.as_double()) &&
                              std::fabs(key.as_double()) < 9e18)) {
          key = Value::Int(key.is_bool() ? key.as_int() : static_cast<int64_t>(key.as_double()));
        }
        if (seen.insert(Repr(key)).second) out.push_back(item);
      }
      return Value::MakeList(std::move(out));
    };
    f["wordcount"] = [](Interpreter&, const Value& v, const CallArgs&) -> absl::StatusOr<Value> {
      int64_t count = 0;
      bool in_word = false;
      for (uint32_t cp : Utf8Decode(SoftStr(v))) {
        const bool word =
            (cp < 0x80 && (absl::ascii_isalnum(static_cast<char>(cp)) || cp == '_')) ||
            (cp >= 0x80 && !IsPySpace(cp));
        if (word && !in_word) ++count;
        in_word = word;
      }
      return Value::Int(count);
    };
    return m;
  }();
  return *filters;
}

absl::StatusOr<bool> CompareTest(const Value& v, const CallArgs& a, absl::string_view op) {
  const Value* other = a.Arg(0, "other");
  if (other == nullptr) return TypeError("comparison test needs an argument");
  if (op == "==") return Equals(v, *other);
  if (op == "!=") return !Equals(v, *other);
  if (v.is_undefined()) return UndefinedError(v);
  SLUICE_ASSIGN_OR_RETURN(int cmp, Compare(v, *other));
  if (op == "<") return cmp < 0;
  if (op == "<=") return cmp <= 0;
  if (op == ">") return cmp > 0;
  return cmp >= 0;
}

absl::StatusOr<Value> Mod2(const Value& v) { return BinaryOp("%", v, Value::Int(2)); }

const absl::flat_hash_map<std::string, TestFn>& Tests() {
  static const auto* tests = [] {
    auto* m = new absl::flat_hash_map<std::string, TestFn>();
    auto& t = *m;
    auto simple = [&t](const std::string& name, std::function<bool(const Value&)> fn) {
      t[name] = [fn](Interpreter&, const Value& v, const CallArgs&) -> absl::StatusOr<bool> {
        return fn(v);
      };
    };
    simple("defined", [](const Value& v) { return !v.is_undefined(); });
    simple("undefined", [](const Value& v) { return v.is_undefined(); });
    simple("none", [](const Value& v) { return v.is_none(); });
    simple("boolean", [](const Value& v) { return v.is_bool(); });
    simple("true", [](const Value& v) { return v.is_bool() && v.as_bool(); });
    simple("false", [](const Value& v) { return v.is_bool() && !v.as_bool(); });
    simple("integer", [](const Value& v) { return v.is_int(); });
    simple("float", [](const Value& v) { return v.is_float(); });
    simple("number", [](const Value& v) { return v.is_number() || v.is_bool(); });
    simple("string", [](const Value& v) { return v.is_string(); });
    simple("mapping", [](const Value& v) { return v.is_dict() && !v.is_namespace(); });
    simple("iterable", [](const Value& v) {
      return v.is_undefined() || v.is_string() || v.is_list() || (v.is_dict() && !v.is_namespace());
    });
    simple("sequence", [](const Value& v) {
      return v.is_undefined() || v.is_string() || v.is_list() || (v.is_dict() && !v.is_namespace());
    });
    simple("callable", [](const Value& v) { return v.is_callable(); });
    simple("escaped", [](const Value&) { return false; });
    simple("lower", [](const Value& v) { return PyIsClass(SoftStr(v), "islower"); });
    simple("upper", [](const Value& v) { return PyIsClass(SoftStr(v), "isupper"); });
    t["odd"] = [](Interpreter&, const Value& v, const CallArgs&) -> absl::StatusOr<bool> {
      SLUICE_ASSIGN_OR_RETURN(Value r, Mod2(v));
      return Equals(r, Value::Int(1));
    };
    t["even"] = [](Interpreter&, const Value& v, const CallArgs&) -> absl::StatusOr<bool> {
      SLUICE_ASSIGN_OR_RETURN(Value r, Mod2(v));
      return Equals(r, Value::Int(0));
    };
    t["divisibleby"] = [](Interpreter&, const Value& v, const CallArgs& a) -> absl::StatusOr<bool> {
      const Value* num = a.Arg(0, "num");
      if (num == nullptr) return TypeError("divisibleby needs an argument");
      SLUICE_ASSIGN_OR_RETURN(Value r, BinaryOp("%", v, *num));
      return Equals(r, Value::Int(0));
    };
    const std::pair<const char*, const char*> compare_aliases[] = {
        {"eq", "=="}, {"equalto", "=="}, {"==", "=="},         {"ne", "!="}, {"!=", "!="},
        {"lt", "<"},  {"lessthan", "<"}, {"<", "<"},           {"le", "<="}, {"<=", "<="},
        {"gt", ">"},  {">", ">"},        {"greaterthan", ">"}, {"ge", ">="}, {">=", ">="}};
    for (const auto& [name, op] : compare_aliases) {
      std::string op_str = op;
      t[name] = [op_str](Interpreter&, const Value& v, const CallArgs& a) {
        return CompareTest(v, a, op_str);
      };
    }
    t["in"] = [](Interpreter&, const Value& v, const CallArgs& a) -> absl::StatusOr<bool> {
      const Value* seq = a.Arg(0, "seq");
      if (seq == nullptr) return TypeError("in test needs an argument");
      return Contains(*seq, v);
    };
    t["sameas"] = [](Interpreter&, const Value& v, const CallArgs& a) -> absl::StatusOr<bool> {
      const Value* other = a.Arg(0, "other");
      if (other == nullptr) return TypeError("sameas needs an argument");
      if (v.kind() != other->kind()) return false;
      switch (v.kind()) {
        case Value::Kind::kList:
          return &v.as_list() == &other->as_list();
        case Value::Kind::kDict:
          return &v.as_dict() == &other->as_dict();
        case Value::Kind::kCallable:
          return &v.as_callable() == &other->as_callable();
        default:
          return Equals(v, *other);
      }
    };
    t["filter"] = [](Interpreter&, const Value& v, const CallArgs&) -> absl::StatusOr<bool> {
      return v.is_string() && HasFilter(v.as_string());
    };
    t["test"] = [](Interpreter&, const Value& v, const CallArgs&) -> absl::StatusOr<bool> {
      return v.is_string() && HasTest(v.as_string());
    };
    return m;
  }();
  return *tests;
}

}  // namespace

bool HasFilter(absl::string_view name) { return Filters().contains(name); }
bool HasTest(absl::string_view name) { return Tests().contains(name); }

absl::StatusOr<Value> ApplyFilter(Interpreter& interp, absl::string_view name, const Value& input,
                                  const CallArgs& args) {
  auto it = Filters().find(name);
  if (it == Filters().end()) return TypeError(absl::StrCat("No filter named '", name, "'."));
  return it->second(interp, input, args);
}

absl::StatusOr<bool> ApplyTest(Interpreter& interp, absl::string_view name, const Value& input,
                               const CallArgs& args) {
  auto it = Tests().find(name);
  if (it == Tests().end()) return TypeError(absl::StrCat("No test named '", name, "'."));
  return it->second(interp, input, args);
}

}  // namespace sluice::jinja
