// `--version` on every command line of `sluice`: `sluice --version`, `sluice serve --version`,
// `sluice --version serve` print the version line and exit 0. The rest of such a command line is
// parsed as usual, only without the required options and subcommand (printing the version needs
// none): an argument no command knows, or a bad value, is the usual usage error (exit 2,
// usage_error.h), not a version.
#ifndef SLUICE_SERVICES_SERVE_VERSION_FLAG_H_
#define SLUICE_SERVICES_SERVE_VERSION_FLAG_H_

#include <optional>
#include <string>

#include <CLI/CLI.hpp>

namespace sluice {

// ParseCommandLine parses argv into `app` (every subcommand already added) after adding a
// `--version` flag to it and to each of its subcommands (recursively). Returns the exit code
// when the program should exit now: 0 after printing `version_line` (stdout) or help,
// kUsageErrorExitCode after a usage error (UsageErrorMessage, printed to stderr); nullopt when
// the command should run.
std::optional<int> ParseCommandLine(CLI::App& app, int argc, char** argv,
                                    const std::string& version_line);

}  // namespace sluice

#endif  // SLUICE_SERVICES_SERVE_VERSION_FLAG_H_
