// HttpServer input limits over loopback: 431 for an oversized head, 413 for an oversized body,
// the request timeout closing a connection that trickles its head (slowloris) or never sends,
// the idle timeout between keep-alive requests, and real requests served while hundreds of
// trickling connections are open.
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <gtest/gtest.h>

#include "services/common/http_server.h"

namespace sluice {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;

class HttpLimitsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    HttpServerOptions options;
    options.port = 0;
    options.header_limit_bytes = 2048;
    options.body_limit_bytes = 4096;
    options.request_timeout = std::chrono::seconds(1);
    options.idle_timeout = std::chrono::seconds(3);
    auto server = HttpServer::Start(
        options, [](const HttpRequestInfo& request, std::shared_ptr<ResponseSink> sink, Poster) {
          sink->SendResponse(200, "text/plain", "ok " + request.target);
          return std::shared_ptr<RequestHandle>();
        });
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }
  void TearDown() override { server_->Stop(); }

  tcp::socket Connect() {
    tcp::socket socket(ioc_);
    socket.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), server_->port()));
    return socket;
  }
  http::response<http::string_body> Get(tcp::socket& socket, const std::string& target,
                                        const std::string& extra_header = "") {
    const std::string request =
        "GET " + target + " HTTP/1.1\r\nHost: x\r\n" + extra_header + "\r\n";
    net::write(socket, net::buffer(request));
    beast::flat_buffer buffer;
    http::response<http::string_body> response;
    http::read(socket, buffer, response);
    return response;
  }
  // ClosedWithin reads until the server closes the connection; returns the seconds it took,
  // or a negative number when it stayed open past `limit_s` (the read is then cancelled).
  static double SecondsUntilClosed(tcp::socket& socket, double limit_s) {
    const auto start = Clock::now();
    timeval tv{static_cast<time_t>(limit_s), 0};
    setsockopt(socket.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    char byte;
    while (true) {
      const ssize_t n = ::recv(socket.native_handle(), &byte, 1, 0);
      if (n == 0 || (n < 0 && errno == ECONNRESET)) break;
      if (n < 0) return -1;  // timed out: still open
    }
    return std::chrono::duration<double>(Clock::now() - start).count();
  }

  net::io_context ioc_;
  std::unique_ptr<HttpServer> server_;
};

TEST_F(HttpLimitsTest, OversizedHeadIs431AndBodyIs413) {
  auto a = Connect();
  auto big_head = Get(a, "/h", "X-Big: " + std::string(4000, 'a') + "\r\n");
  EXPECT_EQ(big_head.result_int(), 431);
  // The OpenAI error body, as every handler's errors.
  EXPECT_EQ(big_head[http::field::content_type], "application/json");
  EXPECT_EQ(big_head.body(),
            R"({"error":{"code":431,"message":"request header larger than 2048 bytes",)"
            R"("param":null,"type":"invalid_request_error"}})");
  auto b = Connect();
  auto big_body = Get(b, "/b", "Content-Length: 5000\r\n");
  EXPECT_EQ(big_body.result_int(), 413);
  EXPECT_EQ(big_body.body(),
            R"({"error":{"code":413,"message":"request body larger than 4096 bytes",)"
            R"("param":null,"type":"invalid_request_error"}})");
  auto c = Connect();
  EXPECT_EQ(Get(c, "/fine").body(), "ok /fine");
}

TEST_F(HttpLimitsTest, TricklingHeadIsCutAtTheRequestTimeout) {
  auto socket = Connect();
  net::write(socket, net::buffer(std::string("GET /slow HTTP/1.1\r\n")));
  std::atomic<bool> stop{false};
  // One header byte every 100 ms: the head never completes.
  std::thread trickle([&] {
    while (!stop) {
      boost::system::error_code ec;
      net::write(socket, net::buffer(std::string("x")), ec);
      if (ec) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  const double closed_after = SecondsUntilClosed(socket, 5.0);
  stop = true;
  trickle.join();
  EXPECT_GT(closed_after, 0.5);
  EXPECT_LT(closed_after, 3.0);
}

TEST_F(HttpLimitsTest, SilentConnectionIsClosedAtTheRequestTimeout) {
  auto socket = Connect();
  const double closed_after = SecondsUntilClosed(socket, 5.0);
  EXPECT_GT(closed_after, 0.5);
  EXPECT_LT(closed_after, 3.0);
}

TEST_F(HttpLimitsTest, KeepAliveWaitsTheIdleTimeoutNotTheRequestTimeout) {
  auto socket = Connect();
  EXPECT_EQ(Get(socket, "/one").body(), "ok /one");
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // > request_timeout
  EXPECT_EQ(Get(socket, "/two").body(), "ok /two");
  const double closed_after = SecondsUntilClosed(socket, 6.0);
  EXPECT_GT(closed_after, 2.0);
  EXPECT_LT(closed_after, 5.0);
}

TEST_F(HttpLimitsTest, ManyTricklingConnectionsDoNotStarveRealRequests) {
  constexpr int kSlow = 300;
  std::vector<tcp::socket> slow;
  for (int i = 0; i < kSlow; ++i) {
    slow.push_back(Connect());
    net::write(slow.back(), net::buffer(std::string("POST /v1/completions HTTP/1.1\r\nX: ")));
  }
  for (int i = 0; i < 20; ++i) {
    auto socket = Connect();
    EXPECT_EQ(Get(socket, "/real").result_int(), 200);
  }
  // Every slow connection is cut at its deadline.
  int closed = 0;
  for (tcp::socket& s : slow) closed += SecondsUntilClosed(s, 5.0) >= 0 ? 1 : 0;
  EXPECT_EQ(closed, kSlow);
}

}  // namespace
}  // namespace sluice
