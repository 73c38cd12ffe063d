#include "tests/util/test_paths.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "build_paths.h"

namespace sluice::testing {

std::string SharedDir() {
  if (const char* env = std::getenv("SLUICE_SHARED_DIR"); env != nullptr && *env != '\0') {
    return env;
  }
  return SLUICE_SHARED_DIR;
}

std::string RequirePath(const std::string& path) {
  if (!std::filesystem::exists(path)) {
    ADD_FAILURE() << "required fixture is missing: " << path
                  << " (set SLUICE_SHARED_DIR to the shared/ folder)";
  }
  return path;
}

std::string ReadFileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    ADD_FAILURE() << "cannot read " << path;
    return "";
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string FixtureDir(const std::string& name) {
  return RequirePath(SharedDir() + "/fixtures/" + name);
}

std::string SharedModelDir(const std::string& name) {
  return RequirePath(SharedDir() + "/models/" + name);
}

std::string RepoFixtureDir(const std::string& name) {
  const char* env = std::getenv("SLUICE_REPO_DIR");
  const std::string repo = env != nullptr && *env != '\0' ? env : SLUICE_SOURCE_DIR;
  return RequirePath(repo + "/tests/fixtures/" + name);
}

std::string EmbeddedModelDir() {
  return RequirePath(std::string(SLUICE_SOURCE_DIR) + "/models/sluice-mini-moe");
}

}  // namespace sluice::testing
