#include "services/api/tool_calls/tool_request.h"

#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "engine/grammar/grammar_import.h"
#include "engine/grammar/json_schema_to_grammar.h"
#include "services/api/openai_errors.h"

namespace sluice::tools {
namespace {

using nlohmann::json;

const json* Present(const json& obj, const char* name) {
  auto it = obj.find(name);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

// OpenAI: a-z, A-Z, 0-9, underscores and dashes, at most 64; dots are accepted too (vLLM
// does not check names; dotted names such as "weather.get" occur in the wild).
bool ValidFunctionName(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '-' || c == '.';
    if (!ok) return false;
  }
  return true;
}

// ParseTool checks tools[i]; `ordered` (may be null) is the same tool in the client's key
// order, which the template copy keeps.
absl::StatusOr<ToolFunction> ParseTool(const json& tool, size_t i,
                                       const nlohmann::ordered_json* ordered,
                                       nlohmann::ordered_json* template_tool) {
  const std::string where = absl::StrCat("tools[", i, "]");
  if (!tool.is_object()) return InvalidParam("tools", absl::StrCat(where, " must be an object"));
  const json* type = Present(tool, "type");
  if (type == nullptr || *type != "function") {
    return InvalidParam("tools", absl::StrCat(where, ".type must be \"function\""));
  }
  const json* function = Present(tool, "function");
  if (function == nullptr || !function->is_object()) {
    return InvalidParam("tools", absl::StrCat(where, ".function must be an object"));
  }
  const json* name = Present(*function, "name");
  if (name == nullptr || !name->is_string()) {
    return InvalidParam("tools", absl::StrCat(where, ".function.name is required (a string)"));
  }
  ToolFunction out;
  out.name = name->get<std::string>();
  if (!ValidFunctionName(out.name)) {
    return InvalidParam("tools", absl::StrCat(where, ".function.name '", out.name.substr(0, 80),
                                              "' must be 1 to 64 of a-z, A-Z, 0-9, _, - and ."));
  }
  if (const json* d = Present(*function, "description"); d != nullptr && !d->is_string()) {
    return InvalidParam("tools", absl::StrCat(where, ".function.description must be a string"));
  }
  if (const json* s = Present(*function, "strict"); s != nullptr && !s->is_boolean()) {
    return InvalidParam("tools", absl::StrCat(where, ".function.strict must be a boolean"));
  }
  // The client's function object without nulls, in its key order when known.
  nlohmann::ordered_json clean_function = nlohmann::ordered_json::object();
  const nlohmann::ordered_json* ordered_function = nullptr;
  if (ordered != nullptr && ordered->is_object()) {
    auto it = ordered->find("function");
    if (it != ordered->end() && it->is_object()) ordered_function = &*it;
  }
  if (ordered_function != nullptr) {
    for (const auto& [key, value] : ordered_function->items()) {
      if (!value.is_null()) clean_function[key] = value;
    }
  } else {
    for (const auto& [key, value] : function->items()) {
      if (!value.is_null()) clean_function[key] = nlohmann::ordered_json(value);
    }
  }
  if (const json* p = Present(*function, "parameters"); p != nullptr) {
    if (!p->is_object()) {
      return InvalidParam("tools", absl::StrCat(where, ".function.parameters must be a JSON "
                                                       "Schema object"));
    }
    auto ordered_p = clean_function.find("parameters");
    out.parameters = ordered_p != clean_function.end() && ordered_p->is_object()
                         ? *ordered_p
                         : nlohmann::ordered_json(*p);
  } else {
    // OpenAI: omitting parameters defines a function with an empty parameter list.
    out.parameters = nlohmann::ordered_json{{"type", "object"},
                                            {"properties", nlohmann::ordered_json::object()}};
  }
  // The schema is checked for every choice, also "auto": a tool whose parameters cannot be
  // constrained is refused up front, never dropped silently.
  absl::StatusOr<grammar::Grammar> g = grammar::JsonSchemaToGrammar(out.parameters);
  if (!g.ok()) {
    return InvalidParam("tools", absl::StrCat(where, ".function.parameters (", out.name,
                                              "): ", g.status().message()));
  }
  if (ordered != nullptr && ordered->is_object()) {
    // The client's tool object as it wrote it (Hugging Face renders it unchanged), nulls out.
    *template_tool = nlohmann::ordered_json::object();
    for (const auto& [key, value] : ordered->items()) {
      if (key == "function") {
        (*template_tool)[key] = clean_function;
      } else if (!value.is_null()) {
        (*template_tool)[key] = value;
      }
    }
  } else {
    *template_tool = nlohmann::ordered_json{{"type", "function"},
                                            {"function", std::move(clean_function)}};
  }
  return out;
}

absl::Status ParseToolChoice(const json& body, ToolRequest& request) {
  const json* choice = Present(body, "tool_choice");
  if (choice == nullptr) return absl::OkStatus();
  if (choice->is_string()) {
    const std::string s = choice->get<std::string>();
    if (s == "none") {
      request.choice = ToolChoice::kNone;
    } else if (s == "auto") {
      request.choice = ToolChoice::kAuto;
    } else if (s == "required") {
      request.choice = ToolChoice::kRequired;
    } else {
      return InvalidParam("tool_choice",
                          absl::StrCat("'tool_choice' must be \"none\", \"auto\", \"required\" or "
                                       "{\"type\": \"function\", \"function\": {\"name\": ...}}, got \"",
                                       s.substr(0, 80), "\""));
    }
    return absl::OkStatus();
  }
  const json* type = choice->is_object() ? Present(*choice, "type") : nullptr;
  const json* function = choice->is_object() ? Present(*choice, "function") : nullptr;
  const json* name = function != nullptr && function->is_object() ? Present(*function, "name")
                                                                   : nullptr;
  if (type == nullptr || *type != "function" || name == nullptr || !name->is_string()) {
    return InvalidParam("tool_choice",
                        "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": "
                        "\"function\", \"function\": {\"name\": ...}}");
  }
  request.choice = ToolChoice::kFunction;
  request.function = name->get<std::string>();
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::optional<ToolRequest>> ParseToolRequest(
    const json& body, const nlohmann::ordered_json* ordered_tools) {
  ToolRequest request;
  if (const json* tools = Present(body, "tools"); tools != nullptr) {
    if (!tools->is_array()) return InvalidParam("tools", "'tools' must be a list of tools");
    if (tools->size() > kMaxTools) {
      return InvalidParam("tools", absl::StrCat("'tools' may hold at most ", kMaxTools,
                                                " tools, got ", tools->size()));
    }
    // The ordered copy counts only when it is the same list.
    if (ordered_tools != nullptr &&
        (!ordered_tools->is_array() || ordered_tools->size() != tools->size())) {
      ordered_tools = nullptr;
    }
    absl::flat_hash_set<std::string> names;
    for (size_t i = 0; i < tools->size(); ++i) {
      nlohmann::ordered_json template_tool;
      absl::StatusOr<ToolFunction> f = ParseTool(
          (*tools)[i], i, ordered_tools != nullptr ? &(*ordered_tools)[i] : nullptr,
          &template_tool);
      if (!f.ok()) return f.status();
      if (!names.insert(f->name).second) {
        return InvalidParam("tools", absl::StrCat("tools[", i, "]: function '", f->name,
                                                  "' is defined twice"));
      }
      request.functions.push_back(*std::move(f));
      request.template_tools.push_back(std::move(template_tool));
    }
  }
  if (absl::Status s = ParseToolChoice(body, request); !s.ok()) return s;
  if (const json* p = Present(body, "parallel_tool_calls"); p != nullptr) {
    if (!p->is_boolean()) {
      return InvalidParam("parallel_tool_calls", "'parallel_tool_calls' must be a boolean");
    }
    request.parallel = p->get<bool>();
  }
  if (request.constrained() && request.functions.empty()) {
    return InvalidParam("tool_choice",
                        request.choice == ToolChoice::kRequired
                            ? "tool_choice \"required\" needs at least one tool in 'tools'"
                            : "tool_choice names a function but 'tools' is empty");
  }
  if (request.choice == ToolChoice::kFunction) {
    bool known = false;
    for (const ToolFunction& f : request.functions) known = known || f.name == request.function;
    if (!known) {
      return InvalidParam("tool_choice", absl::StrCat("tool_choice names function '",
                                                      request.function.substr(0, 80),
                                                      "', which is not in 'tools'"));
    }
  }
  if (request.functions.empty()) return std::optional<ToolRequest>();
  return std::optional<ToolRequest>(std::move(request));
}

absl::StatusOr<std::shared_ptr<const grammar::CompiledGrammar>> CompileToolGrammar(
    const ToolRequest& request, const ToolCallSyntax& syntax, grammar::GrammarCompiler& compiler) {
  std::vector<const ToolFunction*> functions;
  for (const ToolFunction& f : request.functions) {
    if (request.choice != ToolChoice::kFunction || f.name == request.function) {
      functions.push_back(&f);
    }
  }
  // A named function is one call; "required" is one call, or more with parallel_tool_calls.
  const bool parallel = request.choice == ToolChoice::kRequired && request.parallel;
  std::string key = absl::StrCat("tool_calls/", syntax.name(), parallel ? "/parallel" : "/one");
  for (const ToolFunction* f : functions) absl::StrAppend(&key, "\n", f->name, "\n", f->parameters.dump());
  absl::StatusOr<std::shared_ptr<const grammar::CompiledGrammar>> compiled =
      compiler.CompileBuilt(key, [&]() -> absl::StatusOr<grammar::Grammar> {
        grammar::Grammar g;
        const int32_t root = g.AddRule("root");
        std::vector<ToolFunctionRule> rules;
        for (size_t i = 0; i < functions.size(); ++i) {
          absl::StatusOr<grammar::Grammar> args = grammar::JsonSchemaToGrammar(functions[i]->parameters);
          if (!args.ok()) return args.status();
          rules.push_back({functions[i]->name,
                           grammar::ImportRules(g, *args, absl::StrCat("f", i, "-"))});
        }
        absl::StatusOr<grammar::Expr> calls = syntax.CallsExpr(rules, parallel);
        if (!calls.ok()) return calls.status();
        g.rule(root).body = *std::move(calls);
        g.set_root(root);
        return g;
      });
  if (!compiled.ok()) {
    return InvalidParam("tool_choice", absl::StrCat("cannot constrain tool calls: ",
                                                    compiled.status().message()));
  }
  return compiled;
}

absl::Status AddToolMessageFields(const json& m, size_t index, json& message) {
  const std::string where = absl::StrCat("messages[", index, "]");
  if (const json* calls = Present(m, "tool_calls"); calls != nullptr) {
    if (message["role"] != "assistant") {
      return InvalidParam("messages", absl::StrCat(where, ": only assistant messages carry "
                                                          "tool_calls"));
    }
    if (!calls->is_array()) {
      return InvalidParam("messages", absl::StrCat(where, ".tool_calls must be a list"));
    }
    json out = json::array();
    for (size_t j = 0; j < calls->size(); ++j) {
      const json& call = (*calls)[j];
      const std::string at = absl::StrCat(where, ".tool_calls[", j, "]");
      const json* function = call.is_object() ? Present(call, "function") : nullptr;
      const json* name = function != nullptr && function->is_object() ? Present(*function, "name")
                                                                       : nullptr;
      if (name == nullptr || !name->is_string()) {
        return InvalidParam("messages", absl::StrCat(at, ".function.name is required"));
      }
      json arguments = json::object();
      if (const json* a = Present(*function, "arguments"); a != nullptr) {
        if (a->is_string()) {
          arguments = json::parse(a->get<std::string>(), nullptr, /*allow_exceptions=*/false);
          if (arguments.is_discarded()) {
            return InvalidParam("messages", absl::StrCat(at, ".function.arguments is not valid "
                                                             "JSON"));
          }
        } else if (a->is_object()) {
          arguments = *a;
        } else {
          return InvalidParam("messages", absl::StrCat(at, ".function.arguments must be a JSON "
                                                           "string"));
        }
      }
      json entry{{"type", "function"},
                 {"function", {{"name", *name}, {"arguments", std::move(arguments)}}}};
      if (const json* id = Present(call, "id"); id != nullptr && id->is_string()) entry["id"] = *id;
      out.push_back(std::move(entry));
    }
    message["tool_calls"] = std::move(out);
  }
  if (const json* id = Present(m, "tool_call_id"); id != nullptr) {
    if (!id->is_string()) {
      return InvalidParam("messages", absl::StrCat(where, ".tool_call_id must be a string"));
    }
    message["tool_call_id"] = *id;
  }
  return absl::OkStatus();
}

}  // namespace sluice::tools
