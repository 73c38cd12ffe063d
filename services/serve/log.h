// Logging for the `sluice` binary: spdlog used header-only (with fmt header-only), so the
// binary needs no extra link libraries.
#ifndef SLUICE_SERVICES_SERVE_LOG_H_
#define SLUICE_SERVICES_SERVE_LOG_H_

#ifndef FMT_HEADER_ONLY
#define FMT_HEADER_ONLY
#endif
#include <spdlog/spdlog.h>

#endif  // SLUICE_SERVICES_SERVE_LOG_H_
