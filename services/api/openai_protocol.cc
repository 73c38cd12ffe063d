#include "services/api/openai_protocol.h"

#include <cmath>
#include <limits>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "services/api/openai_errors.h"
#include "services/api/structured_output.h"

namespace sluice {
namespace {

using nlohmann::json;

// Present returns the field when it is there and not null (null means "not given").
const json* Present(const json& body, const char* name) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

absl::Status TypeError(const std::string& name, const char* type) {
  return InvalidParam(name, absl::StrCat("'", name, "' must be ", type));
}

absl::Status RangeError(const std::string& name, const std::string& range) {
  return InvalidParam(name, absl::StrCat("'", name, "' must be ", range));
}

// GetBool reads an optional boolean into `out`.
absl::Status GetBool(const json& body, const char* name, bool* out) {
  const json* v = Present(body, name);
  if (v == nullptr) return absl::OkStatus();
  if (!v->is_boolean()) return TypeError(name, "a boolean");
  *out = v->get<bool>();
  return absl::OkStatus();
}

// GetFloat reads an optional number in [lo, hi] into `out`.
absl::Status GetFloat(const json& body, const char* name, double lo, double hi, float* out) {
  const json* v = Present(body, name);
  if (v == nullptr) return absl::OkStatus();
  if (!v->is_number()) return TypeError(name, "a number");
  const double x = v->get<double>();
  if (!std::isfinite(x) || x < lo || x > hi) {
    return RangeError(name, absl::StrCat("between ", lo, " and ", hi, ", got ", x));
  }
  *out = static_cast<float>(x);
  return absl::OkStatus();
}

// AsInt64 converts an integral JSON number (an integral float such as 5.0 is accepted).
std::optional<int64_t> AsInt64(const json& v) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
    return static_cast<int64_t>(u);
  }
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e15) {
      return static_cast<int64_t>(d);
    }
  }
  return std::nullopt;
}

// GetInt reads an optional integer in [lo, hi]; returns whether it was present.
absl::StatusOr<bool> GetInt(const json& body, const char* name, int64_t lo, int64_t hi,
                            int64_t* out) {
  const json* v = Present(body, name);
  if (v == nullptr) return false;
  std::optional<int64_t> x = AsInt64(*v);
  if (!x.has_value()) return TypeError(name, "an integer");
  if (*x < lo || *x > hi) {
    return RangeError(name, absl::StrCat("between ", lo, " and ", hi, ", got ", *x));
  }
  *out = *x;
  return true;
}

// RejectUnsupported returns 400 naming the first output-changing OpenAI field that Sluice does
// not implement. Harmless forms (null, empty lists/objects, "text" formats) are accepted.
absl::Status RejectUnsupported(const json& body, Endpoint endpoint) {
  auto unsupported = [](const std::string& name) {
    return InvalidParam(name, absl::StrCat("'", name, "' is not supported by this server"));
  };
  for (const char* name : {"tools", "functions", "logit_bias"}) {
    const json* v = Present(body, name);
    if (v != nullptr && !((v->is_array() || v->is_object()) && v->empty())) {
      return unsupported(name);
    }
  }
  if (const json* v = Present(body, "tool_choice");
      v != nullptr && !(v->is_string() && v->get<std::string>() == "none")) {
    return unsupported("tool_choice");
  }
  for (const char* name :
       {"function_call", "parallel_tool_calls", "prediction", "audio", "web_search_options",
        "reasoning_effort", "logits_processors", "prompt_logprobs", "prompt_embeds"}) {
    if (Present(body, name) != nullptr) return unsupported(name);
  }
  if (const json* v = Present(body, "modalities"); v != nullptr) {
    if (!v->is_array()) return TypeError("modalities", "a list of strings");
    for (const json& m : *v) {
      if (!m.is_string() || m.get<std::string>() != "text") return unsupported("modalities");
    }
  }
  if (endpoint == Endpoint::kCompletions) {
    if (const json* v = Present(body, "suffix");
        v != nullptr && !(v->is_string() && v->get<std::string>().empty())) {
      return unsupported("suffix");
    }
  }
  return absl::OkStatus();
}

// ParseCommon reads the fields shared by both endpoints into `req` (prompts must be set).
absl::Status ParseCommon(const json& body, const ParseContext& context, GenerationRequest& req) {
  if (absl::Status s = RejectUnsupported(body, req.endpoint); !s.ok()) return s;

  SamplingParams& sp = req.sampling;
  // OpenAI: temperature in [0, 2]; vLLM accepts larger values, as do we.
  if (auto s = GetFloat(body, "temperature", 0.0, 100.0, &sp.temperature); !s.ok()) return s;
  // (0, 1]: 0 keeps no token, so one message names the half-open range for every bad value.
  if (const json* v = Present(body, "top_p"); v != nullptr && v->is_number()) {
    const double x = v->get<double>();
    if (!(x > 0.0 && x <= 1.0)) return RangeError("top_p", absl::StrCat("in (0, 1], got ", x));
  }
  if (auto s = GetFloat(body, "top_p", 0.0, 1.0, &sp.top_p); !s.ok()) return s;
  if (auto s = GetFloat(body, "min_p", 0.0, 1.0, &sp.min_p); !s.ok()) return s;
  if (auto s = GetFloat(body, "presence_penalty", -2.0, 2.0, &sp.presence_penalty); !s.ok()) {
    return s;
  }
  if (auto s = GetFloat(body, "frequency_penalty", -2.0, 2.0, &sp.frequency_penalty); !s.ok()) {
    return s;
  }
  if (auto s = GetFloat(body, "repetition_penalty", 0.0, 1e6, &sp.repetition_penalty); !s.ok()) {
    return s;
  }
  if (sp.repetition_penalty <= 0.0f) return RangeError("repetition_penalty", "> 0");

  int64_t v = 0;
  absl::StatusOr<bool> got = GetInt(body, "top_k", -1, std::numeric_limits<int32_t>::max(), &v);
  if (!got.ok()) return got.status();
  if (*got) sp.top_k = static_cast<int32_t>(v);

  got = GetInt(body, "n", 1, 16, &v);
  if (!got.ok()) return got.status();
  if (*got) req.n = static_cast<int32_t>(v);
  got = GetInt(body, "best_of", 1, 16, &v);
  if (!got.ok()) return got.status();
  if (*got && v != req.n) {
    return InvalidParam("best_of", "'best_of' other than n is not supported by this server");
  }

  got = GetInt(body, "seed", std::numeric_limits<int64_t>::min(),
               std::numeric_limits<int64_t>::max(), &v);
  if (!got.ok()) return got.status();
  if (*got) sp.seed = static_cast<uint64_t>(v);

  // max_completion_tokens (current OpenAI name) wins over the deprecated max_tokens.
  int64_t max_tokens = 0;
  for (const char* name : {"max_tokens", "max_completion_tokens"}) {
    got = GetInt(body, name, 1, std::numeric_limits<int32_t>::max(), &v);
    if (!got.ok()) return got.status();
    if (*got) {
      max_tokens = v;
      req.max_tokens_given = true;
    }
  }
  got = GetInt(body, "min_tokens", 0, std::numeric_limits<int32_t>::max(), &v);
  if (!got.ok()) return got.status();
  if (*got) sp.min_tokens = static_cast<int32_t>(v);
  if (req.max_tokens_given && sp.min_tokens > max_tokens) {
    return RangeError("min_tokens", absl::StrCat("at most max_tokens (", max_tokens, ")"));
  }

  if (auto s = GetBool(body, "stream", &req.stream); !s.ok()) return s;
  if (const json* so = Present(body, "stream_options"); so != nullptr) {
    if (!so->is_object()) return TypeError("stream_options", "an object");
    if (auto s = GetBool(*so, "include_usage", &req.include_usage); !s.ok()) {
      return InvalidParam("stream_options", std::string(s.message()));
    }
  }
  if (auto s = GetBool(body, "ignore_eos", &sp.ignore_eos); !s.ok()) return s;
  // cache_salt (vLLM extra): requests share prefix-cache KV only with the same salt. An empty
  // salt would silently mean "shared", so it is rejected like vLLM does.
  if (const json* salt = Present(body, "cache_salt"); salt != nullptr) {
    constexpr size_t kMaxCacheSaltBytes = 256;
    if (!salt->is_string()) return TypeError("cache_salt", "a string");
    req.cache_salt = salt->get<std::string>();
    if (req.cache_salt.empty() || req.cache_salt.size() > kMaxCacheSaltBytes) {
      return RangeError("cache_salt", absl::StrCat("a string of 1 to ", kMaxCacheSaltBytes,
                                                   " bytes, got ", req.cache_salt.size()));
    }
  }
  if (auto s = GetBool(body, "skip_special_tokens", &sp.skip_special_tokens); !s.ok()) return s;
  if (auto s = GetBool(body, "include_stop_str_in_output", &sp.include_stop_str_in_output);
      !s.ok()) {
    return s;
  }

  if (const json* stop = Present(body, "stop"); stop != nullptr) {
    if (stop->is_string()) {
      sp.stop.push_back(stop->get<std::string>());
    } else if (stop->is_array()) {
      for (const json& s : *stop) {
        if (!s.is_string()) return TypeError("stop", "a string or a list of strings");
        sp.stop.push_back(s.get<std::string>());
      }
    } else {
      return TypeError("stop", "a string or a list of strings");
    }
    // Matching cost per streamed delta grows with the total stop length: bound it (OpenAI
    // allows 4 stop strings; vLLM is unbounded).
    constexpr size_t kMaxStopStrings = 64;
    constexpr size_t kMaxStopStringBytes = 1024;
    if (sp.stop.size() > kMaxStopStrings) {
      return InvalidParam("stop", absl::StrCat("'stop' may hold at most ", kMaxStopStrings,
                                               " strings, got ", sp.stop.size()));
    }
    for (const std::string& s : sp.stop) {
      if (s.size() > kMaxStopStringBytes) {
        return InvalidParam("stop", absl::StrCat("each 'stop' string may be at most ",
                                                 kMaxStopStringBytes, " bytes, got ", s.size()));
      }
    }
  }
  const int32_t vocab_size = context.tokenizer->vocab_size();
  if (const json* ids = Present(body, "stop_token_ids"); ids != nullptr) {
    if (!ids->is_array()) return TypeError("stop_token_ids", "a list of integers");
    for (const json& id : *ids) {
      std::optional<int64_t> x = AsInt64(id);
      if (!x.has_value()) return TypeError("stop_token_ids", "a list of integers");
      if (*x < 0 || *x >= vocab_size) {
        return RangeError("stop_token_ids", absl::StrCat("token ids in [0, ", vocab_size, ")"));
      }
      sp.stop_token_ids.push_back(static_cast<int32_t>(*x));
    }
  }

  // Logprobs: chat uses logprobs (bool) + top_logprobs; completions an integer logprobs.
  if (req.endpoint == Endpoint::kChatCompletions) {
    if (auto s = GetBool(body, "logprobs", &req.logprobs); !s.ok()) return s;
    got = GetInt(body, "top_logprobs", 0, 20, &v);
    if (!got.ok()) return got.status();
    if (*got) {
      if (!req.logprobs && v > 0) {
        return InvalidParam("top_logprobs", "'top_logprobs' requires 'logprobs' to be true");
      }
      req.top_logprobs = static_cast<int32_t>(v);
    }
  } else {
    const json* lp = Present(body, "logprobs");
    if (lp != nullptr && lp->is_boolean()) return TypeError("logprobs", "an integer");
    got = GetInt(body, "logprobs", 0, 20, &v);
    if (!got.ok()) return got.status();
    if (*got) {
      req.logprobs = true;
      req.top_logprobs = static_cast<int32_t>(v);
    }
    if (auto s = GetBool(body, "echo", &req.echo); !s.ok()) return s;
    if (req.echo && req.logprobs) {
      return InvalidParam("echo", "'echo' together with 'logprobs' is not supported");
    }
    if (auto s = GetBool(body, "return_tokens_as_token_ids", &req.return_tokens_as_token_ids);
        !s.ok()) {
      return s;
    }
  }
  if (req.logprobs) sp.logprobs = req.top_logprobs;

  // Context length: prompt + max_tokens must fit; unset max_tokens takes what is left.
  const char* prompt_param = req.endpoint == Endpoint::kChatCompletions ? "messages" : "prompt";
  size_t longest = 0;
  for (const std::vector<int32_t>& prompt : req.prompts) {
    if (prompt.empty()) return InvalidParam(prompt_param, "the prompt is empty");
    for (int32_t id : prompt) {
      if (id < 0 || id >= vocab_size) {
        return InvalidParam(prompt_param, absl::StrCat("token id ", id, " is outside [0, ",
                                                       vocab_size, ")"));
      }
    }
    longest = std::max(longest, prompt.size());
  }
  const int64_t num_prompt = static_cast<int64_t>(longest);
  const int64_t max_len = context.max_model_len;
  if (req.max_tokens_given) {
    if (num_prompt + max_tokens > max_len) {
      return InvalidParam(
          prompt_param,
          absl::StrCat("This model's maximum context length is ", max_len,
                       " tokens. However, you requested ", num_prompt + max_tokens, " tokens (",
                       num_prompt, " in the ", prompt_param, ", ", max_tokens,
                       " in the completion). Please reduce the length of the ", prompt_param,
                       " or the completion."));
    }
    sp.max_tokens = static_cast<int32_t>(max_tokens);
  } else {
    if (num_prompt >= max_len) {
      return InvalidParam(prompt_param,
                          absl::StrCat("This model's maximum context length is ", max_len,
                                       " tokens. However, your ", prompt_param, " has ",
                                       num_prompt, " tokens, leaving no room for the completion."));
    }
    sp.max_tokens = static_cast<int32_t>(max_len - num_prompt);
  }
  if (!req.max_tokens_given && sp.min_tokens > sp.max_tokens) sp.min_tokens = sp.max_tokens;
  // The engine's own checks as a safety net; its messages start with the field name.
  if (absl::Status s = sp.Validate(vocab_size); !s.ok()) {
    const std::string message(s.message());
    return InvalidParam(message.substr(0, message.find(' ')), message);
  }
  // Structured output, compiled last (the costly check, once the rest is valid).
  absl::StatusOr<std::shared_ptr<const grammar::CompiledGrammar>> grammar =
      StructuredOutputGrammar(body, context.grammar_compiler);
  if (!grammar.ok()) return grammar.status();
  req.grammar = *std::move(grammar);
  return absl::OkStatus();
}

// CheckModel returns NotFound (param "model") unless `model` names the served model.
absl::Status CheckModel(const json& body, const ParseContext& context, GenerationRequest& req) {
  const json* model = Present(body, "model");
  if (model == nullptr) return InvalidParam("model", "'model' is required");
  if (!model->is_string()) return TypeError("model", "a string");
  req.model = model->get<std::string>();
  if (req.model != context.served_model_name) {
    return WithParam(
        absl::NotFoundError(absl::StrCat("The model '", req.model, "' does not exist")),
        "model");
  }
  return absl::OkStatus();
}

// MessageContent flattens a message's content (a string or a list of text parts, joined by
// newlines as vLLM does) into a string.
absl::StatusOr<std::string> MessageContent(const json& content, size_t index) {
  const std::string where = absl::StrCat("messages[", index, "].content");
  if (content.is_null()) return std::string();
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) {
    return InvalidParam("messages", absl::StrCat(where, " must be a string or a list of parts"));
  }
  std::vector<std::string> texts;
  for (const json& part : content) {
    if (!part.is_object() || !part.contains("type") || !part["type"].is_string()) {
      return InvalidParam("messages", absl::StrCat(where, " parts must be objects with a type"));
    }
    const std::string type = part["type"].get<std::string>();
    if (type != "text") {
      return InvalidParam("messages", absl::StrCat(where, " part type '", type,
                                                   "' is not supported (only 'text')"));
    }
    auto text = part.find("text");
    if (text == part.end() || !text->is_string()) {
      return InvalidParam("messages", absl::StrCat(where, " text part needs a string 'text'"));
    }
    texts.push_back(text->get<std::string>());
  }
  return absl::StrJoin(texts, "\n");
}

}  // namespace

absl::StatusOr<json> ParseJsonBody(std::string_view body) {
  json parsed = json::parse(body.begin(), body.end(), /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) {
    return absl::InvalidArgumentError("The request body is not valid JSON");
  }
  if (!parsed.is_object()) {
    return absl::InvalidArgumentError("The request body must be a JSON object");
  }
  return parsed;
}

absl::StatusOr<GenerationRequest> ParseChatCompletionRequest(const json& body,
                                                             const ParseContext& context) {
  GenerationRequest req;
  req.endpoint = Endpoint::kChatCompletions;
  if (absl::Status s = CheckModel(body, context, req); !s.ok()) return s;
  const json* messages = Present(body, "messages");
  if (messages == nullptr) return InvalidParam("messages", "'messages' is required");
  if (!messages->is_array() || messages->empty()) {
    return InvalidParam("messages", "'messages' must be a non-empty list");
  }
  json rendered_messages = json::array();
  for (size_t i = 0; i < messages->size(); ++i) {
    const json& m = (*messages)[i];
    if (!m.is_object()) return InvalidParam("messages", "each message must be an object");
    auto role = m.find("role");
    if (role == m.end() || !role->is_string()) {
      return InvalidParam("messages", absl::StrCat("messages[", i, "].role must be a string"));
    }
    std::string role_name = role->get<std::string>();
    if (role_name == "developer") role_name = "system";  // OpenAI's newer name for system
    if (m.contains("tool_calls") && !m["tool_calls"].is_null()) {
      return InvalidParam("messages", "tool calls in messages are not supported");
    }
    absl::StatusOr<std::string> content =
        MessageContent(m.contains("content") ? m["content"] : json(), i);
    if (!content.ok()) return content.status();
    rendered_messages.push_back({{"role", role_name}, {"content", *content}});
  }
  bool add_generation_prompt = true;
  if (auto s = GetBool(body, "add_generation_prompt", &add_generation_prompt); !s.ok()) return s;
  if (context.chat_template == nullptr) {
    return InvalidParam("messages", "this model has no chat template; use /v1/completions");
  }
  absl::StatusOr<std::string> text =
      context.chat_template->RenderMessages(rendered_messages, add_generation_prompt);
  if (!text.ok()) {
    return InvalidParam("messages", absl::StrCat("chat template: ", text.status().message()));
  }
  req.prompts.push_back(context.tokenizer->Encode(*text, /*add_special_tokens=*/false,
                                                  /*parse_special=*/true));
  if (absl::Status s = ParseCommon(body, context, req); !s.ok()) return s;
  return req;
}

absl::StatusOr<GenerationRequest> ParseCompletionRequest(const json& body,
                                                         const ParseContext& context) {
  GenerationRequest req;
  req.endpoint = Endpoint::kCompletions;
  if (absl::Status s = CheckModel(body, context, req); !s.ok()) return s;
  const json* prompt = Present(body, "prompt");
  if (prompt == nullptr) return InvalidParam("prompt", "'prompt' is required");
  const absl::Status bad_type = TypeError(
      "prompt", "a string, a list of strings, a list of token ids or a list of token-id lists");
  auto token_list = [&](const json& list) -> absl::StatusOr<std::vector<int32_t>> {
    std::vector<int32_t> ids;
    for (const json& id : list) {
      std::optional<int64_t> x = AsInt64(id);
      if (!x.has_value() || !id.is_number_integer()) return bad_type;
      if (*x < std::numeric_limits<int32_t>::min() || *x > std::numeric_limits<int32_t>::max()) {
        return InvalidParam("prompt", absl::StrCat("token id ", *x, " is out of range"));
      }
      ids.push_back(static_cast<int32_t>(*x));
    }
    return ids;
  };
  auto encode = [&](const std::string& text) {
    return context.tokenizer->Encode(text, /*add_special_tokens=*/true, /*parse_special=*/true);
  };
  if (prompt->is_string()) {
    req.prompts.push_back(encode(prompt->get<std::string>()));
  } else if (prompt->is_array() && !prompt->empty()) {
    const json& first = (*prompt)[0];
    if (first.is_number()) {
      absl::StatusOr<std::vector<int32_t>> ids = token_list(*prompt);
      if (!ids.ok()) return ids.status();
      req.prompts.push_back(*std::move(ids));
    } else {
      for (const json& item : *prompt) {
        if (item.is_string()) {
          req.prompts.push_back(encode(item.get<std::string>()));
        } else if (item.is_array()) {
          absl::StatusOr<std::vector<int32_t>> ids = token_list(item);
          if (!ids.ok()) return ids.status();
          req.prompts.push_back(*std::move(ids));
        } else {
          return bad_type;
        }
      }
    }
  } else {
    return bad_type;
  }
  if (absl::Status s = ParseCommon(body, context, req); !s.ok()) return s;
  if (req.num_choices() > 64) {
    return InvalidParam("prompt", "at most 64 choices (prompts x n) per request");
  }
  return req;
}

}  // namespace sluice
