// Field tables of the OpenAI endpoints (OpenAI API reference; vLLM's protocol.py for the
// extras vLLM clients send). See openai_fields.h for the rule.
#include "services/api/openai_fields.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "services/api/openai_errors.h"

namespace sluice {
namespace {

using nlohmann::json;

// ---- value predicates ----
bool IsString(const json& v) { return v.is_string(); }
bool IsBool(const json& v) { return v.is_boolean(); }
bool IsFalse(const json& v) { return v.is_boolean() && !v.get<bool>(); }
bool IsTrue(const json& v) { return v.is_boolean() && v.get<bool>(); }
bool IsEmptyList(const json& v) { return v.is_array() && v.empty(); }
bool IsEmptyListOrObject(const json& v) { return (v.is_array() || v.is_object()) && v.empty(); }
bool IsEmptyString(const json& v) { return v.is_string() && v.get<std::string>().empty(); }
bool IsZero(const json& v) { return v.is_number() && v.get<double>() == 0.0; }
bool IsOne(const json& v) { return v.is_number() && v.get<double>() == 1.0; }
bool IsNone(const json& v) { return v.is_string() && v.get<std::string>() == "none"; }
bool IsDisabled(const json& v) { return v.is_string() && v.get<std::string>() == "disabled"; }
bool IsTextOnly(const json& v) {
  if (!v.is_array()) return false;
  return std::all_of(v.begin(), v.end(), [](const json& m) { return m == "text"; });
}
// OpenAI metadata: up to 16 string values.
bool IsStringMap(const json& v) {
  if (!v.is_object() || v.size() > 16) return false;
  return std::all_of(v.begin(), v.end(), [](const json& x) { return x.is_string(); });
}

constexpr std::string_view kNoGrammar =
    "is not supported by this server (no structured output / guided decoding)";
constexpr std::string_view kNoBeam =
    "is not supported by this server: beam search is not implemented";
constexpr std::string_view kNoMultimodal = "is not supported by this server (text only)";
constexpr std::string_view kUnsupported = "is not supported by this server";

FieldSpec Honoured(std::string_view name) { return {name, FieldUse::kHonoured, nullptr, ""}; }
FieldSpec Metadata(std::string_view name, bool (*allows)(const json&), std::string_view type) {
  return {name, FieldUse::kMetadata, allows, type};
}
FieldSpec Refused(std::string_view name, std::string_view why,
                  bool (*allows)(const json&) = nullptr) {
  return {name, FieldUse::kRefused, allows, why};
}

// Sampling and output fields /v1/chat/completions and /v1/completions share (OpenAI's and
// vLLM's SamplingParams extras).
void AddSharedFields(std::vector<FieldSpec>& t) {
  for (std::string_view name :
       {"model", "n", "best_of", "temperature", "top_p", "top_k", "min_p", "presence_penalty",
        "frequency_penalty", "repetition_penalty", "seed", "stop", "stop_token_ids",
        "max_tokens", "min_tokens", "ignore_eos", "stream", "stream_options",
        "skip_special_tokens", "include_stop_str_in_output", "logprobs", "cache_salt",
        "logit_bias", "allowed_token_ids", "bad_words", "truncate_prompt_tokens",
        "prompt_logprobs", "echo", "add_special_tokens", "return_tokens_as_token_ids",
        "priority"}) {
    t.push_back(Honoured(name));
  }
  t.push_back(Metadata("user", IsString, "a string"));
  t.push_back(Metadata("request_id", IsString, "a string"));
  t.push_back(Refused("use_beam_search", kNoBeam, IsFalse));
  t.push_back(Refused("length_penalty",
                      "applies only to beam search, which this server does not implement",
                      IsOne));
  t.push_back(Refused("early_stopping", kNoBeam, IsFalse));
  t.push_back(Refused("spaces_between_special_tokens",
                      "= false is not supported by this server", IsTrue));
  // Structured outputs (services/api/structured_output.h; through the router the grammar
  // travels to the workers as text).
  for (std::string_view name : {"response_format", "guided_json", "guided_regex",
                                "guided_choice", "guided_grammar", "structured_outputs"}) {
    t.push_back(Honoured(name));
  }
  for (std::string_view name : {"guided_decoding_backend", "guided_whitespace_pattern"}) {
    t.push_back(Refused(name, kNoGrammar));
  }
  t.push_back(Refused("logits_processors", kUnsupported));
  t.push_back(Refused("kv_transfer_params", kUnsupported));
  t.push_back(Refused("vllm_xargs", kUnsupported));
  t.push_back(Refused("return_token_ids", kUnsupported, IsFalse));
}

std::vector<FieldSpec> ChatFields() {
  std::vector<FieldSpec> t;
  AddSharedFields(t);
  for (std::string_view name :
       {"messages", "max_completion_tokens", "top_logprobs", "add_generation_prompt",
        "continue_final_message", "chat_template", "chat_template_kwargs", "documents"}) {
    t.push_back(Honoured(name));
  }
  t.push_back(Metadata("metadata", IsStringMap, "an object of at most 16 string values"));
  t.push_back(Metadata("store", IsBool, "a boolean"));
  t.push_back(Metadata("service_tier", IsString, "a string"));
  t.push_back(Metadata("prompt_cache_key", IsString, "a string"));
  t.push_back(Metadata("safety_identifier", IsString, "a string"));
  // Tool calling (services/api/chat_tools.h).
  for (std::string_view name : {"tools", "tool_choice", "parallel_tool_calls"}) {
    t.push_back(Honoured(name));
  }
  // The deprecated function-calling fields: clients send tools / tool_choice instead.
  t.push_back(Refused("functions", "is deprecated and not supported: use 'tools'", IsEmptyList));
  t.push_back(Refused("function_call", "is deprecated and not supported: use 'tool_choice'",
                      IsNone));
  t.push_back(Refused("prediction", kUnsupported));
  t.push_back(Refused("audio", kNoMultimodal));
  t.push_back(Refused("modalities", kNoMultimodal, IsTextOnly));
  t.push_back(Refused("web_search_options", kUnsupported));
  t.push_back(Refused("reasoning_effort", kUnsupported));
  t.push_back(Refused("verbosity", kUnsupported));
  t.push_back(Refused("mm_processor_kwargs", kNoMultimodal));
  return t;
}

std::vector<FieldSpec> CompletionFields() {
  std::vector<FieldSpec> t;
  AddSharedFields(t);
  t.push_back(Honoured("prompt"));
  t.push_back(Refused("suffix", kUnsupported, IsEmptyString));
  t.push_back(Refused("prompt_embeds", kUnsupported));
  return t;
}

// /v1/responses (stateless): the OpenAI Responses fields plus vLLM's sampling extras.
std::vector<FieldSpec> ResponsesFields() {
  std::vector<FieldSpec> t;
  for (std::string_view name :
       {"model", "input", "instructions", "max_output_tokens", "temperature", "top_p",
        "top_k", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty",
        "seed", "stream", "logit_bias", "allowed_token_ids", "bad_words", "ignore_eos",
        "min_tokens", "cache_salt", "skip_special_tokens"}) {
    t.push_back(Honoured(name));
  }
  t.push_back(Metadata("user", IsString, "a string"));
  t.push_back(Metadata("metadata", IsStringMap, "an object of at most 16 string values"));
  t.push_back(Metadata("service_tier", IsString, "a string"));
  t.push_back(Metadata("prompt_cache_key", IsString, "a string"));
  t.push_back(Metadata("safety_identifier", IsString, "a string"));
  t.push_back(Metadata("request_id", IsString, "a string"));
  t.push_back(Refused("store", "= true is not supported: this server keeps no response state",
                      IsFalse));
  t.push_back(Refused("previous_response_id",
                      "is not supported: this server keeps no response state"));
  t.push_back(Refused("conversation", "is not supported: this server keeps no response state"));
  t.push_back(Refused("background", "= true is not supported by this server", IsFalse));
  t.push_back(Refused("include", kUnsupported, IsEmptyList));
  // Function calling and structured output through the chat code (responses_tools.h).
  for (std::string_view name : {"tools", "tool_choice", "parallel_tool_calls", "text"}) {
    t.push_back(Honoured(name));
  }
  t.push_back(Refused("max_tool_calls",
                      "is not supported by this server (it bounds built-in tool calls, and this "
                      "server runs none); use parallel_tool_calls: false for one function call "
                      "per response"));
  t.push_back(Refused("reasoning", kUnsupported));
  t.push_back(Refused("top_logprobs", "is not supported on /v1/responses (no logprobs output)",
                      IsZero));
  t.push_back(Refused("truncation", "other than \"disabled\" is not supported", IsDisabled));
  t.push_back(Refused("prompt", "(stored prompt templates) is not supported"));
  t.push_back(Refused("stream_options", kUnsupported, IsEmptyListOrObject));
  t.push_back(Refused("use_beam_search", kNoBeam, IsFalse));
  t.push_back(Refused("length_penalty",
                      "applies only to beam search, which this server does not implement",
                      IsOne));
  return t;
}

}  // namespace

absl::Span<const FieldSpec> Fields(FieldTable table) {
  static const std::vector<FieldSpec>* const chat = new std::vector<FieldSpec>(ChatFields());
  static const std::vector<FieldSpec>* const completions =
      new std::vector<FieldSpec>(CompletionFields());
  static const std::vector<FieldSpec>* const responses =
      new std::vector<FieldSpec>(ResponsesFields());
  switch (table) {
    case FieldTable::kChatCompletions:
      return *chat;
    case FieldTable::kCompletions:
      return *completions;
    case FieldTable::kResponses:
      return *responses;
  }
  return {};
}

absl::Status CheckFields(const json& body, FieldTable table, bool allow_unknown,
                         std::vector<std::string>* unknown) {
  const absl::Span<const FieldSpec> fields = Fields(table);
  for (const auto& item : body.items()) {
    // Named variables, not a structured binding: clang before 16 cannot capture those.
    const std::string& name = item.key();
    const json& value = item.value();
    auto spec = std::find_if(fields.begin(), fields.end(),
                             [&](const FieldSpec& f) { return f.name == name; });
    if (spec == fields.end()) {
      if (allow_unknown) {
        if (unknown != nullptr) unknown->push_back(name);
        continue;
      }
      return InvalidParam(name, absl::StrCat("Unrecognized request argument supplied: ", name));
    }
    if (value.is_null()) continue;
    switch (spec->use) {
      case FieldUse::kHonoured:
        break;
      case FieldUse::kMetadata:
        if (spec->allows != nullptr && !spec->allows(value)) {
          return InvalidParam(name,
                              absl::StrCat("'", name, "' must be ", std::string(spec->why)));
        }
        break;
      case FieldUse::kRefused:
        if (spec->allows == nullptr || !spec->allows(value)) {
          return InvalidParam(name, absl::StrCat("'", name, "' ", std::string(spec->why)));
        }
        break;
    }
  }
  return absl::OkStatus();
}

absl::Status CheckKnownKeys(const json& obj, absl::Span<const std::string_view> known,
                            std::string_view param, std::string_view path, bool allow_unknown,
                            std::vector<std::string>* unknown) {
  if (!obj.is_object()) return absl::OkStatus();
  for (const auto& item : obj.items()) {
    const std::string& key = item.key();
    if (std::find(known.begin(), known.end(), key) != known.end()) continue;
    std::string field = absl::StrCat(std::string(path), ".", key);
    if (!allow_unknown) {
      return InvalidParam(std::string(param),
                          absl::StrCat("Unrecognized request argument supplied: ", field));
    }
    if (unknown != nullptr) unknown->push_back(std::move(field));
  }
  return absl::OkStatus();
}

}  // namespace sluice
