#include "services/api/structured_output.h"

#include <algorithm>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/json_parse.h"
#include "services/api/openai_errors.h"
#include "services/api/openai_fields.h"

namespace sluice {
namespace {

using grammar::GrammarKind;
using grammar::GrammarSpec;
using nlohmann::json;

const json* Present(const json& body, const char* name) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

using ordered_json = nlohmann::ordered_json;

// At: the member `key` of `obj` (null when obj is null or has no such member).
const ordered_json* At(const ordered_json* obj, const char* key) {
  if (obj == nullptr || !obj->is_object()) return nullptr;
  auto it = obj->find(key);
  return it == obj->end() ? nullptr : &*it;
}

// SchemaText accepts a schema given as an object/boolean or as JSON text. Its keys keep the
// client's order (the generated objects list properties as the schema does): a string is
// parsed keeping it, an object is dumped from `ordered` (the same value in the body parsed
// keeping key order) when given.
absl::StatusOr<std::string> SchemaText(const json& v, const std::string& param,
                                       const ordered_json* ordered) {
  if (v.is_object() || v.is_boolean()) {
    return ordered != nullptr && ordered->type() == v.type() ? ordered->dump() : v.dump();
  }
  if (v.is_string()) {
    absl::StatusOr<ordered_json> parsed = ParseJsonLimited<ordered_json>(v.get<std::string>());
    if (!parsed.ok() || !(parsed->is_object() || parsed->is_boolean())) {
      return InvalidParam(param, absl::StrCat("'", param, "' is not a valid JSON schema",
                                              parsed.ok() ? "" : ": ",
                                              parsed.ok() ? "" : parsed.status().message()));
    }
    return parsed->dump();
  }
  return InvalidParam(param, absl::StrCat("'", param, "' must be a JSON schema object"));
}

absl::StatusOr<std::vector<std::string>> Choices(const json& v, const std::string& param) {
  if (!v.is_array() || v.empty()) {
    return InvalidParam(param, absl::StrCat("'", param, "' must be a non-empty list of strings"));
  }
  std::vector<std::string> out;
  for (const json& c : v) {
    if (!c.is_string()) {
      return InvalidParam(param, absl::StrCat("'", param, "' must be a list of strings"));
    }
    out.push_back(c.get<std::string>());
  }
  return out;
}

absl::StatusOr<std::string> String(const json& v, const std::string& param) {
  if (!v.is_string()) return InvalidParam(param, absl::StrCat("'", param, "' must be a string"));
  return v.get<std::string>();
}

// FromVllmFields reads {json, regex, choice, grammar, json_object} style fields: `names` maps
// each kind to its field name in `obj`; `prefix` names them in errors.
absl::Status AddVllm(const json& obj, const ordered_json* ordered_obj, const std::string& prefix,
                     const char* json_name, const char* regex_name, const char* choice_name,
                     const char* grammar_name, std::vector<StructuredOutputRequest>* found) {
  auto param = [&](const char* name) { return absl::StrCat(prefix, name); };
  if (const json* v = Present(obj, json_name)) {
    absl::StatusOr<std::string> text = SchemaText(*v, param(json_name), At(ordered_obj, json_name));
    if (!text.ok()) return text.status();
    found->push_back({GrammarSpec{GrammarKind::kJsonSchema, *text, {}}, param(json_name)});
  }
  if (const json* v = Present(obj, regex_name)) {
    absl::StatusOr<std::string> text = String(*v, param(regex_name));
    if (!text.ok()) return text.status();
    found->push_back({GrammarSpec{GrammarKind::kRegex, *text, {}}, param(regex_name)});
  }
  if (const json* v = Present(obj, choice_name)) {
    absl::StatusOr<std::vector<std::string>> choices = Choices(*v, param(choice_name));
    if (!choices.ok()) return choices.status();
    found->push_back({GrammarSpec{GrammarKind::kChoice, "", *choices}, param(choice_name)});
  }
  if (const json* v = Present(obj, grammar_name)) {
    absl::StatusOr<std::string> text = String(*v, param(grammar_name));
    if (!text.ok()) return text.status();
    found->push_back({GrammarSpec{GrammarKind::kEbnf, *text, {}}, param(grammar_name)});
  }
  return absl::OkStatus();
}

}  // namespace

bool ValidSchemaFormatName(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-';
  });
}

absl::StatusOr<std::optional<StructuredOutputRequest>> ParseStructuredOutput(
    const json& body, bool allow_unknown, std::vector<std::string>* unknown,
    const ordered_json* ordered_body) {
  std::vector<StructuredOutputRequest> found;
  if (const json* rf = Present(body, "response_format")) {
    if (!rf->is_object() || !rf->contains("type") || !(*rf)["type"].is_string()) {
      return InvalidParam("response_format", "'response_format' must be an object with a 'type'");
    }
    const std::string type = (*rf)["type"].get<std::string>();
    if (absl::Status s = CheckKnownKeys(*rf, {"type", "json_schema"}, "response_format",
                                        "response_format", allow_unknown, unknown);
        !s.ok()) {
      return s;
    }
    if (type == "json_object") {
      found.push_back({GrammarSpec{GrammarKind::kJsonObject, "", {}}, "response_format"});
    } else if (type == "json_schema") {
      const json* js = Present(*rf, "json_schema");
      if (js == nullptr || !js->is_object()) {
        return InvalidParam("response_format",
                            "response_format type 'json_schema' needs a 'json_schema' object");
      }
      // name/description/strict describe the schema; it is always enforced strictly.
      if (absl::Status s = CheckKnownKeys(*js, {"name", "schema", "strict", "description"},
                                          "response_format", "response_format.json_schema",
                                          allow_unknown, unknown);
          !s.ok()) {
        return s;
      }
      const json* name = Present(*js, "name");
      if (name == nullptr || !name->is_string() || !ValidSchemaFormatName(name->get<std::string>())) {
        return InvalidParam("response_format",
                            "'response_format.json_schema.name' is required: 1 to 64 of a-z, A-Z, "
                            "0-9, _ and -");
      }
      if (const json* d = Present(*js, "description"); d != nullptr && !d->is_string()) {
        return InvalidParam("response_format",
                            "'response_format.json_schema.description' must be a string");
      }
      if (const json* st = Present(*js, "strict"); st != nullptr && !st->is_boolean()) {
        return InvalidParam("response_format", "'response_format.json_schema.strict' must be a boolean");
      }
      const json* schema = Present(*js, "schema");
      if (schema == nullptr) {
        return InvalidParam("response_format", "'response_format.json_schema.schema' is required");
      }
      // An object, as OpenAI's API and vLLM's take it (only guided_json and
      // structured_outputs.json take JSON text): a string here is a mistake to name, not text
      // to parse and then blame for its JSON syntax.
      if (!schema->is_object()) {
        const std::string type = schema->type_name();
        return InvalidParam("response_format.json_schema.schema",
                            absl::StrCat("'response_format.json_schema.schema' must be a JSON "
                                         "Schema object, got ",
                                         type == "array" ? "an " : "a ", type));
      }
      absl::StatusOr<std::string> text = SchemaText(
          *schema, "response_format",
          At(At(At(ordered_body, "response_format"), "json_schema"), "schema"));
      if (!text.ok()) return text.status();
      found.push_back({GrammarSpec{GrammarKind::kJsonSchema, *text, {}}, "response_format"});
    } else if (type != "text") {
      return InvalidParam("response_format",
                          absl::StrCat("response_format type '", type,
                                       "' is not supported (use text, json_object or json_schema)"));
    }
  }
  if (const json* so = Present(body, "structured_outputs")) {
    if (!so->is_object()) {
      return InvalidParam("structured_outputs", "'structured_outputs' must be an object");
    }
    for (auto it = so->begin(); it != so->end(); ++it) {
      static const char* kKnown[] = {"json", "regex", "choice", "grammar", "json_object",
                                     "disable_fallback", "disable_any_whitespace",
                                     "disable_additional_properties", "whitespace_pattern"};
      if (std::find_if(std::begin(kKnown), std::end(kKnown),
                       [&](const char* k) { return it.key() == k; }) == std::end(kKnown)) {
        return InvalidParam("structured_outputs",
                            absl::StrCat("'structured_outputs.", it.key(), "' is not supported"));
      }
    }
    if (const json* w = Present(*so, "whitespace_pattern")) {
      (void)w;
      return InvalidParam("structured_outputs",
                          "'structured_outputs.whitespace_pattern' is not supported");
    }
    absl::Status st = AddVllm(*so, At(ordered_body, "structured_outputs"), "structured_outputs.",
                              "json", "regex", "choice", "grammar", &found);
    if (!st.ok()) return st;
    if (const json* v = Present(*so, "json_object"); v != nullptr && v->is_boolean() && v->get<bool>()) {
      found.push_back({GrammarSpec{GrammarKind::kJsonObject, "", {}}, "structured_outputs.json_object"});
    }
  }
  absl::Status st = AddVllm(body, ordered_body, "", "guided_json", "guided_regex",
                            "guided_choice", "guided_grammar", &found);
  if (!st.ok()) return st;
  if (found.empty()) return std::optional<StructuredOutputRequest>();
  if (found.size() > 1) {
    return InvalidParam(found[1].param,
                        absl::StrCat("only one output constraint may be given, got '",
                                     found[0].param, "' and '", found[1].param, "'"));
  }
  return std::optional<StructuredOutputRequest>(std::move(found[0]));
}

absl::StatusOr<std::shared_ptr<const grammar::CompiledGrammar>> CompileStructuredOutput(
    const StructuredOutputRequest& request, grammar::GrammarCompiler& compiler) {
  absl::StatusOr<std::shared_ptr<const grammar::CompiledGrammar>> g = compiler.Compile(request.spec);
  if (!g.ok()) {
    return InvalidParam(request.param, absl::StrCat("invalid '", request.param, "': ",
                                                    g.status().message()));
  }
  return g;
}

absl::StatusOr<std::shared_ptr<const grammar::CompiledGrammar>> StructuredOutputGrammar(
    const json& body, grammar::GrammarCompiler* compiler, bool allow_unknown,
    std::vector<std::string>* unknown, const ordered_json* ordered_body) {
  absl::StatusOr<std::optional<StructuredOutputRequest>> request =
      ParseStructuredOutput(body, allow_unknown, unknown, ordered_body);
  if (!request.ok()) return request.status();
  if (!request->has_value()) return std::shared_ptr<const grammar::CompiledGrammar>();
  if (compiler == nullptr) {
    return InvalidParam((*request)->param, absl::StrCat("'", (*request)->param,
                                                        "' is not supported by this server"));
  }
  return CompileStructuredOutput(**request, *compiler);
}

}  // namespace sluice
