#include "engine/grammar/grammar_compiler.h"

#include "absl/strings/str_cat.h"
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

absl::StatusOr<nlohmann::json> ParseSchema(const std::string& text) {
  absl::StatusOr<nlohmann::json> j = ParseJsonLimited(text);
  if (!j.ok()) return absl::InvalidArgumentError(absl::StrCat("the JSON schema is ", j.status().message()));
  return j;
}

}  // namespace

absl::StatusOr<std::string> GrammarSpec::CacheKey() const {
  std::string key = absl::StrCat(GrammarKindName(kind), "\n");
  switch (kind) {
    case GrammarKind::kJsonSchema: {
      absl::StatusOr<nlohmann::json> j = ParseSchema(text);
      if (!j.ok()) return j.status();
      absl::StrAppend(&key, j->dump());
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
      absl::StatusOr<nlohmann::json> j = ParseSchema(spec.text);
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
