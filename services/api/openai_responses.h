// Builders of OpenAI response JSON: chat.completion(.chunk), text_completion, usage, logprobs,
// and Server-Sent Events framing.
//
// Shapes follow the OpenAI API reference (and what the official Python SDK parses):
//   chat:  {id:"chatcmpl-…", object:"chat.completion", created, model,
//           choices:[{index, message:{role, content}, logprobs, finish_reason}], usage}
//   chunk: {id, object:"chat.completion.chunk", created, model,
//           choices:[{index, delta, logprobs, finish_reason}] [, usage]}
//   completions: {id:"cmpl-…", object:"text_completion", created, model,
//           choices:[{index, text, logprobs:{tokens, token_logprobs, top_logprobs,
//           text_offset}, finish_reason}], usage}
#ifndef SLUICE_SERVICES_API_OPENAI_RESPONSES_H_
#define SLUICE_SERVICES_API_OPENAI_RESPONSES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "engine/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"
#include "services/api/choice_output.h"

namespace sluice {

// ResponseMeta is shared by every object of one response.
struct ResponseMeta {
  std::string id;       // "chatcmpl-<hex>" or "cmpl-<hex>"
  int64_t created = 0;  // Unix seconds
  std::string model;
  // The request's sampling seed (given, or generated when the request had none), as the client
  // sends it back in `seed` to reproduce the response.
  int64_t seed = 0;
};

// NewResponseId returns `prefix` followed by 32 random hex digits (thread-safe).
std::string NewResponseId(const std::string& prefix);

// UsageJson: {prompt_tokens, completion_tokens, total_tokens, prompt_tokens_details:
// {cached_tokens}}.
nlohmann::json UsageJson(int64_t prompt_tokens, int64_t completion_tokens,
                         int64_t cached_tokens);

// ChatLogprobsJson: {content:[{token, logprob, bytes, top_logprobs:[{token, logprob, bytes}]}]}.
// `token` is the token's decoded text (U+FFFD for a partial character), `bytes` its raw bytes.
// With tokens_as_ids, `token` is "token_id:N" (vLLM's return_tokens_as_token_ids).
nlohmann::json ChatLogprobsJson(const Tokenizer& tokenizer,
                                const std::vector<TokenLogprobInfo>& tokens,
                                bool tokens_as_ids = false);

// CompletionLogprobsJson: {tokens, token_logprobs, top_logprobs:[{token: logprob}],
// text_offset}; each top_logprobs dict also holds the sampled token (OpenAI: up to logprobs+1
// entries). With tokens_as_ids, tokens (and top_logprobs keys) are "token_id:N" (vLLM's
// return_tokens_as_token_ids).
nlohmann::json CompletionLogprobsJson(const Tokenizer& tokenizer,
                                      const std::vector<TokenLogprobInfo>& tokens,
                                      bool tokens_as_ids);

// PromptTokenInfos: the prompt's tokens as logprob entries for completions echo + logprobs —
// the first without a logprob (null), then prompt_logprobs[i - 1] for token i — with text
// offsets into the prompt's decoded text.
std::vector<TokenLogprobInfo> PromptTokenInfos(const Tokenizer& tokenizer,
                                               const std::vector<int32_t>& prompt,
                                               const std::vector<PromptLogprob>& prompt_logprobs,
                                               bool skip_special_tokens);

// PromptLogprobsJson is vLLM's `prompt_logprobs`: [null, {"<id>": {logprob, rank,
// decoded_token}}, ...], one entry per prompt token; each dict holds the prompt token and its
// top alternatives.
nlohmann::json PromptLogprobsJson(const Tokenizer& tokenizer,
                                  const std::vector<PromptLogprob>& prompt_logprobs);

// ChatChoiceJson is one non-streamed chat choice.
nlohmann::json ChatChoiceJson(int32_t index, const std::string& content,
                              const nlohmann::json& logprobs, const std::string& finish_reason);
// CompletionChoiceJson is one completions choice (also a streamed one).
nlohmann::json CompletionChoiceJson(int32_t index, const std::string& text,
                                    const nlohmann::json& logprobs,
                                    const nlohmann::json& finish_reason);
// ChatChunkChoiceJson is one streamed chat choice: {index, delta, logprobs, finish_reason}.
nlohmann::json ChatChunkChoiceJson(int32_t index, const nlohmann::json& delta,
                                   const nlohmann::json& logprobs,
                                   const nlohmann::json& finish_reason);

// ResponseJson wraps choices as a full response; `object` is "chat.completion" or
// "text_completion".
nlohmann::json ResponseJson(const ResponseMeta& meta, const char* object,
                            nlohmann::json choices, nlohmann::json usage);
// ChunkJson wraps streamed choices; `object` is "chat.completion.chunk" or "text_completion".
// with_usage_null adds "usage": null (streams with include_usage).
nlohmann::json ChunkJson(const ResponseMeta& meta, const char* object, nlohmann::json choices,
                         bool with_usage_null);

// DumpJson serializes without throwing: invalid UTF-8 is replaced by U+FFFD.
std::string DumpJson(const nlohmann::json& value);

// SseEvent frames one Server-Sent Event carrying `value`: "data: <json>\n\n".
std::string SseEvent(const nlohmann::json& value);
// SseDone is the OpenAI end-of-stream event "data: [DONE]\n\n".
std::string SseDone();

}  // namespace sluice

#endif  // SLUICE_SERVICES_API_OPENAI_RESPONSES_H_
