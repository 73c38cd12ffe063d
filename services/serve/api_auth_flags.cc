#include "services/serve/api_auth_flags.h"

#include "services/serve/log.h"

namespace sluice {

void AddApiAuthFlags(CLI::App& app, ApiAuthOptions& options) {
  app.add_option("--api-key", options.api_key,
                 "Require this key (Authorization: Bearer KEY) on the API; also $SLUICE_API_KEY")
      ->envname("SLUICE_API_KEY");
  app.add_option("--api-keys-file", options.api_keys_file,
                 "JSON file of SHA-256-hashed keys with tenants and per-key limits "
                 "(services/api/README.md); reloaded on SIGHUP")
      ->check(CLI::ExistingFile);
  app.add_flag("--protect-metrics", options.protect_metrics,
               "/metrics needs an API key too (/health never does)");
}

sigset_t BlockServerSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  return signals;
}

int WaitForShutdown(const sigset_t& signals, ApiAuth* auth) {
  while (true) {
    int signal_number = 0;
    if (sigwait(&signals, &signal_number) != 0) continue;
    if (signal_number != SIGHUP) return signal_number;
    if (auth == nullptr) {
      spdlog::info("SIGHUP: no API keys file to reload");
      continue;
    }
    if (absl::Status status = auth->Reload(); !status.ok()) {
      spdlog::error("SIGHUP: keeping the previous API keys: {}", std::string(status.message()));
    } else {
      spdlog::info("SIGHUP: reloaded {} API keys", auth->num_keys());
    }
  }
}

absl::StatusOr<std::unique_ptr<ApiAuth>> CreateApiAuth(const ApiAuthOptions& options) {
  if (!options.enabled()) return std::unique_ptr<ApiAuth>();
  absl::StatusOr<std::unique_ptr<ApiAuth>> auth = ApiAuth::Create(options);
  if (auth.ok()) spdlog::info("API keys required ({} keys)", (*auth)->num_keys());
  return auth;
}

}  // namespace sluice
