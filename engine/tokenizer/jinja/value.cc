#include "engine/tokenizer/jinja/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "engine/tokenizer/byte_level.h"

namespace sluice::jinja {

const Value* Dict::Get(absl::string_view key) const {
  auto it = index_.find(key);
  return it == index_.end() ? nullptr : &entries_[it->second].second;
}

void Dict::Set(const std::string& key, Value value) {
  auto it = index_.find(key);
  if (it != index_.end()) {
    entries_[it->second].second = std::move(value);
    return;
  }
  index_.emplace(key, entries_.size());
  entries_.emplace_back(key, std::move(value));
}

void Dict::SetAt(size_t index, Value value) { entries_[index].second = std::move(value); }

const Value* CallArgs::Kwarg(absl::string_view name) const {
  for (const auto& [key, value] : keyword) {
    if (key == name) return &value;
  }
  return nullptr;
}

const Value* CallArgs::Arg(size_t index, absl::string_view name) const {
  if (index < positional.size()) return &positional[index];
  return Kwarg(name);
}

namespace {

constexpr int64_t kMaxWeight = int64_t{1} << 62;

int64_t AddWeight(int64_t a, int64_t b) { return b >= kMaxWeight - a ? kMaxWeight : a + b; }

}  // namespace

int64_t Value::ShallowWeight() const {
  switch (kind_) {
    case Kind::kString:
      return static_cast<int64_t>(s_->size());
    case Kind::kList:
      return static_cast<int64_t>(list_->size()) * kElementBytes;
    case Kind::kDict:
      return static_cast<int64_t>(dict_->size()) * kElementBytes;
    default:
      return 0;
  }
}

Value Value::Undefined(std::string hint) {
  Value v;
  v.hint_ = std::move(hint);
  return v;
}

Value Value::None() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}

Value Value::Bool(bool b) {
  Value v;
  v.kind_ = Kind::kBool;
  v.b_ = b;
  return v;
}

Value Value::Int(int64_t i) {
  Value v;
  v.kind_ = Kind::kInt;
  v.i_ = i;
  return v;
}

Value Value::Float(double f) {
  Value v;
  v.kind_ = Kind::kFloat;
  v.f_ = f;
  return v;
}

Value Value::String(std::string s) {
  Value v;
  v.kind_ = Kind::kString;
  v.weight_ = static_cast<int64_t>(s.size());
  v.s_ = std::make_shared<const std::string>(std::move(s));
  return v;
}

Value Value::MakeList(List items, bool is_tuple) {
  Value v;
  v.kind_ = Kind::kList;
  v.is_tuple_ = is_tuple;
  for (const Value& item : items) {
    v.depth_ = std::max(v.depth_, item.depth_ + 1);
    v.has_namespace_ = v.has_namespace_ || item.has_namespace_;
    v.weight_ = AddWeight(v.weight_, AddWeight(item.weight_, kElementBytes));
  }
  if (items.empty()) v.depth_ = 1;
  v.list_ = std::make_shared<const List>(std::move(items));
  return v;
}

Value Value::MakeDict(std::shared_ptr<Dict> dict, bool is_namespace) {
  Value v;
  v.kind_ = Kind::kDict;
  v.is_namespace_ = is_namespace;
  v.has_namespace_ = is_namespace;
  v.depth_ = 1;
  v.weight_ = static_cast<int64_t>(dict->size()) * kElementBytes;
  if (!is_namespace) {
    for (const auto& [key, item] : dict->entries()) {
      v.depth_ = std::max(v.depth_, item.depth_ + 1);
      v.has_namespace_ = v.has_namespace_ || item.has_namespace_;
      v.weight_ = AddWeight(v.weight_, AddWeight(item.weight_, static_cast<int64_t>(key.size())));
    }
  }
  v.dict_ = std::move(dict);
  return v;
}

Value Value::MakeCallable(std::string name,
                          std::function<absl::StatusOr<Value>(Interpreter&, const CallArgs&)> fn) {
  Value v;
  v.kind_ = Kind::kCallable;
  v.callable_ = std::make_shared<const Callable>(Callable{std::move(name), std::move(fn)});
  return v;
}

double Value::as_double() const {
  switch (kind_) {
    case Kind::kFloat:
      return f_;
    case Kind::kInt:
      return static_cast<double>(i_);
    case Kind::kBool:
      return b_ ? 1.0 : 0.0;
    default:
      return 0.0;
  }
}

bool Value::Truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return b_;
    case Kind::kInt:
      return i_ != 0;
    case Kind::kFloat:
      return f_ != 0.0;
    case Kind::kString:
      return !s_->empty();
    case Kind::kList:
      return !list_->empty();
    case Kind::kDict:
      return is_namespace_ || dict_->size() > 0;
    case Kind::kCallable:
      return true;
  }
  return false;
}

std::string Value::TypeName() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "NoneType";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "str";
    case Kind::kList:
      return is_tuple_ ? "tuple" : "list";
    case Kind::kDict:
      return is_namespace_ ? "Namespace" : "dict";
    case Kind::kCallable:
      return "function";
  }
  return "object";
}

// ---------------------------------------------------------------------------------------------
// UTF-8

std::vector<uint32_t> Utf8Decode(absl::string_view s) {
  std::vector<uint32_t> out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    int len = 0;
    uint32_t cp = 0;
    if (c < 0x80) {
      len = 1;
      cp = c;
    } else if ((c & 0xE0) == 0xC0) {
      len = 2;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4;
      cp = c & 0x07;
    }
    bool ok = len > 0 && i + len <= s.size();
    for (int k = 1; ok && k < len; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) {
        ok = false;
      } else {
        cp = (cp << 6) | (cc & 0x3F);
      }
    }
    if (ok && len > 1) {
      // Reject overlong forms and surrogates so that re-encoding is byte-identical.
      static constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
      if (cp < kMin[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) ok = false;
    }
    if (!ok) {
      // Invalid byte: keep it as a lone "surrogate escape" (U+DC80..U+DCFF) that re-encodes to
      // the same byte.
      out.push_back(0xDC00 + c);
      ++i;
      continue;
    }
    out.push_back(cp);
    i += len;
  }
  return out;
}

void Utf8Append(uint32_t cp, std::string* out) {
  if (cp >= 0xDC80 && cp <= 0xDCFF) {
    out->push_back(static_cast<char>(cp - 0xDC00));
  } else {
    byte_level::AppendUtf8(static_cast<char32_t>(cp), out);
  }
}

std::string Utf8Encode(const std::vector<uint32_t>& cps, size_t begin, size_t end) {
  std::string out;
  for (size_t i = begin; i < end && i < cps.size(); ++i) Utf8Append(cps[i], &out);
  return out;
}

size_t Utf8Length(absl::string_view s) { return Utf8Decode(s).size(); }

bool IsPySpace(uint32_t cp) {
  switch (cp) {
    case ' ':
    case '\t':
    case '\n':
    case '\r':
    case 0x0B:
    case 0x0C:
    case 0x1C:
    case 0x1D:
    case 0x1E:
    case 0x1F:
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

// ---------------------------------------------------------------------------------------------
// Printing

std::string FormatFloat(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  if (value == 0) return std::signbit(value) ? "-0.0" : "0.0";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), value, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  // sci = [-]d[.ddd]e[+-]XX: split digits and exponent.
  bool negative = sci[0] == '-';
  if (negative) sci.erase(0, 1);
  size_t e_pos = sci.find('e');
  std::string digits;
  for (size_t i = 0; i < e_pos; ++i) {
    if (sci[i] != '.') digits.push_back(sci[i]);
  }
  int exponent = std::atoi(sci.c_str() + e_pos + 1);
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  int decpt = exponent + 1;  // value = 0.DIGITS * 10^decpt
  std::string out = negative ? "-" : "";
  if (decpt <= -4 || decpt > 16) {
    out += digits[0];
    if (digits.size() > 1) {
      out += '.';
      out += digits.substr(1);
    }
    absl::StrAppend(&out, "e", exponent < 0 ? "-" : "+",
                    absl::StrFormat("%02d", std::abs(exponent)));
  } else if (decpt <= 0) {
    out += "0.";
    out.append(static_cast<size_t>(-decpt), '0');
    out += digits;
  } else if (static_cast<size_t>(decpt) >= digits.size()) {
    out += digits;
    out.append(static_cast<size_t>(decpt) - digits.size(), '0');
    out += ".0";
  } else {
    out += digits.substr(0, decpt);
    out += '.';
    out += digits.substr(decpt);
  }
  return out;
}

namespace {

bool IsPyPrintable(uint32_t cp) {
  if (cp < 0x20 || cp == 0x7F) return false;
  if (cp >= 0x80 && cp <= 0xA0) return false;
  if (cp == 0xAD) return false;
  if (cp >= 0xDC80 && cp <= 0xDCFF) return false;
  if (cp == ' ') return true;
  if (IsPySpace(cp)) return false;
  if ((cp >= 0x200B && cp <= 0x200F) || (cp >= 0x2060 && cp <= 0x206F) || cp == 0xFEFF ||
      (cp >= 0x202A && cp <= 0x202E) || (cp >= 0xFFF9 && cp <= 0xFFFB) ||
      (cp >= 0xE000 && cp <= 0xF8FF)) {
    return false;
  }
  return true;
}

std::string ReprString(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos;
  const bool has_double = s.find('"') != std::string::npos;
  const char quote = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, quote);
  for (uint32_t cp : Utf8Decode(s)) {
    if (cp == static_cast<uint32_t>(quote) || cp == '\\') {
      out += '\\';
      out += static_cast<char>(cp);
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp == '\t') {
      out += "\\t";
    } else if (IsPyPrintable(cp)) {
      Utf8Append(cp, &out);
    } else if (cp <= 0xFF) {
      out += absl::StrFormat("\\x%02x", cp);
    } else if (cp <= 0xFFFF) {
      out += absl::StrFormat("\\u%04x", cp);
    } else {
      out += absl::StrFormat("\\U%08x", cp);
    }
  }
  out += quote;
  return out;
}

void AppendRepr(const Value& value, std::string* out, int depth);

void AppendSeqRepr(const Value& value, std::string* out, int depth) {
  const bool tuple = value.is_tuple();
  out->push_back(tuple ? '(' : '[');
  const List& items = value.as_list();
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out->append(", ");
    AppendRepr(items[i], out, depth + 1);
  }
  if (tuple && items.size() == 1) out->push_back(',');
  out->push_back(tuple ? ')' : ']');
}

void AppendRepr(const Value& value, std::string* out, int depth) {
  if (depth > 200 || out->size() > kMaxValueBytes) {
    out->append("...");
    return;
  }
  switch (value.kind()) {
    case Value::Kind::kString:
      out->append(ReprString(value.as_string()));
      return;
    case Value::Kind::kList:
      AppendSeqRepr(value, out, depth);
      return;
    case Value::Kind::kDict: {
      if (value.is_namespace()) {
        out->append("<Namespace ");
      }
      out->push_back('{');
      bool first = true;
      for (const auto& [key, item] : value.as_dict().entries()) {
        if (!first) out->append(", ");
        first = false;
        out->append(ReprString(key));
        out->append(": ");
        AppendRepr(item, out, depth + 1);
      }
      out->push_back('}');
      if (value.is_namespace()) out->push_back('>');
      return;
    }
    default:
      out->append(ToStr(value));
      return;
  }
}

}  // namespace

std::string ToStr(const Value& value) {
  switch (value.kind()) {
    case Value::Kind::kUndefined:
      return "";
    case Value::Kind::kNone:
      return "None";
    case Value::Kind::kBool:
      return value.as_bool() ? "True" : "False";
    case Value::Kind::kInt:
      return absl::StrCat(value.as_int());
    case Value::Kind::kFloat:
      return FormatFloat(value.as_double());
    case Value::Kind::kString:
      return value.as_string();
    case Value::Kind::kList:
    case Value::Kind::kDict: {
      std::string out;
      AppendRepr(value, &out, 0);
      return out;
    }
    case Value::Kind::kCallable:
      return absl::StrCat("<function ", value.as_callable().name, ">");
  }
  return "";
}

std::string Repr(const Value& value) {
  if (value.is_undefined()) return "Undefined";
  std::string out;
  AppendRepr(value, &out, 0);
  return out;
}

// ---------------------------------------------------------------------------------------------
// JSON (Python json.dumps)

namespace {

void AppendJsonString(const std::string& s, bool ensure_ascii, std::string* out) {
  out->push_back('"');
  for (uint32_t cp : Utf8Decode(s)) {
    switch (cp) {
      case '"':
        out->append("\\\"");
        continue;
      case '\\':
        out->append("\\\\");
        continue;
      case '\n':
        out->append("\\n");
        continue;
      case '\r':
        out->append("\\r");
        continue;
      case '\t':
        out->append("\\t");
        continue;
      case '\b':
        out->append("\\b");
        continue;
      case '\f':
        out->append("\\f");
        continue;
      default:
        break;
    }
    if (cp < 0x20) {
      out->append(absl::StrFormat("\\u%04x", cp));
    } else if (ensure_ascii && cp >= 0x80) {
      if (cp >= 0x10000) {
        const uint32_t v = cp - 0x10000;
        out->append(absl::StrFormat("\\u%04x\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF)));
      } else {
        out->append(absl::StrFormat("\\u%04x", cp));
      }
    } else {
      Utf8Append(cp, out);
    }
  }
  out->push_back('"');
}

std::string JsonFloat(double f) {
  if (std::isnan(f)) return "NaN";
  if (std::isinf(f)) return f > 0 ? "Infinity" : "-Infinity";
  return FormatFloat(f);
}

absl::Status AppendJson(const Value& value, const JsonOptions& options, int level,
                        std::string* out) {
  if (level > 256) return absl::InvalidArgumentError("tojson: value nested too deeply");
  if (out->size() > kMaxValueBytes) {
    return absl::InvalidArgumentError("tojson: output exceeds the size limit");
  }
  const bool pretty = options.indent >= 0 || options.indent_str.has_value();
  const std::string indent_unit = options.indent_str.has_value()
                                      ? *options.indent_str
                                      : std::string(std::max(options.indent, 0), ' ');
  const std::string item_sep =
      options.item_separator.value_or(pretty ? std::string(",") : std::string(", "));
  const std::string key_sep = options.key_separator.value_or(": ");
  auto newline = [&](int lvl) {
    out->push_back('\n');
    for (int i = 0; i < lvl; ++i) out->append(indent_unit);
  };
  switch (value.kind()) {
    case Value::Kind::kNone:
      out->append("null");
      return absl::OkStatus();
    case Value::Kind::kBool:
      out->append(value.as_bool() ? "true" : "false");
      return absl::OkStatus();
    case Value::Kind::kInt:
      absl::StrAppend(out, value.as_int());
      return absl::OkStatus();
    case Value::Kind::kFloat:
      out->append(JsonFloat(value.as_double()));
      return absl::OkStatus();
    case Value::Kind::kString:
      AppendJsonString(value.as_string(), options.ensure_ascii, out);
      return absl::OkStatus();
    case Value::Kind::kList: {
      const List& items = value.as_list();
      if (items.empty()) {
        out->append("[]");
        return absl::OkStatus();
      }
      out->push_back('[');
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) out->append(item_sep);
        if (pretty) newline(level + 1);
        SLUICE_RETURN_IF_ERROR(AppendJson(items[i], options, level + 1, out));
      }
      if (pretty) newline(level);
      out->push_back(']');
      return absl::OkStatus();
    }
    case Value::Kind::kDict: {
      if (value.is_namespace()) {
        return absl::InvalidArgumentError("Object of type Namespace is not JSON serializable");
      }
      std::vector<const std::pair<std::string, Value>*> entries;
      for (const auto& entry : value.as_dict().entries()) entries.push_back(&entry);
      if (options.sort_keys) {
        std::stable_sort(entries.begin(), entries.end(),
                         [](const auto* a, const auto* b) { return a->first < b->first; });
      }
      if (entries.empty()) {
        out->append("{}");
        return absl::OkStatus();
      }
      out->push_back('{');
      for (size_t i = 0; i < entries.size(); ++i) {
        if (i > 0) out->append(item_sep);
        if (pretty) newline(level + 1);
        AppendJsonString(entries[i]->first, options.ensure_ascii, out);
        out->append(key_sep);
        SLUICE_RETURN_IF_ERROR(AppendJson(entries[i]->second, options, level + 1, out));
      }
      if (pretty) newline(level);
      out->push_back('}');
      return absl::OkStatus();
    }
    case Value::Kind::kUndefined:
      return absl::InvalidArgumentError("Object of type Undefined is not JSON serializable");
    case Value::Kind::kCallable:
      return absl::InvalidArgumentError("Object of type function is not JSON serializable");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> ToJson(const Value& value, const JsonOptions& options) {
  std::string out;
  SLUICE_RETURN_IF_ERROR(AppendJson(value, options, 0, &out));
  if (out.size() > kMaxValueBytes) {
    return absl::InvalidArgumentError("tojson: output exceeds the size limit");
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Comparison

bool Equals(const Value& a, const Value& b) {
  const bool a_num = a.is_number() || a.is_bool();
  const bool b_num = b.is_number() || b.is_bool();
  if (a_num && b_num) {
    if (a.is_float() || b.is_float()) return a.as_double() == b.as_double();
    return a.as_int() == b.as_int();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return true;
    case Value::Kind::kString:
      return a.as_string() == b.as_string();
    case Value::Kind::kList: {
      if (a.is_tuple() != b.is_tuple()) return false;
      const List& x = a.as_list();
      const List& y = b.as_list();
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i) {
        if (!Equals(x[i], y[i])) return false;
      }
      return true;
    }
    case Value::Kind::kDict: {
      if (a.is_namespace() || b.is_namespace()) return &a.as_dict() == &b.as_dict();
      const Dict& x = a.as_dict();
      const Dict& y = b.as_dict();
      if (x.size() != y.size()) return false;
      for (const auto& [key, item] : x.entries()) {
        const Value* other = y.Get(key);
        if (other == nullptr || !Equals(item, *other)) return false;
      }
      return true;
    }
    case Value::Kind::kCallable:
      return &a.as_callable() == &b.as_callable();
    default:
      return false;
  }
}

absl::StatusOr<int> Compare(const Value& a, const Value& b) {
  const bool a_num = a.is_number() || a.is_bool();
  const bool b_num = b.is_number() || b.is_bool();
  if (a_num && b_num) {
    if (a.is_float() || b.is_float()) {
      const double x = a.as_double();
      const double y = b.as_double();
      return x < y ? -1 : (x > y ? 1 : 0);
    }
    const int64_t x = a.as_int();
    const int64_t y = b.as_int();
    return x < y ? -1 : (x > y ? 1 : 0);
  }
  if (a.is_string() && b.is_string()) {
    const int c = a.as_string().compare(b.as_string());
    return c < 0 ? -1 : (c > 0 ? 1 : 0);
  }
  if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
    const List& x = a.as_list();
    const List& y = b.as_list();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (Equals(x[i], y[i])) continue;
      return Compare(x[i], y[i]);
    }
    return x.size() < y.size() ? -1 : (x.size() > y.size() ? 1 : 0);
  }
  return absl::InvalidArgumentError(absl::StrCat("'<' not supported between instances of '",
                                                 a.TypeName(), "' and '", b.TypeName(), "'"));
}

}  // namespace sluice::jinja
