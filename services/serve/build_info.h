// The version of this build and the git commit it was built from (`sluice --version`). Defined
// in a source cmake/build_info.cmake writes at every build.
#ifndef SLUICE_SERVICES_SERVE_BUILD_INFO_H_
#define SLUICE_SERVICES_SERVE_BUILD_INFO_H_

#include <string>

namespace sluice {

// The project's version (CMakeLists.txt `project(... VERSION)`), e.g. "0.1.0".
const char* SluiceVersion();
// `git describe --always --dirty` of the checkout built (e.g. "8e17b2f0c1d2-dirty"), "unknown"
// for a build from sources outside git (a tarball).
const char* SluiceGitCommit();
// "sluice 0.1.0 (git 8e17b2f0c1d2)": what `sluice --version` prints.
std::string SluiceVersionLine();

}  // namespace sluice

#endif  // SLUICE_SERVICES_SERVE_BUILD_INFO_H_
