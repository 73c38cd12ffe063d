#include "engine/grammar/grammar_compiler.h"

#include <algorithm>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/json_parse.h"
#include "engine/grammar/ebnf_parser.h"
#include "engine/grammar/json_schema_to_grammar.h"
#include "engine/grammar/regex_to_grammar.h"
#include "nlohmann/json.hpp"

namespace sluice::grammar {

const char* GrammarKindName(GrammarKind kind) {
  switch (kind) {
    case GrammarKind::kJsonSchema: return "json_schema";
    case GrammarKind::kJsonObject: return "json_object";
    case GrammarKind::kRegex: return "regex";
    case GrammarKind::kChoice: return "choice";
    case GrammarKind::kEbnf: return "grammar";
  }
  return "unknown";
}

namespace {

// Key order is kept: the schema's property order is the output's (and part of the cache key).
absl::StatusOr<nlohmann::ordered_json> ParseSchema(const std::string& text) {
  absl::StatusOr<nlohmann::ordered_json> j = ParseJsonLimited<nlohmann::ordered_json>(text);
  if (!j.ok()) return absl::InvalidArgumentError(absl::StrCat("the JSON schema is ", j.status().message()));
  return j;
}

// CanonicalSchema: `s` with the keywords of every schema object sorted, so formatting and
// keyword order do not split the cache, while what the output depends on stays as written:
// the order of `properties` (generated objects follow it) and data (enum, const, ...).
nlohmann::ordered_json CanonicalSchema(const nlohmann::ordered_json& s) {
  if (!s.is_object()) return s;
  static const absl::flat_hash_set<absl::string_view> kSchemaMaps = {
      "properties", "$defs", "definitions", "patternProperties", "dependentSchemas"};
  static const absl::flat_hash_set<absl::string_view> kSchemaValues = {
      "items", "additionalProperties", "not", "contains", "if", "then", "else",
      "propertyNames", "additionalItems", "unevaluatedItems", "unevaluatedProperties",
      "allOf", "anyOf", "oneOf", "prefixItems"};
  std::vector<std::string> keys;
  for (auto it = s.begin(); it != s.end(); ++it) keys.push_back(it.key());
  std::sort(keys.begin(), keys.end());
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  for (const std::string& k : keys) {
    const nlohmann::ordered_json& v = s.at(k);
    if (kSchemaMaps.contains(k) && v.is_object()) {
      nlohmann::ordered_json m = nlohmann::ordered_json::object();
      for (auto it = v.begin(); it != v.end(); ++it) m[it.key()] = CanonicalSchema(it.value());
      out[k] = std::move(m);
    } else if (kSchemaValues.contains(k) && v.is_array()) {
      nlohmann::ordered_json a = nlohmann::ordered_json::array();
      for (const nlohmann::ordered_json& x : v) a.push_back(CanonicalSchema(x));
      out[k] = std::move(a);
    } else if (kSchemaValues.contains(k)) {
      out[k] = CanonicalSchema(v);
    } else {
      out[k] = v;
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<std::string> GrammarSpec::CacheKey() const {
  std::string key = absl::StrCat(GrammarKindName(kind), "\n");
  switch (kind) {
    case GrammarKind::kJsonSchema: {
      absl::StatusOr<nlohmann::ordered_json> j = ParseSchema(text);
      if (!j.ok()) return j.status();
      absl::StrAppend(&key, CanonicalSchema(*j).dump());
      break;
    }
    case GrammarKind::kJsonObject:
      break;
    case GrammarKind::kChoice:
      // Length-prefixed raw bytes: unambiguous, and no JSON dump, which throws on a choice
      // that is not valid UTF-8 (fuzz finding).
      for (const std::string& c : choices) absl::StrAppend(&key, c.size(), ":", c, ";");
      break;
    default:
      absl::StrAppend(&key, text);
  }
  return key;
}

absl::StatusOr<Grammar> BuildGrammar(const GrammarSpec& spec) {
  switch (spec.kind) {
    case GrammarKind::kJsonSchema: {
      absl::StatusOr<nlohmann::ordered_json> j = ParseSchema(spec.text);
      if (!j.ok()) return j.status();
      return JsonSchemaToGrammar(*j);
    }
    case GrammarKind::kJsonObject:
      return AnyJsonGrammar(/*root_object=*/true);
    case GrammarKind::kRegex:
      return RegexToGrammar(spec.text);
    case GrammarKind::kChoice:
      return ChoiceGrammar(spec.choices);
    case GrammarKind::kEbnf:
      return ParseEbnf(spec.text);
  }
  return absl::InvalidArgumentError("unknown grammar kind");
}

GrammarCompiler::GrammarCompiler(std::shared_ptr<const TokenVocab> vocab,
                                 GrammarCompilerOptions options)
    : vocab_(std::move(vocab)), options_(std::move(options)) {}

absl::StatusOr<std::shared_ptr<const CompiledGrammar>> GrammarCompiler::Compile(
    const GrammarSpec& spec) {
  absl::StatusOr<std::string> key = spec.CacheKey();
  if (!key.ok()) return key.status();
  return CompileBuilt(*key, [&spec] { return BuildGrammar(spec); });
}

absl::StatusOr<std::shared_ptr<const CompiledGrammar>> GrammarCompiler::CompileBuilt(
    const std::string& key, absl::FunctionRef<absl::StatusOr<Grammar>()> build) {
  {
    absl::MutexLock lock(&mu_);
    auto it = index_.find(key);
    if (it != index_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      ++hits_;
      return it->second->second;
    }
  }
  // Compile outside the lock: two threads may compile the same spec once each; both results
  // are equal and the second insert is dropped.
  absl::StatusOr<Grammar> grammar = build();
  if (!grammar.ok()) return grammar.status();
  absl::StatusOr<std::shared_ptr<const CompiledGrammar>> compiled =
      CompiledGrammar::Create(*grammar, vocab_, options_.pda);
  if (!compiled.ok()) return compiled.status();
  absl::MutexLock lock(&mu_);
  ++compiles_;
  if (!index_.contains(key) && options_.cache_capacity > 0) {
    lru_.emplace_front(key, *compiled);
    index_[key] = lru_.begin();
    while (lru_.size() > options_.cache_capacity) {
      index_.erase(lru_.back().first);
      lru_.pop_back();
    }
  }
  return compiled;
}

int64_t GrammarCompiler::num_cache_hits() const {
  absl::MutexLock lock(&mu_);
  return hits_;
}

int64_t GrammarCompiler::num_compiles() const {
  absl::MutexLock lock(&mu_);
  return compiles_;
}

}  // namespace sluice::grammar
