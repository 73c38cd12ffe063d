// Command-line and signal plumbing of the API keys (services/api/auth/api_auth.h) for
// `sluice serve` and `sluice router`.
#ifndef SLUICE_SERVICES_SERVE_API_AUTH_FLAGS_H_
#define SLUICE_SERVICES_SERVE_API_AUTH_FLAGS_H_

#include <signal.h>

#include <memory>

#include <CLI/CLI.hpp>

#include "services/api/auth/api_auth.h"

namespace sluice {

// AddApiAuthFlags registers --api-key (also $SLUICE_API_KEY), --api-keys-file and
// --protect-metrics.
void AddApiAuthFlags(CLI::App& app, ApiAuthOptions& options);

// BlockServerSignals blocks SIGINT, SIGTERM and SIGHUP in the calling thread (and so in every
// thread it starts later) and returns that set for WaitForShutdown. Call first thing.
sigset_t BlockServerSignals();

// WaitForShutdown waits for SIGINT/SIGTERM and returns its number. Each SIGHUP in between
// reloads `auth`'s keys file (when auth is not null); open connections are untouched.
int WaitForShutdown(const sigset_t& signals, ApiAuth* auth);

// CreateApiAuth builds the auth from the flags: null with OK when no key is configured.
absl::StatusOr<std::unique_ptr<ApiAuth>> CreateApiAuth(const ApiAuthOptions& options);

}  // namespace sluice

#endif  // SLUICE_SERVICES_SERVE_API_AUTH_FLAGS_H_
