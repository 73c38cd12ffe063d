// /v1/responses, the stateless subset of OpenAI's Responses API: a request becomes a chat
// generation (input as a string or messages, instructions as the system message), and the
// result is a Response object or its stream of typed events, in the shapes the official SDK
// parses (openai.types.responses).
//
// Output items: messages and function calls (responses_output.h). Nothing is stored:
// store=true, previous_response_id and conversation are refused (400).
// A generation that ends by max_output_tokens has status "incomplete" with incomplete_details
// {"reason": "max_output_tokens"}; its stream still ends with response.completed (as vLLM's),
// so the SDK's responses.stream(...).get_final_response() returns it.
#ifndef SLUICE_SERVICES_API_RESPONSES_API_H_
#define SLUICE_SERVICES_API_RESPONSES_API_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "services/api/openai_protocol.h"

namespace sluice {

// ParseResponsesRequest validates a /v1/responses body against its field table, maps it to a
// chat request (input string → one user message; input items {role, content} or
// {type: "message", ...} with string or input_text/output_text parts, function_call and
// function_call_output items as assistant tool calls and tool results; instructions → a system
// message first; max_output_tokens → max_tokens; tools, tool_choice, parallel_tool_calls and
// text.format as chat's tools and response_format, responses_tools.h) and parses that. The
// result has endpoint kResponses, n = 1, and responses_echo holding the request fields a
// Response echoes.
absl::StatusOr<GenerationRequest> ParseResponsesRequest(const nlohmann::json& body,
                                                        const ParseContext& context);

// ResponseState is what a Response object reports of one generation.
struct ResponseState {
  std::string id;          // "resp_<hex>"
  int64_t created_at = 0;  // Unix seconds
  std::string model;
  std::string status;       // "in_progress" | "completed" | "incomplete"
  nlohmann::json output = nlohmann::json::array();  // the items (ResponsesOutput::Items)
  nlohmann::json usage;     // null until done
};

// ResponsesUsageJson: {input_tokens, input_tokens_details:{cached_tokens}, output_tokens,
// output_tokens_details:{reasoning_tokens: 0}, total_tokens}.
nlohmann::json ResponsesUsageJson(int64_t input_tokens, int64_t output_tokens,
                                  int64_t cached_tokens);

// ResponseObjectJson is the Response object; `echo` holds the request's echoed fields
// (GenerationRequest::responses_echo).
nlohmann::json ResponseObjectJson(const ResponseState& state, const nlohmann::json& echo);

// ResponseEvent frames one stream event: "event: <type>\ndata: <json>\n\n" where the JSON
// holds "type" and "sequence_number" plus `fields`.
std::string ResponseEvent(const std::string& type, int64_t sequence_number,
                          nlohmann::json fields);

}  // namespace sluice

#endif  // SLUICE_SERVICES_API_RESPONSES_API_H_
