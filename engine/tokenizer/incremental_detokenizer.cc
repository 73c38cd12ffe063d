#include "engine/tokenizer/incremental_detokenizer.h"

#include "engine/tokenizer/byte_level.h"

namespace sluice {

IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(tokenizer), skip_special_tokens_(skip_special_tokens) {}

std::string IncrementalDetokenizer::Push(int32_t token_id) {
  const int32_t ids[1] = {token_id};
  pending_.append(tokenizer_.DecodeBytes(ids, skip_special_tokens_));
  // Hold back only a tail that can still become a character; everything before it is final:
  // lossy repair of the prefix equals the repair of the whole text because maximal ill-formed
  // subparts never extend past a proper prefix of a well-formed sequence.
  const size_t hold = byte_level::IncompleteUtf8TailLength(pending_);
  std::string delta;
  if (pending_.size() == hold) return delta;
  byte_level::AppendUtf8Lossy(std::string_view(pending_).substr(0, pending_.size() - hold), &delta);
  pending_.erase(0, pending_.size() - hold);
  return delta;
}

std::string IncrementalDetokenizer::Flush() {
  std::string delta;
  byte_level::AppendUtf8Lossy(pending_, &delta);
  pending_.clear();
  return delta;
}

}  // namespace sluice
