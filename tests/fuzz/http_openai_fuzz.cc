// One HTTP request, as the server reads it off a socket (Boost.Beast's parser with the server's
// header and body limits), then through the OpenAI service: routing, API-key check, JSON
// validation of /v1/chat/completions, /v1/completions and /v1/responses (chat template,
// tokenization, sampling fields, structured outputs), and the response/stream formatting of a
// generation the fake backend answers.
//
// Checks beyond "no crash": every request gets exactly one answer (a response, or a stream
// that ends), JSON answers parse, and an error status carries an OpenAI error object.
#include <cstdint>
#include <memory>
#include <string>

#include "boost/beast/http.hpp"
#include "engine/tokenizer/chat_template.h"
#include "services/api/auth/api_auth.h"
#include "services/common/http_server.h"
#include "services/api/openai_service.h"
#include "tests/fuzz/fuzz_util.h"
#include "tests/unit/api_test_fakes.h"

namespace {

namespace http = boost::beast::http;
using sluice::testing::ByteTokenizer;

struct Globals {
  ByteTokenizer tokenizer;
  std::unique_ptr<sluice::ChatTemplate> chat_template;
  std::unique_ptr<sluice::ApiAuth> auth;
};
Globals* g = nullptr;

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  g = new Globals();
  const std::string dir = sluice::fuzz::SharedPath("fixtures/tokenizer/tokenizer_config.json");
  auto tmpl = sluice::ChatTemplate::FromModelDir(dir.substr(0, dir.rfind('/')));
  if (!tmpl.ok()) std::abort();
  g->chat_template = *std::move(tmpl);
  sluice::ApiAuthOptions auth;
  auth.api_key = "sk-fuzz";
  auto created = sluice::ApiAuth::Create(auth);
  if (!created.ok()) std::abort();
  g->auth = *std::move(created);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  sluice::fuzz::Input in(data, size);
  const uint8_t mode = in.Byte();
  const std::string_view wire = in.Rest();

  const sluice::HttpServerOptions limits;
  http::request_parser<http::string_body> parser;
  parser.header_limit(limits.header_limit_bytes);
  parser.body_limit(limits.body_limit_bytes);
  parser.eager(true);
  boost::beast::error_code ec;
  size_t used = 0;
  while (!ec && used < wire.size() && !parser.is_done()) {
    used += parser.put(boost::asio::buffer(wire.data() + used, wire.size() - used), ec);
    if (ec == http::error::need_more) break;
  }
  if (ec || !parser.is_done()) return 0;
  http::request<http::string_body> req = parser.release();

  sluice::HttpRequestInfo info;
  info.method = std::string(req.method_string());
  info.target = std::string(req.target());
  info.body = std::move(req.body());
  info.authorization = std::string(req[http::field::authorization]);

  sluice::testing::FakeBackend backend;
  backend.max_len = 256;
  sluice::OpenAiServiceOptions options;
  options.served_model_name = "fuzz-model";
  options.auth = (mode & 1) ? g->auth.get() : nullptr;
  options.allow_unknown_fields = mode & 2;
  sluice::OpenAiService service(&backend, &g->tokenizer, g->chat_template.get(), options);
  auto sink = std::make_shared<sluice::testing::RecordingSink>();
  sluice::testing::ManualExecutor executor;
  auto handle = service.Handle(info, sink, executor.poster());
  executor.Drain();
  // The engine's side: a few tokens for each submitted request, then its end (or a cancel).
  for (const std::string& id : backend.order()) {
    if (mode & 4) {
      if (handle) handle->Cancel();
      backend.Emit(id, {}, sluice::FinishReason::kAbort);
    } else {
      backend.EmitText(id, "ok \xe2\x82");
      backend.EmitText(id, "\xac}", (mode & 8) ? sluice::FinishReason::kStop
                                                : sluice::FinishReason::kLength);
    }
    executor.Drain();
  }
  const bool cancelled = (mode & 4) && !backend.order().empty();
  const int answers = sink->num_responses + (sink->stream_started ? 1 : 0);
  if (answers != 1 && !cancelled) __builtin_trap();
  if (sink->stream_started && !sink->stream_ended && !cancelled) __builtin_trap();
  if (sink->num_responses == 1 && sink->type.find("json") != std::string::npos) {
    auto body = nlohmann::json::parse(sink->body, nullptr, /*allow_exceptions=*/false);
    if (body.is_discarded()) __builtin_trap();
    if (sink->status >= 400 && !(body.contains("error") && body["error"].is_object())) {
      __builtin_trap();
    }
  }
  return 0;
}
