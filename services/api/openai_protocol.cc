#include "services/api/openai_protocol.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <limits>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/json_parse.h"
#include "engine/tokenizer/jinja/value.h"
#include "services/api/openai_errors.h"
#include "services/api/message_fields.h"
#include "services/api/openai_fields.h"
#include "services/api/structured_output.h"
#include "services/api/chat_tools.h"

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
  if (!x.has_value()) {
    // An integer beyond int64 (2**63, 1e300) is out of range, not of the wrong type.
    const double d = v->is_number() ? v->get<double>() : 0.0;
    const bool integral = v->is_number_integer() ||
                          (v->is_number_float() && std::isfinite(d) && d == std::floor(d));
    if (!integral) return TypeError(name, "an integer");
    return RangeError(name, absl::StrCat("between ", lo, " and ", hi, ", got ", v->dump()));
  }
  if (*x < lo || *x > hi) {
    return RangeError(name, absl::StrCat("between ", lo, " and ", hi, ", got ", *x));
  }
  *out = *x;
  return true;
}

// ParseTruncation applies truncate_prompt_tokens (vLLM): keep the last k tokens of each
// prompt; -1 keeps the last max_model_len tokens.
absl::Status ParseTruncation(const json& body, const ParseContext& context,
                             GenerationRequest& req) {
  int64_t k = 0;
  absl::StatusOr<bool> got =
      GetInt(body, "truncate_prompt_tokens", -1, std::numeric_limits<int32_t>::max(), &k);
  if (!got.ok()) return got.status();
  if (!*got) return absl::OkStatus();
  if (k == 0) return RangeError("truncate_prompt_tokens", "-1 or at least 1, got 0");
  if (k > context.max_model_len) {
    // vLLM refuses it too: the prompt alone could not fit the context.
    return RangeError("truncate_prompt_tokens",
                      absl::StrCat("at most the model's context length (", context.max_model_len,
                                   "), got ", k));
  }
  if (k == -1) k = context.max_model_len;
  for (std::vector<int32_t>& prompt : req.prompts) {
    if (static_cast<int64_t>(prompt.size()) > k) prompt.erase(prompt.begin(), prompt.end() - k);
  }
  return absl::OkStatus();
}

// ParseStreamOptions reads stream_options {include_usage, continuous_usage_stats}; like OpenAI
// and vLLM it is only valid with stream=true.
absl::Status ParseStreamOptions(const json& body, bool allow_unknown, GenerationRequest& req) {
  const json* so = Present(body, "stream_options");
  if (so == nullptr) return absl::OkStatus();
  if (!so->is_object()) return TypeError("stream_options", "an object");
  if (!req.stream) {
    return InvalidParam("stream_options", "'stream_options' is only allowed when 'stream' is true");
  }
  if (absl::Status s = CheckKnownKeys(*so, {"include_usage", "continuous_usage_stats"},
                                      "stream_options", "stream_options", allow_unknown,
                                      &req.unknown_fields);
      !s.ok()) {
    return s;
  }
  for (const auto& [key, value] : so->items()) {
    bool* out = key == "include_usage"            ? &req.include_usage
                : key == "continuous_usage_stats" ? &req.continuous_usage_stats
                                                  : nullptr;
    if (out == nullptr || value.is_null()) continue;
    if (!value.is_boolean()) {
      return InvalidParam("stream_options",
                          absl::StrCat("'stream_options.", key, "' must be a boolean"));
    }
    *out = value.get<bool>();
  }
  if (req.continuous_usage_stats) req.include_usage = true;
  return absl::OkStatus();
}

// TokenIdList reads a list of token ids in [0, vocab_size).
absl::StatusOr<std::vector<int32_t>> TokenIdList(const json& list, const std::string& name,
                                                 int32_t vocab_size) {
  if (!list.is_array()) return TypeError(name, "a list of token ids");
  std::vector<int32_t> ids;
  for (const json& id : list) {
    std::optional<int64_t> x = AsInt64(id);
    if (!x.has_value()) return TypeError(name, "a list of token ids");
    if (*x < 0 || *x >= vocab_size) {
      return RangeError(name, absl::StrCat("token ids in [0, ", vocab_size, "), got ", *x));
    }
    ids.push_back(static_cast<int32_t>(*x));
  }
  return ids;
}

// ParseTokenConstraints reads allowed_token_ids, logit_bias and bad_words (vLLM semantics).
absl::Status ParseTokenConstraints(const json& body, const ParseContext& context,
                                   SamplingParams& sp) {
  const int32_t vocab_size = context.tokenizer->vocab_size();
  if (const json* v = Present(body, "allowed_token_ids"); v != nullptr) {
    absl::StatusOr<std::vector<int32_t>> ids = TokenIdList(*v, "allowed_token_ids", vocab_size);
    if (!ids.ok()) return ids.status();
    if (ids->empty()) return InvalidParam("allowed_token_ids", "'allowed_token_ids' is empty");
    sp.allowed_token_ids = *std::move(ids);
  }
  if (const json* v = Present(body, "logit_bias"); v != nullptr) {
    // OpenAI: {"token id": bias} with bias in [-100, 100].
    if (!v->is_object()) return TypeError("logit_bias", "an object of token id -> bias");
    for (const auto& [key, bias] : v->items()) {
      int64_t id = -1;
      if (key.empty() || key.size() > 10 ||
          key.find_first_not_of("0123456789") != std::string::npos) {
        return InvalidParam("logit_bias",
                            absl::StrCat("'logit_bias' keys must be token ids, got '", key, "'"));
      }
      id = std::stoll(key);
      if (id >= vocab_size) {
        return RangeError("logit_bias", absl::StrCat("keyed by token ids in [0, ", vocab_size,
                                                     "), got ", id));
      }
      if (!bias.is_number()) return TypeError("logit_bias", "an object of token id -> number");
      const double b = bias.get<double>();
      if (!(b >= -100.0 && b <= 100.0)) {
        return RangeError("logit_bias", absl::StrCat("values in [-100, 100], got ", b));
      }
      sp.logit_bias.emplace_back(static_cast<int32_t>(id), static_cast<float>(b));
    }
  }
  if (const json* v = Present(body, "bad_words"); v != nullptr) {
    if (!v->is_array()) return TypeError("bad_words", "a list of strings");
    // vLLM (SamplingParams.update_from_tokenizer): each word as written (left-stripped) and,
    // when that gives another first token but as many tokens, with a leading space.
    for (const json& word : *v) {
      if (!word.is_string()) return TypeError("bad_words", "a list of strings");
      std::string text = word.get<std::string>();
      const size_t first = text.find_first_not_of(" \t\n\r\f\v");
      text.erase(0, first == std::string::npos ? text.size() : first);
      if (text.empty()) return InvalidParam("bad_words", "'bad_words' holds an empty word");
      std::vector<int32_t> plain = context.tokenizer->Encode(text, false, false);
      std::vector<int32_t> spaced = context.tokenizer->Encode(" " + text, false, false);
      if (plain.empty()) continue;
      sp.bad_words_token_ids.push_back(plain);
      if (!spaced.empty() && spaced[0] != plain[0] && spaced.size() == plain.size()) {
        sp.bad_words_token_ids.push_back(std::move(spaced));
      }
    }
  }
  return absl::OkStatus();
}

// ParseCommon reads the fields shared by both endpoints into `req` (prompts must be set).
absl::Status ParseCommon(const json& body, const ParseContext& context, GenerationRequest& req) {
  SamplingParams& sp = req.sampling;
  if (absl::Status s = ParseTruncation(body, context, req); !s.ok()) return s;
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
  int64_t best_of = 0;
  got = GetInt(body, "best_of", 1, 16, &best_of);
  if (!got.ok()) return got.status();

  got = GetInt(body, "seed", std::numeric_limits<int64_t>::min(),
               std::numeric_limits<int64_t>::max(), &v);
  if (!got.ok()) return got.status();
  if (*got) sp.seed = static_cast<uint64_t>(v);

  // max_completion_tokens (current OpenAI name) wins over the deprecated max_tokens. 0 only
  // on completions with echo: the prompt scored, nothing generated.
  const json* echo = Present(body, "echo");
  const int64_t min_max_tokens = req.endpoint == Endpoint::kCompletions && echo != nullptr &&
                                         echo->is_boolean() && echo->get<bool>()
                                     ? 0
                                     : 1;
  int64_t max_tokens = 0;
  for (const char* name : {"max_tokens", "max_completion_tokens"}) {
    got = GetInt(body, name, min_max_tokens, std::numeric_limits<int32_t>::max(), &v);
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
  // best_of > n (vLLM): best_of choices are generated per prompt and the n of highest
  // cumulative logprob returned, so none is known before all end: no streaming (OpenAI's rule).
  if (best_of != 0 && best_of != req.n) {
    if (best_of < req.n) {
      return RangeError("best_of", absl::StrCat("at least n (", req.n, "), got ", best_of));
    }
    if (req.stream) {
      return InvalidParam("best_of", "'best_of' greater than n cannot be streamed");
    }
    req.best_of_keep = req.n;
    req.n = static_cast<int32_t>(best_of);
  }
  if (auto s = ParseStreamOptions(body, context.allow_unknown_fields, req); !s.ok()) {
    return s;
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
  got = GetInt(body, "priority", std::numeric_limits<int32_t>::min(),
               std::numeric_limits<int32_t>::max(), &v);
  if (!got.ok()) return got.status();
  if (*got) req.priority = static_cast<int32_t>(v);
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

  if (auto s = ParseTokenConstraints(body, context, sp); !s.ok()) return s;

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
    // echo + logprobs: the prompt's tokens carry logprobs too (vLLM, lm-eval's scoring).
    if (req.echo && req.logprobs) req.prompt_logprobs = req.top_logprobs;
  }
  if (auto s = GetBool(body, "return_tokens_as_token_ids", &req.return_tokens_as_token_ids);
      !s.ok()) {
    return s;
  }
  if (req.logprobs) sp.logprobs = req.top_logprobs;
  if (req.best_of_keep > 0 && !sp.logprobs.has_value()) sp.logprobs = 0;  // ranks by logprob
  got = GetInt(body, "prompt_logprobs", 0, 20, &v);
  if (!got.ok()) return got.status();
  if (*got) {
    req.prompt_logprobs = std::max<int32_t>(req.prompt_logprobs.value_or(0), v);
    req.prompt_logprobs_field = true;
  }
  sp.prompt_logprobs = req.prompt_logprobs;
  if (req.prompt_logprobs.has_value()) {
    int64_t entries = 0;
    for (const std::vector<int32_t>& prompt : req.prompts) {
      entries += static_cast<int64_t>(prompt.size()) * (1 + *req.prompt_logprobs) * req.n;
    }
    if (entries > context.max_prompt_logprob_entries) {
      return InvalidParam(
          req.prompt_logprobs_field ? "prompt_logprobs" : "logprobs",
          absl::StrCat("prompt logprobs would hold ", entries,
                       " entries (prompt tokens x (1 + alternatives) x n), more than the limit "
                       "of ",
                       context.max_prompt_logprob_entries,
                       "; ask for fewer alternatives, a shorter prompt or a smaller n"));
    }
  }

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
  req.echo_only = req.max_tokens_given && max_tokens == 0;
  if (req.echo_only) {
    if (num_prompt >= max_len) {
      // The engine samples one token after the prompt even when none is returned.
      return InvalidParam(prompt_param,
                          absl::StrCat("This model's maximum context length is ", max_len,
                                       " tokens. However, your ", prompt_param, " has ",
                                       num_prompt, " tokens; scoring it with max_tokens 0 "
                                       "needs one position after it"));
    }
    sp.max_tokens = 1;
  } else if (req.max_tokens_given) {
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
      StructuredOutputGrammar(body, context.grammar_compiler, context.allow_unknown_fields,
                              &req.unknown_fields, context.ordered_body.get());
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

// MessageContent flattens a message's content (a string or a list of parts) into what the
// template reads: text parts joined by newlines as vLLM does; image parts (vision-language
// models only) collected into `images` and marked per multimodal_input.h's content format.
absl::StatusOr<json> MessageContent(const json& content, size_t index,
                                    const MultimodalContext* mm, std::vector<ChatImage>* images) {
  const std::string where = absl::StrCat("messages[", index, "].content");
  if (content.is_null()) return json(std::string());
  if (content.is_string()) return content;
  if (!content.is_array()) {
    return InvalidParam("messages", absl::StrCat(where, " must be a string or a list of parts"));
  }
  std::vector<std::string> texts;
  std::vector<bool> is_image;
  for (size_t j = 0; j < content.size(); ++j) {
    const json& part = content[j];
    if (!part.is_object() || !part.contains("type") || !part["type"].is_string()) {
      return InvalidParam("messages", absl::StrCat(where, " parts must be objects with a type"));
    }
    const std::string type = part["type"].get<std::string>();
    if (type == "image_url" || type == "image") {
      if (mm == nullptr) {
        return InvalidParam("messages", absl::StrCat(where, " part type '", type,
                                                     "' is not supported: this model takes no "
                                                     "images"));
      }
      absl::StatusOr<ChatImage> image =
          ImagePartBytes(part, absl::StrCat(where, "[", j, "]"), *mm);
      if (!image.ok()) return image.status();
      // Checked while collecting, so a request cannot make the server decode base64 without end.
      if (static_cast<int64_t>(images->size()) >= mm->max_images_per_prompt) {
        return InvalidParam("messages",
                            absl::StrCat("At most ", mm->max_images_per_prompt,
                                         " image(s) may be provided in one prompt "
                                         "(--limit-mm-per-prompt)"));
      }
      images->push_back(*std::move(image));
      texts.emplace_back();
      is_image.push_back(true);
      continue;
    }
    if (type != "text") {
      return InvalidParam("messages",
                          absl::StrCat(where, " part type '", type, "' is not supported (",
                                       mm == nullptr ? "only 'text'" : "'text', 'image_url'",
                                       ")"));
    }
    auto text = part.find("text");
    if (text == part.end() || !text->is_string()) {
      return InvalidParam("messages", absl::StrCat(where, " text part needs a string 'text'"));
    }
    texts.push_back(text->get<std::string>());
    is_image.push_back(false);
  }
  if (mm == nullptr) return json(absl::StrJoin(texts, "\n"));
  return FlattenContent(texts, is_image, *mm, where);
}

// ChatMessages converts `messages` into the template's message list (content flattened,
// "developer" renamed "system"); image parts go to `images` in conversation order.
absl::StatusOr<json> ChatMessages(const json& messages, const MultimodalContext* mm,
                                  std::vector<ChatImage>* images) {
  json out = json::array();
  for (size_t i = 0; i < messages.size(); ++i) {
    const json& m = messages[i];
    if (!m.is_object()) return InvalidParam("messages", "each message must be an object");
    auto role = m.find("role");
    if (role == m.end() || !role->is_string()) {
      return InvalidParam("messages", absl::StrCat("messages[", i, "].role must be a string"));
    }
    std::string role_name = role->get<std::string>();
    if (role_name == "developer") role_name = "system";  // OpenAI's newer name for system
    absl::StatusOr<json> content =
        MessageContent(m.contains("content") ? m["content"] : json(), i, mm, images);
    if (!content.ok()) return content.status();
    json message{{"role", role_name}, {"content", *content}};
    if (auto name = m.find("name"); name != m.end() && name->is_string()) {
      message["name"] = *name;
    }
    if (absl::Status st = tools::AddToolMessageFields(m, i, message); !st.ok()) return st;
    out.push_back(std::move(message));
  }
  return out;
}

// RenderChatPrompt renders the conversation to the prompt text: the request's chat_template or
// the model's, with chat_template_kwargs and documents as variables; add_generation_prompt /
// continue_final_message as Hugging Face's apply_chat_template does them. Fills req.echo_texts
// for chat echo.
absl::StatusOr<std::string> RenderChatPrompt(const json& body, const ParseContext& context,
                                             GenerationRequest& req,
                                             std::vector<ChatImage>* images,
                                             const nlohmann::ordered_json& tools) {
  const json* messages = Present(body, "messages");
  if (messages == nullptr) return InvalidParam("messages", "'messages' is required");
  if (!messages->is_array() || messages->empty()) {
    return InvalidParam("messages", "'messages' must be a non-empty list");
  }
  // A request's own chat_template decides how image parts reach it (multimodal_input.h).
  std::optional<MultimodalContext> request_mm;
  const MultimodalContext* mm = context.multimodal;
  if (const json* source = Present(body, "chat_template");
      mm != nullptr && source != nullptr && source->is_string()) {
    request_mm = *mm;
    request_mm->content_format = DetectChatContentFormat(source->get<std::string>());
    mm = &*request_mm;
  }
  // Keys first: a misspelt key is named before any image in the message is decoded.
  if (absl::Status s =
          CheckMessageFields(*messages, context.allow_unknown_fields, &req.unknown_fields);
      !s.ok()) {
    return s;
  }
  absl::StatusOr<json> conversation = ChatMessages(*messages, mm, images);
  if (!conversation.ok()) return conversation.status();
  AddTemplateFields(*messages, &*conversation);

  bool add_generation_prompt = true;
  if (auto s = GetBool(body, "add_generation_prompt", &add_generation_prompt); !s.ok()) return s;
  bool continue_final = false;
  if (auto s = GetBool(body, "continue_final_message", &continue_final); !s.ok()) return s;
  const json& last = conversation->back();
  if (continue_final) {
    // vLLM: both at once is ambiguous; the message continued must be the assistant's.
    if (add_generation_prompt && Present(body, "add_generation_prompt") != nullptr) {
      return InvalidParam("continue_final_message",
                          "'continue_final_message' and 'add_generation_prompt' cannot both "
                          "be true");
    }
    if (last["role"] != "assistant") {
      return InvalidParam("continue_final_message",
                          "'continue_final_message' needs the last message to be the "
                          "assistant's");
    }
    add_generation_prompt = false;
  }

  std::unique_ptr<ChatTemplate> request_template;
  const ChatTemplate* chat_template = context.chat_template;
  if (const json* source = Present(body, "chat_template"); source != nullptr) {
    if (!source->is_string()) return TypeError("chat_template", "a string (a Jinja template)");
    // Hugging Face also takes the name of one of a tokenizer's named templates; this server
    // ships none, so a string with no Jinja markup is refused rather than rendered literally.
    const std::string& text = source->get_ref<const std::string&>();
    if (text.find("{{") == std::string::npos && text.find("{%") == std::string::npos) {
      return InvalidParam("chat_template",
                          absl::StrCat("'chat_template' must be a Jinja template; named "
                                       "templates ('", text.substr(0, 64),
                                       "') are not supported"));
    }
    absl::StatusOr<std::unique_ptr<ChatTemplate>> parsed =
        ChatTemplate::Parse(source->get<std::string>());
    if (!parsed.ok()) {
      return InvalidParam("chat_template",
                          absl::StrCat("'chat_template' does not parse: ",
                                       parsed.status().message()));
    }
    request_template = *std::move(parsed);
    chat_template = request_template.get();
  }
  if (chat_template == nullptr) {
    return InvalidParam("messages", "this model has no chat template; use /v1/completions");
  }
  // Ordered: the template's `tojson` prints tools and tool-call arguments in the client's key
  // order, as Hugging Face's apply_chat_template does.
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();
  if (!tools.is_null()) extra["tools"] = tools;  // Hugging Face's `tools=` of apply_chat_template
  // The model's special tokens, also for a request template (Parse knows none).
  if (context.chat_template != nullptr) {
    extra["bos_token"] = context.chat_template->bos_token();
    extra["eos_token"] = context.chat_template->eos_token();
  }
  // Template variables are copied (recursively): a nesting the renderer refuses anyway is
  // refused before the copy, so a deep body cannot exhaust the stack.
  const auto too_deep = [](const json& value) {
    return jinja::Value::JsonDepth(value, jinja::kMaxValueDepth) > jinja::kMaxValueDepth;
  };
  if (const json* docs = Present(body, "documents"); docs != nullptr) {
    if (!docs->is_array()) return TypeError("documents", "a list of objects");
    for (const json& doc : *docs) {
      if (!doc.is_object()) return TypeError("documents", "a list of objects");
    }
    if (too_deep(*docs)) {
      return InvalidParam("documents", absl::StrCat("'documents' is nested deeper than ",
                                                    jinja::kMaxValueDepth, " levels"));
    }
    extra["documents"] = *docs;
  }
  if (const json* kwargs = Present(body, "chat_template_kwargs"); kwargs != nullptr) {
    if (!kwargs->is_object()) return TypeError("chat_template_kwargs", "an object");
    if (too_deep(*kwargs)) {
      return InvalidParam("chat_template_kwargs",
                          absl::StrCat("'chat_template_kwargs' is nested deeper than ",
                                       jinja::kMaxValueDepth, " levels"));
    }
    for (const auto& [key, value] : kwargs->items()) {
      if (key == "messages") {
        return InvalidParam("chat_template_kwargs",
                            "'chat_template_kwargs' may not set 'messages'");
      }
      extra[key] = value;
    }
    if (kwargs->contains("add_generation_prompt")) {
      const json& v = (*kwargs)["add_generation_prompt"];
      if (!v.is_boolean()) {
        return TypeError("chat_template_kwargs", "an object whose add_generation_prompt is a "
                                                 "boolean");
      }
      add_generation_prompt = v.get<bool>();
    }
  }
  nlohmann::ordered_json ordered_conversation = *conversation;
  KeepArgumentOrder(*messages, ordered_conversation);
  absl::StatusOr<std::string> text = chat_template->RenderMessagesOrdered(
      ordered_conversation, add_generation_prompt, extra, context.render_limits);
  if (!text.ok()) {
    // Over budget or failing: 400; cancelled (client gone) or past the deadline keep their code.
    return WithParam(absl::Status(text.status().code(),
                                  absl::StrCat("chat template: ", text.status().message())),
                     Present(body, "chat_template") != nullptr ? "chat_template" : "messages");
  }
  // The final message's text (content parts: their text joined, images left out).
  std::string final_content;
  if (last["content"].is_string()) {
    final_content = last["content"].get<std::string>();
  } else {
    for (const json& part : last["content"]) {
      if (part.contains("text")) final_content += part["text"].get<std::string>();
    }
  }
  if (continue_final && !final_content.empty()) {
    // Hugging Face: cut after the final message's content (stripped, for templates that trim),
    // dropping the end-of-turn the template wrote after it.
    size_t at = text->rfind(final_content);
    size_t length = final_content.size();
    if (at == std::string::npos) {
      const size_t b = final_content.find_first_not_of(" \t\n\r");
      const size_t e = final_content.find_last_not_of(" \t\n\r");
      const std::string stripped =
          b == std::string::npos ? std::string() : final_content.substr(b, e - b + 1);
      at = stripped.empty() ? std::string::npos : text->rfind(stripped);
      length = stripped.size();
    }
    if (at == std::string::npos) {
      return InvalidParam("continue_final_message",
                          "the chat template does not render the final message's content");
    }
    text->resize(at + length);
  }
  if (auto s = GetBool(body, "echo", &req.echo); !s.ok()) return s;
  if (req.echo) {
    // vLLM: the response continues the last message when it has the response's role
    // ("assistant" with a generation prompt, else the last message's own role).
    const std::string role =
        add_generation_prompt ? "assistant" : last["role"].get<std::string>();
    req.echo_texts.push_back(last["role"] == role ? final_content : std::string());
  }
  return text;
}

}  // namespace

std::shared_ptr<const nlohmann::ordered_json> OrderedTools(std::string_view raw_body) {
  absl::StatusOr<nlohmann::ordered_json> body = ParseJsonLimited<nlohmann::ordered_json>(raw_body);
  if (!body.ok() || !body->is_object()) return nullptr;
  auto tools = body->find("tools");
  if (tools == body->end() || !tools->is_array()) return nullptr;
  return std::make_shared<const nlohmann::ordered_json>(std::move(*tools));
}

bool NeedsKeyOrder(const json& body) {
  return body.contains("response_format") || body.contains("structured_outputs") ||
         body.contains("guided_json") || body.contains("text");  // text: responses' text.format
}

std::shared_ptr<const nlohmann::ordered_json> OrderedBody(std::string_view raw_body) {
  absl::StatusOr<nlohmann::ordered_json> body = ParseJsonLimited<nlohmann::ordered_json>(raw_body);
  if (!body.ok() || !body->is_object()) return nullptr;
  return std::make_shared<const nlohmann::ordered_json>(*std::move(body));
}

absl::StatusOr<json> ParseJsonBody(std::string_view body) {
  absl::StatusOr<json> parsed_or = ParseJsonLimited(body);
  if (!parsed_or.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("The request body is ", parsed_or.status().message()));
  }
  json parsed = *std::move(parsed_or);
  if (!parsed.is_object()) {
    return absl::InvalidArgumentError("The request body must be a JSON object");
  }
  return parsed;
}

absl::StatusOr<GenerationRequest> ParseChatCompletionRequest(const json& body,
                                                             const ParseContext& context) {
  GenerationRequest req;
  req.endpoint = Endpoint::kChatCompletions;
  if (absl::Status s = CheckFields(body, FieldTable::kChatCompletions,
                                   context.allow_unknown_fields, &req.unknown_fields);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckModel(body, context, req); !s.ok()) return s;
  std::vector<ChatImage> images;
  absl::StatusOr<std::optional<tools::ToolRequest>> tool_request =
      tools::ParseToolRequest(body, context.ordered_tools.get());
  if (!tool_request.ok()) return tool_request.status();
  absl::StatusOr<std::string> text =
      RenderChatPrompt(body, context, req, &images, TemplateTools(*tool_request));
  if (!text.ok()) return text.status();
  bool add_special_tokens = false;  // the template emits BOS itself
  if (auto s = GetBool(body, "add_special_tokens", &add_special_tokens); !s.ok()) return s;
  req.prompts.push_back(
      context.tokenizer->Encode(*text, add_special_tokens, /*parse_special=*/true));
  if (context.multimodal != nullptr) {
    // Also without images: a placeholder typed as text has no image to stand for.
    absl::StatusOr<std::vector<MultimodalInput>> mm =
        EncodePromptImages(images, *context.multimodal, &req.prompts[0]);
    if (!mm.ok()) return mm.status();
    req.mm_inputs = *std::move(mm);
  }
  if (absl::Status s = ParseCommon(body, context, req); !s.ok()) return s;
  if (absl::Status s = ApplyToolRequest(*tool_request, body, context, req); !s.ok()) return s;
  return req;
}

absl::StatusOr<GenerationRequest> ParseCompletionRequest(const json& body,
                                                         const ParseContext& context) {
  GenerationRequest req;
  req.endpoint = Endpoint::kCompletions;
  if (absl::Status s = CheckFields(body, FieldTable::kCompletions, context.allow_unknown_fields,
                                   &req.unknown_fields);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckModel(body, context, req); !s.ok()) return s;
  bool add_special_tokens = true;
  if (auto s = GetBool(body, "add_special_tokens", &add_special_tokens); !s.ok()) return s;
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
    return context.tokenizer->Encode(text, add_special_tokens, /*parse_special=*/true);
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
