// The keys of a chat message: which are known, which are required, and the ones that reach the
// chat template as they are. OpenAI and vLLM refuse a user message without content, and the
// field rule (openai_fields.h) refuses unknown keys inside messages as it does at the top level.
#ifndef SLUICE_SERVICES_API_MESSAGE_FIELDS_H_
#define SLUICE_SERVICES_API_MESSAGE_FIELDS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "nlohmann/json.hpp"

namespace sluice {

// CheckMessageFields checks every message of `messages` (a list; non-objects and messages
// without a string role are left to the message parser):
// - keys other than role, content, name, tool_calls, tool_call_id and reasoning_content, and
//   keys of content parts other than those of their type (text: type, text; image_url: type,
//   image_url {url, detail}; image: type, image, url), are a 400 "Unrecognized request argument
//   supplied: messages[i].KEY" / "messages[i].content[j].KEY" (param "messages"), or, with
//   allow_unknown, appended to `unknown`;
// - `content` absent or null is a 400 except on an assistant message with tool_calls;
// - name, tool_call_id and reasoning_content must be strings.
absl::Status CheckMessageFields(const nlohmann::json& messages, bool allow_unknown,
                                std::vector<std::string>* unknown);

// AddTemplateFields copies each message's tool_call_id and reasoning_content (when strings)
// into the template's message list `conversation` (built from `messages`, same order), where
// templates read them (tool results, Qwen3/DeepSeek reasoning).
void AddTemplateFields(const nlohmann::json& messages, nlohmann::json* conversation);

}  // namespace sluice

#endif  // SLUICE_SERVICES_API_MESSAGE_FIELDS_H_
