// Usage errors of the `sluice` command line: every argument CLI11 refuses (an unknown
// subcommand or option, a value of the wrong type or out of range, a missing required option or
// value) exits with one code, kUsageErrorExitCode, and one message form:
//
//   sluice: error: --port: invalid value 'abc' (expected an integer in [0, 65535])
//   Run 'sluice serve --help' for usage.
//
// instead of CLI11's own exit codes (104-114, one per exception type) and wording ("Could not
// convert: --f = x", "Value 0 not in range 0.000000 to 1.797693e+308").
#ifndef SLUICE_SERVICES_SERVE_USAGE_ERROR_H_
#define SLUICE_SERVICES_SERVE_USAGE_ERROR_H_

#include <string>

#include <CLI/CLI.hpp>

namespace sluice {

// The exit code of every usage error, as argparse and most Unix tools use (also the code of a
// parallel layout the model cannot take: main.cc).
inline constexpr int kUsageErrorExitCode = 2;

// UsageErrorMessage: the text to print to stderr for `error`, which `app.parse` threw (not a
// CLI::Success): "sluice: error: WHAT\nRun 'sluice [SUBCOMMAND...] --help' for usage.\n". WHAT
// names the bad argument and the form it expects; after a bad value, arguments no command knows
// are named before any other error (a misspelt option otherwise surfaces as "--model is
// required"), with the closest known name when one is a typo away. `app` is the
// top-level app, in the state the failed parse left it (its parsed subcommands, leftovers and
// option values).
std::string UsageErrorMessage(const CLI::App& app, const CLI::ParseError& error);

}  // namespace sluice

#endif  // SLUICE_SERVICES_SERVE_USAGE_ERROR_H_
