// StopStringMatcher: finds OpenAI `stop` strings in streamed text without emitting text that
// may turn out to be the start of a stop string.
#ifndef SLUICE_ENGINE_SAMPLE_STOP_STRING_MATCHER_H_
#define SLUICE_ENGINE_SAMPLE_STOP_STRING_MATCHER_H_

#include <string>
#include <string_view>
#include <vector>

namespace sluice {

class StopStringMatcher {
 public:
  // `stops`: the stop strings (empty strings are ignored). include_stop_str_in_output keeps the
  // matched stop string in the output (vLLM's `include_stop_str_in_output`).
  StopStringMatcher(std::vector<std::string> stops, bool include_stop_str_in_output);

  struct Result {
    std::string text;      // safe to emit now
    bool stopped = false;  // a stop string matched; no more text will be emitted
  };
  // Push appends a UTF-8 delta. Text that could be a prefix of a stop string is held back
  // (at most max_stop_len - 1 bytes), never split inside a UTF-8 character.
  Result Push(std::string_view delta);
  // Flush returns the held-back text at the end of generation (when no stop matched).
  std::string Flush();
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  bool include_stop_;
  std::string buffer_;  // held back, not yet emitted
  bool stopped_ = false;
};

}  // namespace sluice

#endif  // SLUICE_ENGINE_SAMPLE_STOP_STRING_MATCHER_H_
