#include "services/api/openai_service.h"

#include <ctime>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "services/api/auth/request_admission.h"
#include "services/api/generation_session.h"
#include "services/api/openai_errors.h"
#include "services/api/openai_responses.h"
#include "services/api/request_log.h"
#include "services/api/responses_api.h"
#include "services/serve/log.h"
#include "services/common/encoder_cache_metrics.h"

namespace sluice {
namespace {

using nlohmann::json;

constexpr char kChatPath[] = "/v1/chat/completions";
constexpr char kCompletionsPath[] = "/v1/completions";
constexpr char kModelsPath[] = "/v1/models";
constexpr char kResponsesPath[] = "/v1/responses";

// Path strips the query string from a request target.
std::string Path(const std::string& target) {
  const size_t q = target.find('?');
  std::string path = q == std::string::npos ? target : target.substr(0, q);
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path;
}

const char* EndpointPath(Endpoint endpoint) {
  return endpoint == Endpoint::kChatCompletions ? kChatPath
         : endpoint == Endpoint::kResponses     ? kResponsesPath
                                                : kCompletionsPath;
}

// SendAuthError answers 401 or 429 with OpenAI's error body and headers.
void SendAuthError(ResponseSink& sink, const absl::Status& status) {
  json error = OpenAiErrorJson(status);
  if (absl::IsUnauthenticated(status)) {
    error["error"]["code"] = "invalid_api_key";
    sink.AddResponseHeader("WWW-Authenticate", "Bearer");
  } else {
    error["error"]["code"] = "rate_limit_exceeded";
    if (std::optional<int64_t> retry = RetryAfterFor(status)) {
      sink.AddResponseHeader("Retry-After", absl::StrCat(*retry));
    }
  }
  sink.SendResponse(HttpStatusFor(status), "application/json", DumpJson(error));
}

}  // namespace

// PendingParse is the handle of a request parsed on the render pool: Cancel (client gone)
// stops its render at the next budget poll, then its session. Touched on the request's
// executor only, except `cancelled`, which the render reads.
class OpenAiService::PendingParse : public RequestHandle {
 public:
  void Cancel() override {
    cancelled->store(true);
    if (session != nullptr) session->Cancel();
  }
  RenderCancel cancelled = std::make_shared<std::atomic<bool>>(false);
  std::shared_ptr<RequestHandle> session;
};

OpenAiService::OpenAiService(InferenceBackend* backend, const Tokenizer* tokenizer,
                             const ChatTemplate* chat_template, OpenAiServiceOptions options)
    : backend_(backend),
      tokenizer_(tokenizer),
      chat_template_(chat_template),
      options_(std::move(options)),
      created_(static_cast<int64_t>(std::time(nullptr))) {
  metrics_.set_model_name(options_.served_model_name);
  if (options_.render_threads > 0) {
    RenderPoolOptions pool_options;
    pool_options.threads = options_.render_threads;
    pool_options.custom_template_threads = options_.custom_template_render_threads;
    pool_options.max_queued = options_.max_queued_renders;
    pool_options.limits = options_.render_limits;
    pool_options.timeout = options_.render_timeout;
    render_pools_ = std::make_unique<RenderPools>(std::move(pool_options));
  }
}

OpenAiService::~OpenAiService() { StopRendering(); }

void OpenAiService::StopRendering() {
  if (render_pools_ != nullptr) render_pools_->Stop();
}

void OpenAiService::SendError(ResponseSink& sink, const std::string& endpoint,
                              const absl::Status& status) {
  const int http = HttpStatusFor(status);
  if (std::optional<int64_t> retry = RetryAfterFor(status)) {
    sink.AddResponseHeader("Retry-After", absl::StrCat(*retry));
  }
  sink.SendResponse(http, "application/json", DumpJson(OpenAiErrorJson(status)));
  metrics_.ObserveRequest(endpoint, http);
}

json OpenAiService::ModelCard() const {
  return json{{"id", options_.served_model_name},
              {"object", "model"},
              {"created", created_},
              {"owned_by", "sluice"},
              {"root", options_.served_model_name},
              {"parent", nullptr},
              {"max_model_len", backend_->max_model_len()}};
}

bool OpenAiService::Authorize(const HttpRequestInfo& request, ResponseSink& sink,
                              std::shared_ptr<const ApiKey>* api_key) {
  if (api_key != nullptr) api_key->reset();
  if (options_.auth == nullptr) return true;
  const std::string path = Path(request.target);
  if (path == "/health" || (path == "/metrics" && !options_.auth->protect_metrics())) return true;
  absl::StatusOr<std::shared_ptr<const ApiKey>> key =
      options_.auth->Authenticate(request.authorization);
  if (!key.ok()) {
    SendAuthError(sink, key.status());
    metrics_.ObserveRequest("other", 401);
    return false;
  }
  if (api_key != nullptr) *api_key = *std::move(key);
  return true;
}

grammar::GrammarCompiler* OpenAiService::grammar_compiler() {
  if (!options_.enable_structured_outputs || tokenizer_ == nullptr) return nullptr;
  std::call_once(grammar_once_, [this] {
    // EOS ids are the engine's business (the matcher gets them there); special tokens never
    // match grammar text.
    grammar_compiler_ = std::make_unique<grammar::GrammarCompiler>(
        grammar::TokenVocab::FromTokenizer(*tokenizer_, /*eos_token_ids=*/{}));
  });
  return grammar_compiler_.get();
}

std::shared_ptr<RequestHandle> OpenAiService::Handle(const HttpRequestInfo& request,
                                                     std::shared_ptr<ResponseSink> sink,
                                                     Poster poster) {
  std::shared_ptr<const ApiKey> api_key;
  if (!Authorize(request, *sink, &api_key)) return nullptr;
  const std::string path = Path(request.target);
  const bool is_get = request.method == "GET" || request.method == "HEAD";
  // The metrics label is one of the known routes, never the raw client path: a raw path
  // would let any client add unbounded series and break the exposition format.
  const std::string metric_endpoint =
      (path == kChatPath || path == kCompletionsPath || path == kResponsesPath ||
       path == kModelsPath ||
       path == "/health" || path == "/metrics")
          ? path
          : absl::StartsWith(path, absl::StrCat(kModelsPath, "/")) ? std::string(kModelsPath)
                                                                   : std::string("other");
  auto reply = [&](int status, const std::string& content_type, std::string body) {
    sink->SendResponse(status, content_type, std::move(body));
    metrics_.ObserveRequest(metric_endpoint, status);
  };
  auto wrong_method = [&](const char* allowed) {
    json error = OpenAiErrorJson(absl::InvalidArgumentError(absl::StrCat(
        "Method ", request.method, " is not allowed on ", path, " (use ", allowed, ")")));
    error["error"]["code"] = 405;
    reply(405, "application/json", DumpJson(error));
  };

  if (path == kChatPath || path == kCompletionsPath || path == kResponsesPath) {
    if (request.method != "POST") {
      wrong_method("POST");
      return nullptr;
    }
    absl::StatusOr<json> body = ParseJsonBody(request.body);
    if (!body.ok()) {
      SendError(*sink, path, body.status());
      return nullptr;
    }
    const Endpoint endpoint = path == kChatPath        ? Endpoint::kChatCompletions
                              : path == kResponsesPath ? Endpoint::kResponses
                                                       : Endpoint::kCompletions;
    std::shared_ptr<const nlohmann::ordered_json> ordered_tools, ordered_body;
    if (NeedsKeyOrder(*body)) ordered_body = OrderedBody(request.body);
    if (auto tools = body->find("tools"); tools != body->end() && tools->is_array()) {
      ordered_tools = OrderedTools(request.body);
    }
    return HandleGeneration(endpoint, *std::move(body), std::move(sink), std::move(poster),
                            std::move(api_key), std::move(ordered_tools),
                            std::move(ordered_body));
  }
  if (path == "/health") {
    if (!is_get) {
      wrong_method("GET");
      return nullptr;
    }
    reply(200, "application/json", R"({"status":"ok"})");
    return nullptr;
  }
  if (path == "/metrics") {
    if (!is_get) {
      wrong_method("GET");
      return nullptr;
    }
    metrics_.SetInFlight(in_flight_.load());
    std::string text = metrics_.Render(backend_->Stats());
    if (options_.multimodal != nullptr && options_.multimodal->cache != nullptr) {
      text += RenderEncoderCacheMetrics(options_.multimodal->cache->stats());
    }
    if (options_.multimodal != nullptr && options_.multimodal->encode_counters != nullptr) {
      const ImageEncodeCounters& c = *options_.multimodal->encode_counters;
      absl::StrAppend(
          &text,
          "# HELP sluice_images_encoded_total Images this server decoded and encoded itself "
          "(embedding-cache hits not counted).\n"
          "# TYPE sluice_images_encoded_total counter\n"
          "sluice_images_encoded_total ", c.images.load(std::memory_order_relaxed), "\n",
          "# HELP sluice_image_encode_seconds_total Wall time spent decoding and encoding "
          "those images (in the request handlers, before the request reaches the engine).\n"
          "# TYPE sluice_image_encode_seconds_total counter\n"
          "sluice_image_encode_seconds_total ",
          c.micros.load(std::memory_order_relaxed) / 1e6, "\n");
    }
    reply(200, "text/plain; version=0.0.4; charset=utf-8", text);
    return nullptr;
  }
  if (path == kModelsPath) {
    if (!is_get) {
      wrong_method("GET");
      return nullptr;
    }
    reply(200, "application/json",
          DumpJson(json{{"object", "list"}, {"data", json::array({ModelCard()})}}));
    return nullptr;
  }
  if (absl::StartsWith(path, absl::StrCat(kModelsPath, "/"))) {
    if (!is_get) {
      wrong_method("GET");
      return nullptr;
    }
    const std::string id = path.substr(sizeof(kModelsPath));
    if (id != options_.served_model_name) {
      SendError(*sink, kModelsPath,
                WithParam(absl::NotFoundError(absl::StrCat("The model '", id,
                                                           "' does not exist")),
                          "model"));
      return nullptr;
    }
    reply(200, "application/json", DumpJson(ModelCard()));
    return nullptr;
  }
  SendError(*sink, "other", absl::NotFoundError(absl::StrCat("Not found: ", path)));
  return nullptr;
}

ParseContext OpenAiService::MakeParseContext() {
  ParseContext context;
  context.tokenizer = tokenizer_;
  context.chat_template = chat_template_;
  context.served_model_name = options_.served_model_name;
  context.max_model_len = backend_->max_model_len();
  context.grammar_compiler = grammar_compiler();
  context.allow_unknown_fields = options_.allow_unknown_fields;
  context.multimodal = options_.multimodal;
  context.tool_call_syntax = options_.tool_call_syntax;
  context.render_limits = options_.render_limits;
  context.render_limits.deadline = absl::Now() + absl::FromChrono(options_.render_timeout);
  return context;
}

absl::StatusOr<GenerationRequest> OpenAiService::Parse(Endpoint endpoint, const json& body,
                                                       const ParseContext& context) {
  return endpoint == Endpoint::kChatCompletions ? ParseChatCompletionRequest(body, context)
         : endpoint == Endpoint::kResponses     ? ParseResponsesRequest(body, context)
                                                : ParseCompletionRequest(body, context);
}

std::shared_ptr<RequestHandle> OpenAiService::HandleGeneration(Endpoint endpoint, json body,
                                                               std::shared_ptr<ResponseSink> sink,
                                                               Poster poster,
                                                               std::shared_ptr<const ApiKey> api_key,
                                                               std::shared_ptr<const nlohmann::ordered_json> ordered_tools,
                                                               std::shared_ptr<const nlohmann::ordered_json> ordered_body) {
  std::string user = RequestUser(body);
  if (render_pools_ == nullptr) {
    ParseContext context = MakeParseContext();
    context.ordered_tools = std::move(ordered_tools);
    context.ordered_body = std::move(ordered_body);
    absl::StatusOr<GenerationRequest> request = Parse(endpoint, body, context);
    return StartSession(endpoint, std::move(request), std::move(sink), std::move(poster),
                        std::move(api_key), user);
  }
  const std::string path = EndpointPath(endpoint);
  auto custom = body.find("chat_template");
  const bool custom_template = custom != body.end() && !custom->is_null();
  auto pending = std::make_shared<PendingParse>();
  // The sink is shared with the job, which answers through it only on the request's executor.
  std::shared_ptr<ResponseSink> job_sink = sink;
  absl::Status posted = render_pools_->Post(
      custom_template, pending->cancelled, absl::InfiniteFuture(),
      [this, endpoint, pending, body = std::move(body), sink = std::move(job_sink),
       poster = std::move(poster), api_key = std::move(api_key),
       ordered_tools = std::move(ordered_tools), ordered_body = std::move(ordered_body),
       user](const jinja::RenderLimits& limits) mutable {
        // Built here: the first one builds the grammar compiler (a vocabulary walk).
        ParseContext context = MakeParseContext();
        context.render_limits = limits;
        context.ordered_tools = ordered_tools;
        context.ordered_body = ordered_body;
        absl::StatusOr<GenerationRequest> request =
            pending->cancelled->load() ? absl::CancelledError("the client went away")
                                       : Parse(endpoint, body, context);
        if (absl::IsCancelled(request.status())) {
          spdlog::info("{}: parse stopped, the client went away or the server is stopping",
                       EndpointPath(endpoint));
          return;
        }
        Poster post = poster;
        post([this, endpoint, pending, request = std::move(request), sink = std::move(sink),
              poster = std::move(poster), api_key = std::move(api_key),
              user = std::move(user)]() mutable {
          if (pending->cancelled->load()) return;  // the transport wants no more sink calls
          pending->session = StartSession(endpoint, std::move(request), std::move(sink),
                                          std::move(poster), std::move(api_key), user);
        });
      });
  if (!posted.ok()) {
    SendError(*sink, path, posted);
    LogRefused(path, posted, user);
    return nullptr;
  }
  return pending;
}

void OpenAiService::LogRefused(const std::string& path, const absl::Status& status,
                               const std::string& user) {
  if (!options_.log_requests) return;
  RequestLogEntry entry;
  entry.path = path;
  entry.status = HttpStatusFor(status);
  entry.user = user;
  entry.error = std::string(status.message());
  spdlog::info("{}", RequestLogLine(entry));
}

std::shared_ptr<RequestHandle> OpenAiService::StartSession(
    Endpoint endpoint, absl::StatusOr<GenerationRequest> request,
    std::shared_ptr<ResponseSink> sink, Poster poster, std::shared_ptr<const ApiKey> api_key,
    const std::string& user) {
  const std::string path = EndpointPath(endpoint);
  // Refusals below answer through `sink` and are logged with the request's user.
  auto refuse = [&](const absl::Status& status) {
    SendError(*sink, path, status);
    LogRefused(path, status, user);
  };
  if (!request.ok()) {
    refuse(request.status());
    return nullptr;
  }
  if (!request->unknown_fields.empty()) {
    spdlog::warn("{}: ignoring unknown request fields: {}", path,
                 absl::StrJoin(request->unknown_fields, ", "));
  }
  // Each choice is an engine request: a long prompt list must not flood the engine.
  if (request->num_choices() > options_.max_choices_per_request) {
    refuse(InvalidParam(endpoint == Endpoint::kChatCompletions ? "n" : "prompt",
                        absl::StrCat("A request may ask for at most ",
                                     options_.max_choices_per_request,
                                     " choices (prompts x n), got ", request->num_choices())));
    return nullptr;
  }
  if (in_flight_.fetch_add(1) >= options_.max_concurrent_requests) {
    in_flight_.fetch_sub(1);
    refuse(absl::UnavailableError(absl::StrCat("The server is overloaded (",
                                               options_.max_concurrent_requests,
                                               " requests in flight); retry later")));
    return nullptr;
  }
  std::shared_ptr<QuotaTicket> ticket;
  if (api_key != nullptr && options_.auth != nullptr) {
    absl::StatusOr<std::shared_ptr<QuotaTicket>> admitted =
        AdmitGeneration(*options_.auth, *api_key, backend_->max_model_len(), &*request);
    if (!admitted.ok()) {
      in_flight_.fetch_sub(1);
      SendAuthError(*sink, admitted.status());
      metrics_.ObserveRequest(path, HttpStatusFor(admitted.status()));
      LogRefused(path, admitted.status(), user);
      return nullptr;
    }
    ticket = *std::move(admitted);
  }
  GenerationSession::Deps deps;
  deps.backend = backend_;
  deps.tokenizer = tokenizer_;
  deps.metrics = &metrics_;
  deps.endpoint_path = path;
  deps.log_requests = options_.log_requests;
  deps.user = user;
  // The quota ticket (the key's concurrency slot) is held until the session is done.
  deps.on_done = [this, ticket = std::move(ticket)]() mutable {
    ticket.reset();
    in_flight_.fetch_sub(1);
  };
  auto session = std::make_shared<GenerationSession>(std::move(deps), *std::move(request),
                                                     std::move(sink), std::move(poster));
  session->Start();
  return session;
}

}  // namespace sluice
