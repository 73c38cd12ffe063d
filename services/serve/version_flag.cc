#include "services/serve/version_flag.h"

#include <cstdio>
#include <string_view>
#include <utility>
#include <vector>

#include "services/serve/usage_error.h"

namespace sluice {
namespace {

constexpr char kVersionHelp[] = "Print the version and the git commit of this build, and exit";

void AddVersionFlags(CLI::App& app, bool* version) {
  if (app.get_option_no_throw("--version") == nullptr) {
    app.add_flag("--version", *version, kVersionHelp);
  }
  for (CLI::App* sub : app.get_subcommands(std::function<bool(CLI::App*)>())) {
    AddVersionFlags(*sub, version);
  }
}

// AsksForVersion: a `--version` token before any `--` (the flag itself, not a value: a value
// that happens to read "--version" is caught after the parse).
bool AsksForVersion(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--") return false;
    if (arg == "--version" || arg.substr(0, 10) == "--version=") return true;
  }
  return false;
}

// Relaxed: what RelaxRequirements turned off, to turn back on.
struct Relaxed {
  std::vector<CLI::Option*> options;
  std::vector<std::pair<CLI::App*, size_t>> subcommand_minimums;
};

void RelaxRequirements(CLI::App& app, Relaxed* relaxed) {
  for (CLI::Option* option : app.get_options()) {
    if (option->get_required()) {
      option->required(false);
      relaxed->options.push_back(option);
    }
  }
  if (app.get_require_subcommand_min() > 0) {
    relaxed->subcommand_minimums.emplace_back(&app, app.get_require_subcommand_min());
    app.require_subcommand(0, app.get_require_subcommand_max());
  }
  for (CLI::App* sub : app.get_subcommands(std::function<bool(CLI::App*)>())) {
    RelaxRequirements(*sub, relaxed);
  }
}

void Restore(const Relaxed& relaxed) {
  for (CLI::Option* option : relaxed.options) option->required(true);
  for (const auto& [app, minimum] : relaxed.subcommand_minimums) {
    app->require_subcommand(minimum, app->get_require_subcommand_max());
  }
}

std::optional<int> Parse(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {
    return app.exit(e);  // --help: the help text, exit 0
  } catch (const CLI::ParseError& e) {
    std::fputs(UsageErrorMessage(app, e).c_str(), stderr);
    return kUsageErrorExitCode;
  }
  return std::nullopt;
}

}  // namespace

std::optional<int> ParseCommandLine(CLI::App& app, int argc, char** argv,
                                    const std::string& version_line) {
  bool version = false;
  AddVersionFlags(app, &version);
  if (!AsksForVersion(argc, argv)) return Parse(app, argc, argv);
  Relaxed relaxed;
  RelaxRequirements(app, &relaxed);
  if (std::optional<int> exit = Parse(app, argc, argv)) return exit;
  if (version) {
    std::printf("%s\n", version_line.c_str());
    return 0;
  }
  // "--version" was an option's value: parse again with every requirement.
  Restore(relaxed);
  app.clear();
  return Parse(app, argc, argv);
}

}  // namespace sluice
