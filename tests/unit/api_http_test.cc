// HttpServer end to end over loopback with a scripted backend: keep-alive, SSE with chunked
// transfer encoding, 404/405/413, and a client disconnect aborting its engine request.
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio/connect.hpp>
#include <boost/asio/read_until.hpp>
#include <boost/asio/write.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "services/common/http_server.h"
#include "services/api/openai_service.h"
#include "tests/unit/api_test_fakes.h"

namespace sluice {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;
using nlohmann::json;
using ::testing::HasSubstr;
using testing::ByteTokenizer;
using testing::FakeBackend;

// WaitFor polls `pred` for up to 5 seconds.
template <typename Pred>
bool WaitFor(Pred pred) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return pred();
}

class HttpTest : public ::testing::Test {
 protected:
  void SetUp() override {
    OpenAiServiceOptions options;
    options.served_model_name = "mini";
    service_ = std::make_unique<OpenAiService>(&backend_, &tokenizer_, nullptr, options);
    HttpServerOptions http_options;
    http_options.port = 0;
    http_options.body_limit_bytes = 4096;
    auto server = HttpServer::Start(
        http_options, [this](const HttpRequestInfo& request, std::shared_ptr<ResponseSink> sink,
                             Poster poster) {
          return service_->Handle(request, std::move(sink), std::move(poster));
        });
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    ASSERT_NE(server_->port(), 0);
  }
  void TearDown() override {
    if (server_) server_->Stop();
  }

  // Connect opens a client connection to the server.
  std::unique_ptr<beast::tcp_stream> Connect() {
    auto stream = std::make_unique<beast::tcp_stream>(ioc_);
    stream->connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), server_->port()));
    return stream;
  }
  http::response<http::string_body> Roundtrip(beast::tcp_stream& stream, http::verb verb,
                                              const std::string& target,
                                              const std::string& body = "") {
    http::request<http::string_body> req{verb, target, 11};
    req.set(http::field::host, "127.0.0.1");
    req.set(http::field::content_type, "application/json");
    req.body() = body;
    req.prepare_payload();
    http::write(stream, req);
    beast::flat_buffer buffer;
    http::response<http::string_body> res;
    http::read(stream, buffer, res);
    return res;
  }

  // Destruction order matters: the backend's callbacks hold sessions that hold connections,
  // which must be released while the server's io_context still exists.
  ByteTokenizer tokenizer_;
  std::unique_ptr<OpenAiService> service_;
  std::unique_ptr<HttpServer> server_;
  FakeBackend backend_;
  net::io_context ioc_;
};

TEST_F(HttpTest, KeepAliveServesSeveralRequestsOnOneConnection) {
  auto stream = Connect();
  auto health = Roundtrip(*stream, http::verb::get, "/health");
  EXPECT_EQ(health.result_int(), 200);
  EXPECT_EQ(health.body(), R"({"status":"ok"})");
  EXPECT_TRUE(health.keep_alive());
  auto models = Roundtrip(*stream, http::verb::get, "/v1/models");
  EXPECT_EQ(models.result_int(), 200);
  EXPECT_EQ(json::parse(models.body())["data"][0]["id"], "mini");
  auto missing = Roundtrip(*stream, http::verb::get, "/nowhere");
  EXPECT_EQ(missing.result_int(), 404);
  auto wrong = Roundtrip(*stream, http::verb::put, "/v1/completions", "{}");
  EXPECT_EQ(wrong.result_int(), 405);
  auto bad = Roundtrip(*stream, http::verb::post, "/v1/completions", "{oops");
  EXPECT_EQ(bad.result_int(), 400);
  EXPECT_EQ(json::parse(bad.body())["error"]["type"], "invalid_request_error");
}

TEST_F(HttpTest, NonStreamedCompletionOverHttp) {
  auto stream = Connect();
  std::thread engine([&] {
    ASSERT_TRUE(WaitFor([&] { return backend_.order().size() == 1; }));
    backend_.EmitText(backend_.order()[0], "hi", FinishReason::kLength);
  });
  auto res = Roundtrip(*stream, http::verb::post, "/v1/completions",
                       R"({"model":"mini","prompt":"x","max_tokens":2})");
  engine.join();
  EXPECT_EQ(res.result_int(), 200);
  EXPECT_EQ(res[http::field::content_type], "application/json");
  EXPECT_EQ(json::parse(res.body())["choices"][0]["text"], "hi");
  // The connection is still usable.
  EXPECT_EQ(Roundtrip(*stream, http::verb::get, "/health").result_int(), 200);
}

TEST_F(HttpTest, StreamUsesChunkedServerSentEvents) {
  auto stream = Connect();
  std::thread engine([&] {
    ASSERT_TRUE(WaitFor([&] { return backend_.order().size() == 1; }));
    const std::string id = backend_.order()[0];
    backend_.EmitText(id, "a");
    backend_.EmitText(id, "b", FinishReason::kLength);
  });
  http::request<http::string_body> req{http::verb::post, "/v1/completions", 11};
  req.set(http::field::host, "127.0.0.1");
  req.body() = R"({"model":"mini","prompt":"x","max_tokens":2,"stream":true})";
  req.prepare_payload();
  http::write(*stream, req);
  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  http::read_header(*stream, buffer, parser);
  EXPECT_EQ(parser.get().result_int(), 200);
  EXPECT_EQ(parser.get()[http::field::content_type], "text/event-stream");
  EXPECT_TRUE(parser.chunked());
  http::read(*stream, buffer, parser);
  engine.join();
  const std::string body = parser.get().body();
  EXPECT_THAT(body, HasSubstr("data: {"));
  EXPECT_THAT(body, HasSubstr(R"("text":"a")"));
  EXPECT_THAT(body, HasSubstr(R"("finish_reason":"length")"));
  EXPECT_EQ(body.substr(body.size() - 14), "data: [DONE]\n\n");
  EXPECT_EQ(Roundtrip(*stream, http::verb::get, "/health").result_int(), 200);
}

TEST_F(HttpTest, ExpectContinueIsAnswered) {
  auto stream = Connect();
  const std::string body = R"({"model":"mini","prompt":"x","stream":"no"})";
  const std::string head =
      "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
      "Expect: 100-continue\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n";
  net::write(stream->socket(), net::buffer(head));
  std::string interim;
  net::read_until(stream->socket(), net::dynamic_buffer(interim), "\r\n\r\n");
  EXPECT_EQ(interim, "HTTP/1.1 100 Continue\r\n\r\n");
  beast::flat_buffer buffer;
  net::write(stream->socket(), net::buffer(body));
  http::response<http::string_body> res;
  http::read(*stream, buffer, res);
  EXPECT_EQ(res.result_int(), 400);
  EXPECT_EQ(json::parse(res.body())["error"]["param"], "stream");
}

TEST_F(HttpTest, BodyOverLimitIs413) {
  auto stream = Connect();
  std::string big = R"({"model":"mini","prompt":")" + std::string(8000, 'x') + R"("})";
  auto res = Roundtrip(*stream, http::verb::post, "/v1/completions", big);
  EXPECT_EQ(res.result_int(), 413);
  EXPECT_TRUE(backend_.order().empty());
}

TEST_F(HttpTest, ClientDisconnectAbortsEngineRequest) {
  {
    auto stream = Connect();
    http::request<http::string_body> req{http::verb::post, "/v1/completions", 11};
    req.set(http::field::host, "127.0.0.1");
    req.body() = R"({"model":"mini","prompt":"x","max_tokens":50,"stream":true})";
    req.prepare_payload();
    http::write(*stream, req);
    ASSERT_TRUE(WaitFor([&] { return backend_.order().size() == 1; }));
    backend_.EmitText(backend_.order()[0], "partial");
    beast::error_code ec;
    stream->socket().shutdown(tcp::socket::shutdown_both, ec);
    stream->socket().close(ec);
  }
  const std::string id = backend_.order()[0];
  EXPECT_TRUE(WaitFor([&] {
    auto aborted = backend_.aborted();
    return std::find(aborted.begin(), aborted.end(), id) != aborted.end();
  }));
  EXPECT_TRUE(WaitFor([&] { return service_->num_in_flight() == 0; }));
  // The server keeps serving.
  auto stream = Connect();
  EXPECT_EQ(Roundtrip(*stream, http::verb::get, "/health").result_int(), 200);
}

}  // namespace
}  // namespace sluice
