// Structured-output request fields: OpenAI's `response_format` (json_object, json_schema),
// vLLM's `structured_outputs` {json, regex, choice, grammar, json_object} and its older
// `guided_json` / `guided_regex` / `guided_choice` / `guided_grammar`. At most one constraint
// per request.
#ifndef SLUICE_SERVICES_API_STRUCTURED_OUTPUT_H_
#define SLUICE_SERVICES_API_STRUCTURED_OUTPUT_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/grammar/grammar_compiler.h"
#include "nlohmann/json.hpp"

namespace sluice {

// StructuredOutputRequest: the constraint a body asked for, and the field that carried it
// (the "param" of errors about it).
struct StructuredOutputRequest {
  grammar::GrammarSpec spec;
  std::string param;
};

// OpenAI: a response format's name is 1 to 64 of a-z, A-Z, 0-9, '_' and '-'.
bool ValidSchemaFormatName(const std::string& name);

// ParseStructuredOutput reads the fields above. nullopt: no constraint (absent, null, or
// response_format type "text"). Errors: InvalidArgument with the field as param (wrong shapes,
// two constraints at once, an unknown response_format type, unknown keys inside
// response_format unless `allow_unknown`, which lists them in `unknown` instead).
// `ordered_body` (may be null): the same body parsed keeping key order (OrderedBody); JSON
// Schemas given as objects take their property order from it (nlohmann::json sorts keys), so
// generated objects list properties as the client's schema does. Schemas given as JSON text
// keep their order anyway.
absl::StatusOr<std::optional<StructuredOutputRequest>> ParseStructuredOutput(
    const nlohmann::json& body, bool allow_unknown = false,
    std::vector<std::string>* unknown = nullptr,
    const nlohmann::ordered_json* ordered_body = nullptr);

// CompileStructuredOutput compiles a parsed constraint; compile errors become InvalidArgument
// naming the field and the problem (unsupported keyword, bad regex, grammar syntax error).
absl::StatusOr<std::shared_ptr<const grammar::CompiledGrammar>> CompileStructuredOutput(
    const StructuredOutputRequest& request, grammar::GrammarCompiler& compiler);

// StructuredOutputGrammar parses and compiles the body's constraint: null when there is none.
// Errors: those of ParseStructuredOutput and CompileStructuredOutput; with a null `compiler`
// (a deployment without structured outputs) a constraint is refused, naming its field.
absl::StatusOr<std::shared_ptr<const grammar::CompiledGrammar>> StructuredOutputGrammar(
    const nlohmann::json& body, grammar::GrammarCompiler* compiler, bool allow_unknown = false,
    std::vector<std::string>* unknown = nullptr,
    const nlohmann::ordered_json* ordered_body = nullptr);

}  // namespace sluice

#endif  // SLUICE_SERVICES_API_STRUCTURED_OUTPUT_H_
