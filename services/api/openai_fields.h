// The request fields of each OpenAI endpoint, and the one rule that governs them: every field
// is honoured, accepted as metadata, or refused with a 400 that names it; a field outside the
// table is a 400 too (unless unknown fields are allowed, then it is reported for a warning).
//
// To support a field, change its entry in openai_fields.cc from kRefused to kHonoured and
// parse it in openai_protocol.cc. The table is the checklist tests/e2e/test_api_fields.py
// sweeps.
#ifndef SLUICE_SERVICES_API_OPENAI_FIELDS_H_
#define SLUICE_SERVICES_API_OPENAI_FIELDS_H_

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "nlohmann/json.hpp"

namespace sluice {

// The endpoints with a field table.
enum class FieldTable { kChatCompletions, kCompletions, kResponses };

enum class FieldUse {
  kHonoured,  // parsed by openai_protocol.cc and applied
  kMetadata,  // accepted (type-checked), no effect on the output; OpenAI metadata like `user`
  kRefused,   // 400 naming the field, unless `allows` accepts the value (e.g. tools: [])
};

// FieldSpec is one documented field of an endpoint.
struct FieldSpec {
  std::string_view name;
  FieldUse use = FieldUse::kHonoured;
  // kRefused: values that ask for nothing unsupported and are accepted (null: none);
  // kMetadata: the values accepted (null: any); others get a type error.
  bool (*allows)(const nlohmann::json& value) = nullptr;
  // kRefused: why, appended to "'<name>' ...". kMetadata: the expected type, for the error.
  std::string_view why;
};

// Fields returns the table of an endpoint.
absl::Span<const FieldSpec> Fields(FieldTable table);

// CheckFields applies the table to `body`: a refused field with a value it does not allow, a
// metadata field of the wrong type, or (without allow_unknown) a field outside the table gives
// InvalidArgument naming that field. With allow_unknown, unknown field names are appended to
// `unknown` (may be null) instead. A null value counts as absent. Fields are checked in the
// body's key order.
absl::Status CheckFields(const nlohmann::json& body, FieldTable table, bool allow_unknown,
                         std::vector<std::string>* unknown);

// CheckKnownKeys applies the same rule inside a request object (a message, a content part,
// stream_options, response_format, ...): a key of `obj` outside `known` is InvalidArgument
// with param `param` and the message "Unrecognized request argument supplied: <path>.<key>";
// with allow_unknown, "<path>.<key>" is appended to `unknown` (may be null) instead. Keys are
// checked in the object's order; a non-object `obj` passes (its type is checked elsewhere).
absl::Status CheckKnownKeys(const nlohmann::json& obj, absl::Span<const std::string_view> known,
                            std::string_view param, std::string_view path, bool allow_unknown,
                            std::vector<std::string>* unknown);

}  // namespace sluice

#endif  // SLUICE_SERVICES_API_OPENAI_FIELDS_H_
