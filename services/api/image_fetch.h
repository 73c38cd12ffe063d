// ImageFetcher: http(s) image URLs of chat image parts, off unless hosts are allowed (vLLM's
// --allowed-media-domains). Every hop of a redirect chain must be on the allow-list too; the
// body is bounded in bytes (a Content-Length over the limit is refused before any body is
// read), the whole fetch (every hop) in time, and the chain in redirects. https verifies the
// server's certificate and host name against the system's CA store.
#ifndef SLUICE_SERVICES_API_IMAGE_FETCH_H_
#define SLUICE_SERVICES_API_IMAGE_FETCH_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace sluice {

struct ImageFetchOptions {
  // Host names (or IP literals) that may be fetched from, compared case-insensitively and
  // exactly (no subdomains); "*" allows any host. Empty: fetching is off.
  std::vector<std::string> allowed_domains;
  int64_t max_bytes = 20 << 20;                // body size of one image
  absl::Duration timeout = absl::Seconds(10);  // the whole fetch, redirects included
  int32_t max_redirects = 3;                   // 0: a redirect is an error
};

// ParsedUrl: the parts of an absolute http(s) URL the fetcher uses.
struct ParsedUrl {
  bool https = false;
  std::string host;    // lower case; an IPv6 literal without its brackets
  std::string port;    // "80" / "443" when the URL names none
  std::string target;  // path and query, at least "/"
};

// ParseHttpUrl: errors InvalidArgument for another scheme, user info, an empty host or a bad
// port.
absl::StatusOr<ParsedUrl> ParseHttpUrl(const std::string& url);

class ImageFetcher {
 public:
  explicit ImageFetcher(ImageFetchOptions options);

  bool enabled() const { return !options_.allowed_domains.empty(); }
  // Allowed: whether `host` is on the allow-list.
  bool Allowed(const std::string& host) const;
  // Fetch GETs `url` and returns the body of its final 200 answer. Thread-safe; blocks the
  // caller up to the timeout. Errors: InvalidArgument with a message a client can act on (the
  // host not allowed, a bad URL, the size over the limit, too many redirects, an HTTP status
  // other than 200, the timeout, a connection or TLS failure).
  absl::StatusOr<std::string> Fetch(const std::string& url) const;

 private:
  ImageFetchOptions options_;
};

}  // namespace sluice

#endif  // SLUICE_SERVICES_API_IMAGE_FETCH_H_
