// HttpServer::Stop with a request still being answered: the request's handle holds the
// connection as its sink (as GenerationSession does), so only Stop can break that cycle. Before
// the fix the connection, its socket and the handle outlived the server (LeakSanitizer report
// from `sluice serve` in the integration suite under ASan, 2026-12-06).
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/write.hpp>
#include <gtest/gtest.h>

#include "services/common/http_server.h"

namespace sluice {
namespace {

namespace net = boost::asio;
using tcp = net::ip::tcp;

// HoldingHandle keeps its sink until it is destroyed, and counts its cancellations.
class HoldingHandle : public RequestHandle {
 public:
  HoldingHandle(std::shared_ptr<ResponseSink> sink, std::atomic<int>* cancels)
      : sink_(std::move(sink)), cancels_(cancels) {}
  void Cancel() override { cancels_->fetch_add(1); }

 private:
  std::shared_ptr<ResponseSink> sink_;
  std::atomic<int>* cancels_;
};

TEST(HttpServerStopTest, OpenRequestIsCancelledAndFreedWithTheServer) {
  std::atomic<int> cancels{0};
  std::atomic<bool> started{false};
  std::mutex mu;
  std::weak_ptr<RequestHandle> handle_seen;
  std::weak_ptr<ResponseSink> sink_seen;
  HttpServerOptions options;
  options.port = 0;
  auto server = HttpServer::Start(
      options, [&](const HttpRequestInfo&, std::shared_ptr<ResponseSink> sink,
                   Poster) -> std::shared_ptr<RequestHandle> {
        auto handle = std::make_shared<HoldingHandle>(sink, &cancels);
        {
          std::lock_guard<std::mutex> lock(mu);
          handle_seen = handle;
          sink_seen = sink;
        }
        started = true;
        return handle;  // never answered: the request is open when the server stops
      });
  ASSERT_TRUE(server.ok()) << server.status();

  net::io_context ioc;
  tcp::socket client(ioc);
  client.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), (*server)->port()));
  net::write(client, net::buffer(std::string("GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!started && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_TRUE(started);

  (*server)->Stop();
  EXPECT_EQ(cancels.load(), 1);  // as when the client goes away
  server->reset();
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_TRUE(handle_seen.expired());
  EXPECT_TRUE(sink_seen.expired());
}

// A connection that finished its request and one that never sent a byte are not cancelled
// (nothing to cancel) and are freed with the server as well.
TEST(HttpServerStopTest, IdleConnectionsAreFreedWithTheServer) {
  std::atomic<int> answered{0};
  std::weak_ptr<ResponseSink> sink_seen;
  std::mutex mu;
  HttpServerOptions options;
  options.port = 0;
  auto server = HttpServer::Start(
      options, [&](const HttpRequestInfo&, std::shared_ptr<ResponseSink> sink,
                   Poster) -> std::shared_ptr<RequestHandle> {
        {
          std::lock_guard<std::mutex> lock(mu);
          sink_seen = sink;
        }
        // Counted before the reply is sent: the client may read it before this thread runs on.
        answered.fetch_add(1);
        sink->SendResponse(200, "text/plain", "ok");
        return nullptr;
      });
  ASSERT_TRUE(server.ok()) << server.status();

  net::io_context ioc;
  const tcp::endpoint endpoint(net::ip::make_address("127.0.0.1"), (*server)->port());
  tcp::socket silent(ioc), answered_client(ioc);
  silent.connect(endpoint);
  answered_client.connect(endpoint);
  net::write(answered_client, net::buffer(std::string("GET / HTTP/1.1\r\nHost: x\r\n\r\n")));
  std::string reply;
  char chunk[256];
  while (reply.size() < 15) reply.append(chunk, answered_client.read_some(net::buffer(chunk)));
  EXPECT_EQ(reply.substr(0, 15), "HTTP/1.1 200 OK");
  EXPECT_EQ(answered.load(), 1);

  server->reset();
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_TRUE(sink_seen.expired());
}

}  // namespace
}  // namespace sluice
