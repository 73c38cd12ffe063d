#include "services/api/openai_service.h"

#include <ctime>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "services/api/generation_session.h"
#include "services/api/openai_errors.h"
#include "services/api/openai_responses.h"

namespace sluice {
namespace {

using nlohmann::json;

constexpr char kChatPath[] = "/v1/chat/completions";
constexpr char kCompletionsPath[] = "/v1/completions";
constexpr char kModelsPath[] = "/v1/models";

// Path strips the query string from a request target.
std::string Path(const std::string& target) {
  const size_t q = target.find('?');
  std::string path = q == std::string::npos ? target : target.substr(0, q);
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path;
}

}  // namespace

OpenAiService::OpenAiService(InferenceBackend* backend, const Tokenizer* tokenizer,
                             const ChatTemplate* chat_template, OpenAiServiceOptions options)
    : backend_(backend),
      tokenizer_(tokenizer),
      chat_template_(chat_template),
      options_(std::move(options)),
      created_(static_cast<int64_t>(std::time(nullptr))) {}

void OpenAiService::SendError(ResponseSink& sink, const std::string& endpoint,
                              const absl::Status& status) {
  const int http = HttpStatusFor(status);
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
  const std::string path = Path(request.target);
  const bool is_get = request.method == "GET" || request.method == "HEAD";
  // The metrics label is one of the known routes, never the raw client path: a raw path
  // would let any client add unbounded series and break the exposition format.
  const std::string metric_endpoint =
      (path == kChatPath || path == kCompletionsPath || path == kModelsPath ||
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

  if (path == kChatPath || path == kCompletionsPath) {
    if (request.method != "POST") {
      wrong_method("POST");
      return nullptr;
    }
    absl::StatusOr<json> body = ParseJsonBody(request.body);
    if (!body.ok()) {
      SendError(*sink, path, body.status());
      return nullptr;
    }
    return HandleGeneration(
        path == kChatPath ? Endpoint::kChatCompletions : Endpoint::kCompletions, *body,
        std::move(sink), std::move(poster));
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
    reply(200, "text/plain; version=0.0.4; charset=utf-8", metrics_.Render(backend_->Stats()));
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

std::shared_ptr<RequestHandle> OpenAiService::HandleGeneration(Endpoint endpoint,
                                                               const json& body,
                                                               std::shared_ptr<ResponseSink> sink,
                                                               Poster poster) {
  const std::string path =
      endpoint == Endpoint::kChatCompletions ? kChatPath : kCompletionsPath;
  ParseContext context;
  context.tokenizer = tokenizer_;
  context.chat_template = chat_template_;
  context.served_model_name = options_.served_model_name;
  context.max_model_len = backend_->max_model_len();
  context.grammar_compiler = grammar_compiler();
  absl::StatusOr<GenerationRequest> request = endpoint == Endpoint::kChatCompletions
                                                  ? ParseChatCompletionRequest(body, context)
                                                  : ParseCompletionRequest(body, context);
  if (!request.ok()) {
    SendError(*sink, path, request.status());
    return nullptr;
  }
  if (in_flight_.fetch_add(1) >= options_.max_concurrent_requests) {
    in_flight_.fetch_sub(1);
    SendError(*sink, path,
              absl::UnavailableError(absl::StrCat("The server is overloaded (",
                                                  options_.max_concurrent_requests,
                                                  " requests in flight); retry later")));
    return nullptr;
  }
  GenerationSession::Deps deps;
  deps.backend = backend_;
  deps.tokenizer = tokenizer_;
  deps.metrics = &metrics_;
  deps.endpoint_path = path;
  deps.on_done = [this]() { in_flight_.fetch_sub(1); };
  auto session = std::make_shared<GenerationSession>(std::move(deps), *std::move(request),
                                                     std::move(sink), std::move(poster));
  session->Start();
  return session;
}

}  // namespace sluice
