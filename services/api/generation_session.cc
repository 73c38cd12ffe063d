#include "services/api/generation_session.h"

#include <ctime>
#include <utility>

#include "absl/strings/str_cat.h"
#include "services/api/openai_errors.h"

namespace sluice {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

double SecondsBetween(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

GenerationSession::GenerationSession(Deps deps, GenerationRequest request,
                                     std::shared_ptr<ResponseSink> sink, Poster poster)
    : deps_(std::move(deps)),
      request_(std::move(request)),
      sink_(std::move(sink)),
      poster_(std::move(poster)),
      arrival_(Clock::now()) {
  meta_.id = NewResponseId(is_chat() ? "chatcmpl-" : "cmpl-");
  meta_.created = static_cast<int64_t>(std::time(nullptr));
  meta_.model = request_.model;
  if (request_.echo) {
    for (const std::vector<int32_t>& prompt : request_.prompts) {
      echo_prefixes_.push_back(
          deps_.tokenizer->Decode(prompt, request_.sampling.skip_special_tokens));
    }
  }
  const int32_t num_choices = request_.num_choices();
  choices_.resize(num_choices);
  for (int32_t c = 0; c < num_choices; ++c) {
    const int64_t offset_base =
        request_.echo ? static_cast<int64_t>(echo_prefixes_[c / request_.n].size()) : 0;
    choices_[c].engine_request_id = absl::StrCat(meta_.id, "-", c);
    choices_[c].output = std::make_unique<ChoiceOutput>(*deps_.tokenizer, request_.sampling,
                                                        request_.logprobs, offset_base);
  }
}

GenerationSession::~GenerationSession() = default;

const char* GenerationSession::object_name() const {
  if (is_chat()) return request_.stream ? "chat.completion.chunk" : "chat.completion";
  return "text_completion";
}

void GenerationSession::Start() {
  std::weak_ptr<GenerationSession> weak = weak_from_this();
  for (int32_t c = 0; c < static_cast<int32_t>(choices_.size()); ++c) {
    EngineRequest engine_request;
    engine_request.request_id = choices_[c].engine_request_id;
    engine_request.prompt_token_ids = request_.prompts[c / request_.n];
    engine_request.sampling = request_.sampling;
    engine_request.cache_salt = request_.cache_salt;
    engine_request.grammar = request_.grammar;
    if (request_.sampling.seed.has_value()) {
      engine_request.sampling.seed = *request_.sampling.seed + static_cast<uint64_t>(c);
    }
    // The callback keeps the session alive until the engine's final output is handled.
    std::shared_ptr<GenerationSession> self = shared_from_this();
    Poster poster = poster_;
    absl::Status status = deps_.backend->Submit(
        std::move(engine_request), [self, poster, c](const RequestOutput& output) {
          poster([self, c, output]() { self->OnOutput(c, output); });
        });
    if (!status.ok()) {
      Fail(status);  // aborts the choices already submitted (unknown ids are ignored)
      return;
    }
  }
  if (request_.stream) {
    sink_->StartEventStream();
    stream_started_ = true;
    deps_.metrics->ObserveRequest(deps_.endpoint_path, 200);
    if (is_chat()) {
      for (int32_t c = 0; c < static_cast<int32_t>(choices_.size()); ++c) {
        json delta{{"role", "assistant"}, {"content", ""}};
        json choice = ChatChunkChoiceJson(c, delta, nullptr, nullptr);
        sink_->SendEvent(SseEvent(ChunkJson(meta_, object_name(), json::array({choice}),
                                            request_.include_usage)));
      }
    } else if (request_.echo) {
      for (int32_t c = 0; c < static_cast<int32_t>(choices_.size()); ++c) {
        json choice = CompletionChoiceJson(c, echo_prefixes_[c / request_.n], nullptr, nullptr);
        sink_->SendEvent(SseEvent(ChunkJson(meta_, object_name(), json::array({choice}),
                                            request_.include_usage)));
      }
    }
  }
}

void GenerationSession::OnOutput(int32_t index, const RequestOutput& output) {
  if (done_) return;
  Choice& choice = choices_[index];
  if (choice.output->finished()) return;
  const Clock::time_point now = Clock::now();
  if (!output.new_tokens.empty()) {
    if (!choice.got_first_token) {
      choice.got_first_token = true;
      deps_.metrics->ObserveTimeToFirstToken(SecondsBetween(arrival_, now));
    } else {
      const double gap = SecondsBetween(choice.last_token_time, now) /
                         static_cast<double>(output.new_tokens.size());
      for (size_t i = 0; i < output.new_tokens.size(); ++i) {
        deps_.metrics->ObserveInterTokenLatency(gap);
      }
    }
    choice.last_token_time = now;
  }
  ChoiceDelta delta = choice.output->Push(output);
  if (delta.failed) {
    Fail(delta.error);
    return;
  }
  if (delta.stopped_by_string) deps_.backend->Abort(choice.engine_request_id);
  if (request_.stream) StreamDelta(index, delta);
  if (delta.finished) {
    deps_.metrics->ObserveE2eLatency(SecondsBetween(arrival_, now));
    deps_.metrics->AddTokens(choice.output->num_prompt_tokens(),
                             choice.output->num_output_tokens());
    if (++num_finished_ == static_cast<int32_t>(choices_.size())) Complete();
  }
}

void GenerationSession::StreamDelta(int32_t index, const ChoiceDelta& delta) {
  const bool has_logprobs = request_.logprobs && !delta.tokens.empty();
  if (!delta.text.empty() || has_logprobs) {
    json choice;
    if (is_chat()) {
      json logprobs = has_logprobs ? ChatLogprobsJson(*deps_.tokenizer, delta.tokens) : json();
      choice = ChatChunkChoiceJson(index, json{{"content", delta.text}}, logprobs, nullptr);
    } else {
      json logprobs = has_logprobs ? CompletionLogprobsJson(*deps_.tokenizer, delta.tokens,
                                                            request_.return_tokens_as_token_ids)
                                   : json();
      choice = CompletionChoiceJson(index, delta.text, logprobs, nullptr);
    }
    sink_->SendEvent(
        SseEvent(ChunkJson(meta_, object_name(), json::array({choice}), request_.include_usage)));
  }
  if (delta.finished) {
    json choice = is_chat()
                      ? ChatChunkChoiceJson(index, json::object(), nullptr, delta.finish_reason)
                      : CompletionChoiceJson(index, "", nullptr, delta.finish_reason);
    sink_->SendEvent(
        SseEvent(ChunkJson(meta_, object_name(), json::array({choice}), request_.include_usage)));
  }
}

void GenerationSession::Complete() {
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;
  int64_t completion_tokens = 0;
  for (size_t p = 0; p < request_.prompts.size(); ++p) {
    prompt_tokens += static_cast<int64_t>(request_.prompts[p].size());
    cached_tokens += choices_[p * request_.n].output->num_cached_tokens();
  }
  for (const Choice& c : choices_) completion_tokens += c.output->num_output_tokens();
  json usage = UsageJson(prompt_tokens, completion_tokens, cached_tokens);

  if (request_.stream) {
    if (request_.include_usage) {
      json chunk = ChunkJson(meta_, object_name(), json::array(), false);
      chunk["usage"] = std::move(usage);
      sink_->SendEvent(SseEvent(chunk));
    }
    sink_->SendEvent(SseDone());
    sink_->EndEventStream();
  } else {
    json choices = json::array();
    for (int32_t c = 0; c < static_cast<int32_t>(choices_.size()); ++c) {
      const ChoiceOutput& out = *choices_[c].output;
      if (is_chat()) {
        json logprobs =
            request_.logprobs ? ChatLogprobsJson(*deps_.tokenizer, out.logprobs()) : json();
        choices.push_back(ChatChoiceJson(c, out.text(), logprobs, out.finish_reason()));
      } else {
        json logprobs = request_.logprobs
                            ? CompletionLogprobsJson(*deps_.tokenizer, out.logprobs(),
                                                     request_.return_tokens_as_token_ids)
                            : json();
        std::string text = request_.echo ? echo_prefixes_[c / request_.n] + out.text()
                                         : out.text();
        choices.push_back(CompletionChoiceJson(c, text, logprobs, out.finish_reason()));
      }
    }
    sink_->SendResponse(200, "application/json",
                        DumpJson(ResponseJson(meta_, object_name(), std::move(choices),
                                              std::move(usage))));
    deps_.metrics->ObserveRequest(deps_.endpoint_path, 200);
  }
  Done();
}

void GenerationSession::AbortUnfinished() {
  for (Choice& c : choices_) {
    if (!c.output->finished()) deps_.backend->Abort(c.engine_request_id);
  }
}

void GenerationSession::Fail(const absl::Status& status) {
  if (done_) return;
  AbortUnfinished();
  const json error = OpenAiErrorJson(status);
  if (stream_started_) {
    // Mid-stream errors travel as an event; the SDKs raise APIError on {"error": ...}.
    sink_->SendEvent(SseEvent(error));
    sink_->SendEvent(SseDone());
    sink_->EndEventStream();
  } else {
    const int http = HttpStatusFor(status);
    sink_->SendResponse(http, "application/json", DumpJson(error));
    deps_.metrics->ObserveRequest(deps_.endpoint_path, http);
  }
  Done();
}

void GenerationSession::Cancel() {
  if (done_) return;
  AbortUnfinished();
  Done();
}

void GenerationSession::Done() {
  if (done_) return;
  done_ = true;
  if (deps_.on_done) deps_.on_done();
}

}  // namespace sluice
