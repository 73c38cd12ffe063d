// GrammarCompiler: turns a structured-output request (JSON Schema, any JSON object, regex,
// choice list, GBNF grammar) into a CompiledGrammar for one vocabulary, compiling each
// distinct request once: results are kept in an LRU cache keyed by the kind and the request's
// canonical text (JSON Schemas re-serialized with their keywords sorted, so formatting does not
// matter; the order of `properties` is kept, since generated objects follow it).
// Thread-safe.
#ifndef SLUICE_ENGINE_GRAMMAR_GRAMMAR_COMPILER_H_
#define SLUICE_ENGINE_GRAMMAR_GRAMMAR_COMPILER_H_

#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "engine/grammar/compiled_grammar.h"
#include "engine/grammar/token_vocab.h"

namespace sluice::grammar {

enum class GrammarKind { kJsonSchema, kJsonObject, kRegex, kChoice, kEbnf };
const char* GrammarKindName(GrammarKind kind);  // "json_schema", "json_object", ...

// GrammarSpec: what a request constrains its output to. `text` holds the JSON Schema (JSON
// text), the regex, or the GBNF grammar; `choices` the choice list; json_object needs neither.
struct GrammarSpec {
  GrammarKind kind = GrammarKind::kJsonObject;
  std::string text;
  std::vector<std::string> choices;

  // CacheKey is the kind plus the canonical text. Errors: InvalidArgument when a JSON Schema
  // is not valid JSON.
  absl::StatusOr<std::string> CacheKey() const;
};

// BuildGrammar compiles a spec to the grammar IR (no vocabulary needed). Errors:
// InvalidArgument naming the problem (unsupported keyword, bad regex, grammar syntax error).
absl::StatusOr<Grammar> BuildGrammar(const GrammarSpec& spec);

struct GrammarCompilerOptions {
  size_t cache_capacity = 256;  // compiled grammars kept
  PdaOptions pda;
};

class GrammarCompiler {
 public:
  GrammarCompiler(std::shared_ptr<const TokenVocab> vocab, GrammarCompilerOptions options = {});

  // Compile returns the compiled grammar of `spec`, from the cache when it was compiled before.
  // Errors: those of BuildGrammar and CompiledGrammar::Create. Failures are not cached.
  absl::StatusOr<std::shared_ptr<const CompiledGrammar>> Compile(const GrammarSpec& spec);
  // CompileBuilt compiles a grammar its caller builds (e.g. the tool-call grammar of a request),
  // cached under `cache_key`; `build` runs only on a cache miss. Callers start their keys with
  // their own tag (not a GrammarKindName followed by a newline) so keys never collide with a
  // spec's. Errors: those of `build` and CompiledGrammar::Create; failures are not cached.
  absl::StatusOr<std::shared_ptr<const CompiledGrammar>> CompileBuilt(
      const std::string& cache_key, absl::FunctionRef<absl::StatusOr<Grammar>()> build);

  const TokenVocab& vocab() const { return *vocab_; }
  int64_t num_cache_hits() const;
  int64_t num_compiles() const;

 private:
  std::shared_ptr<const TokenVocab> vocab_;
  GrammarCompilerOptions options_;
  mutable absl::Mutex mu_;
  // Most recently used first.
  std::list<std::pair<std::string, std::shared_ptr<const CompiledGrammar>>> lru_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, decltype(lru_)::iterator> index_ ABSL_GUARDED_BY(mu_);
  int64_t hits_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t compiles_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace sluice::grammar

#endif  // SLUICE_ENGINE_GRAMMAR_GRAMMAR_COMPILER_H_
