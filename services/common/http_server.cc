#include "services/common/http_server.h"

#include <algorithm>
#include <deque>
#include <memory>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include <boost/asio/dispatch.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"
#include "services/common/tls_context.h"

namespace sluice {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
namespace ssl = net::ssl;
using tcp = net::ip::tcp;
using TlsStream = beast::ssl_stream<beast::tcp_stream>;

constexpr size_t kMonitorReadBytes = 4096;

std::string StatusLine(int status) {
  const beast::string_view reason = http::obsolete_reason(static_cast<http::status>(status));
  return absl::StrCat("HTTP/1.1 ", status, " ", std::string(reason.data(), reason.size()),
                      "\r\n");
}

// LiveConnection is what the server keeps of each connection to close it on Stop.
class LiveConnection {
 public:
  virtual ~LiveConnection() = default;
  // CloseForStop cancels the request being answered and closes the socket. Only once no io
  // thread runs (the strand's work is then serialized with the caller).
  virtual void CloseForStop() = 0;
};

// Connection serves one TCP connection (Stream: beast::tcp_stream, or TlsStream over it), on
// its own strand. It is the ResponseSink of the request it is answering.
template <class Stream>
class Connection : public ResponseSink,
                   public LiveConnection,
                   public std::enable_shared_from_this<Connection<Stream>> {
 public:
  static constexpr bool kTls = std::is_same_v<Stream, TlsStream>;

  // `tls` (TLS connections only) is kept alive as long as the connection.
  Connection(tcp::socket socket, const HttpServerOptions& options, const HttpHandler& handler,
             std::shared_ptr<ssl::context> tls = nullptr)
      : stream_(MakeStream(std::move(socket), tls.get())),
        tls_(std::move(tls)),
        options_(options),
        handler_(handler) {}

  void Run() {
    net::dispatch(stream_.get_executor(), [self = this->shared_from_this()] {
      if constexpr (kTls) {
        // The handshake counts against the first request's deadline.
        self->lowest().expires_after(self->options_.request_timeout);
        self->stream_.async_handshake(ssl::stream_base::server,
                                      [self](beast::error_code ec) {
                                        if (ec) {
                                          self->Close();
                                        } else {
                                          self->DoRead();
                                        }
                                      });
      } else {
        self->DoRead();
      }
    });
  }

  void SendResponse(int status, const std::string& content_type, std::string body) override {
    if (closed_) return;
    std::string out = StatusLine(status);
    absl::StrAppend(&out, "Server: sluice\r\n", extra_headers_, "Content-Type: ", content_type,
                    "\r\nContent-Length: ", body.size(),
                    keep_alive_ ? "\r\nConnection: keep-alive\r\n\r\n"
                                : "\r\nConnection: close\r\n\r\n");
    extra_headers_.clear();
    if (!head_request_) out += body;
    Enqueue(std::move(out), /*last=*/true);
  }

  void StartEventStream() override {
    if (closed_) return;
    std::string out = StatusLine(200);
    absl::StrAppend(&out,
                    "Server: sluice\r\n", extra_headers_,
                    "Content-Type: text/event-stream\r\n"
                    "Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n",
                    keep_alive_ ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n");
    extra_headers_.clear();
    Enqueue(std::move(out), /*last=*/false);
  }

  void AddResponseHeader(const std::string& name, const std::string& value) override {
    absl::StrAppend(&extra_headers_, name, ": ", value, "\r\n");
  }

  void SendEvent(std::string event) override {
    if (closed_ || event.empty()) return;
    // RFC 9112 §7.1: chunk = chunk-size (hex) CRLF chunk-data CRLF.
    std::string out = absl::StrFormat("%x\r\n", event.size());
    out += event;
    out += "\r\n";
    Enqueue(std::move(out), /*last=*/false);
  }

  void EndEventStream() override {
    if (closed_) return;
    Enqueue("0\r\n\r\n", /*last=*/true);
  }

  // The request's handle usually holds this connection as its sink (GenerationSession::sink_):
  // a cycle that only Close breaks. Without it, a request still open when the server stops
  // would keep the connection, its socket and the handle alive forever.
  void CloseForStop() override { Close(); }

 private:
  // DoRead waits for the next request. Between keep-alive requests the wait for its first
  // byte is bounded by idle_timeout; from then on (and on a fresh connection, from the accept)
  // the whole request by request_timeout, so a client trickling its header cannot hold the
  // connection longer.
  void DoRead() {
    if (closed_) return;
    if (num_requests_ > 0 && buffer_.size() == 0) {
      lowest().expires_after(options_.idle_timeout);
      stream_.async_read_some(buffer_.prepare(kMonitorReadBytes),
                              [self = this->shared_from_this()](beast::error_code ec, size_t n) {
                                if (ec) {
                                  self->OnRead(ec);
                                  return;
                                }
                                self->buffer_.commit(n);
                                self->ReadHeader();
                              });
      return;
    }
    ReadHeader();
  }

  void ReadHeader() {
    if (closed_) return;
    ++num_requests_;
    parser_.emplace();
    parser_->body_limit(options_.body_limit_bytes);
    parser_->header_limit(options_.header_limit_bytes);
    lowest().expires_after(options_.request_timeout);
    http::async_read_header(stream_, buffer_, *parser_,
                            [self = this->shared_from_this()](beast::error_code ec, size_t) {
                              self->OnHeader(ec);
                            });
  }

  // OnHeader answers `Expect: 100-continue` (curl sends it for bodies over 1 KiB and would
  // otherwise wait a second) before reading the body. An over-limit Content-Length is already
  // reported here as body_limit, so such bodies are refused before they are sent.
  void OnHeader(beast::error_code ec) {
    if (ec || parser_->is_done()) {
      OnRead(ec);
      return;
    }
    const auto expect = parser_->get()[http::field::expect];
    if (beast::iequals(expect, "100-continue")) {
      static const std::string kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
      net::async_write(stream_, net::buffer(kContinue),
                       [self = this->shared_from_this()](beast::error_code ec, size_t) {
                         if (ec) {
                           self->Close();
                         } else {
                           self->ReadBody();
                         }
                       });
      return;
    }
    ReadBody();
  }

  void ReadBody() {
    http::async_read(stream_, buffer_, *parser_,
                     [self = this->shared_from_this()](beast::error_code ec, size_t) {
                       self->OnRead(ec);
                     });
  }

  void OnRead(beast::error_code ec) {
    if (closed_) return;
    lowest().expires_never();
    if (ec == http::error::body_limit) {
      RespondAndClose(413, absl::StrCat("request body larger than ", options_.body_limit_bytes,
                                        " bytes"));
      return;
    }
    if (ec == http::error::header_limit) {
      RespondAndClose(431, absl::StrCat("request header larger than ",
                                        options_.header_limit_bytes, " bytes"));
      return;
    }
    if (ec == http::error::end_of_stream || ec == net::error::eof ||
        ec == net::error::connection_reset || ec == beast::error::timeout ||
        ec == net::error::operation_aborted) {
      Close();
      return;
    }
    if (ec) {
      RespondAndClose(400, absl::StrCat("malformed HTTP request: ", ec.message()));
      return;
    }
    http::request<http::string_body> req = parser_->release();
    parser_.reset();
    keep_alive_ = req.keep_alive();
    head_request_ = req.method() == http::verb::head;
    request_active_ = true;
    response_finished_ = false;
    HttpRequestInfo info;
    info.method = std::string(req.method_string());
    info.target = std::string(req.target());
    info.body = std::move(req.body());
    info.authorization = std::string(req[http::field::authorization]);
    auto executor = stream_.get_executor();
    Poster poster = [executor](std::function<void()> task) {
      net::post(executor, std::move(task));
    };
    handle_ = handler_(info, this->shared_from_this(), std::move(poster));
    if (!response_finished_) StartMonitor();
  }

  // RespondAndClose answers a request that could not be parsed, then closes.
  void RespondAndClose(int status, const std::string& message) {
    keep_alive_ = false;
    head_request_ = false;
    request_active_ = true;
    response_finished_ = false;
    // The OpenAI error body every Sluice HTTP endpoint answers with (openai_errors.h).
    const nlohmann::json error = {{"error",
                                   {{"message", message},
                                    {"type", "invalid_request_error"},
                                    {"param", nullptr},
                                    {"code", status}}}};
    SendResponse(status, "application/json",
                 error.dump(-1, ' ', /*ensure_ascii=*/false,
                            nlohmann::json::error_handler_t::replace));
  }

  // StartMonitor keeps a read pending while the response is produced, to notice a client
  // that goes away. Data that arrives (a pipelined request) is kept in buffer_ for the parser.
  void StartMonitor() {
    if (monitor_pending_ || closed_) return;
    // Bytes of a pipelined next request are already buffered: the client is alive, and a
    // monitor read would wait for input that never comes while the next request sits unparsed.
    if (buffer_.size() > 0) return;
    monitor_pending_ = true;
    stream_.async_read_some(buffer_.prepare(kMonitorReadBytes),
                            [self = this->shared_from_this()](beast::error_code ec, size_t n) {
                              self->OnMonitor(ec, n);
                            });
  }

  void OnMonitor(beast::error_code ec, size_t n) {
    monitor_pending_ = false;
    if (closed_) return;
    if (ec) {
      Close();  // cancels the active request
      return;
    }
    buffer_.commit(n);
    if (!keep_alive_ && !request_active_) {
      Linger();  // the response said Connection: close; never read another request
      return;
    }
    // Between requests the monitor read is the start of the next request.
    if (!request_active_) DoRead();
  }

  void Enqueue(std::string bytes, bool last) {
    if (last) response_finished_ = true;
    pending_ += bytes;
    if (!writing_) DoWrite();
  }

  void DoWrite() {
    if (pending_.empty() || closed_) return;
    writing_ = true;
    in_flight_.swap(pending_);
    pending_.clear();
    net::async_write(stream_, net::buffer(in_flight_),
                     [self = this->shared_from_this()](beast::error_code ec, size_t) {
                       self->OnWrite(ec);
                     });
  }

  void OnWrite(beast::error_code ec) {
    writing_ = false;
    in_flight_.clear();
    if (closed_) return;
    if (ec) {
      Close();
      return;
    }
    if (!pending_.empty()) {
      DoWrite();
      return;
    }
    if (request_active_ && response_finished_) ResponseComplete();
  }

  void ResponseComplete() {
    request_active_ = false;
    handle_.reset();
    if (!keep_alive_) {
      Linger();
      return;
    }
    if (!monitor_pending_) DoRead();  // else OnMonitor starts the next read
  }

  // Linger ends a `Connection: close` response gracefully: closing a socket with unread input
  // sends a TCP reset that can destroy the response in flight (e.g. a 413 answered before the
  // body was read), so half-close, discard input until the client closes (or 2 s), then close.
  void Linger() {
    if (closed_) return;
    beast::error_code ignored;
    lowest().socket().shutdown(tcp::socket::shutdown_send, ignored);
    if (monitor_pending_) return;  // OnMonitor sees the client's EOF and closes
    lowest().expires_after(std::chrono::seconds(2));
    DiscardInput();
  }

  void DiscardInput() {
    buffer_.clear();
    stream_.async_read_some(buffer_.prepare(kMonitorReadBytes),
                            [self = this->shared_from_this()](beast::error_code ec, size_t) {
                              if (ec) {
                                self->Close();
                              } else {
                                self->DiscardInput();
                              }
                            });
  }

  void Close() {
    if (closed_) return;
    closed_ = true;
    if (request_active_ && handle_ != nullptr) handle_->Cancel();
    handle_.reset();
    beast::error_code ignored;
    lowest().socket().shutdown(tcp::socket::shutdown_both, ignored);
    lowest().socket().close(ignored);
  }

  static Stream MakeStream(tcp::socket socket, ssl::context* tls) {
    if constexpr (kTls) {
      return Stream(std::move(socket), *tls);
    } else {
      return Stream(std::move(socket));
    }
  }
  beast::tcp_stream& lowest() { return beast::get_lowest_layer(stream_); }

  Stream stream_;
  std::shared_ptr<ssl::context> tls_;
  const HttpServerOptions& options_;
  const HttpHandler& handler_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::string extra_headers_;  // AddResponseHeader lines for the next response head
  std::string pending_;    // bytes queued behind the write in flight
  std::string in_flight_;  // bytes of the write in flight
  std::shared_ptr<RequestHandle> handle_;
  bool writing_ = false;
  bool request_active_ = false;
  bool response_finished_ = false;
  bool monitor_pending_ = false;
  bool keep_alive_ = true;
  bool head_request_ = false;
  bool closed_ = false;
  int64_t num_requests_ = 0;  // requests whose reading started on this connection
};

}  // namespace

class HttpServer::Impl {
 public:
  Impl(const HttpServerOptions& options, HttpHandler handler)
      : options_(options),
        handler_(std::move(handler)),
        ioc_(options.num_io_threads),
        acceptor_(net::make_strand(ioc_)),
        accept_backoff_(acceptor_.get_executor()) {}

  absl::Status Listen() {
    if (!options_.tls_cert_file.empty() || !options_.tls_key_file.empty()) {
      absl::StatusOr<std::unique_ptr<TlsContextSource>> tls =
          TlsContextSource::Create(options_.tls_cert_file, options_.tls_key_file);
      if (!tls.ok()) return tls.status();
      tls_ = *std::move(tls);
    }
    beast::error_code ec;
    const net::ip::address address = net::ip::make_address(options_.host, ec);
    if (ec) return absl::InvalidArgumentError(absl::StrCat("bad host '", options_.host, "'"));
    const tcp::endpoint endpoint(address, options_.port);
    acceptor_.open(endpoint.protocol(), ec);
    if (!ec) acceptor_.set_option(net::socket_base::reuse_address(true), ec);
    if (!ec) acceptor_.bind(endpoint, ec);
    if (!ec) acceptor_.listen(net::socket_base::max_listen_connections, ec);
    if (ec) {
      return absl::UnavailableError(absl::StrCat("cannot listen on ", options_.host, ":",
                                                 options_.port, ": ", ec.message()));
    }
    port_ = acceptor_.local_endpoint().port();
    DoAccept();
    const int n = std::max(1, options_.num_io_threads);
    for (int i = 0; i < n; ++i) threads_.emplace_back([this] { ioc_.run(); });
    return absl::OkStatus();
  }

  void Stop() {
    if (stopped_) return;
    stopped_ = true;
    net::post(acceptor_.get_executor(), [this] {
      beast::error_code ignored;
      acceptor_.close(ignored);
      accept_backoff_.cancel();
    });
    ioc_.stop();
    for (std::thread& t : threads_) {
      if (t.joinable()) t.join();
    }
    // No io thread runs now: close what is still open, cancelling its request (as when its
    // client goes away), which breaks the connection <-> request handle cycle.
    for (const std::weak_ptr<LiveConnection>& weak : connections_) {
      if (std::shared_ptr<LiveConnection> connection = weak.lock()) connection->CloseForStop();
    }
    connections_.clear();
  }

  uint16_t port() const { return port_; }

 private:
  void DoAccept() {
    acceptor_.async_accept(net::make_strand(ioc_),
                           [this](beast::error_code ec, tcp::socket socket) {
                             if (ec == net::error::operation_aborted || !acceptor_.is_open()) {
                               return;
                             }
                             if (!ec) {
                               socket.set_option(tcp::no_delay(true), ec);
                               if (tls_ != nullptr) {
                                 auto connection = std::make_shared<Connection<TlsStream>>(
                                     std::move(socket), options_, handler_, tls_->Current());
                                 Track(connection);
                                 connection->Run();
                               } else {
                                 auto connection =
                                     std::make_shared<Connection<beast::tcp_stream>>(
                                         std::move(socket), options_, handler_);
                                 Track(connection);
                                 connection->Run();
                               }
                             } else if (ec == net::error::no_descriptors ||
                                        ec == net::error::no_buffer_space ||
                                        ec == net::error::no_memory) {
                               // Out of file descriptors: retrying at once would spin; the
                               // pending connection stays in the backlog until one is freed.
                               accept_backoff_.expires_after(std::chrono::milliseconds(50));
                               accept_backoff_.async_wait([this](beast::error_code wait_ec) {
                                 if (!wait_ec && acceptor_.is_open()) DoAccept();
                               });
                               return;
                             }
                             DoAccept();
                           });
  }

  // Track remembers a new connection for Stop (on the acceptor's strand). Closed connections
  // are dropped when the list has doubled since the last sweep, so it stays within twice the
  // number of open connections.
  void Track(const std::shared_ptr<LiveConnection>& connection) {
    if (connections_.size() >= sweep_at_) {
      std::erase_if(connections_,
                    [](const std::weak_ptr<LiveConnection>& weak) { return weak.expired(); });
      sweep_at_ = std::max<size_t>(64, 2 * connections_.size());
    }
    connections_.push_back(connection);
  }

  HttpServerOptions options_;
  HttpHandler handler_;
  std::unique_ptr<TlsContextSource> tls_;  // null: plain HTTP
  net::io_context ioc_;
  tcp::acceptor acceptor_;
  net::steady_timer accept_backoff_;  // on the acceptor's strand
  std::vector<std::thread> threads_;
  // Every accepted connection, for Stop; the acceptor's strand's, then Stop's after the join.
  std::vector<std::weak_ptr<LiveConnection>> connections_;
  size_t sweep_at_ = 64;
  uint16_t port_ = 0;
  bool stopped_ = false;
};

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

HttpServer::~HttpServer() { Stop(); }

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(const HttpServerOptions& options,
                                                              HttpHandler handler) {
  auto impl = std::make_unique<Impl>(options, std::move(handler));
  if (absl::Status s = impl->Listen(); !s.ok()) return s;
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

uint16_t HttpServer::port() const { return impl_->port(); }

void HttpServer::Stop() {
  if (impl_ != nullptr) impl_->Stop();
}

}  // namespace sluice
