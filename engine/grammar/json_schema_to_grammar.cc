#include "engine/grammar/json_schema_to_grammar.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "engine/grammar/regex_to_grammar.h"
#include "engine/grammar/string_exclusion.h"

namespace sluice::grammar {
namespace {

// Schemas keep their key order: generated objects list properties as the schema does.
using json = nlohmann::ordered_json;

constexpr char kItemSep[] = ", ";
// Keys of additional properties have at most kMaxKeyLength characters unless `propertyNames`
// bounds them (maxLength, pattern, format, enum, const): a free key must still close within
// max_tokens (as numbers are capped).
constexpr int32_t kMaxKeyLength = 64;
// min/maxProperties are enforced by counting in rules: (properties + 1) x (maxProperties + 1).
constexpr int64_t kMaxCountedObjectRules = 20000;
constexpr char kKeySep[] = ": ";

// ---- integers ----

Expr Digits(char lo, char hi) {
  if (lo == hi) return Literal(std::string(1, lo));
  return CharClass({{static_cast<char32_t>(lo), static_cast<char32_t>(hi)}});
}

// SameLength: decimal strings a <= b of equal length.
Expr SameLength(const std::string& a, const std::string& b) {
  const size_t n = a.size();
  if (n == 1) return Digits(a[0], b[0]);
  const std::string a_rest = a.substr(1), b_rest = b.substr(1);
  if (a[0] == b[0]) return Sequence({Literal(std::string(1, a[0])), SameLength(a_rest, b_rest)});
  if (a_rest == std::string(n - 1, '0') && b_rest == std::string(n - 1, '9')) {
    return Sequence({Digits(a[0], b[0]), Repeat(Digits('0', '9'), n - 1, n - 1)});
  }
  std::vector<Expr> alts;
  alts.push_back(Sequence({Literal(std::string(1, a[0])), SameLength(a_rest, std::string(n - 1, '9'))}));
  if (a[0] + 1 <= b[0] - 1) {
    alts.push_back(Sequence({Digits(a[0] + 1, b[0] - 1),
                             Repeat(Digits('0', '9'), static_cast<int32_t>(n - 1),
                                    static_cast<int32_t>(n - 1))}));
  }
  alts.push_back(Sequence({Literal(std::string(1, b[0])), SameLength(std::string(n - 1, '0'), b_rest)}));
  return Choice(std::move(alts));
}

uint64_t Pow10(size_t n) {
  uint64_t v = 1;
  for (size_t i = 0; i < n; ++i) v *= 10;
  return v;
}

Expr NonNegRange(uint64_t a, uint64_t b) {
  std::vector<Expr> alts;
  const std::string sb = std::to_string(b);
  for (std::string sa = std::to_string(a); sa.size() <= sb.size();) {
    const uint64_t cur = std::stoull(sa);
    const uint64_t len_max = sa.size() >= 20 ? std::numeric_limits<uint64_t>::max()
                                             : Pow10(sa.size()) - 1;
    const uint64_t end = std::min(b, len_max);
    alts.push_back(SameLength(sa, std::to_string(end)));
    if (end == b) break;
    (void)cur;
    sa = std::to_string(end + 1);
  }
  return Choice(std::move(alts));
}

// Open-ended numbers are capped at kMaxDigits integer digits, kMaxFractionDigits fraction
// digits and kMaxExponentDigits exponent digits: a double holds no more, and a model stuck
// repeating a digit must still close the value within max_tokens.
constexpr int32_t kMaxDigits = 16;
constexpr int32_t kMaxFractionDigits = 16;
constexpr int32_t kMaxExponentDigits = 3;

Expr NonNegAtLeast(uint64_t a) {
  if (a == 0) {
    return Choice({Literal("0"), Sequence({Digits('1', '9'), Repeat(Digits('0', '9'), 0, kMaxDigits - 1)})});
  }
  const std::string sa = std::to_string(a);
  const int32_t len = static_cast<int32_t>(sa.size());
  return Choice({NonNegRange(a, Pow10(sa.size()) - 1),
                 Sequence({Digits('1', '9'),
                           Repeat(Digits('0', '9'), len, std::max(len, kMaxDigits - 1))})});
}

Expr Fraction() { return Sequence({Literal("."), Repeat(Digits('0', '9'), 1, kMaxFractionDigits)}); }

}  // namespace

Expr IntegerRangeExpr(std::optional<int64_t> lo, std::optional<int64_t> hi) {
  std::vector<Expr> alts;
  // Negative values: magnitudes in [neg_lo, neg_hi].
  if (!lo.has_value() || *lo <= -1) {
    const uint64_t neg_lo = (hi.has_value() && *hi < 0) ? static_cast<uint64_t>(-(*hi + 1)) + 1 : 1;
    if (!lo.has_value()) {
      alts.push_back(Sequence({Literal("-"), NonNegAtLeast(neg_lo)}));
    } else {
      const uint64_t neg_hi = static_cast<uint64_t>(-(*lo + 1)) + 1;
      if (neg_lo <= neg_hi) alts.push_back(Sequence({Literal("-"), NonNegRange(neg_lo, neg_hi)}));
    }
  }
  const int64_t a = lo.has_value() ? std::max<int64_t>(*lo, 0) : 0;
  if (!hi.has_value()) {
    alts.push_back(NonNegAtLeast(static_cast<uint64_t>(a)));
  } else if (*hi >= a) {
    alts.push_back(NonNegRange(static_cast<uint64_t>(a), static_cast<uint64_t>(*hi)));
  }
  return Choice(std::move(alts));
}

namespace {

// ---- strings ----

// JsonEscapeExpr rewrites a regex over string contents into one over the JSON string body:
// '"' and '\' appear escaped, control characters only as \n \r \t (the others are dropped).
Expr JsonEscapeExpr(const Expr& e) {
  switch (e.kind) {
    case ExprKind::kLiteral: {
      std::string out;
      for (char c : e.text) {
        if (c == '"') {
          out += "\\\"";
        } else if (c == '\\') {
          out += "\\\\";
        } else if (c == '\n') {
          out += "\\n";
        } else if (c == '\r') {
          out += "\\r";
        } else if (c == '\t') {
          out += "\\t";
        } else if (static_cast<unsigned char>(c) < 0x20) {
          return Choice({});
        } else {
          out.push_back(c);
        }
      }
      return Literal(out);
    }
    case ExprKind::kCharClass: {
      std::vector<CodepointRange> ranges = e.negated ? ComplementRanges(e.ranges) : NormalizeRanges(e.ranges);
      auto contains = [&](char32_t cp) {
        for (const CodepointRange& r : ranges) {
          if (r.lo <= cp && cp <= r.hi) return true;
        }
        return false;
      };
      std::vector<Expr> alts;
      for (auto [cp, esc] : {std::pair<char32_t, const char*>{'"', "\\\""}, {'\\', "\\\\"},
                             {'\n', "\\n"}, {'\r', "\\r"}, {'\t', "\\t"}}) {
        if (contains(cp)) alts.push_back(Literal(esc));
      }
      std::vector<CodepointRange> plain;
      for (const CodepointRange& r : ComplementRanges(ranges)) plain.push_back(r);
      plain.push_back({0, 0x1F});
      plain.push_back({'"', '"'});
      plain.push_back({'\\', '\\'});
      std::vector<CodepointRange> allowed = ComplementRanges(plain);
      if (!allowed.empty()) alts.insert(alts.begin(), CharClass(std::move(allowed)));
      return Choice(std::move(alts));
    }
    default: {
      Expr out = e;
      for (Expr& c : out.children) c = JsonEscapeExpr(c);
      return out;
    }
  }
}

const char* FormatRegex(const std::string& format) {
  static const absl::flat_hash_map<std::string, const char*>* kFormats =
      new absl::flat_hash_map<std::string, const char*>{
          {"date", R"([0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01]))"},
          {"time", R"(([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,6})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9]))"},
          {"date-time",
           R"([0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,6})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9]))"},
          {"uuid", R"([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})"},
          // Bounded (local part <= 4 dot-separated atoms, <= 5 domain labels) so the value ends.
          {"email", R"([A-Za-z0-9_+-]{1,32}(\.[A-Za-z0-9_+-]{1,32}){0,3}@[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?){1,4})"},
          {"ipv4", R"((25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])(\.(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])){3})"},
      };
  auto it = kFormats->find(format);
  return it == kFormats->end() ? nullptr : it->second;
}

bool IsAnnotation(const std::string& key) {
  static const absl::flat_hash_set<std::string>* kKeys = new absl::flat_hash_set<std::string>{
      "title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated",
      "readOnly", "writeOnly", "discriminator", "$anchor", "contentEncoding", "contentMediaType"};
  return kKeys->contains(key) || key.starts_with("x-");
}

bool IsSupported(const std::string& key) {
  static const absl::flat_hash_set<std::string>* kKeys = new absl::flat_hash_set<std::string>{
      "type", "enum", "const", "properties", "required", "additionalProperties", "items",
      "prefixItems", "minItems", "maxItems", "anyOf", "oneOf", "allOf", "$ref", "$defs",
      "definitions", "pattern", "minLength", "maxLength", "format", "minimum", "maximum",
      "exclusiveMinimum", "exclusiveMaximum", "uniqueItems", "additionalItems", "propertyNames",
      "minProperties", "maxProperties"};
  return kKeys->contains(key) || IsAnnotation(key);
}

std::string Child(const std::string& path, const std::string& key) {
  std::string k;
  for (char c : key) {
    if (c == '~') {
      k += "~0";
    } else if (c == '/') {
      k += "~1";
    } else {
      k.push_back(c);
    }
  }
  return absl::StrCat(path, "/", k);
}

absl::Status SchemaError(const std::string& path, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("invalid JSON schema at ", path, ": ", what));
}

class SchemaCompiler {
 public:
  explicit SchemaCompiler(const json& root) : root_(root) {}

  absl::StatusOr<Grammar> Run() {
    const int32_t r = g_.AddRule("root");
    g_.set_root(r);
    absl::StatusOr<Expr> e = Visit(root_, "#", 0);
    if (!e.ok()) return e.status();
    g_.rule(r).body = *std::move(e);
    return std::move(g_);
  }

  // Any-value rules, created once.
  int32_t ValueRule() {
    if (value_rule_ >= 0) return value_rule_;
    value_rule_ = g_.AddRule("value");
    const int32_t object = g_.AddRule("object");
    const int32_t array = g_.AddRule("array");
    const Expr member = Sequence({RuleRef(StringRule()), Literal(kKeySep), RuleRef(value_rule_)});
    g_.rule(object).body = Sequence(
        {Literal("{"),
         Optional(Sequence({member, Star(Sequence({Literal(kItemSep), member}))})),
         Literal("}")});
    g_.rule(array).body = Sequence(
        {Literal("["),
         Optional(Sequence({RuleRef(value_rule_),
                            Star(Sequence({Literal(kItemSep), RuleRef(value_rule_)}))})),
         Literal("]")});
    g_.rule(value_rule_).body =
        Choice({RuleRef(object), RuleRef(array), RuleRef(StringRule()), RuleRef(NumberRule()),
                Literal("true"), Literal("false"), Literal("null")});
    object_rule_ = object;
    return value_rule_;
  }
  int32_t ObjectRule() {
    ValueRule();
    return object_rule_;
  }
  int32_t StringRule() {
    if (string_rule_ < 0) {
      string_rule_ = g_.AddRule("string", Sequence({Literal("\""), Star(JsonCharExpr()), Literal("\"")}));
    }
    return string_rule_;
  }
  int32_t NumberRule() {
    if (number_rule_ < 0) {
      number_rule_ = g_.AddRule(
          "number",
          Sequence({Optional(Literal("-")), NonNegAtLeast(0), Optional(Fraction()),
                    Optional(Sequence({CharClass({{'e', 'e'}, {'E', 'E'}}),
                                       Optional(CharClass({{'+', '+'}, {'-', '-'}})),
                                       Repeat(Digits('0', '9'), 1, kMaxExponentDigits)}))}));
    }
    return number_rule_;
  }
  Grammar& grammar() { return g_; }

 private:
  absl::StatusOr<const json*> Resolve(const std::string& ref, const std::string& path) {
    if (ref.empty() || ref[0] != '#') {
      return SchemaError(path, absl::StrCat("$ref '", ref,
                                            "' is not local (only references into this schema, "
                                            "starting with '#', are supported)"));
    }
    const json* cur = &root_;
    if (ref.size() > 1) {
      if (ref[1] != '/') return SchemaError(path, absl::StrCat("$ref '", ref, "' is not a JSON pointer"));
      for (absl::string_view part : absl::StrSplit(ref.substr(2), '/')) {
        std::string key;
        for (size_t i = 0; i < part.size(); ++i) {
          if (part[i] == '~' && i + 1 < part.size()) {
            key.push_back(part[i + 1] == '1' ? '/' : '~');
            ++i;
          } else {
            key.push_back(part[i]);
          }
        }
        if (cur->is_object() && cur->contains(key)) {
          cur = &(*cur)[key];
        } else if (cur->is_array() && !key.empty() &&
                   std::all_of(key.begin(), key.end(), ::isdigit) &&
                   std::stoul(key) < cur->size()) {
          cur = &(*cur)[std::stoul(key)];
        } else {
          return SchemaError(path, absl::StrCat("$ref '", ref, "' does not resolve"));
        }
      }
    }
    return cur;
  }

  // Merge folds `b` into `a` for allOf. Errors name the conflicting keyword.
  absl::Status Merge(json& a, const json& b, const std::string& path) {
    if (b.is_boolean()) {
      if (!b.get<bool>()) return SchemaError(path, "allOf contains false (nothing can match)");
      return absl::OkStatus();
    }
    for (auto it = b.begin(); it != b.end(); ++it) {
      const std::string& k = it.key();
      if (IsAnnotation(k)) continue;
      if (!a.contains(k)) {
        a[k] = it.value();
      } else if (k == "properties") {
        for (auto p = it.value().begin(); p != it.value().end(); ++p) {
          if (!a[k].contains(p.key())) {
            a[k][p.key()] = p.value();
          } else if (a[k][p.key()] != p.value()) {
            json merged = a[k][p.key()];
            absl::Status st = Merge(merged, p.value(), Child(Child(path, "properties"), p.key()));
            if (!st.ok()) return st;
            a[k][p.key()] = merged;
          }
        }
      } else if (k == "required") {
        for (const json& r : it.value()) {
          if (std::find(a[k].begin(), a[k].end(), r) == a[k].end()) a[k].push_back(r);
        }
      } else if (k == "type") {
        auto as_list = [](const json& t) {
          std::vector<std::string> v;
          if (t.is_string()) v.push_back(t.get<std::string>());
          if (t.is_array()) {
            for (const json& x : t) {
              if (x.is_string()) v.push_back(x.get<std::string>());
            }
          }
          return v;
        };
        std::vector<std::string> x = as_list(a[k]), y = as_list(it.value()), both;
        for (const std::string& t : x) {
          if (std::find(y.begin(), y.end(), t) != y.end() ||
              (t == "integer" && std::find(y.begin(), y.end(), "number") != y.end())) {
            both.push_back(t);
          } else if (t == "number" && std::find(y.begin(), y.end(), "integer") != y.end()) {
            both.push_back("integer");
          }
        }
        if (both.empty()) return SchemaError(path, "allOf has disjoint 'type's (nothing can match)");
        a[k] = both;
      } else if (k == "minimum" || k == "minLength" || k == "minItems" || k == "exclusiveMinimum") {
        if (it.value().is_number() && a[k].is_number()) a[k] = std::max(a[k].get<double>(), it.value().get<double>());
      } else if (k == "maximum" || k == "maxLength" || k == "maxItems" || k == "exclusiveMaximum") {
        if (it.value().is_number() && a[k].is_number()) a[k] = std::min(a[k].get<double>(), it.value().get<double>());
      } else if (a[k] != it.value()) {
        return SchemaError(path, absl::StrCat("allOf cannot be merged: the subschemas disagree on '", k, "'"));
      }
    }
    return absl::OkStatus();
  }

  absl::StatusOr<Expr> Visit(const json& s, const std::string& path, int depth) {
    if (depth > 256) return SchemaError(path, "schema nested too deeply");
    if (s.is_boolean()) {
      if (s.get<bool>()) return RuleRef(ValueRule());
      return SchemaError(path, "the schema is false (nothing can match)");
    }
    if (!s.is_object()) return SchemaError(path, "a schema must be an object or a boolean");
    for (auto it = s.begin(); it != s.end(); ++it) {
      if (!IsSupported(it.key())) {
        return absl::InvalidArgumentError(absl::StrCat("unsupported JSON Schema keyword '",
                                                       it.key(), "' at ", path));
      }
    }
    if (s.contains("uniqueItems") && s["uniqueItems"] != json(false)) {
      return absl::InvalidArgumentError(
          absl::StrCat("unsupported JSON Schema keyword 'uniqueItems' at ", path));
    }
    auto has_constraints_besides = [&](std::initializer_list<const char*> skip) {
      for (auto it = s.begin(); it != s.end(); ++it) {
        const std::string& k = it.key();
        if (IsAnnotation(k) || k == "$defs" || k == "definitions") continue;
        if (std::find_if(skip.begin(), skip.end(), [&](const char* x) { return k == x; }) != skip.end()) continue;
        return true;
      }
      return false;
    };
    if (s.contains("$ref")) {
      if (!s["$ref"].is_string()) return SchemaError(path, "$ref must be a string");
      const std::string ref = s["$ref"].get<std::string>();
      absl::StatusOr<const json*> target = Resolve(ref, path);
      if (!target.ok()) return target.status();
      if (has_constraints_besides({"$ref"})) {
        json merged = s;
        merged.erase("$ref");
        absl::Status st = Merge(merged, **target, path);
        if (!st.ok()) return st;
        return Visit(merged, path, depth + 1);
      }
      auto it = ref_rules_.find(ref);
      if (it != ref_rules_.end()) return RuleRef(it->second);
      std::string name = ref.size() > 1 ? ref.substr(ref.rfind('/') + 1) : "root-ref";
      const int32_t rule = g_.AddRule(name.empty() ? "ref" : name);
      g_.rule(rule).origin = absl::StrCat("JSON Schema $ref '", ref, "'");
      ref_rules_[ref] = rule;
      absl::StatusOr<Expr> body = Visit(**target, ref, depth + 1);
      if (!body.ok()) return body.status();
      g_.rule(rule).body = *std::move(body);
      return RuleRef(rule);
    }
    if (s.contains("allOf")) {
      const json& all = s["allOf"];
      if (!all.is_array() || all.empty()) return SchemaError(path, "allOf must be a non-empty array");
      json merged = s;
      merged.erase("allOf");
      for (size_t i = 0; i < all.size(); ++i) {
        const std::string sub_path = Child(Child(path, "allOf"), std::to_string(i));
        json sub = all[i];
        // Resolve references so their keywords can be merged.
        while (sub.is_object() && sub.contains("$ref")) {
          absl::StatusOr<const json*> t = Resolve(sub["$ref"].get<std::string>(), sub_path);
          if (!t.ok()) return t.status();
          json rest = sub;
          rest.erase("$ref");
          sub = **t;
          if (sub.is_object()) {
            absl::Status st = Merge(sub, rest, sub_path);
            if (!st.ok()) return st;
          }
        }
        if (sub.is_object() && (sub.contains("anyOf") || sub.contains("oneOf") || sub.contains("allOf"))) {
          if (sub.contains("allOf")) {
            // Flatten nested allOf by visiting through a merged copy.
          } else if (merged.contains("anyOf") || merged.contains("oneOf")) {
            return SchemaError(sub_path, "allOf cannot be merged: more than one anyOf/oneOf");
          }
        }
        absl::Status st = Merge(merged, sub, sub_path);
        if (!st.ok()) return st;
      }
      return Visit(merged, path, depth + 1);
    }
    for (const char* key : {"anyOf", "oneOf"}) {
      if (!s.contains(key)) continue;
      const json& list = s[key];
      if (!list.is_array() || list.empty()) {
        return SchemaError(path, absl::StrCat(key, " must be a non-empty array"));
      }
      json rest = s;
      rest.erase(key);
      const bool with_rest = has_constraints_besides({key});
      std::vector<Expr> alts;
      for (size_t i = 0; i < list.size(); ++i) {
        const std::string sub_path = Child(Child(path, key), std::to_string(i));
        absl::StatusOr<Expr> e;
        if (with_rest) {
          json both = json::object();
          both["allOf"] = json::array({rest, list[i]});
          e = Visit(both, sub_path, depth + 1);
        } else {
          e = Visit(list[i], sub_path, depth + 1);
        }
        if (!e.ok()) return e.status();
        alts.push_back(*std::move(e));
      }
      return Choice(std::move(alts));
    }
    if (s.contains("enum")) {
      const json& values = s["enum"];
      if (!values.is_array()) return SchemaError(path, "enum must be an array");
      if (values.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("JSON schema at ", path, " has an empty 'enum': no value can match"));
      }
      std::vector<Expr> alts;
      for (const json& v : values) {
        if (s.contains("type") && !MatchesType(v, s["type"])) continue;
        alts.push_back(Literal(DumpValue(v)));
      }
      if (alts.empty()) {
        return SchemaError(path, "no value of 'enum' has the schema's 'type' (nothing can match)");
      }
      return Choice(std::move(alts));
    }
    if (s.contains("const")) return Literal(DumpValue(s["const"]));

    std::vector<std::string> types;
    if (s.contains("type")) {
      const json& t = s["type"];
      if (t.is_string()) {
        types.push_back(t.get<std::string>());
      } else if (t.is_array() && !t.empty()) {
        for (const json& x : t) {
          if (!x.is_string()) return SchemaError(path, "'type' entries must be strings");
          types.push_back(x.get<std::string>());
        }
      } else {
        return SchemaError(path, "'type' must be a string or a non-empty array of strings");
      }
    } else {
      // Infer from the keywords present; none: any value.
      if (s.contains("properties") || s.contains("required") || s.contains("additionalProperties") ||
          s.contains("propertyNames") || s.contains("minProperties") || s.contains("maxProperties")) {
        types.push_back("object");
      } else if (s.contains("items") || s.contains("prefixItems") || s.contains("minItems") ||
                 s.contains("maxItems")) {
        types.push_back("array");
      } else if (s.contains("pattern") || s.contains("minLength") || s.contains("maxLength") ||
                 s.contains("format")) {
        types.push_back("string");
      } else if (s.contains("minimum") || s.contains("maximum") || s.contains("exclusiveMinimum") ||
                 s.contains("exclusiveMaximum")) {
        types.push_back("number");
      } else {
        return RuleRef(ValueRule());
      }
    }
    std::vector<Expr> alts;
    for (const std::string& t : types) {
      absl::StatusOr<Expr> e = VisitType(s, t, path, depth);
      if (!e.ok()) return e.status();
      alts.push_back(*std::move(e));
    }
    return Choice(std::move(alts));
  }

  static bool MatchesType(const json& v, const json& type) {
    auto one = [&](const std::string& t) {
      if (t == "string") return v.is_string();
      if (t == "integer") return v.is_number_integer() || (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>());
      if (t == "number") return v.is_number();
      if (t == "boolean") return v.is_boolean();
      if (t == "null") return v.is_null();
      if (t == "object") return v.is_object();
      if (t == "array") return v.is_array();
      return false;
    };
    if (type.is_string()) return one(type.get<std::string>());
    if (type.is_array()) {
      for (const json& t : type) {
        if (t.is_string() && one(t.get<std::string>())) return true;
      }
    }
    return false;
  }

  static std::string DumpValue(const json& v) {
    return v.dump(-1, ' ', /*ensure_ascii=*/false, json::error_handler_t::replace);
  }

  absl::StatusOr<int32_t> GetCount(const json& s, const char* key, const std::string& path) {
    if (!s.contains(key)) return -1;
    const json& v = s[key];
    if (!v.is_number() || v.get<double>() < 0 || std::floor(v.get<double>()) != v.get<double>()) {
      return SchemaError(path, absl::StrCat("'", key, "' must be a non-negative integer"));
    }
    if (v.get<double>() > 100000) return SchemaError(path, absl::StrCat("'", key, "' over 100000 is not supported"));
    return static_cast<int32_t>(v.get<double>());
  }

  absl::StatusOr<Expr> VisitType(const json& s, const std::string& t, const std::string& path, int depth) {
    if (t == "null") return Literal("null");
    if (t == "boolean") return Choice({Literal("true"), Literal("false")});
    if (t == "string") return VisitString(s, path);
    if (t == "integer" || t == "number") return VisitNumber(s, t == "integer", path);
    if (t == "object") return VisitObject(s, path, depth);
    if (t == "array") return VisitArray(s, path, depth);
    return SchemaError(path, absl::StrCat("unknown type '", t, "'"));
  }

  // StringContent: what a string schema allows, as code points (before JSON escaping), and
  // whether every JSON spelling of it is allowed (length bounds: JsonSpellings) or only the
  // plain one (pattern, format: JsonEscapeExpr). `unconstrained` when no keyword bounds it.
  struct Content {
    Expr decoded;
    bool all_spellings = true;
    bool unconstrained = false;
  };
  absl::StatusOr<Content> StringContent(const json& s, const std::string& path) {
    absl::StatusOr<int32_t> min_len = GetCount(s, "minLength", path);
    if (!min_len.ok()) return min_len.status();
    absl::StatusOr<int32_t> max_len = GetCount(s, "maxLength", path);
    if (!max_len.ok()) return max_len.status();
    const int constraints = (s.contains("pattern") ? 1 : 0) + (s.contains("format") ? 1 : 0) +
                            ((*min_len >= 0 || *max_len >= 0) ? 1 : 0);
    if (constraints > 1) {
      return SchemaError(path, "combining pattern, format and minLength/maxLength in one string is not supported");
    }
    if (s.contains("pattern") || s.contains("format")) {
      std::string regex;
      if (s.contains("pattern")) {
        if (!s["pattern"].is_string()) return SchemaError(path, "'pattern' must be a string");
        regex = s["pattern"].get<std::string>();
      } else {
        if (!s["format"].is_string()) return SchemaError(path, "'format' must be a string");
        const std::string format = s["format"].get<std::string>();
        const char* r = FormatRegex(format);
        if (r == nullptr) {
          return absl::InvalidArgumentError(absl::StrCat("unsupported JSON Schema format '", format,
                                                         "' at ", path));
        }
        regex = r;
      }
      absl::StatusOr<Expr> e = RegexToExpr(regex);
      if (!e.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("invalid JSON schema at ", Child(path, "pattern"),
                                                       ": ", e.status().message()));
      }
      return Content{*std::move(e), /*all_spellings=*/false};
    }
    const Expr any = CharClass({{0, 0x10FFFF}});
    if (*min_len < 0 && *max_len < 0) return Content{Star(any), true, /*unconstrained=*/true};
    const int32_t lo = std::max(*min_len, 0);
    if (*max_len >= 0 && *max_len < lo) return SchemaError(path, "maxLength is below minLength (nothing can match)");
    return Content{Repeat(any, lo, *max_len), true};
  }

  static Expr Spell(const Content& c, const Expr& decoded) {
    return Sequence({Literal("\""), c.all_spellings ? JsonSpellings(decoded) : JsonEscapeExpr(decoded),
                     Literal("\"")});
  }

  absl::StatusOr<Expr> VisitString(const json& s, const std::string& path) {
    absl::StatusOr<Content> c = StringContent(s, path);
    if (!c.ok()) return c.status();
    if (c->unconstrained) return RuleRef(StringRule());
    return Spell(*c, c->decoded);
  }

  // KeyExpr: the key (a JSON string) of an additional property: the strings of `c` except the
  // declared property names, in every spelling (an escaped spelling of a declared name is the
  // same key once parsed); nullopt when no key is left.
  absl::StatusOr<std::optional<Expr>> KeyExpr(const Content& c, const std::vector<std::string>& declared,
                                              const std::string& path) {
    absl::StatusOr<Expr> left = ExcludeStrings(c.decoded, declared);
    if (!left.ok()) return SchemaError(path, std::string(left.status().message()));
    if (IsNothing(*left)) return std::optional<Expr>();
    return std::optional<Expr>(Spell(c, *left));
  }

  absl::StatusOr<Expr> VisitNumber(const json& s, bool integer, const std::string& path) {
    std::optional<double> lo, hi;
    bool lo_exclusive = false, hi_exclusive = false;
    for (const char* key : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}) {
      if (!s.contains(key)) continue;
      const json& v = s[key];
      const std::string k = key;
      if (v.is_boolean()) {  // draft 4: a flag on minimum / maximum
        if (k == "exclusiveMinimum") lo_exclusive = v.get<bool>();
        if (k == "exclusiveMaximum") hi_exclusive = v.get<bool>();
        continue;
      }
      if (!v.is_number()) return SchemaError(path, absl::StrCat("'", key, "' must be a number"));
      const double d = v.get<double>();
      if (k == "minimum" && (!lo.has_value() || d > *lo)) lo = d;
      if (k == "maximum" && (!hi.has_value() || d < *hi)) hi = d;
      if (k == "exclusiveMinimum") {
        if (!lo.has_value() || d >= *lo) {
          lo = d;
          lo_exclusive = true;
        }
      }
      if (k == "exclusiveMaximum") {
        if (!hi.has_value() || d <= *hi) {
          hi = d;
          hi_exclusive = true;
        }
      }
    }
    constexpr double kLimit = 1e15;
    if ((lo.has_value() && std::fabs(*lo) > kLimit) || (hi.has_value() && std::fabs(*hi) > kLimit)) {
      return SchemaError(path, "numeric bounds beyond 1e15 are not supported");
    }
    if (integer) {
      std::optional<int64_t> a, b;
      if (lo.has_value()) a = static_cast<int64_t>(lo_exclusive ? std::floor(*lo) + 1 : std::ceil(*lo));
      if (hi.has_value()) b = static_cast<int64_t>(hi_exclusive ? std::ceil(*hi) - 1 : std::floor(*hi));
      if (a.has_value() && b.has_value() && *a > *b) {
        return SchemaError(path, "the integer bounds leave no value (nothing can match)");
      }
      if (!a.has_value() && !b.has_value()) return IntegerRangeExpr(std::nullopt, std::nullopt);
      return IntegerRangeExpr(a, b);
    }
    if (!lo.has_value() && !hi.has_value()) return RuleRef(NumberRule());
    // Numbers: bounds are supported where they are integral with a non-negative lower bound
    // and no upper bound (e.g. minimum 0): integer part >= lo, any fraction.
    if (hi.has_value() || !lo.has_value() || *lo < 0 || std::floor(*lo) != *lo || lo_exclusive) {
      return absl::InvalidArgumentError(absl::StrCat(
          "unsupported JSON Schema bounds for type 'number' at ", path,
          " (only an integral, non-negative 'minimum' is supported; use type 'integer' for ranges)"));
    }
    return Sequence({NonNegAtLeast(static_cast<uint64_t>(*lo)), Optional(Fraction())});
  }

  absl::StatusOr<Expr> VisitObject(const json& s, const std::string& path, int depth) {
    std::vector<std::pair<std::string, Expr>> props;
    absl::flat_hash_set<std::string> required;
    std::vector<std::string> required_order;  // the schema's order, for keys not in properties
    if (s.contains("required")) {
      if (!s["required"].is_array()) return SchemaError(path, "'required' must be an array");
      for (const json& r : s["required"]) {
        if (!r.is_string()) return SchemaError(path, "'required' entries must be strings");
        if (required.insert(r.get<std::string>()).second) required_order.push_back(r.get<std::string>());
      }
    }
    if (s.contains("properties")) {
      const json& p = s["properties"];
      if (!p.is_object()) return SchemaError(path, "'properties' must be an object");
      for (auto it = p.begin(); it != p.end(); ++it) {
        absl::StatusOr<Expr> e = Visit(it.value(), Child(Child(path, "properties"), it.key()), depth + 1);
        if (!e.ok()) return e.status();
        props.emplace_back(it.key(), *std::move(e));
      }
    }
    if (s.contains("propertyNames")) {
      // propertyNames binds declared keys too: an optional property whose name does not fit can
      // never appear; a required one makes the object impossible.
      const std::string pn_path = Child(path, "propertyNames");
      for (const std::string& r : required_order) {
        absl::StatusOr<bool> fits = NameFitsPropertyNames(s["propertyNames"], r, pn_path);
        if (!fits.ok()) return fits.status();
        if (!*fits) {
          return SchemaError(path, absl::StrCat("required property '", r,
                                                "' does not match 'propertyNames' (nothing can match)"));
        }
      }
      std::vector<std::pair<std::string, Expr>> kept;
      for (auto& p : props) {
        absl::StatusOr<bool> fits = NameFitsPropertyNames(s["propertyNames"], p.first, pn_path);
        if (!fits.ok()) return fits.status();
        if (*fits) kept.push_back(std::move(p));
      }
      props = std::move(kept);
    }
    std::optional<Expr> extra;
    if (s.contains("additionalProperties")) {
      const json& a = s["additionalProperties"];
      if (!(a.is_boolean() && !a.get<bool>())) {
        absl::StatusOr<Expr> e = Visit(a, Child(path, "additionalProperties"), depth + 1);
        if (!e.ok()) return e.status();
        extra = *std::move(e);
      }
    }
    // The keys of additional properties (propertyNames, or free strings of bounded length),
    // never a declared name: the object would repeat the key, and a JSON parser keeps the
    // last value, which only the additional schema checked.
    std::vector<std::string> declared;
    for (const auto& p : props) declared.push_back(p.first);
    for (const std::string& r : required_order) {
      if (std::find(declared.begin(), declared.end(), r) == declared.end()) declared.push_back(r);
    }
    std::optional<Expr> extra_key;
    if (extra.has_value()) {
      absl::StatusOr<std::optional<Expr>> k =
          s.contains("propertyNames")
              ? PropertyNameExpr(s["propertyNames"], Child(path, "propertyNames"), depth, declared)
              : KeyExpr(Content{Repeat(CharClass({{0, 0x10FFFF}}), 0, kMaxKeyLength)}, declared, path);
      if (!k.ok()) return k.status();
      if (!k->has_value()) extra.reset();  // no key fits (propertyNames false, or all declared)
      extra_key = std::move(*k);  // empty when no key fits
    }
    for (const std::string& r : required_order) {
      if (std::none_of(props.begin(), props.end(), [&](const auto& p) { return p.first == r; })) {
        if (!extra.has_value()) {
          return SchemaError(path, absl::StrCat("required property '", r,
                                                "' is not in 'properties' and no additional "
                                                "properties are allowed (nothing can match)"));
        }
        props.emplace_back(r, *extra);
      }
    }
    absl::StatusOr<int32_t> min_props = GetCount(s, "minProperties", path);
    if (!min_props.ok()) return min_props.status();
    absl::StatusOr<int32_t> max_props = GetCount(s, "maxProperties", path);
    if (!max_props.ok()) return max_props.status();
    const size_t n = props.size();
    const std::string base = path == "#" ? "root" : path.substr(path.rfind('/') + 1);
    const std::string prefix = base.empty() ? "obj" : base;
    auto member = [&](const std::string& key, Expr value) {
      return Sequence({Literal(DumpValue(json(key))), Literal(kKeySep), std::move(value)});
    };
    // One rule for an additional member, however many places the object rules offer one (one
    // automaton, walked over the vocabulary once).
    std::optional<Expr> extra_member;
    if (extra.has_value()) {
      extra_member = RuleRef(g_.AddRule(absl::StrCat(prefix, "-extra"),
                                        Sequence({*extra_key, Literal(kKeySep), *extra})));
    }
    if (*min_props > 0 || *max_props >= 0) {
      return CountedObject(props, required, extra_member, std::max(*min_props, 0), *max_props, prefix, path);
    }
    // Rules A_i (nothing emitted yet) and B_i (something emitted) for properties i..n-1.
    std::vector<int32_t> a_rules(n + 1), b_rules(n + 1);
    for (size_t i = 0; i <= n; ++i) {
      a_rules[i] = g_.AddRule(absl::StrCat(prefix, "-a", i));
      b_rules[i] = g_.AddRule(absl::StrCat(prefix, "-b", i));
    }
    if (extra_member.has_value()) {
      g_.rule(b_rules[n]).body = Star(Sequence({Literal(kItemSep), *extra_member}));
      g_.rule(a_rules[n]).body = Optional(Sequence({*extra_member, RuleRef(b_rules[n])}));
    }
    for (size_t i = n; i-- > 0;) {
      const bool req = required.contains(props[i].first);
      Expr with_b = Sequence({Literal(kItemSep), member(props[i].first, props[i].second), RuleRef(b_rules[i + 1])});
      Expr with_a = Sequence({member(props[i].first, props[i].second), RuleRef(b_rules[i + 1])});
      g_.rule(b_rules[i]).body = req ? std::move(with_b) : Choice({std::move(with_b), RuleRef(b_rules[i + 1])});
      g_.rule(a_rules[i]).body = req ? std::move(with_a) : Choice({std::move(with_a), RuleRef(a_rules[i + 1])});
    }
    return Sequence({Literal("{"), RuleRef(a_rules[0]), Literal("}")});
  }

  // CountedObject: the object with between lo and hi (-1: any) properties, counted in the rules:
  // rule (i, c) emits properties i..n-1 (then additional ones) after c declared ones were
  // emitted.
  absl::StatusOr<Expr> CountedObject(const std::vector<std::pair<std::string, Expr>>& props,
                                     const absl::flat_hash_set<std::string>& required,
                                     const std::optional<Expr>& extra_member, int32_t lo, int32_t hi,
                                     const std::string& prefix, const std::string& path) {
    const int32_t n = static_cast<int32_t>(props.size());
    int32_t num_required = 0;
    for (const auto& p : props) num_required += required.contains(p.first) ? 1 : 0;
    if (hi >= 0 && hi < lo) return SchemaError(path, "maxProperties is below minProperties (nothing can match)");
    if (hi >= 0 && num_required > hi) {
      return SchemaError(path, "maxProperties is below the number of required properties (nothing can match)");
    }
    if (!extra_member.has_value() && lo > n) {
      return SchemaError(path, "minProperties exceeds the properties allowed (nothing can match)");
    }
    // Additional keys are never a declared name, but they may repeat one another (a grammar
    // cannot remember every key emitted), and a repeated key is one property once parsed. So
    // at most one additional property counts toward minProperties: the count always meets
    // it in distinct keys, and a minimum that needs two additional properties is refused.
    if (extra_member.has_value() && lo > n + 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "unsupported JSON Schema combination at ", path, ": minProperties ", lo,
          " with additionalProperties needs more than one additional property, and additional keys "
          "are not kept distinct from one another (at most minProperties ", n + 1, " with ", n,
          " declared properties)"));
    }
    // Rules count the declared properties emitted (at most n, and at most hi); additional ones
    // follow them in one repeat bounded by hi.
    const int32_t cap = hi >= 0 ? std::min(hi, n) : n;
    if (static_cast<int64_t>(n + 1) * (cap + 1) > kMaxCountedObjectRules) {
      return SchemaError(path, "minProperties / maxProperties too large to enforce with these properties");
    }
    std::vector<int32_t> remaining_required(n + 1, 0);  // required among i..n-1
    for (int32_t i = n - 1; i >= 0; --i) {
      remaining_required[i] = remaining_required[i + 1] + (required.contains(props[i].first) ? 1 : 0);
    }
    std::vector<int32_t> rules(static_cast<size_t>(n + 1) * (cap + 1), -1);
    // Separator before a property: none for the first.
    auto sep = [&](int32_t c) { return c == 0 ? Literal("") : Literal(kItemSep); };
    // Only the reachable (i, c) get a rule, and every choice leaves a way to end: a property is
    // emitted only if the required ones after it still fit under hi, skipped only if lo can
    // still be reached.
    auto build = [&](auto& self, int32_t i, int32_t c) -> int32_t {
      int32_t& slot = rules[static_cast<size_t>(i) * (cap + 1) + c];
      if (slot >= 0) return slot;
      const int32_t r = g_.AddRule(absl::StrCat(prefix, "-p", i, "-", c));
      slot = r;
      std::vector<Expr> alts;
      if (i == n) {
        // c declared properties were emitted; the first additional one counts (c + 1 >= lo
        // here), the rest only toward maxProperties.
        if (c >= lo) alts.push_back(Literal(""));
        if (extra_member.has_value() && (hi < 0 || c < hi)) {
          alts.push_back(Sequence({sep(c), *extra_member,
                                   Repeat(Sequence({Literal(kItemSep), *extra_member}), 0, hi < 0 ? -1 : hi - c - 1)}));
        }
      } else {
        const int32_t next_c = std::min(c + 1, cap);  // saturates only when hi is unbounded
        if (hi < 0 || c + 1 + remaining_required[i + 1] <= hi) {
          alts.push_back(Sequence({sep(c), Literal(DumpValue(json(props[i].first))), Literal(kKeySep),
                                   props[i].second, RuleRef(self(self, i + 1, next_c))}));
        }
        const bool can_skip = !required.contains(props[i].first) &&
                              c + (n - i - 1) + (extra_member.has_value() ? 1 : 0) >= lo;
        if (can_skip) alts.push_back(RuleRef(self(self, i + 1, c)));
      }
      g_.rule(r).body = Choice(std::move(alts));
      return r;
    };
    const int32_t start = build(build, 0, 0);
    return Sequence({Literal("{"), RuleRef(start), Literal("}")});
  }

  // NameFitsPropertyNames: whether the declared key `name` satisfies the `propertyNames` schema
  // `pn` (the keywords PropertyNameExpr takes; `pattern` is an unanchored search, as JSON Schema
  // defines it, with PCRE2 standing in for ECMA-262 regexes). `format` is checked only on
  // additional keys, so with declared properties it is refused rather than left unchecked.
  absl::StatusOr<bool> NameFitsPropertyNames(const json& pn, const std::string& name, const std::string& path) {
    if (pn.is_boolean()) return pn.get<bool>();
    if (!pn.is_object()) return SchemaError(path, "a schema must be an object or a boolean");
    for (auto it = pn.begin(); it != pn.end(); ++it) {
      const std::string& k = it.key();
      if (IsAnnotation(k) || k == "type" || k == "enum" || k == "const" || k == "pattern" ||
          k == "minLength" || k == "maxLength") {
        continue;
      }
      if (k == "format") {
        return absl::InvalidArgumentError(absl::StrCat(
            "unsupported JSON Schema combination at ", path,
            ": 'format' in propertyNames with declared properties (only additional keys are checked against "
            "a format)"));
      }
      return absl::InvalidArgumentError(absl::StrCat("unsupported JSON Schema keyword '", k, "' at ", path,
                                                     " (propertyNames takes type, enum, const, pattern, "
                                                     "minLength, maxLength, format)"));
    }
    if (pn.contains("type")) {
      const json& t = pn["type"];
      const bool has_string = (t.is_string() && t == "string") ||
                              (t.is_array() && std::find(t.begin(), t.end(), json("string")) != t.end());
      if (!has_string) return SchemaError(path, "propertyNames must allow strings (keys are strings)");
    }
    const json key(name);
    if (pn.contains("const") && pn["const"] != key) return false;
    if (pn.contains("enum")) {
      if (!pn["enum"].is_array()) return SchemaError(path, "enum must be an array");
      if (std::find(pn["enum"].begin(), pn["enum"].end(), key) == pn["enum"].end()) return false;
    }
    // Lengths count code points: every byte that does not continue a UTF-8 sequence.
    const int64_t length = std::count_if(name.begin(), name.end(), [](char c) {
      return (static_cast<unsigned char>(c) & 0xC0) != 0x80;
    });
    absl::StatusOr<int32_t> min_len = GetCount(pn, "minLength", path);
    if (!min_len.ok()) return min_len.status();
    absl::StatusOr<int32_t> max_len = GetCount(pn, "maxLength", path);
    if (!max_len.ok()) return max_len.status();
    if (length < *min_len || (*max_len >= 0 && length > *max_len)) return false;
    if (pn.contains("pattern")) {
      if (!pn["pattern"].is_string()) return SchemaError(path, "'pattern' must be a string");
      const std::string pattern = pn["pattern"].get<std::string>();
      int error = 0;
      PCRE2_SIZE offset = 0;
      pcre2_code* re = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                     PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
      if (re == nullptr) {
        return SchemaError(path, absl::StrCat("'pattern' is not a valid regular expression at offset ", offset));
      }
      pcre2_match_data* md = pcre2_match_data_create_from_pattern(re, nullptr);
      const int rc = pcre2_match(re, reinterpret_cast<PCRE2_SPTR>(name.data()), name.size(), 0, 0, md, nullptr);
      pcre2_match_data_free(md);
      pcre2_code_free(re);
      if (rc < 0 && rc != PCRE2_ERROR_NOMATCH) {
        return SchemaError(path, absl::StrCat("'pattern' could not be matched against the key '", name, "'"));
      }
      if (rc == PCRE2_ERROR_NOMATCH) return false;
    }
    return true;
  }

  // PropertyNameExpr: the key grammar (a JSON string) of a `propertyNames` schema for additional
  // properties minus the `declared` names; nullopt for false, or when no name is left (a declared name
  // as an additional key would repeat the key). Only string keywords apply to names; other
  // keywords are refused.
  absl::StatusOr<std::optional<Expr>> PropertyNameExpr(const json& pn, const std::string& path, int depth,
                                                       const std::vector<std::string>& declared) {
    if (pn.is_boolean()) {
      if (!pn.get<bool>()) return std::optional<Expr>();
      return KeyExpr(Content{Repeat(CharClass({{0, 0x10FFFF}}), 0, kMaxKeyLength)}, declared, path);
    }
    if (!pn.is_object()) return SchemaError(path, "a schema must be an object or a boolean");
    json names = pn;
    for (auto it = pn.begin(); it != pn.end(); ++it) {
      const std::string& k = it.key();
      if (IsAnnotation(k)) continue;
      if (k != "type" && k != "enum" && k != "const" && k != "pattern" && k != "minLength" &&
          k != "maxLength" && k != "format") {
        return absl::InvalidArgumentError(absl::StrCat("unsupported JSON Schema keyword '", k, "' at ", path,
                                                       " (propertyNames takes type, enum, const, pattern, "
                                                       "minLength, maxLength, format)"));
      }
    }
    if (names.contains("type")) {
      const json& t = names["type"];
      const bool has_string = (t.is_string() && t == "string") ||
                              (t.is_array() && std::find(t.begin(), t.end(), json("string")) != t.end());
      if (!has_string) return SchemaError(path, "propertyNames must allow strings (keys are strings)");
    }
    names["type"] = "string";
    if (names.contains("const") || names.contains("enum")) {
      // Keys are strings: only the string values can be names.
      json values = names.contains("enum") ? names["enum"] : json::array({names["const"]});
      if (!values.is_array()) return SchemaError(path, "enum must be an array");
      json strings = json::array();
      for (const json& v : values) {
        if (v.is_string() && (!names.contains("const") || v == names["const"])) strings.push_back(v);
      }
      if (strings.empty()) return SchemaError(path, "no value of 'enum' / 'const' is a string (no key can match)");
      json extra_names = json::array();
      for (const json& v : strings) {
        if (std::find(declared.begin(), declared.end(), v.get<std::string>()) == declared.end()) {
          extra_names.push_back(v);
        }
      }
      if (extra_names.empty()) return std::optional<Expr>();
      names.erase("const");
      names["enum"] = std::move(extra_names);
      absl::StatusOr<Expr> e = Visit(names, path, depth + 1);
      if (!e.ok()) return e.status();
      return std::optional<Expr>(*std::move(e));
    }
    if (!names.contains("enum") && !names.contains("pattern") && !names.contains("format")) {
      absl::StatusOr<int32_t> min_len = GetCount(names, "minLength", path);
      if (!min_len.ok()) return min_len.status();
      absl::StatusOr<int32_t> max_len = GetCount(names, "maxLength", path);
      if (!max_len.ok()) return max_len.status();
      if (*max_len < 0) names["maxLength"] = std::max(*min_len, kMaxKeyLength);
    }
    absl::StatusOr<Content> c = StringContent(names, path);
    if (!c.ok()) return c.status();
    return KeyExpr(*c, declared, path);
  }

  absl::StatusOr<Expr> VisitArray(const json& s, const std::string& path, int depth) {
    absl::StatusOr<int32_t> min_items = GetCount(s, "minItems", path);
    if (!min_items.ok()) return min_items.status();
    absl::StatusOr<int32_t> max_items = GetCount(s, "maxItems", path);
    if (!max_items.ok()) return max_items.status();
    const int32_t lo = std::max(*min_items, 0);
    const int32_t hi = *max_items;
    if (hi >= 0 && hi < lo) return SchemaError(path, "maxItems is below minItems (nothing can match)");
    std::vector<Expr> prefix;
    const json* prefix_list = nullptr;
    std::string prefix_key;
    if (s.contains("prefixItems")) {
      prefix_list = &s["prefixItems"];
      prefix_key = "prefixItems";
    } else if (s.contains("items") && s["items"].is_array()) {
      prefix_list = &s["items"];
      prefix_key = "items";
    }
    if (prefix_list != nullptr) {
      if (!prefix_list->is_array()) return SchemaError(path, "'prefixItems' must be an array");
      for (size_t i = 0; i < prefix_list->size(); ++i) {
        absl::StatusOr<Expr> e = Visit((*prefix_list)[i], Child(Child(path, prefix_key), std::to_string(i)), depth + 1);
        if (!e.ok()) return e.status();
        prefix.push_back(*std::move(e));
      }
    }
    // The schema for items past the prefix (nullopt: none allowed).
    std::optional<Expr> rest;
    const json* rest_schema = nullptr;
    std::string rest_key;
    if (prefix_key == "items") {
      if (s.contains("additionalItems")) {
        rest_schema = &s["additionalItems"];
        rest_key = "additionalItems";
      }
    } else if (s.contains("items")) {
      rest_schema = &s["items"];
      rest_key = "items";
    }
    if (rest_schema == nullptr) {
      // No items keyword: any value; a tuple without additionalItems: any value (JSON Schema),
      // except when prefixItems is given (2020-12): also any value.
      rest = RuleRef(ValueRule());
    } else if (!(rest_schema->is_boolean() && !rest_schema->get<bool>())) {
      absl::StatusOr<Expr> e = Visit(*rest_schema, Child(path, rest_key), depth + 1);
      if (!e.ok()) return e.status();
      rest = *std::move(e);
    }
    const int32_t k = static_cast<int32_t>(prefix.size());
    if (!rest.has_value() && lo > k) {
      return SchemaError(path, "minItems exceeds the tuple length and no further items are allowed");
    }
    const int32_t max_total = rest.has_value() ? hi : (hi < 0 ? k : std::min(hi, k));
    if (max_total == 0) return Literal("[]");
    // Element i (0-based) of the array; i >= 1 carries the separator.
    auto element = [&](int32_t i) -> Expr { return i < k ? prefix[i] : *rest; };
    // Build from the back: tail(i) = what follows element i-1.
    // tail for i >= k: (sep rest){max(lo-i,0), max_total-i}
    auto rest_tail = [&](int32_t i) -> Expr {
      if (!rest.has_value()) return Empty();
      const int32_t need = std::max(lo - i, 0);
      const int32_t allow = max_total < 0 ? -1 : max_total - i;
      if (allow == 0) return Empty();
      return Repeat(Sequence({Literal(kItemSep), *rest}), need, allow);
    };
    Expr tail = (max_total >= 0 && max_total < k) ? Empty() : rest_tail(std::max(k, 1));
    const int32_t last_prefix = max_total < 0 ? k : std::min(k, max_total);
    for (int32_t i = last_prefix - 1; i >= 1; --i) {
      Expr step = Sequence({Literal(kItemSep), element(i), std::move(tail)});
      tail = i >= lo ? Optional(std::move(step)) : std::move(step);
    }
    if (k == 0) tail = rest_tail(1);
    Expr body = Sequence({element(0), std::move(tail)});
    if (lo == 0) body = Optional(std::move(body));
    return Sequence({Literal("["), std::move(body), Literal("]")});
  }

  const json& root_;
  Grammar g_;
  absl::flat_hash_map<std::string, int32_t> ref_rules_;
  int32_t value_rule_ = -1, object_rule_ = -1, string_rule_ = -1, number_rule_ = -1;
};

}  // namespace

absl::StatusOr<Grammar> JsonSchemaToGrammar(const nlohmann::ordered_json& schema) {
  return SchemaCompiler(schema).Run();
}

absl::StatusOr<Grammar> JsonSchemaToGrammar(const nlohmann::json& schema) {
  return JsonSchemaToGrammar(nlohmann::ordered_json(schema));
}

Grammar AnyJsonGrammar(bool root_object) {
  const json dummy = json::object();
  SchemaCompiler c(dummy);
  const int32_t root = c.grammar().AddRule("root");
  c.grammar().rule(root).body = RuleRef(root_object ? c.ObjectRule() : c.ValueRule());
  c.grammar().set_root(root);
  return std::move(c.grammar());
}

absl::StatusOr<Grammar> ChoiceGrammar(const std::vector<std::string>& choices) {
  if (choices.empty()) return absl::InvalidArgumentError("the choice list is empty");
  std::vector<Expr> alts;
  for (const std::string& c : choices) alts.push_back(Literal(c));
  Grammar g;
  g.set_root(g.AddRule("root", Choice(std::move(alts))));
  return g;
}

}  // namespace sluice::grammar
