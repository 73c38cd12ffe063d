// GenerationSession: streaming a chat choice whose output is parsed for tool calls.
#include "services/api/generation_session.h"

namespace sluice {

using nlohmann::json;

void GenerationSession::StreamToolDelta(int32_t index, const ChoiceDelta& delta) {
  Choice& choice = choices_[index];
  tools::ToolCallStream::Delta parsed =
      choice.tool_stream->Update(choice.output->text(), delta.finished);
  json logprobs;
  if (request_.logprobs && !delta.tokens.empty()) {
    logprobs = ChatLogprobsJson(*deps_.tokenizer, delta.tokens, request_.return_tokens_as_token_ids);
  }
  // Logprobs ride on the first chunk of this delta (a content chunk with "" when the tokens
  // went into a call that has not shown its name yet).
  if (!parsed.content.empty() || (!logprobs.is_null() && parsed.tool_calls.empty())) {
    SendChunk(ChatChunkChoiceJson(index, json{{"content", parsed.content}}, logprobs, nullptr));
    logprobs = json();
  }
  // One entry per chunk, as OpenAI streams them.
  for (json& entry : parsed.tool_calls) {
    SendChunk(ChatChunkChoiceJson(index, json{{"tool_calls", json::array({std::move(entry)})}},
                                  logprobs, nullptr));
    logprobs = json();
  }
  if (delta.finished) {
    const std::string reason = choice.tool_stream->any_call() && delta.finish_reason == "stop"
                                   ? "tool_calls"
                                   : delta.finish_reason;
    SendChunk(ChatChunkChoiceJson(index, json::object(), nullptr, reason));
  }
}

}  // namespace sluice
