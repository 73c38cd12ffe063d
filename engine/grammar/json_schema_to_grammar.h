// JSON Schema (and "any JSON") to Grammar.
//
// Output style: compact JSON with ", " between items and ": " after keys (as OpenAI's and
// XGrammar's default), properties in the order the schema's `properties` lists them (as
// XGrammar and Outlines do; an nlohmann::json schema has its keys sorted, so pass an
// ordered_json parsed from the client's text to keep theirs). An object without
// `additionalProperties` allows no other keys (OpenAI strict mode's rule).
//
// Supported keywords: type (incl. unions), enum, const, properties, required,
// additionalProperties (false / true / schema), propertyNames (type, enum, const, pattern,
// minLength, maxLength, format: the keys of additional properties, which are otherwise free
// strings of at most 64 characters; never a declared or required name, in any spelling:
// string_exclusion.h), minProperties / maxProperties (maxProperties counts all properties,
// minProperties the declared ones and at most one additional property, since additional keys
// may repeat one another: a minimum past the declared properties + 1 with
// additionalProperties is an error), items (schema, false, or an array = tuple),
// prefixItems, minItems, maxItems, anyOf, oneOf (as anyOf: exclusivity is not enforced),
// allOf (merged), $ref to "#..." JSON pointers (recursion allowed), $defs / definitions,
// pattern (regex_to_grammar.h subset), minLength, maxLength, format (date, time, date-time,
// uuid, email, ipv4, ipv6 not supported), minimum / maximum / exclusiveMinimum /
// exclusiveMaximum for integers (and integral, non-negative lower bounds on numbers).
// Open-ended numbers have at most 16 integer digits, 16 fraction digits and 3 exponent digits.
// Annotations (title, description, default, examples, $schema, $id, $comment, deprecated,
// readOnly, writeOnly, discriminator, x-*) are ignored. Every other keyword is an error: a
// constraint is never dropped silently.
#ifndef SLUICE_ENGINE_GRAMMAR_JSON_SCHEMA_TO_GRAMMAR_H_
#define SLUICE_ENGINE_GRAMMAR_JSON_SCHEMA_TO_GRAMMAR_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/grammar/grammar.h"
#include "nlohmann/json.hpp"

namespace sluice::grammar {

// JsonSchemaToGrammar: Errors: InvalidArgument naming the keyword and its location (a JSON
// pointer), e.g. "unsupported JSON Schema keyword 'patternProperties' at #/properties/a", an
// empty enum, a non-local $ref, a $ref that does not resolve, an allOf that cannot be merged.
absl::StatusOr<Grammar> JsonSchemaToGrammar(const nlohmann::ordered_json& schema);
// The same for a schema whose keys are sorted (properties then come in sorted order).
absl::StatusOr<Grammar> JsonSchemaToGrammar(const nlohmann::json& schema);

// AnyJsonGrammar: any JSON value (root_object: only an object, as response_format json_object).
Grammar AnyJsonGrammar(bool root_object);

// ChoiceGrammar: exactly one of `choices` (vLLM's guided_choice). Errors: InvalidArgument
// when the list is empty.
absl::StatusOr<Grammar> ChoiceGrammar(const std::vector<std::string>& choices);

// IntegerRangeExpr: decimal integers in [lo, hi] (no leading zeros, "-0" excluded); unset
// bounds are open. Exposed for tests.
Expr IntegerRangeExpr(std::optional<int64_t> lo, std::optional<int64_t> hi);

}  // namespace sluice::grammar

#endif  // SLUICE_ENGINE_GRAMMAR_JSON_SCHEMA_TO_GRAMMAR_H_
