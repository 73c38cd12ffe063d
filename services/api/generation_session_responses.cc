// GenerationSession: the /v1/responses side — Response object, typed stream events, and the
// output items (responses_output.h), parsed for function calls when the request has tools.
#include <utility>

#include "services/api/generation_session.h"
#include "services/api/tool_calls/tool_call_output.h"

namespace sluice {

using nlohmann::json;

void GenerationSession::StartResponseEvents() {
  response_state_.id = meta_.id;
  response_state_.created_at = meta_.created;
  response_state_.model = meta_.model;
  response_state_.status = "in_progress";
  const json response = ResponseObjectJson(response_state_, request_.responses_echo);
  SendResponseEvent("response.created", {{"response", response}});
  SendResponseEvent("response.in_progress", {{"response", response}});
  // Items open as their text or calls arrive.
  responses_output_ = std::make_unique<ResponsesOutput>(
      [this](const std::string& type, json fields) { SendResponseEvent(type, std::move(fields)); });
}

void GenerationSession::StreamResponseDelta(int32_t index, const ChoiceDelta& delta) {
  Choice& choice = choices_[index];
  if (choice.tool_stream == nullptr) {
    responses_output_->AddText(delta.text);
    return;
  }
  tools::ToolCallStream::Delta parsed =
      choice.tool_stream->Update(choice.output->text(), delta.finished);
  responses_output_->AddText(parsed.content);
  for (const json& entry : parsed.tool_calls) responses_output_->AddToolCallDelta(entry);
}

void GenerationSession::SendResponseEvent(const std::string& type, json fields) {
  sink_->SendEvent(ResponseEvent(type, next_sequence_number_++, std::move(fields)));
}

void GenerationSession::CompleteResponse() {
  const ChoiceOutput& out = *choices_[0].output;
  const bool incomplete = out.finish_reason() == "length";
  if (responses_output_ == nullptr) {  // not streamed: the finished text, parsed at once
    response_state_.id = meta_.id;
    response_state_.created_at = meta_.created;
    response_state_.model = meta_.model;
    responses_output_ = std::make_unique<ResponsesOutput>();
    if (request_.tool_call_syntax != nullptr) {
      tools::ToolCallMessage message =
          tools::ParseToolCallMessage(*request_.tool_call_syntax, out.text());
      if (message.content.is_string()) {
        responses_output_->AddText(message.content.get_ref<const std::string&>());
      }
      responses_output_->AddToolCalls(message.tool_calls);
    } else {
      responses_output_->AddText(out.text());
    }
  }
  responses_output_->Finish(incomplete);
  response_state_.output = responses_output_->Items();
  response_state_.status = incomplete ? "incomplete" : "completed";
  response_state_.usage = ResponsesUsageJson(out.num_prompt_tokens(), out.num_output_tokens(),
                                             out.num_cached_tokens());
  const json response = ResponseObjectJson(response_state_, request_.responses_echo);
  if (!request_.stream) {
    sink_->SendResponse(200, "application/json", DumpJson(response));
    deps_.metrics->ObserveRequest(deps_.endpoint_path, 200);
    return;
  }
  SendResponseEvent("response.completed", {{"response", response}});
  sink_->EndEventStream();
}

}  // namespace sluice
