// Logging for the `sluice` binary: spdlog used header-only (with fmt header-only), so the
// binary needs no extra link libraries.
#ifndef SLUICE_SERVICES_SERVE_LOG_H_
#define SLUICE_SERVICES_SERVE_LOG_H_

#ifndef FMT_HEADER_ONLY
#define FMT_HEADER_ONLY
#endif
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

namespace sluice {

// InitLogging sends logs to stderr (stdout carries the ready line and nothing else).
inline void InitLogging() { spdlog::set_default_logger(spdlog::stderr_color_mt("sluice")); }

}  // namespace sluice

#endif  // SLUICE_SERVICES_SERVE_LOG_H_
