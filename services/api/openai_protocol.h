// Parsing and validation of OpenAI request bodies (/v1/chat/completions, /v1/completions).
//
// A body becomes a GenerationRequest: tokenized prompt(s), resolved SamplingParams, and the
// response options (n, streaming, logprobs, echo). Every rejection is InvalidArgument with the
// offending request field as the "param" payload (see InvalidParam in openai_errors.h), except
// an unknown model, which is NotFound (param "model").
#ifndef SLUICE_SERVICES_API_OPENAI_PROTOCOL_H_
#define SLUICE_SERVICES_API_OPENAI_PROTOCOL_H_

#include <cstdint>
#include <optional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/grammar/grammar_compiler.h"
#include "engine/sample/sampling_params.h"
#include "engine/tokenizer/chat_template.h"
#include "engine/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"
#include "services/api/multimodal_input.h"
#include "services/api/tool_calls/tool_call_syntax.h"

namespace sluice {

// Endpoint is the OpenAI API a request came through; it selects the response shapes.
enum class Endpoint { kChatCompletions, kCompletions, kResponses };

// GenerationRequest is a validated request. Choice c (0 <= c < num_choices()) generates from
// prompts[c / n]; its response index is c.
struct GenerationRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string model;                          // the served model name it asked for
  std::vector<std::vector<int32_t>> prompts;  // token ids, one entry per prompt (chat: 1)
  SamplingParams sampling;                    // max_tokens resolved against the context
  bool max_tokens_given = false;              // false: max_tokens = context left per prompt
  int32_t n = 1;                              // choices generated per prompt, 1..16
  // best_of > n: n above is best_of, and the best_of_keep (the request's n) choices of each
  // prompt with the highest cumulative logprob are returned; 0: all n are.
  int32_t best_of_keep = 0;
  bool stream = false;
  bool include_usage = false;                 // stream_options.include_usage
  // stream_options.continuous_usage_stats (vLLM): usage on every chunk (implies include_usage).
  bool continuous_usage_stats = false;
  bool logprobs = false;                      // return logprobs for sampled tokens
  int32_t top_logprobs = 0;                   // alternatives per token, 0..20
  bool echo = false;                          // prepend echo_texts[prompt] to the choice text
  // Completions max_tokens 0 with echo (vLLM, the legacy OpenAI API): the prompt is scored
  // and echoed without a completion. The engine still samples one token (sampling.max_tokens
  // is 1); the session leaves it out of the reply.
  bool echo_only = false;
  // With echo: per prompt, the text to prepend — completions: the decoded prompt (filled by
  // the session); chat: the last message's content when it has the response's role (vLLM).
  std::vector<std::string> echo_texts;
  // Prompt logprobs wanted (completions echo+logprobs, or prompt_logprobs): per prompt token
  // after the first, its logprob and this many alternatives. Unset: none.
  std::optional<int32_t> prompt_logprobs;
  bool prompt_logprobs_field = false;  // `prompt_logprobs` was asked: vLLM's field in the reply
  bool return_tokens_as_token_ids = false;    // completions logprobs tokens as "token_id:N"
  std::string cache_salt;                     // prefix-cache namespace (vLLM extra), 1..256 B
  // Scheduling class (vLLM extra): lower is prefilled first under --scheduling-policy priority
  // or shortest_prefill_first; ignored under fcfs. Any int32; default 0.
  int32_t priority = 0;
  // Fields outside the endpoint's table, accepted because unknown fields are allowed (for a
  // warning in the log).
  std::vector<std::string> unknown_fields;
  // /v1/responses: the request fields its Response object echoes (responses_api.h).
  nlohmann::json responses_echo;
  // Structured output (response_format, structured_outputs, guided_*): null when unconstrained.
  std::shared_ptr<const grammar::CompiledGrammar> grammar;
  // Chat with images: the prompt's images (placeholders already expanded in prompts[0]),
  // handed to every choice's EngineRequest.
  std::vector<MultimodalInput> mm_inputs;
  // Tool calling (chat with tools, tool_choice not "none"): the syntax the output is parsed
  // with into message.tool_calls (services/api/chat_tools.h); null: the output is content.
  std::shared_ptr<const tools::ToolCallSyntax> tool_call_syntax;

  int32_t num_choices() const { return static_cast<int32_t>(prompts.size()) * n; }
};

// ParseContext is what parsing needs from the deployment. Pointers are borrowed.
struct ParseContext {
  const Tokenizer* tokenizer = nullptr;
  const ChatTemplate* chat_template = nullptr;  // null: chat requests get 400
  std::string served_model_name;
  int32_t max_model_len = 0;  // prompt + output tokens per sequence
  // Fields outside the endpoint's table are accepted (listed in unknown_fields) instead of
  // refused with 400 (`--allow-unknown-fields`).
  bool allow_unknown_fields = false;
  // Compiles structured-output constraints (services/api/structured_output.h); null: they are
  // refused with 400.
  grammar::GrammarCompiler* grammar_compiler = nullptr;
  // Work budget of the chat template render (jinja/budget.h): a template from the request, and
  // the model's on client data, must end in bounded time; the service sets its cancellation
  // flag (client gone) and deadline.
  jinja::RenderLimits render_limits;
  // Prompt logprobs are returned whole in one response: (prompt tokens x (1 + alternatives) x
  // n) entries, each a few hundred bytes of JSON. More than this many → 400.
  int64_t max_prompt_logprob_entries = int64_t{1} << 20;
  // Vision-language models: image content parts are accepted (multimodal_input.h); null:
  // they are refused with 400.
  const MultimodalContext* multimodal = nullptr;
  // The model's tool-call syntax (`--tool-call-parser`); null: found in the chat template.
  std::shared_ptr<const tools::ToolCallSyntax> tool_call_syntax;
  // The body's `tools` in the client's key order (OrderedTools), for the chat template; null:
  // the template sees their keys sorted.
  std::shared_ptr<const nlohmann::ordered_json> ordered_tools;
  // The whole body parsed keeping key order (OrderedBody): JSON Schemas given as objects
  // (response_format, structured_outputs.json, guided_json) take their property order from it,
  // which generated objects follow; null: their properties come sorted.
  std::shared_ptr<const nlohmann::ordered_json> ordered_body;
};

// ParseJsonBody parses a request body. Errors: InvalidArgument for malformed JSON or a body
// that is not a JSON object (no exception escapes).
absl::StatusOr<nlohmann::json> ParseJsonBody(std::string_view body);

// OrderedTools parses a raw body again keeping object key order and returns its `tools` list
// (null when there is none, or the body does not parse): nlohmann::json sorts keys, while chat
// templates print tools as the client wrote them (Hugging Face's `tojson`).
std::shared_ptr<const nlohmann::ordered_json> OrderedTools(std::string_view raw_body);

// NeedsKeyOrder: the body carries a JSON Schema whose property order counts
// (response_format, structured_outputs, guided_json, responses' text.format).
bool NeedsKeyOrder(const nlohmann::json& body);
// OrderedBody parses a raw body again keeping object key order (null when it does not parse
// as an object).
std::shared_ptr<const nlohmann::ordered_json> OrderedBody(std::string_view raw_body);

// Every field of a body is checked against the endpoint's table first (openai_fields.h): refused
// and unknown fields give 400 naming them.
//
// ParseChatCompletionRequest validates a /v1/chat/completions body: renders `messages` with
// the chat template (the request's `chat_template` if given, else the model's;
// add_generation_prompt defaults to true; `chat_template_kwargs` and `documents` are template
// variables; continue_final_message cuts the text after the last message's content) and
// tokenizes the result with add_special_tokens (default false: the template emits BOS itself),
// parse_special=true.
absl::StatusOr<GenerationRequest> ParseChatCompletionRequest(const nlohmann::json& body,
                                                             const ParseContext& context);

// ParseCompletionRequest validates a /v1/completions body. `prompt` may be a string, a list of
// strings, a list of token ids, or a list of token-id lists (each list entry is one prompt);
// strings are tokenized with add_special_tokens=true.
absl::StatusOr<GenerationRequest> ParseCompletionRequest(const nlohmann::json& body,
                                                         const ParseContext& context);

}  // namespace sluice

#endif  // SLUICE_SERVICES_API_OPENAI_PROTOCOL_H_
