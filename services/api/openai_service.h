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
// With `auth` set, every path but /health (and /metrics unless protect_metrics) needs an API
// key: missing or wrong → 401; over the key's quotas → 429 with Retry-After (auth/api_auth.h).
#ifndef SLUICE_SERVICES_API_OPENAI_SERVICE_H_
#define SLUICE_SERVICES_API_OPENAI_SERVICE_H_

#include <atomic>
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
#include "services/api/metrics.h"
#include "services/api/openai_protocol.h"
#include "services/api/response_sink.h"

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
  // The model's tool-call syntax (`--tool-call-parser`); null: found in the chat template.
  std::shared_ptr<const tools::ToolCallSyntax> tool_call_syntax;
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
  std::shared_ptr<RequestHandle> HandleGeneration(
      Endpoint endpoint, const nlohmann::json& body, std::shared_ptr<ResponseSink> sink,
      Poster poster, std::shared_ptr<const ApiKey> api_key = nullptr);

  // Authorize checks the request's API key when auth is on (/health is always open, /metrics
  // unless protect_metrics). On failure it answers 401 through `sink` and returns false; on
  // success `*api_key` (if not null) is the key, or null when no key was needed.
  bool Authorize(const HttpRequestInfo& request, ResponseSink& sink,
                 std::shared_ptr<const ApiKey>* api_key);

  ApiMetrics& metrics() { return metrics_; }
  int64_t num_in_flight() const { return in_flight_.load(); }
  const std::string& served_model_name() const { return options_.served_model_name; }

 private:
  void SendError(ResponseSink& sink, const std::string& endpoint, const absl::Status& status);
  nlohmann::json ModelCard() const;
  // GrammarCompiler is built on first use (the vocabulary walk costs ~0.1 s on 128k tokens);
  // null when structured outputs are off.
  grammar::GrammarCompiler* grammar_compiler();

  InferenceBackend* backend_;
  const Tokenizer* tokenizer_;
  const ChatTemplate* chat_template_;
  OpenAiServiceOptions options_;
  ApiMetrics metrics_;
  std::atomic<int64_t> in_flight_{0};
  int64_t created_;  // Unix seconds, for the model card
  std::once_flag grammar_once_;
  std::unique_ptr<grammar::GrammarCompiler> grammar_compiler_;
};

}  // namespace sluice

#endif  // SLUICE_SERVICES_API_OPENAI_SERVICE_H_
