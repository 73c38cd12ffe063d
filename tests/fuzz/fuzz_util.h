// Helpers shared by the libFuzzer targets: fixture paths and a byte reader that splits one
// fuzz input into fields.
#ifndef SLUICE_TESTS_FUZZ_FUZZ_UTIL_H_
#define SLUICE_TESTS_FUZZ_FUZZ_UTIL_H_

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>

#include "build_paths.h"

namespace sluice::fuzz {

// SharedPath returns $SLUICE_SHARED_DIR/<rel> (else the build's shared folder); aborts when
// it is missing, since a target without its fixtures would fuzz nothing.
inline std::string SharedPath(const std::string& rel) {
  const char* env = std::getenv("SLUICE_SHARED_DIR");
  std::string path = std::string(env != nullptr ? env : SLUICE_SHARED_DIR) + "/" + rel;
  if (!std::ifstream(path).good()) {
    std::fprintf(stderr, "fuzz: missing fixture %s\n", path.c_str());
    std::abort();
  }
  return path;
}

// SourcePath returns <source tree>/<rel> ($SLUICE_REPO_DIR overrides the tree).
inline std::string SourcePath(const std::string& rel) {
  const char* env = std::getenv("SLUICE_REPO_DIR");
  return std::string(env != nullptr ? env : SLUICE_SOURCE_DIR) + "/" + rel;
}

inline std::string ReadFileOrDie(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "fuzz: cannot read %s\n", path.c_str());
    std::abort();
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Input consumes a fuzz input front to back: single bytes for choices, and the rest split on
// a separator into text fields (so seeds stay readable files).
class Input {
 public:
  Input(const uint8_t* data, size_t size)
      : rest_(reinterpret_cast<const char*>(data), size) {}
  uint8_t Byte() {
    if (rest_.empty()) return 0;
    uint8_t b = static_cast<uint8_t>(rest_[0]);
    rest_.remove_prefix(1);
    return b;
  }
  // Field returns the text up to the next `sep` (consumed) or the end.
  std::string_view Field(char sep) {
    size_t pos = rest_.find(sep);
    std::string_view field = rest_.substr(0, pos);
    rest_.remove_prefix(pos == std::string_view::npos ? rest_.size() : pos + 1);
    return field;
  }
  std::string_view Rest() {
    std::string_view r = rest_;
    rest_ = {};
    return r;
  }

 private:
  std::string_view rest_;
};

}  // namespace sluice::fuzz

#endif  // SLUICE_TESTS_FUZZ_FUZZ_UTIL_H_
