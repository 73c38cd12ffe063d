// Paths of the shared fixtures and trained models used by tests.
//
// Tests fail loudly (never skip) when a fixture is missing: a missing fixture is a broken
// checkout, not a reason to pass.
#ifndef SLUICE_TESTS_UTIL_TEST_PATHS_H_
#define SLUICE_TESTS_UTIL_TEST_PATHS_H_

#include <string>

namespace sluice::testing {

// SharedDir returns `$SLUICE_SHARED_DIR` if set, else the `../shared` beside the source tree.
std::string SharedDir();
// FixtureDir returns SharedDir()/fixtures/<name>, failing the current test if it is missing.
std::string FixtureDir(const std::string& name);
// SharedModelDir returns SharedDir()/models/<name>, failing the current test if it is missing.
std::string SharedModelDir(const std::string& name);
// EmbeddedModelDir returns <source>/models/sluice-mini-moe.
std::string EmbeddedModelDir();
// RepoFixtureDir returns <repo>/tests/fixtures/<name> (fixtures this repository makes itself,
// e.g. deepseek-v2-tiny), <repo> being `$SLUICE_REPO_DIR` if set (a copy of the tree elsewhere,
// as on the GPU machine), else the source tree; fails the current test if it is missing.
std::string RepoFixtureDir(const std::string& name);
// RequirePath fails the current test (ADD_FAILURE) when `path` does not exist; returns `path`.
std::string RequirePath(const std::string& path);
// ReadFileBytes returns the whole file at `path` (binary); fails the current test and returns ""
// when it cannot be read.
std::string ReadFileBytes(const std::string& path);

}  // namespace sluice::testing

#endif  // SLUICE_TESTS_UTIL_TEST_PATHS_H_
