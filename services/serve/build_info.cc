#include "services/serve/build_info.h"

#include "absl/strings/str_cat.h"

namespace sluice {

std::string SluiceVersionLine() {
  return absl::StrCat("sluice ", SluiceVersion(), " (git ", SluiceGitCommit(), ")");
}

}  // namespace sluice
