// IncrementalDetokenizer: turns a stream of token ids into text deltas for streaming.
//
// A token may end in the middle of a UTF-8 character (byte-level BPE splits multi-byte
// characters); such bytes are held back until the character completes, so a delta is always
// valid UTF-8. At the end, Flush() emits anything held back (invalid tails become U+FFFD).
#ifndef SLUICE_ENGINE_TOKENIZER_INCREMENTAL_DETOKENIZER_H_
#define SLUICE_ENGINE_TOKENIZER_INCREMENTAL_DETOKENIZER_H_

#include <cstdint>
#include <string>

#include "engine/tokenizer/tokenizer.h"

namespace sluice {

class IncrementalDetokenizer {
 public:
  // `tokenizer` must outlive this object.
  IncrementalDetokenizer(const Tokenizer& tokenizer, bool skip_special_tokens);
  // Push appends one token and returns the newly completed text (possibly empty).
  std::string Push(int32_t token_id);
  // Flush returns the held-back bytes (repaired to valid UTF-8) and resets the hold-back.
  std::string Flush();
  // Text emitted so far plus pending bytes are not exposed; callers accumulate deltas.

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_tokens_;
  std::string pending_;  // bytes of an incomplete UTF-8 sequence
};

}  // namespace sluice

#endif  // SLUICE_ENGINE_TOKENIZER_INCREMENTAL_DETOKENIZER_H_
