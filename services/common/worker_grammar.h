// WorkerGrammars: a worker's side of structured outputs and tool calls through the router. The
// router compiles and validates a request's grammar and sends it as GBNF text
// (SamplingParams.grammar_ebnf); the worker compiles it again against its own tokenizer (LRU
// cached, so repeated schemas compile once) for EngineRequest::grammar.
#ifndef SLUICE_SERVICES_COMMON_WORKER_GRAMMAR_H_
#define SLUICE_SERVICES_COMMON_WORKER_GRAMMAR_H_

#include <memory>
#include <mutex>

#include "absl/status/statusor.h"
#include "engine/grammar/grammar_compiler.h"
#include "engine/tokenizer/tokenizer.h"
#include "sluice/v1/common.pb.h"

namespace sluice {

class WorkerGrammars {
 public:
  // `tokenizer` is borrowed (null: a request with a grammar is refused).
  explicit WorkerGrammars(const Tokenizer* tokenizer);

  // Compile returns the grammar `sampling` carries; null when it carries none. Errors:
  // InvalidArgument (text that does not parse or compile), FailedPrecondition (no tokenizer).
  absl::StatusOr<std::shared_ptr<const grammar::CompiledGrammar>> Compile(
      const v1::SamplingParams& sampling);

 private:
  const Tokenizer* tokenizer_;
  std::once_flag once_;
  std::unique_ptr<grammar::GrammarCompiler> compiler_;  // built on first use (vocabulary walk)
};

// RequestGrammar: grammars->Compile(sampling); with null `grammars` a request that carries a
// grammar is InvalidArgument (this worker does not constrain outputs).
absl::StatusOr<std::shared_ptr<const grammar::CompiledGrammar>> RequestGrammar(
    WorkerGrammars* grammars, const v1::SamplingParams& sampling);

}  // namespace sluice

#endif  // SLUICE_SERVICES_COMMON_WORKER_GRAMMAR_H_
