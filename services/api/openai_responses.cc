#include "services/api/openai_responses.h"

#include <cmath>
#include <mutex>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/tokenizer/byte_level.h"
#include "engine/tokenizer/incremental_detokenizer.h"

namespace sluice {
namespace {

using nlohmann::json;

// JSON has no -inf: clamp like vLLM (-9999.0) so clients can parse every logprob.
double FiniteLogprob(float logprob) {
  if (std::isnan(logprob)) return -9999.0;
  return std::max(static_cast<double>(logprob), -9999.0);
}

json BytesJson(const std::string& bytes) {
  json out = json::array();
  for (unsigned char c : bytes) out.push_back(static_cast<int>(c));
  return out;
}

// TokenText is a token's text as a continuation of the text before it (what vLLM reports,
// decoding with context): SentencePiece's "▁the" is " the", although decoding that id alone
// drops the space (the Strip decoder removes the text's first space). Bytes that are not valid
// UTF-8 on their own (part of a character) become U+FFFD.
std::string TokenText(const Tokenizer& tokenizer, int32_t id) {
  const int32_t ids[1] = {id};
  std::string text;
  byte_level::AppendUtf8Lossy(tokenizer.DecodeBytes(ids, /*skip_special_tokens=*/false), &text);
  return text;
}

std::string TokenBytes(const Tokenizer& tokenizer, int32_t id) {
  const int32_t ids[1] = {id};
  return tokenizer.DecodeBytes(ids, /*skip_special_tokens=*/false);
}

}  // namespace

std::string NewResponseId(const std::string& prefix) {
  static std::mutex mu;
  static std::mt19937_64 rng(std::random_device{}());
  uint64_t a, b;
  {
    std::lock_guard<std::mutex> lock(mu);
    a = rng();
    b = rng();
  }
  char hex[33];
  std::snprintf(hex, sizeof(hex), "%016llx%016llx", static_cast<unsigned long long>(a),
                static_cast<unsigned long long>(b));
  return prefix + hex;
}

json UsageJson(int64_t prompt_tokens, int64_t completion_tokens, int64_t cached_tokens) {
  return json{{"prompt_tokens", prompt_tokens},
              {"completion_tokens", completion_tokens},
              {"total_tokens", prompt_tokens + completion_tokens},
              {"prompt_tokens_details", {{"cached_tokens", cached_tokens}}}};
}

json ChatLogprobsJson(const Tokenizer& tokenizer, const std::vector<TokenLogprobInfo>& tokens,
                      bool tokens_as_ids) {
  auto name = [&](int32_t id) {
    return tokens_as_ids ? absl::StrCat("token_id:", id) : TokenText(tokenizer, id);
  };
  json content = json::array();
  for (const TokenLogprobInfo& t : tokens) {
    json top = json::array();
    for (const TokenLogprob& alt : t.top_logprobs) {
      top.push_back({{"token", name(alt.token_id)},
                     {"logprob", FiniteLogprob(alt.logprob)},
                     {"bytes", BytesJson(TokenBytes(tokenizer, alt.token_id))}});
    }
    content.push_back({{"token", name(t.token_id)},
                       {"logprob", FiniteLogprob(t.logprob)},
                       {"bytes", BytesJson(TokenBytes(tokenizer, t.token_id))},
                       {"top_logprobs", std::move(top)}});
  }
  return json{{"content", std::move(content)}, {"refusal", nullptr}};
}

json CompletionLogprobsJson(const Tokenizer& tokenizer,
                            const std::vector<TokenLogprobInfo>& tokens, bool tokens_as_ids) {
  auto name = [&](int32_t id) {
    return tokens_as_ids ? absl::StrCat("token_id:", id) : TokenText(tokenizer, id);
  };
  json out_tokens = json::array();
  json token_logprobs = json::array();
  json top_logprobs = json::array();
  json text_offset = json::array();
  for (const TokenLogprobInfo& t : tokens) {
    out_tokens.push_back(name(t.token_id));
    text_offset.push_back(t.text_offset);
    if (!t.has_logprob) {  // the first prompt token: nothing predicts it
      token_logprobs.push_back(nullptr);
      top_logprobs.push_back(nullptr);
      continue;
    }
    token_logprobs.push_back(FiniteLogprob(t.logprob));
    json top = json::object();
    for (const TokenLogprob& alt : t.top_logprobs) {
      const std::string key = name(alt.token_id);
      if (!top.contains(key)) top[key] = FiniteLogprob(alt.logprob);
    }
    // OpenAI: "the API will always return the logprob of the sampled token, so there may be
    // up to logprobs+1 elements".
    const std::string sampled = name(t.token_id);
    if (!top.contains(sampled)) top[sampled] = FiniteLogprob(t.logprob);
    top_logprobs.push_back(std::move(top));
  }
  return json{{"tokens", std::move(out_tokens)},
              {"token_logprobs", std::move(token_logprobs)},
              {"top_logprobs", std::move(top_logprobs)},
              {"text_offset", std::move(text_offset)}};
}

std::vector<TokenLogprobInfo> PromptTokenInfos(const Tokenizer& tokenizer,
                                               const std::vector<int32_t>& prompt,
                                               const std::vector<PromptLogprob>& prompt_logprobs,
                                               bool skip_special_tokens) {
  std::vector<TokenLogprobInfo> out;
  out.reserve(prompt.size());
  IncrementalDetokenizer detokenizer(tokenizer, skip_special_tokens);
  int64_t offset = 0;
  for (size_t i = 0; i < prompt.size(); ++i) {
    TokenLogprobInfo info;
    info.token_id = prompt[i];
    info.text_offset = offset;
    if (i == 0 || i - 1 >= prompt_logprobs.size()) {
      info.has_logprob = false;
    } else {
      info.logprob = prompt_logprobs[i - 1].logprob;
      info.top_logprobs = prompt_logprobs[i - 1].top_logprobs;
    }
    out.push_back(std::move(info));
    offset += static_cast<int64_t>(detokenizer.Push(prompt[i]).size());
  }
  return out;
}

json PromptLogprobsJson(const Tokenizer& tokenizer,
                        const std::vector<PromptLogprob>& prompt_logprobs) {
  json out = json::array({nullptr});
  for (const PromptLogprob& p : prompt_logprobs) {
    json entry = json::object();
    auto add = [&](int32_t id, float logprob, int32_t rank) {
      const std::string key = std::to_string(id);
      if (entry.contains(key)) return;
      entry[key] = json{{"logprob", FiniteLogprob(logprob)},
                        {"rank", rank},
                        {"decoded_token", TokenText(tokenizer, id)}};
    };
    add(p.token_id, p.logprob, p.rank);
    for (size_t r = 0; r < p.top_logprobs.size(); ++r) {
      add(p.top_logprobs[r].token_id, p.top_logprobs[r].logprob, static_cast<int32_t>(r + 1));
    }
    out.push_back(std::move(entry));
  }
  return out;
}

json ChatChoiceJson(int32_t index, const std::string& content, const json& logprobs,
                    const std::string& finish_reason) {
  return json{{"index", index},
              {"message", {{"role", "assistant"}, {"content", content}, {"refusal", nullptr}}},
              {"logprobs", logprobs},
              {"finish_reason", finish_reason}};
}

json CompletionChoiceJson(int32_t index, const std::string& text, const json& logprobs,
                          const json& finish_reason) {
  return json{{"index", index},
              {"text", text},
              {"logprobs", logprobs},
              {"finish_reason", finish_reason}};
}

json ChatChunkChoiceJson(int32_t index, const json& delta, const json& logprobs,
                         const json& finish_reason) {
  return json{{"index", index},
              {"delta", delta},
              {"logprobs", logprobs},
              {"finish_reason", finish_reason}};
}

json ResponseJson(const ResponseMeta& meta, const char* object, json choices, json usage) {
  return json{{"id", meta.id},        {"object", object},
              {"created", meta.created}, {"model", meta.model},
              {"seed", meta.seed},       {"choices", std::move(choices)},
              {"usage", std::move(usage)}};
}

json ChunkJson(const ResponseMeta& meta, const char* object, json choices,
               bool with_usage_null) {
  json chunk{{"id", meta.id},
             {"object", object},
             {"created", meta.created},
             {"model", meta.model},
             {"seed", meta.seed},
             {"choices", std::move(choices)}};
  if (with_usage_null) chunk["usage"] = nullptr;
  return chunk;
}

std::string DumpJson(const json& value) {
  return value.dump(-1, ' ', /*ensure_ascii=*/false, json::error_handler_t::replace);
}

std::string SseEvent(const json& value) { return absl::StrCat("data: ", DumpJson(value), "\n\n"); }

std::string SseDone() { return "data: [DONE]\n\n"; }

}  // namespace sluice
