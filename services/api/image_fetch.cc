#include "services/api/image_fetch.h"

#include <openssl/ssl.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/ssl/host_name_verification.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <chrono>
#include <optional>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace sluice {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;

absl::Status Bad(const std::string& problem) { return absl::InvalidArgumentError(problem); }

// Await starts one async operation and runs `ioc` until it completes or `deadline` passes; then
// `cancel` stops it and its handler is drained (operations here reference the caller's stack).
template <typename Start, typename Cancel>
beast::error_code Await(net::io_context& ioc, Clock::time_point deadline, Start start,
                        Cancel cancel) {
  std::optional<beast::error_code> result;
  start([&result](beast::error_code ec, auto&&...) { result = ec; });
  ioc.restart();
  ioc.run_until(deadline);
  if (result.has_value()) return *result;
  cancel();
  ioc.restart();
  ioc.run();
  return beast::error::timeout;
}

bool IsRedirect(unsigned status) {
  return status == 301 || status == 302 || status == 303 || status == 307 || status == 308;
}

// One GET over `stream` (connected, handshaken): the response, or the error.
template <typename Stream>
absl::StatusOr<http::response<http::string_body>> Get(net::io_context& ioc, Stream& stream,
                                                      const ParsedUrl& url, int64_t max_bytes,
                                                      Clock::time_point deadline) {
  auto& lowest = beast::get_lowest_layer(stream);
  auto close = [&lowest] { lowest.close(); };
  http::request<http::empty_body> request{http::verb::get, url.target, 11};
  request.set(http::field::host, url.host);
  request.set(http::field::user_agent, "sluice");
  request.set(http::field::accept, "image/*");
  lowest.expires_at(deadline);
  beast::error_code ec = Await(
      ioc, deadline, [&](auto handler) { http::async_write(stream, request, handler); }, close);
  if (ec) return Bad(absl::StrCat("sending the request failed: ", ec.message()));
  const absl::Status too_big =
      Bad(absl::StrCat("the image is over the limit of ", max_bytes, " bytes"));
  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  parser.header_limit(64 << 10);
  ec = Await(
      ioc, deadline,
      [&](auto handler) { http::async_read_header(stream, buffer, parser, handler); }, close);
  if (ec == beast::error::timeout) return Bad("timed out");
  if (ec) return Bad(absl::StrCat("reading the response failed: ", ec.message()));
  // A declared length over the limit is refused before any of the body is read (the parser's
  // own check of it was seen to let bodies through).
  const unsigned status = parser.get().result_int();
  if (status == 200 && parser.content_length().has_value() &&
      *parser.content_length() > static_cast<std::uint64_t>(max_bytes)) {
    return too_big;
  }
  parser.body_limit(static_cast<std::uint64_t>(max_bytes));
  ec = Await(
      ioc, deadline, [&](auto handler) { http::async_read(stream, buffer, parser, handler); },
      close);
  if (ec == http::error::body_limit) return too_big;
  if (ec == beast::error::timeout) return Bad("timed out");
  if (ec) return Bad(absl::StrCat("reading the response failed: ", ec.message()));
  if (static_cast<int64_t>(parser.get().body().size()) > max_bytes) return too_big;
  return parser.release();
}

}  // namespace

absl::StatusOr<ParsedUrl> ParseHttpUrl(const std::string& url) {
  ParsedUrl out;
  absl::string_view rest = url;
  if (absl::StartsWithIgnoreCase(rest, "https://")) {
    out.https = true;
    rest.remove_prefix(8);
  } else if (absl::StartsWithIgnoreCase(rest, "http://")) {
    rest.remove_prefix(7);
  } else {
    return Bad("only http and https URLs can be fetched");
  }
  const size_t end = rest.find_first_of("/?#");
  absl::string_view authority = rest.substr(0, end);
  absl::string_view target = end == absl::string_view::npos ? "" : rest.substr(end);
  if (const size_t hash = target.find('#'); hash != absl::string_view::npos) {
    target = target.substr(0, hash);
  }
  if (absl::StrContains(authority, '@')) return Bad("URLs with user info are not fetched");
  absl::string_view port;
  if (absl::StartsWith(authority, "[")) {  // [IPv6]:port
    const size_t close = authority.find(']');
    if (close == absl::string_view::npos) return Bad("bad IPv6 host in the URL");
    out.host = std::string(authority.substr(1, close - 1));
    absl::string_view after = authority.substr(close + 1);
    if (!after.empty()) {
      if (after[0] != ':') return Bad("bad host in the URL");
      port = after.substr(1);
    }
  } else {
    const size_t colon = authority.rfind(':');
    out.host = std::string(authority.substr(0, colon));
    if (colon != absl::string_view::npos) port = authority.substr(colon + 1);
  }
  if (out.host.empty()) return Bad("the URL has no host");
  out.host = absl::AsciiStrToLower(out.host);
  int port_number = out.https ? 443 : 80;
  if (!port.empty() && (!absl::SimpleAtoi(port, &port_number) || port_number <= 0 ||
                        port_number > 65535)) {
    return Bad("bad port in the URL");
  }
  out.port = absl::StrCat(port_number);
  out.target = target.empty() || target[0] != '/' ? absl::StrCat("/", target)
                                                   : std::string(target);
  return out;
}

ImageFetcher::ImageFetcher(ImageFetchOptions options) : options_(std::move(options)) {
  for (std::string& d : options_.allowed_domains) d = absl::AsciiStrToLower(d);
}

bool ImageFetcher::Allowed(const std::string& host) const {
  const std::string lower = absl::AsciiStrToLower(host);
  for (const std::string& d : options_.allowed_domains) {
    if (d == "*" || d == lower) return true;
  }
  return false;
}

absl::StatusOr<std::string> ImageFetcher::Fetch(const std::string& url) const {
  const Clock::time_point deadline = Clock::now() + absl::ToChronoNanoseconds(options_.timeout);
  const std::string timed_out =
      absl::StrCat("fetching the image URL took longer than ",
                   absl::FormatDuration(options_.timeout));
  std::string current = url;
  for (int32_t redirects = 0;; ++redirects) {
    absl::StatusOr<ParsedUrl> parsed = ParseHttpUrl(current);
    if (!parsed.ok()) return parsed.status();
    if (!Allowed(parsed->host)) {
      return Bad(absl::StrCat("the host '", parsed->host, "'",
                              redirects > 0 ? " (redirected to)" : "",
                              " is not in --allowed-media-domains"));
    }
    net::io_context ioc;
    tcp::resolver resolver(ioc);
    tcp::resolver::results_type endpoints;
    beast::error_code ec = Await(
        ioc, deadline,
        [&](auto handler) {
          resolver.async_resolve(parsed->host, parsed->port,
                                 [&endpoints, handler](beast::error_code e,
                                                       tcp::resolver::results_type r) mutable {
                                   endpoints = std::move(r);
                                   handler(e);
                                 });
        },
        [&resolver] { resolver.cancel(); });
    if (ec == beast::error::timeout) return Bad(timed_out);
    if (ec) return Bad(absl::StrCat("cannot resolve '", parsed->host, "': ", ec.message()));
    absl::StatusOr<http::response<http::string_body>> response;
    if (parsed->https) {
      net::ssl::context ctx(net::ssl::context::tls_client);
      ctx.set_default_verify_paths();
      ctx.set_verify_mode(net::ssl::verify_peer);
      beast::ssl_stream<beast::tcp_stream> stream(ioc, ctx);
      SSL_set_tlsext_host_name(stream.native_handle(), parsed->host.c_str());
      stream.set_verify_callback(net::ssl::host_name_verification(parsed->host));
      auto close = [&stream] { beast::get_lowest_layer(stream).close(); };
      beast::get_lowest_layer(stream).expires_at(deadline);
      ec = Await(
          ioc, deadline,
          [&](auto handler) { beast::get_lowest_layer(stream).async_connect(endpoints, handler); },
          close);
      if (ec == beast::error::timeout) return Bad(timed_out);
      if (ec) return Bad(absl::StrCat("cannot connect to '", parsed->host, "': ", ec.message()));
      ec = Await(
          ioc, deadline,
          [&](auto handler) { stream.async_handshake(net::ssl::stream_base::client, handler); },
          close);
      if (ec == beast::error::timeout) return Bad(timed_out);
      if (ec) return Bad(absl::StrCat("TLS with '", parsed->host, "' failed: ", ec.message()));
      response = Get(ioc, stream, *parsed, options_.max_bytes, deadline);
      close();
    } else {
      beast::tcp_stream stream(ioc);
      stream.expires_at(deadline);
      ec = Await(
          ioc, deadline, [&](auto handler) { stream.async_connect(endpoints, handler); },
          [&stream] { stream.close(); });
      if (ec == beast::error::timeout) return Bad(timed_out);
      if (ec) return Bad(absl::StrCat("cannot connect to '", parsed->host, "': ", ec.message()));
      response = Get(ioc, stream, *parsed, options_.max_bytes, deadline);
      stream.close();
    }
    if (!response.ok()) {
      if (absl::StrContains(response.status().message(), "timed out")) return Bad(timed_out);
      return response.status();
    }
    const unsigned status = response->result_int();
    if (status == 200) return std::move(response->body());
    if (!IsRedirect(status)) {
      return Bad(absl::StrCat("the image URL answered HTTP ", status));
    }
    if (redirects >= options_.max_redirects) {
      return Bad(absl::StrCat("the image URL redirected more than ", options_.max_redirects,
                              " times"));
    }
    const std::string location(response->base()[http::field::location]);
    if (location.empty()) return Bad(absl::StrCat("HTTP ", status, " without a Location"));
    if (absl::StartsWith(location, "/") && !absl::StartsWith(location, "//")) {
      const bool ipv6 = absl::StrContains(parsed->host, ':');
      current = absl::StrCat(parsed->https ? "https://" : "http://", ipv6 ? "[" : "",
                             parsed->host, ipv6 ? "]" : "", ":", parsed->port, location);
    } else {
      current = location;
    }
  }
}

}  // namespace sluice
