#include "services/api/generation_session.h"

#include <algorithm>
#include <ctime>
#include <numeric>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/sample/philox.h"
#include "services/api/chat_tools.h"
#include "services/api/openai_errors.h"
#include "services/api/request_log.h"
#include "services/api/responses_api.h"
#include "services/common/vllm_metrics.h"
#include "services/serve/log.h"

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
  meta_.id = NewResponseId(is_responses() ? "resp_" : is_chat() ? "chatcmpl-" : "cmpl-");
  meta_.created = static_cast<int64_t>(std::time(nullptr));
  meta_.model = request_.model;
  // Every response can be reproduced: a request without a seed gets one, reported in `seed`.
  if (!request_.sampling.seed.has_value()) request_.sampling.seed = NewRandomSeed();
  meta_.seed = static_cast<int64_t>(*request_.sampling.seed);
  // /v1/responses reports it too (a Sluice extra beside the Response object's fields).
  if (is_responses()) request_.responses_echo["seed"] = meta_.seed;
  if (request_.echo) {
    if (is_chat()) {
      echo_prefixes_ = request_.echo_texts;
    } else {
      for (const std::vector<int32_t>& prompt : request_.prompts) {
        echo_prefixes_.push_back(
            deps_.tokenizer->Decode(prompt, request_.sampling.skip_special_tokens));
      }
    }
  }
  const int32_t num_choices = request_.num_choices();
  choices_.resize(num_choices);
  for (int32_t c = 0; c < num_choices; ++c) {
    const int64_t offset_base = request_.echo && !is_chat()
                                    ? static_cast<int64_t>(echo_prefixes_[c / request_.n].size())
                                    : 0;
    choices_[c].engine_request_id = absl::StrCat(meta_.id, "-", c);
    choices_[c].output = std::make_unique<ChoiceOutput>(*deps_.tokenizer, request_.sampling,
                                                        request_.logprobs, offset_base);
    if (!is_completions() && request_.stream && request_.tool_call_syntax != nullptr) {
      choices_[c].tool_stream = std::make_unique<tools::ToolCallStream>(request_.tool_call_syntax);
    }
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
    engine_request.priority = request_.priority;
    engine_request.sampling.choice_index = static_cast<uint32_t>(c);  // choices share the seed
    engine_request.grammar = request_.grammar;
    engine_request.mm_inputs = request_.mm_inputs;  // shared embeddings, copied by pointer
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
    if (is_responses()) {
      StartResponseEvents();
    } else if (is_chat()) {
      for (int32_t c = 0; c < static_cast<int32_t>(choices_.size()); ++c) {
        json delta{{"role", "assistant"}, {"content", ""}};
        SendChunk(ChatChunkChoiceJson(c, delta, nullptr, nullptr));
        if (request_.echo && !echo_prefixes_[c / request_.n].empty()) {
          SendChunk(ChatChunkChoiceJson(c, json{{"content", echo_prefixes_[c / request_.n]}},
                                        nullptr, nullptr));
        }
      }
    } else if (request_.echo && !echo_with_logprobs()) {
      // With logprobs the echo waits for the prompt logprobs (StreamDelta).
      for (int32_t c = 0; c < static_cast<int32_t>(choices_.size()); ++c) {
        SendChunk(CompletionChoiceJson(c, echo_prefixes_[c / request_.n], nullptr, nullptr));
      }
    }
  }
}

void GenerationSession::OnOutput(int32_t index, const RequestOutput& output) {
  if (done_) return;
  Choice& choice = choices_[index];
  if (choice.output->finished()) return;
  const Clock::time_point now = Clock::now();
  if (output.queue_seconds >= 0) choice.queue_seconds = output.queue_seconds;
  if (!output.new_tokens.empty()) {
    if (!choice.got_first_token) {
      choice.got_first_token = true;
      choice.first_token_time = now;
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
  ChoiceDelta delta = request_.echo_only ? choice.output->Push(EchoOnlyOutput(output))
                                         : choice.output->Push(output);
  if (delta.failed) {
    if (output.finish_reason == FinishReason::kAbort) ObserveEnd(choice, FinishReason::kAbort, now);
    Fail(delta.error);
    return;
  }
  if (delta.stopped_by_string || (delta.finished && !output.finished())) {
    deps_.backend->Abort(choice.engine_request_id);  // the choice ended before the engine's
  }
  if (request_.stream) StreamDelta(index, delta);
  if (delta.finished) {
    ObserveEnd(choice, delta.finish_reason == "length" ? FinishReason::kLength : FinishReason::kStop,
               now);
    if (++num_finished_ == static_cast<int32_t>(choices_.size())) Complete();
  }
}

RequestOutput GenerationSession::EchoOnlyOutput(const RequestOutput& output) {
  RequestOutput out = output;
  if (!out.new_tokens.empty()) {
    // The token sampled after the prompt is not part of a max_tokens 0 reply: the choice
    // ends there, with the prompt (and its logprobs) only.
    out.new_tokens.clear();
    if (out.finish_reason == FinishReason::kNone || out.finish_reason == FinishReason::kStop) {
      out.finish_reason = FinishReason::kLength;
    }
  }
  return out;
}

void GenerationSession::ObserveEnd(const Choice& choice, FinishReason reason,
                                   Clock::time_point now) {
  FinishedRequest end;
  end.finish_reason = reason;
  end.num_prompt_tokens = choice.output->num_prompt_tokens();
  end.num_generation_tokens = choice.output->num_output_tokens();
  end.num_cached_tokens = choice.output->num_cached_tokens();
  end.e2e_seconds = SecondsBetween(arrival_, now);
  end.queue_seconds = choice.queue_seconds;
  if (choice.got_first_token) {
    // Prefill: first scheduled -> first token (arrival -> first token less the queue time).
    end.prefill_seconds = std::max(
        0.0, SecondsBetween(arrival_, choice.first_token_time) - std::max(0.0, choice.queue_seconds));
    end.decode_seconds = SecondsBetween(choice.first_token_time, choice.last_token_time);
  }
  deps_.metrics->ObserveFinished(end);
}

void GenerationSession::StreamDelta(int32_t index, const ChoiceDelta& delta) {
  if (is_responses()) {
    StreamResponseDelta(index, delta);
    return;
  }
  // The first output of a choice carries its prompt logprobs (when asked).
  if (!choices_[index].prompt_part_sent) {
    choices_[index].prompt_part_sent = true;
    const ChoiceOutput& out = *choices_[index].output;
    if (echo_with_logprobs()) {
      // The echoed prompt with its tokens' logprobs, before the first generated text.
      json choice = CompletionChoiceJson(index, echo_prefixes_[index / request_.n],
                                         EchoLogprobsJson(index, {}), nullptr);
      if (request_.prompt_logprobs_field) {
        choice["prompt_logprobs"] = PromptLogprobsJson(*deps_.tokenizer, out.prompt_logprobs());
      }
      SendChunk(std::move(choice));
    } else if (request_.prompt_logprobs_field && !is_responses()) {
      json choice = is_chat() ? ChatChunkChoiceJson(index, json::object(), nullptr, nullptr)
                              : CompletionChoiceJson(index, "", nullptr, nullptr);
      json prompt_logprobs = PromptLogprobsJson(*deps_.tokenizer, out.prompt_logprobs());
      // vLLM: on the choice for completions, on the chunk for chat.
      if (is_chat()) {
        SendChunk(std::move(choice), std::move(prompt_logprobs));
      } else {
        choice["prompt_logprobs"] = std::move(prompt_logprobs);
        SendChunk(std::move(choice));
      }
    }
  }
  if (choices_[index].tool_stream != nullptr) {
    StreamToolDelta(index, delta);
    return;
  }
  const bool has_logprobs = request_.logprobs && !delta.tokens.empty();
  if (!delta.text.empty() || has_logprobs) {
    json choice;
    if (is_chat()) {
      json logprobs = has_logprobs ? ChatLogprobsJson(*deps_.tokenizer, delta.tokens,
                                                      request_.return_tokens_as_token_ids)
                                   : json();
      choice = ChatChunkChoiceJson(index, json{{"content", delta.text}}, logprobs, nullptr);
    } else {
      json logprobs = has_logprobs ? CompletionLogprobsJson(*deps_.tokenizer, delta.tokens,
                                                            request_.return_tokens_as_token_ids)
                                   : json();
      choice = CompletionChoiceJson(index, delta.text, logprobs, nullptr);
    }
    SendChunk(std::move(choice));
  }
  if (delta.finished) {
    SendChunk(is_chat() ? ChatChunkChoiceJson(index, json::object(), nullptr, delta.finish_reason)
                        : CompletionChoiceJson(index, "", nullptr, delta.finish_reason));
  }
}

json GenerationSession::Usage() const {
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;
  int64_t completion_tokens = 0;
  for (size_t p = 0; p < request_.prompts.size(); ++p) {
    prompt_tokens += static_cast<int64_t>(request_.prompts[p].size());
    cached_tokens += choices_[p * request_.n].output->num_cached_tokens();
  }
  for (const Choice& c : choices_) completion_tokens += c.output->num_output_tokens();
  return UsageJson(prompt_tokens, completion_tokens, cached_tokens);
}

json GenerationSession::EchoLogprobsJson(int32_t index,
                                        const std::vector<TokenLogprobInfo>& generated) const {
  const ChoiceOutput& out = *choices_[index].output;
  std::vector<TokenLogprobInfo> tokens =
      PromptTokenInfos(*deps_.tokenizer, request_.prompts[index / request_.n],
                       out.prompt_logprobs(), request_.sampling.skip_special_tokens);
  tokens.insert(tokens.end(), generated.begin(), generated.end());
  return CompletionLogprobsJson(*deps_.tokenizer, tokens, request_.return_tokens_as_token_ids);
}

void GenerationSession::SendChunk(json choice, json prompt_logprobs) {
  json chunk =
      ChunkJson(meta_, object_name(), json::array({std::move(choice)}), request_.include_usage);
  if (!prompt_logprobs.is_null()) chunk["prompt_logprobs"] = std::move(prompt_logprobs);
  // continuous_usage_stats: the usage so far (all choices) on every chunk, as vLLM does.
  if (request_.continuous_usage_stats) chunk["usage"] = Usage();
  sink_->SendEvent(SseEvent(chunk));
}

void GenerationSession::Complete() {
  if (is_responses()) {
    CompleteResponse();
    Done();
    return;
  }
  json usage = Usage();

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
    const std::vector<int32_t> returned = ReturnedChoices();
    for (int32_t index = 0; index < static_cast<int32_t>(returned.size()); ++index) {
      const int32_t c = returned[index];
      const ChoiceOutput& out = *choices_[c].output;
      if (is_chat()) {
        json logprobs = request_.logprobs
                            ? ChatLogprobsJson(*deps_.tokenizer, out.logprobs(),
                                               request_.return_tokens_as_token_ids)
                            : json();
        std::string text = request_.echo ? echo_prefixes_[c / request_.n] + out.text()
                                         : out.text();
        json choice = ChatChoiceJson(index, text, logprobs, out.finish_reason());
        if (request_.tool_call_syntax != nullptr) {
          SetToolCallMessage(*request_.tool_call_syntax, out.text(), choice);
        }
        choices.push_back(std::move(choice));
      } else {
        json logprobs = echo_with_logprobs() ? EchoLogprobsJson(c, out.logprobs())
                        : request_.logprobs
                            ? CompletionLogprobsJson(*deps_.tokenizer, out.logprobs(),
                                                     request_.return_tokens_as_token_ids)
                            : json();
        std::string text = request_.echo ? echo_prefixes_[c / request_.n] + out.text()
                                         : out.text();
        json choice = CompletionChoiceJson(index, text, logprobs, out.finish_reason());
        if (request_.prompt_logprobs_field) {
          choice["prompt_logprobs"] = PromptLogprobsJson(*deps_.tokenizer, out.prompt_logprobs());
        }
        choices.push_back(std::move(choice));
      }
    }
    json response = ResponseJson(meta_, object_name(), std::move(choices), std::move(usage));
    if (is_chat() && request_.prompt_logprobs_field) {
      response["prompt_logprobs"] =
          PromptLogprobsJson(*deps_.tokenizer, choices_[0].output->prompt_logprobs());
    }
    sink_->SendResponse(200, "application/json", DumpJson(response));
    deps_.metrics->ObserveRequest(deps_.endpoint_path, 200);
  }
  Done();
}

std::vector<int32_t> GenerationSession::ReturnedChoices() const {
  std::vector<int32_t> out(choices_.size());
  std::iota(out.begin(), out.end(), 0);
  if (request_.best_of_keep <= 0) return out;
  // Per prompt: its n candidates, best cumulative logprob first (ties: generation order).
  std::vector<int32_t> kept;
  for (size_t first = 0; first < out.size(); first += request_.n) {
    std::stable_sort(out.begin() + first, out.begin() + first + request_.n,
                     [&](int32_t a, int32_t b) {
                       return choices_[a].output->cumulative_logprob() >
                              choices_[b].output->cumulative_logprob();
                     });
    kept.insert(kept.end(), out.begin() + first, out.begin() + first + request_.best_of_keep);
  }
  return kept;
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
    if (std::optional<int64_t> retry = RetryAfterFor(status)) {
      sink_->AddResponseHeader("Retry-After", absl::StrCat(*retry));
    }
    sink_->SendResponse(http, "application/json", DumpJson(error));
    deps_.metrics->ObserveRequest(deps_.endpoint_path, http);
  }
  Done(stream_started_ ? 200 : HttpStatusFor(status), std::string(status.message()));
}

void GenerationSession::Cancel() {
  if (done_) return;
  // The client left: each unfinished choice ends as an abort (vLLM's finished_reason "abort").
  // The backend's abort outputs arrive after Done and are not observed again.
  const Clock::time_point now = Clock::now();
  for (const Choice& c : choices_) {
    if (!c.output->finished()) ObserveEnd(c, FinishReason::kAbort, now);
  }
  AbortUnfinished();
  Done(499, "the client went away");
}

void GenerationSession::Done(int http_status, const std::string& error) {
  if (done_) return;
  done_ = true;
  if (deps_.log_requests) {
    RequestLogEntry entry;
    entry.path = deps_.endpoint_path;
    entry.status = http_status;
    entry.id = meta_.id;
    entry.user = deps_.user;
    entry.prompt_tokens = 0;
    for (const std::vector<int32_t>& prompt : request_.prompts) {
      entry.prompt_tokens += static_cast<int64_t>(prompt.size());
    }
    entry.completion_tokens = 0;
    for (const Choice& c : choices_) {
      entry.completion_tokens += c.output->num_output_tokens();
      if (c.output->finished() && error.empty()) {
        absl::StrAppend(&entry.finish, entry.finish.empty() ? "" : ",", c.output->finish_reason());
      }
    }
    entry.e2e_seconds = SecondsBetween(arrival_, Clock::now());
    entry.error = error;
    spdlog::info("{}", RequestLogLine(entry));
  }
  if (deps_.on_done) deps_.on_done();
}

}  // namespace sluice
