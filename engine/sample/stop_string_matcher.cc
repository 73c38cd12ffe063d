// StopStringMatcher: streaming stop-string detection with hold-back (see the header).
//
// Behaviour matches vLLM's stop-string handling (vllm/v1/engine/detokenizer.py,
// check_stop_strings): the output is truncated before the stop string, or after it with
// include_stop_str_in_output, and text that may still become a stop string is not streamed.
// When several stop strings occur, the one that completes first in the text stream wins (the
// lowest end offset; on a tie, the one starting earlier), so the result does not depend on how
// the text was split into deltas.
#include "engine/sample/stop_string_matcher.h"

#include <algorithm>
#include <cstddef>
#include <utility>

namespace sluice {
namespace {

bool IsUtf8Continuation(char c) { return (static_cast<unsigned char>(c) & 0xC0) == 0x80; }

}  // namespace

StopStringMatcher::StopStringMatcher(std::vector<std::string> stops,
                                     bool include_stop_str_in_output)
    : include_stop_(include_stop_str_in_output) {
  for (std::string& stop : stops) {
    if (!stop.empty()) stops_.push_back(std::move(stop));
  }
}

StopStringMatcher::Result StopStringMatcher::Push(std::string_view delta) {
  Result result;
  if (stopped_) {
    result.stopped = true;
    return result;
  }
  buffer_.append(delta);

  // Earliest-completing stop string. Every occurrence lies inside buffer_: text before it was
  // emitted only once no suffix of it could begin a stop string.
  size_t best_end = std::string::npos;
  size_t best_begin = 0;
  for (const std::string& stop : stops_) {
    const size_t begin = buffer_.find(stop);
    if (begin == std::string::npos) continue;
    const size_t end = begin + stop.size();
    if (end < best_end || (end == best_end && begin < best_begin)) {
      best_end = end;
      best_begin = begin;
    }
  }
  if (best_end != std::string::npos) {
    result.text = buffer_.substr(0, include_stop_ ? best_end : best_begin);
    result.stopped = true;
    stopped_ = true;
    buffer_.clear();
    return result;
  }

  // Hold back the longest suffix that is a proper prefix of some stop string.
  size_t hold = 0;
  for (const std::string& stop : stops_) {
    const size_t longest = std::min(stop.size() - 1, buffer_.size());
    for (size_t len = longest; len > hold; --len) {
      if (buffer_.compare(buffer_.size() - len, len, stop, 0, len) == 0) {
        hold = len;
        break;
      }
    }
  }
  size_t emit = buffer_.size() - hold;
  // Never split a UTF-8 character: move the cut back to the start of the character.
  while (emit > 0 && emit < buffer_.size() && IsUtf8Continuation(buffer_[emit])) --emit;
  result.text = buffer_.substr(0, emit);
  buffer_.erase(0, emit);
  return result;
}

std::string StopStringMatcher::Flush() {
  std::string text;
  if (!stopped_) text.swap(buffer_);
  buffer_.clear();
  return text;
}

}  // namespace sluice
