// HttpServer: a small asynchronous HTTP/1.1 server (Boost.Beast + Asio) for the OpenAI API.
//
// A fixed pool of io threads runs every connection; each connection lives on its own strand
// (no thread per request). Supports keep-alive, a request body limit (413), and
// Server-Sent Events with chunked transfer encoding. Slow clients are bounded: a request's
// header and body must arrive within request_timeout of its first byte (a fresh connection's
// first request: of the accept), and a keep-alive connection waits idle_timeout for the next
// request; a slowloris connection is closed at its deadline and costs one file descriptor and
// a few KiB until then. While a request is being answered the
// connection keeps a read pending: when the client disconnects (the read fails) or a write
// fails, the request's RequestHandle is cancelled, which aborts its engine work.
#ifndef SLUICE_SERVICES_COMMON_HTTP_SERVER_H_
#define SLUICE_SERVICES_COMMON_HTTP_SERVER_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "services/common/response_sink.h"

namespace sluice {

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 8000;                         // 0: an ephemeral port (see HttpServer::port)
  int num_io_threads = 2;
  uint64_t body_limit_bytes = 8ull << 20;       // larger bodies get 413
  uint32_t header_limit_bytes = 64u << 10;      // larger request heads get 431
  std::chrono::seconds idle_timeout{300};       // keep-alive wait for the next request
  std::chrono::seconds request_timeout{60};     // whole header + body, from its first byte
  // HTTPS: PEM certificate chain and private key; both empty: plain HTTP. The files are
  // re-read when they change (checked at most once a second, on accept).
  std::string tls_cert_file;
  std::string tls_key_file;
};

// HttpHandler answers one request through the sink (see OpenAiService::Handle). It runs on the
// connection's strand; `Poster` posts onto that strand.
using HttpHandler = std::function<std::shared_ptr<RequestHandle>(
    const HttpRequestInfo&, std::shared_ptr<ResponseSink>, Poster)>;

class HttpServer {
 public:
  // Start binds, listens and starts the io threads. Errors: InvalidArgument (bad host
  // address, unusable TLS files), Unavailable (bind/listen failed, e.g. the port is in use).
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(const HttpServerOptions& options,
                                                           HttpHandler handler);
  ~HttpServer();  // Stop()

  // port is the bound port (the actual one when options.port was 0).
  uint16_t port() const;
  // Stop closes the listener, stops the io threads and joins them, then closes the connections
  // still open, cancelling the requests they answer (RequestHandle::Cancel, on the calling
  // thread: no io thread runs then). Pending handlers are destroyed with the server.
  // Idempotent. Sinks and Posters handed to the handler refer to the server's io_context:
  // whoever holds them (e.g. engine callbacks) must release them before the server is
  // destroyed (stop the server, then the engine, then destroy the server).
  void Stop();

 private:
  class Impl;
  explicit HttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace sluice

#endif  // SLUICE_SERVICES_COMMON_HTTP_SERVER_H_
