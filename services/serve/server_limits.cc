#include "services/serve/server_limits.h"

#include <sys/resource.h>

namespace sluice {

void AddHttpLimitFlags(CLI::App& app, HttpServerOptions& http) {
  app.add_option("--max-request-body-bytes", http.body_limit_bytes,
                 "Larger HTTP request bodies get 413")
      ->check(CLI::PositiveNumber);
  app.add_option("--max-request-header-bytes", http.header_limit_bytes,
                 "Larger HTTP request heads get 431")
      ->check(CLI::PositiveNumber);
  app.add_option_function<int64_t>(
         "--http-request-timeout-s",
         [&http](int64_t s) { http.request_timeout = std::chrono::seconds(s); },
         "Close a connection whose request head and body take longer than this (60)")
      ->check(CLI::PositiveNumber);
  app.add_option_function<int64_t>(
         "--http-idle-timeout-s",
         [&http](int64_t s) { http.idle_timeout = std::chrono::seconds(s); },
         "Close a keep-alive connection idle this long between requests (300)")
      ->check(CLI::PositiveNumber);
}

uint64_t RaiseOpenFileLimit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return 0;
  if (limit.rlim_cur < limit.rlim_max) {
    rlimit raised = limit;
    raised.rlim_cur = limit.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &raised) == 0) return raised.rlim_cur;
  }
  return limit.rlim_cur;
}

}  // namespace sluice
