#include "services/router/inference_grpc_service.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/json_parse.h"
#include "engine/sample/philox.h"
#include "services/api/auth/request_admission.h"
#include "services/api/choice_output.h"
#include "services/api/openai_errors.h"
#include "services/api/tool_calls/tool_call_output.h"
#include "services/api/openai_responses.h"
#include "services/common/vllm_metrics.h"
#include "services/router/wire_convert.h"
#include "proto/grpc_status.h"

namespace sluice {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// SamplingToJson writes the fields the client set, under the HTTP API's names.
void SamplingToJson(const v1::SamplingParams& sp, Endpoint endpoint, json& body) {
  if (sp.has_temperature()) body["temperature"] = sp.temperature();
  if (sp.has_top_p()) body["top_p"] = sp.top_p();
  if (sp.has_top_k()) body["top_k"] = sp.top_k();
  if (sp.has_min_p()) body["min_p"] = sp.min_p();
  if (sp.has_presence_penalty()) body["presence_penalty"] = sp.presence_penalty();
  if (sp.has_frequency_penalty()) body["frequency_penalty"] = sp.frequency_penalty();
  if (sp.has_repetition_penalty()) body["repetition_penalty"] = sp.repetition_penalty();
  if (sp.has_seed()) body["seed"] = sp.seed();
  if (sp.has_max_tokens()) body["max_tokens"] = sp.max_tokens();
  if (sp.has_min_tokens()) body["min_tokens"] = sp.min_tokens();
  if (sp.ignore_eos()) body["ignore_eos"] = true;
  if (sp.stop_token_ids_size() > 0) {
    body["stop_token_ids"] =
        std::vector<int32_t>(sp.stop_token_ids().begin(), sp.stop_token_ids().end());
  }
  if (sp.stop_size() > 0) {
    body["stop"] = std::vector<std::string>(sp.stop().begin(), sp.stop().end());
  }
  if (sp.include_stop_str_in_output()) body["include_stop_str_in_output"] = true;
  if (sp.has_skip_special_tokens()) body["skip_special_tokens"] = sp.skip_special_tokens();
  if (sp.has_logprobs()) {
    if (endpoint == Endpoint::kChatCompletions) {
      body["logprobs"] = true;
      body["top_logprobs"] = sp.logprobs();
    } else {
      body["logprobs"] = sp.logprobs();
    }
  }
  if (sp.allowed_token_ids_size() > 0) {
    body["allowed_token_ids"] =
        std::vector<int32_t>(sp.allowed_token_ids().begin(), sp.allowed_token_ids().end());
  }
  if (sp.logit_bias_size() > 0) {
    json bias = json::object();
    for (const v1::LogitBias& b : sp.logit_bias()) bias[std::to_string(b.token_id())] = b.bias();
    body["logit_bias"] = std::move(bias);
  }
}

// AddToolFields copies a message's tool fields under the HTTP API's names.
void AddToolFields(const v1::ChatMessage& m, json& message) {
  if (!m.name().empty()) message["name"] = m.name();
  if (!m.tool_call_id().empty()) message["tool_call_id"] = m.tool_call_id();
  if (m.tool_calls_size() == 0) return;
  json calls = json::array();
  for (const v1::ToolCall& call : m.tool_calls()) {
    calls.push_back(json{{"id", call.id()},
                         {"type", "function"},
                         {"function", {{"name", call.name()}, {"arguments", call.arguments()}}}});
  }
  message["tool_calls"] = std::move(calls);
}

json ChatToJson(const v1::ChatPrompt& chat) {
  json messages = json::array();
  for (const v1::ChatMessage& m : chat.messages()) {
    if (m.parts_size() == 0) {
      json message{{"role", m.role()}, {"content", m.content()}};
      AddToolFields(m, message);
      messages.push_back(std::move(message));
      continue;
    }
    // The HTTP API's content parts, so both APIs share one parser and its errors.
    json parts = json::array();
    for (const v1::ContentPart& p : m.parts()) {
      if (p.has_image()) {
        json image_url = json::object();
        image_url["url"] = p.image().url().empty()
                               ? absl::StrCat("data:application/octet-stream;base64,",
                                              absl::Base64Escape(p.image().data()))
                               : p.image().url();
        if (!p.image().detail().empty()) image_url["detail"] = p.image().detail();
        parts.push_back(json{{"type", "image_url"}, {"image_url", std::move(image_url)}});
      } else {
        parts.push_back(json{{"type", "text"}, {"text", p.text()}});
      }
    }
    json message{{"role", m.role()}, {"content", std::move(parts)}};
    AddToolFields(m, message);
    messages.push_back(std::move(message));
  }
  return messages;
}

// JsonField parses a JSON text field of the request (a schema), naming `param` and `where`.
template <typename Json = json>
absl::StatusOr<Json> JsonField(const std::string& text, const std::string& param,
                               const std::string& where) {
  absl::StatusOr<Json> parsed = ParseJsonLimited<Json>(text);
  if (!parsed.ok()) {
    return InvalidParam(param, absl::StrCat(where, " is ", parsed.status().message()));
  }
  return parsed;
}

// ToolsToJson writes tools / tool_choice / parallel_tool_calls under the HTTP API's names
// and shapes, which its parser then validates; `ordered_tools` gets the tools with their
// schemas' key order kept (for the chat template).
absl::Status ToolsToJson(const v1::GenerateRequest& request, json& body,
                         std::shared_ptr<const nlohmann::ordered_json>* ordered_tools) {
  if (request.tools_size() > 0) {
    nlohmann::ordered_json tools = nlohmann::ordered_json::array();
    for (int i = 0; i < request.tools_size(); ++i) {
      const v1::Tool& tool = request.tools(i);
      nlohmann::ordered_json function{{"name", tool.name()}};
      if (!tool.description().empty()) function["description"] = tool.description();
      if (!tool.parameters_json().empty()) {
        absl::StatusOr<nlohmann::ordered_json> schema = JsonField<nlohmann::ordered_json>(
            tool.parameters_json(), "tools", absl::StrCat("tools[", i, "].parameters_json"));
        if (!schema.ok()) return schema.status();
        function["parameters"] = *std::move(schema);
      }
      if (tool.has_strict()) function["strict"] = tool.strict();
      tools.push_back(
          nlohmann::ordered_json{{"type", "function"}, {"function", std::move(function)}});
    }
    body["tools"] = json(tools);
    if (ordered_tools != nullptr) {
      *ordered_tools = std::make_shared<const nlohmann::ordered_json>(std::move(tools));
    }
  }
  switch (request.tool_choice().choice_case()) {
    case v1::ToolChoice::kMode:
      body["tool_choice"] = request.tool_choice().mode();
      break;
    case v1::ToolChoice::kFunction:
      body["tool_choice"] = json{{"type", "function"},
                                 {"function", {{"name", request.tool_choice().function()}}}};
      break;
    default:
      break;
  }
  if (request.has_parallel_tool_calls()) {
    body["parallel_tool_calls"] = request.parallel_tool_calls();
  }
  return absl::OkStatus();
}

// ResponseFormatToJson writes response_format as the HTTP API's object; `ordered_schema` gets
// the schema with its key order kept (the generated objects follow its property order).
absl::Status ResponseFormatToJson(const v1::ResponseFormat& format, json& body,
                                  std::optional<nlohmann::ordered_json>* ordered_schema) {
  json rf{{"type", format.type()}};
  const bool schema_fields = !format.name().empty() || !format.schema_json().empty() ||
                             format.has_strict() || !format.description().empty();
  if (format.type() == "json_schema") {
    json js = json::object();
    if (!format.name().empty()) js["name"] = format.name();
    if (!format.description().empty()) js["description"] = format.description();
    if (!format.schema_json().empty()) {
      absl::StatusOr<nlohmann::ordered_json> schema = JsonField<nlohmann::ordered_json>(
          format.schema_json(), "response_format", "response_format.schema_json");
      if (!schema.ok()) return schema.status();
      // Any JSON value goes to the HTTP parser, which refuses all but an object as there.
      js["schema"] = json(*schema);
      if (schema->is_object()) *ordered_schema = *std::move(schema);
    }
    if (format.has_strict()) js["strict"] = format.strict();
    rf["json_schema"] = std::move(js);
  } else if (schema_fields) {
    return InvalidParam("response_format",
                        absl::StrCat("response_format.name, schema_json, strict and description "
                                     "are only valid with type 'json_schema', got type '",
                                     format.type(), "'"));
  }
  body["response_format"] = std::move(rf);
  return absl::OkStatus();
}

// FinishedReactor answers a unary call at once.
grpc::ServerUnaryReactor* Answer(grpc::CallbackServerContext* context, grpc::Status status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(std::move(status));
  return reactor;
}

v1::FinishReason FinishReasonFromText(const std::string& reason) {
  if (reason == "stop") return v1::FINISH_REASON_STOP;
  if (reason == "length") return v1::FINISH_REASON_LENGTH;
  return v1::FINISH_REASON_UNSPECIFIED;
}

}  // namespace

absl::StatusOr<json> GenerateRequestToJson(
    const v1::GenerateRequest& request, const std::string& served_model_name, Endpoint* endpoint,
    std::shared_ptr<const nlohmann::ordered_json>* ordered_tools,
    std::shared_ptr<const nlohmann::ordered_json>* ordered_body) {
  json body = json::object();
  body["model"] = request.model().empty() ? served_model_name : request.model();
  switch (request.prompt_case()) {
    case v1::GenerateRequest::kChat:
      *endpoint = Endpoint::kChatCompletions;
      body["messages"] = ChatToJson(request.chat());
      body["add_generation_prompt"] = request.chat().add_generation_prompt();
      break;
    case v1::GenerateRequest::kText:
      *endpoint = Endpoint::kCompletions;
      body["prompt"] = request.text();
      break;
    case v1::GenerateRequest::kTokenIds:
      *endpoint = Endpoint::kCompletions;
      body["prompt"] =
          std::vector<int32_t>(request.token_ids().ids().begin(), request.token_ids().ids().end());
      break;
    default:
      return absl::InvalidArgumentError("one of 'text', 'token_ids' or 'chat' is required");
  }
  // Tokenized bad words and prompt logprobs have no form in this API's replies / JSON fields.
  if (request.sampling().bad_words_size() > 0) {
    return absl::InvalidArgumentError(
        "sampling.bad_words is not supported on the Inference API (use the HTTP API's "
        "bad_words strings)");
  }
  if (request.sampling().has_prompt_logprobs()) {
    return absl::InvalidArgumentError(
        "sampling.prompt_logprobs is not supported on the Inference API (use the HTTP API)");
  }
  SamplingToJson(request.sampling(), *endpoint, body);
  const bool tool_fields = request.tools_size() > 0 || request.has_tool_choice() ||
                           request.has_parallel_tool_calls();
  if (tool_fields && *endpoint != Endpoint::kChatCompletions) {
    return InvalidParam("tools", "tools, tool_choice and parallel_tool_calls need a chat prompt");
  }
  if (absl::Status s = ToolsToJson(request, body, ordered_tools); !s.ok()) return s;
  if (request.has_response_format()) {
    std::optional<nlohmann::ordered_json> schema;
    if (absl::Status s = ResponseFormatToJson(request.response_format(), body, &schema); !s.ok()) {
      return s;
    }
    // The only part of the body whose key order matters to the parser (ParseStructuredOutput).
    if (schema.has_value() && ordered_body != nullptr) {
      *ordered_body = std::make_shared<const nlohmann::ordered_json>(nlohmann::ordered_json{
          {"response_format", {{"json_schema", {{"schema", *std::move(schema)}}}}}});
    }
  }
  if (request.has_cache_salt()) body["cache_salt"] = request.cache_salt();
  if (request.has_priority()) body["priority"] = request.priority();
  return body;
}

// GenerateReactor: one Generate call. Engine outputs arrive on backend threads
// and are queued as TokenOutput messages; one write is in flight at a time.
// Deletes itself once gRPC is done with it (OnDone) and the backend delivered
// its final output (or was never started).
class InferenceGrpcService::GenerateReactor final
    : public grpc::ServerWriteReactor<v1::TokenOutput> {
 public:
  GenerateReactor(InferenceGrpcService* service, grpc::CallbackServerContext* context,
                  std::string request_id)
      : service_(service),
        context_(context),
        request_id_(std::move(request_id)),
        arrival_(Clock::now()) {}

  // cancelled: set when the client cancels; stops the request's render.
  const RenderCancel& cancelled() const { return cancelled_; }

  // Admit starts the parsed request (limits, quotas, then the engine) or ends the call with
  // the parse's error. Runs on a render thread or the gRPC thread.
  void Admit(absl::StatusOr<GenerationRequest> parsed, bool detokenize,
             std::shared_ptr<const ApiKey> api_key) {
    if (!parsed.ok()) {
      Fail(parsed.status());
      return;
    }
    if (cancelled_->load()) {
      Fail(absl::CancelledError("the client cancelled the call"));
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      choice_.emplace(*service_->tokenizer_, parsed->sampling, parsed->logprobs);
      detokenize_ = detokenize || !parsed->sampling.stop.empty();
      num_prompt_tokens_ = static_cast<int32_t>(parsed->prompts[0].size());
      tool_call_syntax_ = parsed->tool_call_syntax;
    }
    if (service_->in_flight_.fetch_add(1) >= service_->options_.max_concurrent_requests) {
      service_->in_flight_.fetch_sub(1);
      Fail(absl::ResourceExhaustedError(absl::StrCat("The server is overloaded (",
                                                     service_->options_.max_concurrent_requests,
                                                     " requests in flight); retry later")));
      return;
    }
    if (api_key != nullptr) {
      absl::StatusOr<std::shared_ptr<QuotaTicket>> admitted =
          AdmitGeneration(*service_->options_.auth, *api_key,
                          service_->backend_->max_model_len(), &*parsed);
      if (!admitted.ok()) {
        service_->in_flight_.fetch_sub(1);
        Fail(admitted.status());  // with its retry-after trailer
        return;
      }
      ticket_ = *std::move(admitted);
    }
    EngineRequest engine_request;
    engine_request.request_id = request_id_;
    engine_request.prompt_token_ids = std::move(parsed->prompts[0]);
    engine_request.sampling = parsed->sampling;
    engine_request.cache_salt = parsed->cache_salt;
    engine_request.mm_inputs = std::move(parsed->mm_inputs);
    engine_request.priority = parsed->priority;
    engine_request.grammar = parsed->grammar;  // response_format, tool_choice required / named
    Start(std::move(engine_request));
  }

  // Fail ends a call that never reached the backend.
  void Fail(const absl::Status& status) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      backend_done_ = true;
    }
    FinishOnce(ErrorStatus(status));
  }

  // Start submits the engine request; on an error the call ends with its status.
  void Start(EngineRequest engine_request) {
    // Every response can be reproduced: a request without a seed gets one, reported in each
    // TokenOutput.
    if (!engine_request.sampling.seed.has_value()) {
      engine_request.sampling.seed = NewRandomSeed();
    }
    seed_ = *engine_request.sampling.seed;
    {
      std::lock_guard<std::mutex> lock(mu_);
      submitted_ = true;
    }
    absl::Status status = service_->backend_->Submit(
        std::move(engine_request), [this](const RequestOutput& output) { OnOutput(output); });
    if (!status.ok()) {
      service_->in_flight_.fetch_sub(1);
      ticket_.reset();
      Fail(status);
    }
  }

  void OnCancel() override {
    cancelled_->store(true);  // a render in progress stops at its next budget poll
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (backend_done_ || !submitted_) return;
    }
    // The backend answers with a final kAbort output, which finishes the call.
    service_->backend_->Abort(request_id_);
  }

  void OnWriteDone(bool ok) override {
    std::unique_lock<std::mutex> lock(mu_);
    queue_.pop_front();
    writing_ = false;
    if (!ok) {
      // The client is gone: drop what is queued, stop the engine request.
      queue_.clear();
      client_gone_ = true;
      const bool abort = !backend_done_;
      lock.unlock();
      if (abort) service_->backend_->Abort(request_id_);
      FinishOnce(grpc::Status(grpc::StatusCode::CANCELLED, "the client went away"));
      return;
    }
    lock.unlock();
    Pump();
  }

  void OnDone() override {
    bool destroy;
    {
      std::lock_guard<std::mutex> lock(mu_);
      grpc_done_ = true;
      destroy = backend_done_;
    }
    if (destroy) delete this;
  }

 private:
  // OnOutput runs on a backend thread; it must not block.
  void OnOutput(const RequestOutput& output) {
    const Clock::time_point now = Clock::now();
    bool abort_engine = false;
    bool destroy = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      const int32_t consumed_before = choice_->num_output_tokens();
      const bool was_finished = choice_->finished();
      ChoiceDelta delta = choice_->Push(output);
      if (!was_finished) Observe(output, delta, now);
      abort_engine = delta.stopped_by_string && !output.finished();
      if (!was_finished && !client_gone_) Enqueue(output, delta, consumed_before);
      if (output.finished()) {
        backend_done_ = true;
        service_->in_flight_.fetch_sub(1);
        ticket_.reset();
        destroy = grpc_done_;
      }
    }
    if (destroy) {
      delete this;
      return;
    }
    if (abort_engine) service_->backend_->Abort(request_id_);
    Pump();
  }

  // Observe records latency metrics beside the HTTP API's. Holds mu_.
  void Observe(const RequestOutput& output, const ChoiceDelta& delta, Clock::time_point now) {
    ApiMetrics* metrics = service_->metrics_;
    if (metrics == nullptr) return;
    if (output.queue_seconds >= 0) queue_seconds_ = output.queue_seconds;
    if (!output.new_tokens.empty()) {
      if (!got_first_token_) {
        got_first_token_ = true;
        first_token_time_ = now;
        metrics->ObserveTimeToFirstToken(SecondsSince(arrival_));
      } else {
        const double gap = std::chrono::duration<double>(now - last_token_time_).count() /
                           static_cast<double>(output.new_tokens.size());
        for (size_t i = 0; i < output.new_tokens.size(); ++i)
          metrics->ObserveInterTokenLatency(gap);
      }
      last_token_time_ = now;
    }
    const bool aborted = delta.failed && output.finish_reason == FinishReason::kAbort;
    if (delta.finished || aborted) {
      FinishedRequest end;
      end.finish_reason = aborted                         ? FinishReason::kAbort
                          : delta.finish_reason == "length" ? FinishReason::kLength
                                                            : FinishReason::kStop;
      end.num_prompt_tokens = num_prompt_tokens_;
      end.num_generation_tokens = choice_->num_output_tokens();
      end.num_cached_tokens = choice_->num_cached_tokens();
      end.e2e_seconds = SecondsSince(arrival_);
      end.queue_seconds = queue_seconds_;
      if (got_first_token_) {
        end.prefill_seconds =
            std::max(0.0, std::chrono::duration<double>(first_token_time_ - arrival_).count() -
                              std::max(0.0, queue_seconds_));
        end.decode_seconds =
            std::chrono::duration<double>(last_token_time_ - first_token_time_).count();
      }
      metrics->ObserveFinished(end);
    }
  }

  // Enqueue turns one engine output into the messages to send. Holds mu_.
  void Enqueue(const RequestOutput& output, const ChoiceDelta& delta, int32_t consumed_before) {
    if (delta.failed) {
      const absl::Status error = output.finish_reason == FinishReason::kAbort && delta.error.ok()
                                     ? absl::CancelledError("the request was aborted")
                                     : delta.error;
      if (!sent_any_) {
        // Nothing streamed yet: the call's status carries the error.
        final_status_ = ErrorStatus(error.ok() ? absl::InternalError("generation failed") : error);
        finish_pending_ = true;
        return;
      }
      v1::TokenOutput& message = queue_.emplace_back();
      message.set_request_id(request_id_);
      message.set_seed(seed_);
      message.set_finish_reason(output.finish_reason == FinishReason::kAbort
                                    ? v1::FINISH_REASON_ABORT
                                    : v1::FINISH_REASON_ERROR);
      message.mutable_error()->set_code(static_cast<int32_t>(error.code()));
      message.mutable_error()->set_message(std::string(error.message()));
      FillUsage(message);
      finish_pending_ = true;
      return;
    }
    // Tokens past a stop string are not part of the choice.
    const int32_t consumed = choice_->num_output_tokens() - consumed_before;
    if (consumed == 0 && delta.text.empty() && !delta.finished) return;
    v1::TokenOutput& message = queue_.emplace_back();
    message.set_request_id(request_id_);
    message.set_seed(seed_);
    for (int32_t i = 0; i < consumed && i < static_cast<int32_t>(output.new_tokens.size()); ++i) {
      ToWire(output.new_tokens[i], message.add_tokens());
    }
    if (detokenize_) message.set_text(delta.text);
    if (delta.finished) {
      message.set_finish_reason(FinishReasonFromText(delta.finish_reason));
      finish_pending_ = true;
      if (tool_call_syntax_ != nullptr) AddToolCalls(delta, message);
    }
    FillUsage(message);
    sent_any_ = true;
  }

  // AddToolCalls parses the finished output for tool calls, as the HTTP API's message does:
  // every call complete with an object of arguments, else none. Holds mu_.
  void AddToolCalls(const ChoiceDelta& delta, v1::TokenOutput& message) {
    tools::ToolCallMessage parsed = tools::ParseToolCallMessage(*tool_call_syntax_, choice_->text());
    if (!parsed.has_calls()) return;
    for (const json& call : parsed.tool_calls) {
      v1::ToolCall* out = message.add_tool_calls();
      out->set_id(call["id"].get<std::string>());
      out->set_name(call["function"]["name"].get<std::string>());
      out->set_arguments(call["function"]["arguments"].get<std::string>());
    }
    if (delta.finish_reason == "stop") message.set_finish_reason(v1::FINISH_REASON_TOOL_CALLS);
  }

  void FillUsage(v1::TokenOutput& message) const {
    v1::Usage* usage = message.mutable_usage();
    usage->set_prompt_tokens(num_prompt_tokens_);
    usage->set_completion_tokens(choice_->num_output_tokens());
    usage->set_cached_tokens(choice_->num_cached_tokens());
  }

  // Pump starts the next write, or finishes the call once everything is written.
  void Pump() {
    std::unique_lock<std::mutex> lock(mu_);
    if (writing_ || client_gone_) return;
    if (!queue_.empty()) {
      writing_ = true;
      // deque: the front element stays put while others are appended.
      const v1::TokenOutput* message = &queue_.front();
      lock.unlock();
      StartWrite(message);
      return;
    }
    if (!finish_pending_) return;
    grpc::Status status = final_status_;
    lock.unlock();
    FinishOnce(std::move(status));
  }

  // ErrorStatus: `error` as the call's status, with the HTTP API's Retry-After as a
  // `retry-after` trailer (whole seconds) where it has one: UNAVAILABLE (overloaded, draining,
  // no decode blocks in time) and RESOURCE_EXHAUSTED over a quota. Before Finish only.
  grpc::Status ErrorStatus(const absl::Status& error) {
    if (std::optional<int64_t> retry = RetryAfterFor(error)) {
      context_->AddTrailingMetadata("retry-after", absl::StrCat(*retry));
    }
    return ToGrpc(error);
  }

  void FinishOnce(grpc::Status status) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (finish_called_) return;
      finish_called_ = true;
    }
    Finish(std::move(status));
  }

  InferenceGrpcService* service_;
  grpc::CallbackServerContext* const context_;
  const std::string request_id_;
  const RenderCancel cancelled_ = std::make_shared<std::atomic<bool>>(false);
  std::mutex mu_;
  std::optional<ChoiceOutput> choice_;  // set by Admit; guarded by mu_
  bool detokenize_ = false;             // set by Admit
  int32_t num_prompt_tokens_ = 0;       // set by Admit
  // Tools: the syntax the output is parsed with at its end (set by Admit); null: no tools.
  std::shared_ptr<const tools::ToolCallSyntax> tool_call_syntax_;
  const Clock::time_point arrival_;
  Clock::time_point first_token_time_;            // guarded by mu_
  Clock::time_point last_token_time_;             // guarded by mu_
  double queue_seconds_ = -1;                     // engine queue time; guarded by mu_
  bool got_first_token_ = false;                  // guarded by mu_
  std::deque<v1::TokenOutput> queue_;             // front = being written; guarded by mu_
  bool writing_ = false;                          // guarded by mu_
  uint64_t seed_ = 0;                             // the request's seed, set before Submit
  bool sent_any_ = false;                         // a token message was queued; guarded by mu_
  bool finish_pending_ = false;                   // finish after the queue drains; guarded by mu_
  grpc::Status final_status_ = grpc::Status::OK;  // guarded by mu_
  bool finish_called_ = false;                    // guarded by mu_
  bool client_gone_ = false;                      // guarded by mu_
  bool submitted_ = false;                        // handed to the backend; guarded by mu_
  bool backend_done_ = false;                     // final output seen / never started; guarded
  bool grpc_done_ = false;                        // OnDone ran; guarded by mu_
  std::shared_ptr<QuotaTicket> ticket_;           // the API key's slot; guarded by mu_ once started
};

InferenceGrpcService::InferenceGrpcService(InferenceBackend* backend, const Tokenizer* tokenizer,
                                           const ChatTemplate* chat_template, ApiMetrics* metrics,
                                           InferenceGrpcServiceOptions options)
    : backend_(backend),
      tokenizer_(tokenizer),
      chat_template_(chat_template),
      metrics_(metrics),
      options_(std::move(options)),
      created_(static_cast<int64_t>(std::time(nullptr))) {}

absl::StatusOr<std::shared_ptr<const ApiKey>> InferenceGrpcService::Authenticate(
    const grpc::CallbackServerContext* context) const {
  if (options_.auth == nullptr) return std::shared_ptr<const ApiKey>();
  const auto& metadata = context->client_metadata();
  auto it = metadata.find("authorization");
  const std::string_view value =
      it == metadata.end() ? std::string_view() : std::string_view(it->second.data(),
                                                                   it->second.size());
  return options_.auth->Authenticate(value);
}

ParseContext InferenceGrpcService::MakeParseContext() const {
  ParseContext context;
  context.tokenizer = tokenizer_;
  context.chat_template = chat_template_;
  context.served_model_name = options_.served_model_name;
  context.max_model_len = backend_->max_model_len();
  context.multimodal = options_.multimodal;
  context.grammar_compiler = options_.grammar_compiler ? options_.grammar_compiler() : nullptr;
  context.tool_call_syntax = options_.tool_call_syntax;
  return context;
}

// TokenizeReactor: a Tokenize call whose chat template renders on the render pools;
// cancelling the call stops the render. Deletes itself when gRPC is done with it.
class InferenceGrpcService::TokenizeReactor final : public grpc::ServerUnaryReactor {
 public:
  void OnCancel() override { cancelled->store(true); }
  void OnDone() override { delete this; }
  const RenderCancel cancelled = std::make_shared<std::atomic<bool>>(false);
};

absl::StatusOr<GenerationRequest> InferenceGrpcService::Parse(
    Endpoint endpoint, const json& body, const jinja::RenderLimits& limits,
    std::shared_ptr<const nlohmann::ordered_json> ordered_tools,
    std::shared_ptr<const nlohmann::ordered_json> ordered_body) const {
  ParseContext context = MakeParseContext();
  context.render_limits = limits;
  context.ordered_tools = std::move(ordered_tools);
  context.ordered_body = std::move(ordered_body);
  return endpoint == Endpoint::kChatCompletions ? ParseChatCompletionRequest(body, context)
                                                : ParseCompletionRequest(body, context);
}

void InferenceGrpcService::RenderThen(
    Endpoint endpoint, json body, std::shared_ptr<const nlohmann::ordered_json> ordered_tools,
    std::shared_ptr<const nlohmann::ordered_json> ordered_body, RenderCancel cancelled,
    absl::Time deadline, std::function<void(absl::StatusOr<GenerationRequest>)> done) {
  if (options_.render_pools == nullptr) {
    jinja::RenderLimits limits = options_.render_limits;
    limits.cancelled = cancelled.get();
    limits.deadline = deadline;
    done(Parse(endpoint, body, limits, std::move(ordered_tools), std::move(ordered_body)));
    return;
  }
  std::function<void(absl::StatusOr<GenerationRequest>)> on_refused = done;
  absl::Status posted = options_.render_pools->Post(
      /*custom_template=*/false, cancelled, deadline,
      [this, endpoint, cancelled, body = std::move(body), ordered_tools = std::move(ordered_tools),
       ordered_body = std::move(ordered_body),
       done = std::move(done)](const jinja::RenderLimits& limits) {
        // Cancelled before it ran (client gone, or the pools stopping): no render at all.
        done(cancelled->load() ? absl::CancelledError("the call was cancelled")
                               : Parse(endpoint, body, limits, ordered_tools, ordered_body));
      });
  if (!posted.ok()) on_refused(posted);
}

namespace {

// CallDeadline is the call's deadline (infinite when the client set none).
absl::Time CallDeadline(const grpc::CallbackServerContext* context) {
  const std::chrono::system_clock::time_point deadline = context->deadline();
  if (deadline == std::chrono::system_clock::time_point::max()) return absl::InfiniteFuture();
  return absl::FromChrono(deadline);
}

}  // namespace

grpc::ServerWriteReactor<v1::TokenOutput>* InferenceGrpcService::Generate(
    grpc::CallbackServerContext* context, const v1::GenerateRequest* request) {
  // Server-assigned ids cannot collide with the HTTP API's ("chatcmpl-…", "cmpl-…").
  std::string id = request->request_id().empty() ? NewResponseId("gen-") : request->request_id();
  auto* reactor = new GenerateReactor(this, context, std::move(id));
  absl::StatusOr<std::shared_ptr<const ApiKey>> api_key = Authenticate(context);
  if (!api_key.ok()) {
    reactor->Fail(api_key.status());
    return reactor;
  }
  Endpoint endpoint = Endpoint::kCompletions;
  std::shared_ptr<const nlohmann::ordered_json> ordered_tools, ordered_body;
  absl::StatusOr<json> body = GenerateRequestToJson(*request, options_.served_model_name,
                                                    &endpoint, &ordered_tools, &ordered_body);
  if (!body.ok()) {
    reactor->Fail(body.status());
    return reactor;
  }
  // The reactor lives until it finishes the call, which only Admit (or Fail) does.
  RenderThen(endpoint, *std::move(body), std::move(ordered_tools), std::move(ordered_body),
             reactor->cancelled(),
             CallDeadline(context),
             [reactor, detokenize = request->detokenize(),
              api_key = *std::move(api_key)](absl::StatusOr<GenerationRequest> parsed) {
               reactor->Admit(std::move(parsed), detokenize, api_key);
             });
  return reactor;
}

grpc::ServerUnaryReactor* InferenceGrpcService::Tokenize(grpc::CallbackServerContext* context,
                                                         const v1::TokenizeRequest* request,
                                                         v1::TokenizeResponse* response) {
  if (auto key = Authenticate(context); !key.ok()) return Answer(context, ToGrpc(key.status()));
  std::vector<int32_t> ids;
  if (request->model().size() > 0 && request->model() != options_.served_model_name) {
    return Answer(context,
                  grpc::Status(grpc::StatusCode::NOT_FOUND,
                               absl::StrCat("The model '", request->model(), "' does not exist")));
  }
  switch (request->prompt_case()) {
    case v1::TokenizeRequest::kText:
      ids = tokenizer_->Encode(request->text(), request->add_special_tokens());
      break;
    case v1::TokenizeRequest::kChat: {
      // The chat template is applied exactly as for a chat Generate, on the render pools.
      json body{{"model", options_.served_model_name},
                {"messages", ChatToJson(request->chat())},
                {"add_generation_prompt", request->chat().add_generation_prompt()}};
      auto* reactor = new TokenizeReactor();
      RenderThen(Endpoint::kChatCompletions, std::move(body), nullptr, nullptr, reactor->cancelled,
                 CallDeadline(context),
                 [this, reactor, response](absl::StatusOr<GenerationRequest> parsed) {
                   if (!parsed.ok()) {
                     reactor->Finish(ToGrpc(parsed.status()));
                     return;
                   }
                   response->mutable_token_ids()->Add(parsed->prompts[0].begin(),
                                                      parsed->prompts[0].end());
                   response->set_max_model_len(backend_->max_model_len());
                   reactor->Finish(grpc::Status::OK);
                 });
      return reactor;
    }
    default:
      return Answer(context, grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                          "one of 'text' or 'chat' is required"));
  }
  response->mutable_token_ids()->Add(ids.begin(), ids.end());
  response->set_max_model_len(backend_->max_model_len());
  return Answer(context, grpc::Status::OK);
}

grpc::ServerUnaryReactor* InferenceGrpcService::ListModels(grpc::CallbackServerContext* context,
                                                           const v1::ListModelsRequest* request,
                                                           v1::ListModelsResponse* response) {
  if (auto key = Authenticate(context); !key.ok()) return Answer(context, ToGrpc(key.status()));
  v1::ModelInfo* model = response->add_models();
  model->set_id(options_.served_model_name);
  model->set_max_model_len(backend_->max_model_len());
  model->set_created(created_);
  model->set_owned_by("sluice");
  return Answer(context, grpc::Status::OK);
}

grpc::ServerUnaryReactor* InferenceGrpcService::Health(grpc::CallbackServerContext* context,
                                                       const v1::HealthRequest* request,
                                                       v1::HealthResponse* response) {
  const absl::Status health = options_.health ? options_.health() : absl::OkStatus();
  response->set_status(health.ok() ? v1::HealthResponse::SERVING : v1::HealthResponse::NOT_SERVING);
  response->set_detail(health.ok() ? "ok" : std::string(health.message()));
  return Answer(context, grpc::Status::OK);
}

}  // namespace sluice
