#include "services/serve/usage_error.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace sluice {
namespace {

// ParsedChain: the top-level app and the subcommands the parse entered, outermost first.
std::vector<const CLI::App*> ParsedChain(const CLI::App& app) {
  std::vector<const CLI::App*> chain = {&app};
  for (;;) {
    std::vector<CLI::App*> subs = chain.back()->get_subcommands();
    if (subs.empty()) return chain;
    chain.push_back(subs.front());
  }
}

std::string CommandPath(const std::vector<const CLI::App*>& chain, size_t end) {
  std::string path = "sluice";
  for (size_t i = 1; i < end; ++i) absl::StrAppend(&path, " ", chain[i]->get_name());
  return path;
}

std::vector<std::string> SubcommandNames(const CLI::App& app) {
  std::vector<std::string> names;
  for (const CLI::App* sub :
       app.get_subcommands(std::function<bool(const CLI::App*)>([](const CLI::App* s) {
         return !s->get_name().empty() && !s->get_disabled();
       }))) {
    names.push_back(sub->get_name());
  }
  return names;
}

std::vector<std::string> OptionNames(const CLI::App& app) {
  std::vector<std::string> names;
  for (const CLI::Option* option : app.get_options()) {
    for (const std::string& name : option->get_lnames()) names.push_back("--" + name);
  }
  return names;
}

size_t EditDistance(absl::string_view a, absl::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// DidYouMean: "; did you mean X?" for the one candidate within two edits of `word` (a typo,
// a swapped pair of letters), else "".
std::string DidYouMean(absl::string_view word, const std::vector<std::string>& candidates) {
  word = word.substr(0, word.find('='));
  std::optional<std::string> best;
  size_t best_distance = 3;
  bool tie = false;
  for (const std::string& c : candidates) {
    const size_t d = EditDistance(word, c);
    if (d < best_distance) {
      best = c;
      best_distance = d;
      tie = false;
    } else if (d == best_distance && best.has_value() && *best != c) {
      tie = true;
    }
  }
  if (!best.has_value() || tie || best_distance == 0) return "";
  return absl::StrCat("; did you mean ", *best, "?");
}

// UnknownArguments: the message for arguments no command of the chain took, or nullopt.
std::optional<std::string> UnknownArguments(const std::vector<const CLI::App*>& chain) {
  for (size_t i = 0; i < chain.size(); ++i) {
    const std::vector<std::string> left = chain[i]->remaining(false);
    if (left.empty()) continue;
    const CLI::App& owner = *chain[i];
    const std::vector<std::string> subcommands = SubcommandNames(owner);
    // A bare word where a subcommand was expected (none was entered below this command).
    if (i + 1 == chain.size() && !subcommands.empty() && !absl::StartsWith(left.front(), "-")) {
      return absl::StrCat("unknown subcommand '", left.front(), "'",
                          i == 0 ? "" : absl::StrCat(" for '", CommandPath(chain, i + 1), "'"),
                          " (expected one of: ", absl::StrJoin(subcommands, ", "), ")",
                          DidYouMean(left.front(), subcommands));
    }
    std::string message = absl::StrCat(left.size() == 1 ? "unrecognized argument: "
                                                        : "unrecognized arguments: ",
                                       absl::StrJoin(left, " "));
    if (absl::StartsWith(left.front(), "--")) {
      // The options of the innermost command the user is running, and the global ones.
      std::vector<std::string> known = OptionNames(*chain.back());
      for (const std::string& name : OptionNames(*chain.front())) known.push_back(name);
      absl::StrAppend(&message, DidYouMean(left.front(), known));
    }
    return message;
  }
  return std::nullopt;
}

// ValueForm: what an option's values must look like, from CLI11's type name ("INT", "UINT",
// "FLOAT", "TEXT") and its validators' descriptions ("INT in [0 - 65535]", "POSITIVE",
// "NONNEGATIVE", "{cpu,cuda}").
struct ValueForm {
  std::string type;
  std::optional<std::pair<double, double>> range;
  bool positive = false;
  bool non_negative = false;
  std::vector<std::string> members;
  std::string words;  // e.g. "an integer in [0, 65535]"
};

// FormOf: nullopt when a check is one FormOf does not know (ExistingFile, a custom validator):
// then CLI11's message, the check's own, is kept.
std::optional<ValueForm> FormOf(const CLI::Option& option) {
  std::vector<std::string> parts = absl::StrSplit(option.get_type_name(), ':');
  ValueForm form;
  form.type = parts.front();
  if (form.type == "INT") {
    form.words = "an integer";
  } else if (form.type == "UINT") {
    form.words = "a non-negative integer";
  } else if (form.type == "FLOAT") {
    form.words = "a number";
  } else if (form.type != "TEXT") {
    return std::nullopt;
  }
  const bool numeric = form.type != "TEXT";
  for (size_t i = 1; i < parts.size(); ++i) {
    absl::string_view check = parts[i];
    if (numeric && check == "POSITIVE") {
      form.positive = true;
      absl::StrAppend(&form.words, " > 0");
    } else if (numeric && check == "NONNEGATIVE") {
      form.non_negative = true;
      if (form.type != "UINT") absl::StrAppend(&form.words, " >= 0");
    } else if (numeric && check.find(" in [") != absl::string_view::npos && absl::EndsWith(check, "]")) {
      absl::string_view bounds = check.substr(check.find(" in [") + 5);
      bounds.remove_suffix(1);
      const size_t dash = bounds.find(" - ");
      double lo = 0, hi = 0;
      if (dash == absl::string_view::npos || !absl::SimpleAtod(bounds.substr(0, dash), &lo) ||
          !absl::SimpleAtod(bounds.substr(dash + 3), &hi)) {
        return std::nullopt;
      }
      form.range = {lo, hi};
      absl::StrAppend(&form.words, " in [", bounds.substr(0, dash), ", ", bounds.substr(dash + 3),
                      "]");
    } else if (check.size() >= 2 && check.front() == '{' && check.back() == '}') {
      check = check.substr(1, check.size() - 2);
      form.members = absl::StrSplit(check, ',');
      form.words = absl::StrCat(form.words, form.words.empty() ? "" : ", ", "one of: ",
                                absl::StrJoin(form.members, ", "));
    } else {
      return std::nullopt;
    }
  }
  if (form.words.empty()) return std::nullopt;  // free text: any value fits
  return form;
}

bool Fits(const std::string& value, const ValueForm& form) {
  if (!form.members.empty() &&
      std::find(form.members.begin(), form.members.end(), value) == form.members.end()) {
    return false;
  }
  if (form.type == "TEXT") return true;
  double number = 0;
  if (form.type == "INT") {
    int64_t v = 0;
    if (!absl::SimpleAtoi(value, &v)) return false;
    number = static_cast<double>(v);
  } else if (form.type == "UINT") {
    uint64_t v = 0;
    if (!absl::SimpleAtoi(value, &v)) return false;
    number = static_cast<double>(v);
  } else if (!absl::SimpleAtod(value, &number) || number != number) {
    return false;
  }
  if (form.positive && !(number > 0)) return false;
  if (form.non_negative && !(number >= 0)) return false;
  if (form.range.has_value() && !(number >= form.range->first && number <= form.range->second)) {
    return false;
  }
  return true;
}

// OptionNamed: the option `name` of the innermost command that has it.
const CLI::Option* OptionNamed(const std::vector<const CLI::App*>& chain, const std::string& name) {
  for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
    if (const CLI::Option* option = (*it)->get_option_no_throw(name)) return option;
  }
  return nullptr;
}

// ValueError: the message for a bad or missing option value, or nullopt to keep CLI11's.
std::optional<std::string> ValueError(const std::vector<const CLI::App*>& chain,
                                      const CLI::ParseError& error) {
  const bool validation = dynamic_cast<const CLI::ValidationError*>(&error) != nullptr;
  const bool conversion = dynamic_cast<const CLI::ConversionError*>(&error) != nullptr;
  const bool mismatch = dynamic_cast<const CLI::ArgumentMismatch*>(&error) != nullptr;
  if (!validation && !conversion && !mismatch) return std::nullopt;
  // CLI11 names the option first ("--port: Value abc not in range 0 to 65535", "--model: 1
  // required TEXT missing"), except for "Could not convert: --f = x".
  absl::string_view what = error.what();
  std::string name;
  if (absl::ConsumePrefix(&what, "Could not convert: ")) {
    name = std::string(what.substr(0, what.find(" = ")));
  } else {
    name = std::string(what.substr(0, what.find(": ")));
  }
  const CLI::Option* option = OptionNamed(chain, name);
  if (option == nullptr) return std::nullopt;
  const std::optional<ValueForm> form = FormOf(*option);
  if (mismatch) {
    if (!absl::EndsWith(what, " missing")) return std::nullopt;
    return absl::StrCat(name, ": missing value",
                        form.has_value() ? absl::StrCat(" (expected ", form->words, ")") : "");
  }
  if (!form.has_value()) return std::nullopt;
  for (const std::string& value : option->results()) {
    if (!Fits(value, *form)) {
      return absl::StrCat(name, ": invalid value '", value, "' (expected ", form->words, ")");
    }
  }
  return std::nullopt;  // refused by something FormOf cannot see: CLI11's message says what
}

}  // namespace

std::string UsageErrorMessage(const CLI::App& app, const CLI::ParseError& error) {
  const std::vector<const CLI::App*> chain = ParsedChain(app);
  // A bad value first: an option missing its value takes the next argument as one, leaving a
  // later argument over ("--port --model m" leaves "m").
  std::optional<std::string> what = ValueError(chain, error);
  if (!what.has_value()) what = UnknownArguments(chain);
  const CLI::App& innermost = *chain.back();
  if (!what.has_value() && dynamic_cast<const CLI::RequiredError*>(&error) != nullptr &&
      innermost.get_require_subcommand_min() > 0 && innermost.get_subcommands().empty()) {
    what = absl::StrCat("missing subcommand",
                        chain.size() == 1 ? "" : absl::StrCat(" for '", CommandPath(chain, chain.size()), "'"),
                        " (expected one of: ", absl::StrJoin(SubcommandNames(innermost), ", "), ")");
  }
  if (!what.has_value()) what = error.what();
  return absl::StrCat("sluice: error: ", *what, "\nRun '", CommandPath(chain, chain.size()),
                      " --help' for usage.\n");
}

}  // namespace sluice
