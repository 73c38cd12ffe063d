// InferenceGrpcService: the public gRPC API (sluice.v1.Inference, proto/sluice/v1/
// inference.proto) over any InferenceBackend — the router's remote workers or
// `sluice serve`'s in-process engine.
//
// It shares the HTTP API's code path instead of repeating it: a GenerateRequest
// is turned into the equivalent OpenAI JSON body (a chat prompt into a
// /v1/chat/completions body, a text or token-id prompt into a /v1/completions
// body) and validated by the same ParseChatCompletionRequest /
// ParseCompletionRequest, so parameters, defaults (e.g. unset max_tokens = the
// context left), limits and error messages are the HTTP API's. Tokens then go
// through the same ChoiceOutput (incremental detokenizer + stop strings) as an
// HTTP choice.
//
// Requests are parsed (chat template render, tokenization) on the render pools
// (render_pools.h) the HTTP API uses, under the same work budget; cancelling the
// call or passing its deadline stops the render.
//
// Status codes: bad parameters INVALID_ARGUMENT (the message names the field,
// as the HTTP 400 does), unknown model NOT_FOUND, too many requests in flight
// RESOURCE_EXHAUSTED, no worker or a full render queue UNAVAILABLE, a render past
// the call's deadline DEADLINE_EXCEEDED. With `auth` set, Generate, Tokenize
// and ListModels need the `authorization` metadata ("Bearer <key>"): missing or
// wrong → UNAUTHENTICATED; over the key's quotas → RESOURCE_EXHAUSTED with a
// `retry-after` trailer (seconds). Every UNAVAILABLE (overloaded router or worker, draining, no
// decode blocks within the queue wait) carries a `retry-after` trailer too, as the HTTP 503's
// Retry-After (openai_errors.h RetryAfterFor). Health stays open. An engine error before any message
// was sent ends the call with its status; after that as a final TokenOutput
// with `error` set. Cancelling a Generate call aborts its engine request (and
// so frees its KV blocks on every worker).
#ifndef SLUICE_SERVICES_ROUTER_INFERENCE_GRPC_SERVICE_H_
#define SLUICE_SERVICES_ROUTER_INFERENCE_GRPC_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/grammar/grammar_compiler.h"
#include "engine/tokenizer/chat_template.h"
#include "engine/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"
#include "services/api/auth/api_auth.h"
#include "services/api/inference_backend.h"
#include "services/common/metrics.h"
#include "services/api/openai_protocol.h"
#include "services/api/render_pools.h"
#include "services/api/tool_calls/tool_call_syntax.h"
#include "sluice/v1/inference.grpc.pb.h"

namespace sluice {

struct InferenceGrpcServiceOptions {
  std::string served_model_name;
  int64_t max_concurrent_requests = 512;  // Generate calls in flight before RESOURCE_EXHAUSTED
  // Health: OK → SERVING; an error → NOT_SERVING with its message. Unset: always SERVING.
  std::function<absl::Status()> health;
  ApiAuth* auth = nullptr;  // borrowed; null: no API keys
  // Vision-language models: image parts in chat messages (borrowed); null: refused.
  const MultimodalContext* multimodal = nullptr;
  // Where chat templates render (borrowed; the HTTP API's pools, so both APIs share their
  // threads, queue bound and budget): a render stops when its call is cancelled, at the
  // call's deadline, at the pools' timeout, and when the pools stop. Null: on the gRPC thread
  // with `render_limits` and the call's deadline (tests).
  RenderPools* render_pools = nullptr;
  jinja::RenderLimits render_limits;
  // Structured outputs (response_format) and constrained tool calls: the HTTP API's grammar
  // compiler (OpenAiService::grammar_compiler); unset or null: they are INVALID_ARGUMENT.
  std::function<grammar::GrammarCompiler*()> grammar_compiler;
  // The model's tool-call syntax (`--tool-call-parser`); null: found in the chat template.
  std::shared_ptr<const tools::ToolCallSyntax> tool_call_syntax;
};

// GenerateRequestToJson returns the OpenAI body equivalent to `request`
// (model filled in with `served_model_name` when empty) and the endpoint whose
// parser validates it; `ordered_tools` (may be null) gets the tools with their
// schemas' key order kept (ParseContext::ordered_tools), `ordered_body` (may be null) the
// response_format schema with its key order kept (ParseContext::ordered_body; null when there
// is none). InvalidArgument when no prompt is set, a schema text is not JSON, or tools come
// without a chat prompt.
absl::StatusOr<nlohmann::json> GenerateRequestToJson(
    const v1::GenerateRequest& request, const std::string& served_model_name, Endpoint* endpoint,
    std::shared_ptr<const nlohmann::ordered_json>* ordered_tools = nullptr,
    std::shared_ptr<const nlohmann::ordered_json>* ordered_body = nullptr);

class InferenceGrpcService final : public v1::Inference::CallbackService {
 public:
  // Pointers are borrowed and must outlive the gRPC server using the service.
  // `chat_template` may be null (chat prompts get INVALID_ARGUMENT); `metrics`
  // may be null (else TTFT, ITL, end-to-end latency and token counts are
  // recorded beside the HTTP API's).
  InferenceGrpcService(InferenceBackend* backend, const Tokenizer* tokenizer,
                       const ChatTemplate* chat_template, ApiMetrics* metrics,
                       InferenceGrpcServiceOptions options);

  grpc::ServerWriteReactor<v1::TokenOutput>* Generate(grpc::CallbackServerContext* context,
                                                      const v1::GenerateRequest* request) override;
  grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* context,
                                     const v1::TokenizeRequest* request,
                                     v1::TokenizeResponse* response) override;
  grpc::ServerUnaryReactor* ListModels(grpc::CallbackServerContext* context,
                                       const v1::ListModelsRequest* request,
                                       v1::ListModelsResponse* response) override;
  grpc::ServerUnaryReactor* Health(grpc::CallbackServerContext* context,
                                   const v1::HealthRequest* request,
                                   v1::HealthResponse* response) override;

  int64_t num_in_flight() const { return in_flight_.load(); }

 private:
  class GenerateReactor;
  class TokenizeReactor;
  ParseContext MakeParseContext() const;
  // Parse validates `body` as the endpoint's HTTP body with render `limits`.
  absl::StatusOr<GenerationRequest> Parse(
      Endpoint endpoint, const nlohmann::json& body, const jinja::RenderLimits& limits,
      std::shared_ptr<const nlohmann::ordered_json> ordered_tools = nullptr,
      std::shared_ptr<const nlohmann::ordered_json> ordered_body = nullptr) const;
  // RenderThen runs `done(Parse(...))` on the render pools (or at once without them), with
  // the call's deadline; `cancelled` stops the render. Pools that refuse the job (queue
  // full, stopping) give `done` their Unavailable status, on this thread.
  void RenderThen(Endpoint endpoint, nlohmann::json body,
                  std::shared_ptr<const nlohmann::ordered_json> ordered_tools,
                  std::shared_ptr<const nlohmann::ordered_json> ordered_body,
                  RenderCancel cancelled, absl::Time deadline,
                  std::function<void(absl::StatusOr<GenerationRequest>)> done);
  // Authenticate checks the call's key (null key and OK when auth is off).
  absl::StatusOr<std::shared_ptr<const ApiKey>> Authenticate(
      const grpc::CallbackServerContext* context) const;

  InferenceBackend* backend_;
  const Tokenizer* tokenizer_;
  const ChatTemplate* chat_template_;
  ApiMetrics* metrics_;
  InferenceGrpcServiceOptions options_;
  std::atomic<int64_t> in_flight_{0};
  std::atomic<int64_t> next_id_{0};
  int64_t created_;  // Unix seconds, for ModelInfo
};

}  // namespace sluice

#endif  // SLUICE_SERVICES_ROUTER_INFERENCE_GRPC_SERVICE_H_
