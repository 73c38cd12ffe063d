// BpeAddedVocab: the "added_tokens" of a HF tokenizer.json and the splitting of input text
// around them, which happens before normalization and pre-tokenization.
//
// Matching follows tokenizers' `AddedVocabulary::extract_and_normalize`: leftmost-longest
// matches (aho-corasick MatchKind::LeftmostLongest), first of the tokens with `normalized: false`
// on the raw text; then each remaining segment is normalized and the `normalized: true` tokens
// (their contents normalized the same way) are matched in it. Flags:
//   * single_word: the match is dropped when a word character (Rust regex's Unicode \w)
//     touches either end;
//   * lstrip / rstrip: whitespace (Unicode White_Space) left / right of the match is absorbed;
//   * special tokens are skipped when special-token parsing is off (`encode_special_tokens`).
#ifndef SLUICE_ENGINE_TOKENIZER_BPE_ADDED_VOCAB_H_
#define SLUICE_ENGINE_TOKENIZER_BPE_ADDED_VOCAB_H_

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "engine/tokenizer/bpe_regex.h"
#include "engine/tokenizer/normalizer.h"

namespace sluice {

// AddedToken mirrors one entry of tokenizer.json's "added_tokens".
struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
  bool special = false;
  // The content after the normalizer, for `normalized` tokens when there is one (else empty).
  // HF's id_to_token and decode return this form ("Hello World" under Lowercase is
  // "hello world"), while token_to_id takes `content`.
  std::string normalized_content;
};

class BpeAddedVocab {
 public:
  // Create indexes `tokens`; `normalizer` (may be null; must outlive this object) normalizes
  // the text and the contents of `normalized: true` tokens. Errors: InvalidArgument for an
  // empty content or a duplicate id.
  static absl::StatusOr<std::unique_ptr<BpeAddedVocab>> Create(std::vector<AddedToken> tokens,
                                                               const Normalizer* normalizer);

  // Split walks `text` left to right, calling `on_text` for each non-empty stretch of ordinary
  // text, already normalized, and `on_token` for each matched added token id. `at_start` tells
  // whether the stretch begins at offset 0 of `text` (Metaspace's prepend_scheme "first").
  // With parse_special=false special tokens are not matched (non-special added tokens still
  // are). Thread-safe.
  void Split(std::string_view text, bool parse_special,
             absl::FunctionRef<void(std::string_view, bool at_start)> on_text,
             absl::FunctionRef<void(int32_t)> on_token) const;

  // FindById returns the added token with `id`, or nullptr.
  const AddedToken* FindById(int32_t id) const;
  // FindByContent returns the id of the added token whose content is `content`.
  std::optional<int32_t> FindByContent(std::string_view content) const;
  int32_t max_id() const { return max_id_; }

 private:
  // A byte trie over token contents; `terminal` is an index into tokens_ or -1.
  class Trie {
   public:
    void Insert(std::string_view key, int32_t value);
    bool empty() const { return nodes_.size() <= 1; }
    // LongestAt returns (length, value) of the longest key starting at text[pos], or value -1.
    std::pair<size_t, int32_t> LongestAt(std::string_view text, size_t pos) const;
    bool MayStartWith(uint8_t byte) const { return first_byte_[byte]; }

   private:
    struct Node {
      int32_t terminal = -1;
    };
    std::vector<Node> nodes_{Node{}};
    absl::flat_hash_map<uint64_t, int32_t> edges_;  // node << 8 | byte -> child node
    std::array<bool, 256> first_byte_{};
  };

  BpeAddedVocab() = default;
  void SplitWith(const Trie& trie, std::string_view text, bool parse_special,
                 absl::FunctionRef<void(std::string_view)> on_text,
                 absl::FunctionRef<void(int32_t)> on_token) const;

  std::vector<AddedToken> tokens_;
  absl::flat_hash_map<int32_t, size_t> by_id_;
  absl::flat_hash_map<std::string, int32_t> by_content_;
  Trie raw_trie_;                        // normalized == false
  Trie normalized_trie_;                 // normalized == true
  std::unique_ptr<BpeRegex> word_char_;  // Rust's `\w`, only when some token is single_word
  int32_t max_id_ = -1;
  const Normalizer* normalizer_ = nullptr;
};

}  // namespace sluice

#endif  // SLUICE_ENGINE_TOKENIZER_BPE_ADDED_VOCAB_H_
