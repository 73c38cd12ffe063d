// GenerationSession: one /v1/chat/completions or /v1/completions request in flight.
//
// It submits one engine request per choice (ids "<response id>-<choice>", all with the
// request's seed, generated when absent, and their choice index), turns engine outputs into
// choice text (ChoiceOutput), and writes either one JSON response or a Server-Sent Events
// stream to its ResponseSink. Engine outputs arrive on the engine thread and are handed to the
// session's executor with the Poster, so all session state is touched by one executor only.
#ifndef SLUICE_SERVICES_API_GENERATION_SESSION_H_
#define SLUICE_SERVICES_API_GENERATION_SESSION_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/tokenizer/tokenizer.h"
#include "services/api/choice_output.h"
#include "services/api/inference_backend.h"
#include "services/common/metrics.h"
#include "services/api/openai_protocol.h"
#include "services/api/openai_responses.h"
#include "services/common/response_sink.h"
#include "services/api/responses_api.h"
#include "services/api/responses_output.h"
#include "services/api/tool_calls/tool_call_output.h"

namespace sluice {

class GenerationSession : public RequestHandle,
                          public std::enable_shared_from_this<GenerationSession> {
 public:
  // Dependencies are borrowed and must outlive the session's engine requests. `on_done` runs
  // once, on the executor, when the response is complete, failed or cancelled.
  struct Deps {
    InferenceBackend* backend = nullptr;
    const Tokenizer* tokenizer = nullptr;
    ApiMetrics* metrics = nullptr;
    std::string endpoint_path;  // metrics label, e.g. "/v1/completions"
    std::function<void()> on_done;
    bool log_requests = false;  // the request log line when done (request_log.h)
    std::string user;           // the request's `user`, for that line
  };

  GenerationSession(Deps deps, GenerationRequest request, std::shared_ptr<ResponseSink> sink,
                    Poster poster);
  ~GenerationSession() override;

  // Start submits the engine requests; on a Submit error it aborts those already submitted
  // and answers with the error. Call on the executor.
  void Start();
  void Cancel() override;

  const ResponseMeta& meta() const { return meta_; }

 private:
  struct Choice {
    std::string engine_request_id;
    std::unique_ptr<ChoiceOutput> output;
    std::chrono::steady_clock::time_point first_token_time;
    std::chrono::steady_clock::time_point last_token_time;
    double queue_seconds = -1;  // engine queue time (RequestOutput::queue_seconds), once known
    bool got_first_token = false;
    bool prompt_part_sent = false;  // streamed echo / prompt logprobs (first output)
    std::unique_ptr<tools::ToolCallStream> tool_stream;  // streamed chat with tool calls
  };

  void OnOutput(int32_t index, const RequestOutput& output);
  // ObserveEnd records a choice's end in the metrics (e2e, phases, tokens, finish reason).
  void ObserveEnd(const Choice& choice, FinishReason reason,
                  std::chrono::steady_clock::time_point now);
  void StreamDelta(int32_t index, const ChoiceDelta& delta);
  // StreamToolDelta streams a chat choice parsed for tool calls: content and delta.tool_calls
  // entries (generation_session_tools.cc).
  void StreamToolDelta(int32_t index, const ChoiceDelta& delta);
  // SendChunk streams one choice as a chunk (with the usage so far when continuous, and
  // `prompt_logprobs` on the chunk unless null).
  void SendChunk(nlohmann::json choice, nlohmann::json prompt_logprobs = nullptr);
  // With echo_only (max_tokens 0): `output` without the sampled token, finished ("length").
  static RequestOutput EchoOnlyOutput(const RequestOutput& output);
  // Completions echo + logprobs: the prompt's tokens (first one null) then `generated`.
  nlohmann::json EchoLogprobsJson(int32_t index,
                                  const std::vector<TokenLogprobInfo>& generated) const;
  bool echo_with_logprobs() const { return !is_chat() && request_.echo && request_.logprobs; }
  // Usage: prompt tokens of all prompts and completion tokens of all choices so far.
  nlohmann::json Usage() const;
  void Fail(const absl::Status& status);
  void Complete();
  // Done ends the session: the request log line (`http_status`: what was sent, 499 when the
  // client went away first; `error`: why it failed), then on_done.
  void Done(int http_status = 200, const std::string& error = "");
  void AbortUnfinished();
  // ReturnedChoices: the choices a non-streamed response holds, in order (best_of: the
  // best_of_keep of each prompt with the highest cumulative logprob; else all).
  std::vector<int32_t> ReturnedChoices() const;
  bool is_chat() const { return request_.endpoint == Endpoint::kChatCompletions; }
  bool is_responses() const { return request_.endpoint == Endpoint::kResponses; }
  bool is_completions() const { return request_.endpoint == Endpoint::kCompletions; }
  // /v1/responses (generation_session_responses.cc): the opening events of a stream, the events
  // of one delta (text, or tool calls when the request has tools), one typed event, and the end
  // (the final events or the Response object).
  void StartResponseEvents();
  void StreamResponseDelta(int32_t index, const ChoiceDelta& delta);
  void SendResponseEvent(const std::string& type, nlohmann::json fields);
  void CompleteResponse();
  const char* object_name() const;

  Deps deps_;
  GenerationRequest request_;
  std::shared_ptr<ResponseSink> sink_;
  Poster poster_;
  ResponseMeta meta_;
  std::vector<Choice> choices_;
  std::vector<std::string> echo_prefixes_;  // per prompt, when echo (chat: may be empty)
  std::chrono::steady_clock::time_point arrival_;
  int32_t num_finished_ = 0;
  bool stream_started_ = false;
  ResponseState response_state_;     // /v1/responses
  std::unique_ptr<ResponsesOutput> responses_output_;  // its items (streamed: from the start)
  int64_t next_sequence_number_ = 0;  // of the next /v1/responses stream event
  bool done_ = false;
};

}  // namespace sluice

#endif  // SLUICE_SERVICES_API_GENERATION_SESSION_H_
