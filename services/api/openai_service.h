// OpenAiService: routes HTTP requests to the OpenAI-compatible endpoints, independent of the
// transport (the HTTP server, the offline batch runner and tests drive it the same way).
//
//   POST /v1/chat/completions, POST /v1/completions   generation (JSON or SSE)
//   POST /v1/responses                                 stateless Responses API (responses_api.h)
//   GET  /v1/models, /v1/models/{id}                  the served model
//   GET  /health                                      200 {"status":"ok"}
//   GET  /metrics                                     Prometheus text format
// A known path with another method gets 405, an unknown path 404, both as OpenAI error JSON.
// More than max_concurrent_requests generations in flight → 503.
// With render_threads > 0, a generation request's parsing (chat template render, tokenization,
// grammar compile) runs on render pools (render_pools.h), off the caller's (I/O) thread: a
// costly render cannot stall other connections, a full render queue answers 503, and a render
// whose client went away (RequestHandle::Cancel) stops at its next budget poll. Requests that
// bring their own `chat_template` get a pool of their own, so they cannot delay the others'.
// With `auth` set, every path but /health (and /metrics unless protect_metrics) needs an API
// key: missing or wrong → 401; over the key's quotas → 429 with Retry-After (auth/api_auth.h).
#ifndef SLUICE_SERVICES_API_OPENAI_SERVICE_H_
#define SLUICE_SERVICES_API_OPENAI_SERVICE_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "engine/grammar/grammar_compiler.h"
#include "engine/tokenizer/chat_template.h"
#include "engine/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"
#include "services/api/auth/api_auth.h"
#include "services/api/inference_backend.h"
#include "services/common/metrics.h"
#include "services/api/openai_protocol.h"
#include "services/api/render_pools.h"
#include "services/common/response_sink.h"

namespace sluice {

struct OpenAiServiceOptions {
  std::string served_model_name;
  int64_t max_concurrent_requests = 512;  // generation requests in flight before 503
  // Request fields outside an endpoint's table are accepted with a logged warning instead of
  // refused with 400 (clients that send vendor extras).
  bool allow_unknown_fields = false;
  ApiAuth* auth = nullptr;                // borrowed; null: the API is open
  int32_t max_choices_per_request = 1024; // prompts × n of one request; more → 400
  // Structured outputs (response_format, structured_outputs, guided_*): compiled here against
  // the tokenizer's vocabulary and enforced by the engine. False: such requests get 400 (a
  // backend that cannot carry a grammar, e.g. the router's remote workers).
  bool enable_structured_outputs = true;
  // Chat template renders: the work budget of each (a `chat_template` from the client gets no
  // more than the model's own), and how long one may wait and run before 504.
  jinja::RenderLimits render_limits;
  std::chrono::milliseconds render_timeout{30'000};
  // Threads parsing generation requests off the caller's thread (render_pools.h; 0: parse on
  // the caller's thread, e.g. tests and `sluice generate`), of them those for requests with
  // their own `chat_template` (0: they share the others'), and the requests that may wait for
  // a thread of either pool before 503.
  int render_threads = 0;
  int custom_template_render_threads = 0;
  int max_queued_renders = 256;
  // Vision-language models: image content parts are accepted and encoded in process
  // (multimodal_input.h); borrowed. Null: image parts get 400.
  const MultimodalContext* multimodal = nullptr;
  // The model's tool-call syntax (`--tool-call-parser`); null: found in the chat template.
  std::shared_ptr<const tools::ToolCallSyntax> tool_call_syntax;
  // One log line per generation request when it ends (request_log.h; `--disable-log-requests`).
  bool log_requests = true;
};

class OpenAiService {
 public:
  // Pointers are borrowed and must outlive the service and every request it started.
  // `chat_template` may be null (chat requests then get 400).
  OpenAiService(InferenceBackend* backend, const Tokenizer* tokenizer,
                const ChatTemplate* chat_template, OpenAiServiceOptions options);

  // Handle answers `request` through `sink`. Quick endpoints answer before returning; a
  // generation returns its handle (for cancellation on disconnect) and answers later through
  // `poster`. Call on the connection's executor. Thread-safe across connections.
  std::shared_ptr<RequestHandle> Handle(const HttpRequestInfo& request,
                                        std::shared_ptr<ResponseSink> sink, Poster poster);

  // HandleGeneration starts a generation from an already parsed body (used by Handle and by
  // `sluice generate`). Errors are answered through `sink`; returns null in that case.
  // `api_key` (authenticated by Authorize) sets the cache_salt and is charged the quotas.
  // `ordered_tools`: the body's tools in the client's key order (OrderedTools), for the chat
  // template; null: sorted. `ordered_body`: the whole body in the client's key order
  // (OrderedBody), for the property order of JSON Schemas; null: sorted.
  // With a render pool the parse runs there and the answer comes later through `poster`; the
  // returned handle then cancels the parse as well as the generation.
  std::shared_ptr<RequestHandle> HandleGeneration(
      Endpoint endpoint, nlohmann::json body, std::shared_ptr<ResponseSink> sink,
      Poster poster, std::shared_ptr<const ApiKey> api_key = nullptr,
      std::shared_ptr<const nlohmann::ordered_json> ordered_tools = nullptr,
      std::shared_ptr<const nlohmann::ordered_json> ordered_body = nullptr);

  // StopRendering cancels the running and queued parses (their requests get no answer; a
  // render stops at its next budget poll) and joins the render pools. Call after the transport
  // stopped and before it is destroyed (queued parses hold its sinks and posters). Jobs of
  // other users of the pools (the gRPC API) are cancelled too. Idempotent; the destructor
  // calls it.
  void StopRendering();

  // The grammar compiler of structured outputs and tool calls, built on first use (the
  // vocabulary walk costs ~0.1 s on 128k tokens); null when structured outputs are off.
  // Shared with the gRPC API. Thread-safe.
  grammar::GrammarCompiler* grammar_compiler();

  // The render pools (null when render_threads == 0), to share with the gRPC API.
  RenderPools* render_pools() { return render_pools_.get(); }
  ~OpenAiService();

  // Authorize checks the request's API key when auth is on (/health is always open, /metrics
  // unless protect_metrics). On failure it answers 401 through `sink` and returns false; on
  // success `*api_key` (if not null) is the key, or null when no key was needed.
  bool Authorize(const HttpRequestInfo& request, ResponseSink& sink,
                 std::shared_ptr<const ApiKey>* api_key);

  ApiMetrics& metrics() { return metrics_; }
  int64_t num_in_flight() const { return in_flight_.load(); }
  const std::string& served_model_name() const { return options_.served_model_name; }

 private:
  class PendingParse;
  void SendError(ResponseSink& sink, const std::string& endpoint, const absl::Status& status);
  ParseContext MakeParseContext();
  absl::StatusOr<GenerationRequest> Parse(Endpoint endpoint, const nlohmann::json& body,
                                          const ParseContext& context);
  // StartSession admits a parsed request (limits, quotas) and starts its generation. Call on
  // the request's executor. `user`: the body's `user`, for the request log.
  std::shared_ptr<RequestHandle> StartSession(Endpoint endpoint,
                                              absl::StatusOr<GenerationRequest> request,
                                              std::shared_ptr<ResponseSink> sink, Poster poster,
                                              std::shared_ptr<const ApiKey> api_key,
                                              const std::string& user);
  // LogRefused writes the request log line of a generation request refused before it ran.
  void LogRefused(const std::string& path, const absl::Status& status, const std::string& user);
  nlohmann::json ModelCard() const;

  InferenceBackend* backend_;
  const Tokenizer* tokenizer_;
  const ChatTemplate* chat_template_;
  OpenAiServiceOptions options_;
  ApiMetrics metrics_;
  std::atomic<int64_t> in_flight_{0};
  int64_t created_;  // Unix seconds, for the model card
  std::once_flag grammar_once_;
  std::unique_ptr<grammar::GrammarCompiler> grammar_compiler_;
  std::unique_ptr<RenderPools> render_pools_;  // null when render_threads == 0
};

}  // namespace sluice

#endif  // SLUICE_SERVICES_API_OPENAI_SERVICE_H_
