#include "services/common/worker_grammar.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "engine/grammar/ebnf_parser.h"

namespace sluice {

WorkerGrammars::WorkerGrammars(const Tokenizer* tokenizer) : tokenizer_(tokenizer) {}

absl::StatusOr<std::shared_ptr<const grammar::CompiledGrammar>> WorkerGrammars::Compile(
    const v1::SamplingParams& sampling) {
  const std::string& text = sampling.grammar_ebnf();
  if (text.empty()) return std::shared_ptr<const grammar::CompiledGrammar>();
  if (tokenizer_ == nullptr) {
    return absl::FailedPreconditionError("this worker has no tokenizer to compile grammars with");
  }
  std::call_once(once_, [this] {
    // As the API front end does: EOS ids come from the engine, special tokens never match.
    compiler_ = std::make_unique<grammar::GrammarCompiler>(
        grammar::TokenVocab::FromTokenizer(*tokenizer_, /*eos_token_ids=*/{}));
  });
  const size_t end_of_name = text.find(" ::= ");
  if (end_of_name == std::string::npos) {
    return absl::InvalidArgumentError("SamplingParams.grammar_ebnf has no root rule");
  }
  const std::string root = text.substr(0, end_of_name);
  absl::StatusOr<std::shared_ptr<const grammar::CompiledGrammar>> compiled =
      compiler_->CompileBuilt(absl::StrCat("wire\n", text),
                              [&] { return grammar::ParseEbnf(text, root); });
  if (!compiled.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("SamplingParams.grammar_ebnf: ", compiled.status().message()));
  }
  return compiled;
}

absl::StatusOr<std::shared_ptr<const grammar::CompiledGrammar>> RequestGrammar(
    WorkerGrammars* grammars, const v1::SamplingParams& sampling) {
  if (grammars != nullptr) return grammars->Compile(sampling);
  if (sampling.grammar_ebnf().empty()) return std::shared_ptr<const grammar::CompiledGrammar>();
  return absl::InvalidArgumentError("this worker does not take constrained (grammar) requests");
}

}  // namespace sluice
