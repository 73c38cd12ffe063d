#include "engine/tokenizer/bpe_added_vocab.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/tokenizer/byte_level.h"

namespace sluice {
namespace {

// Start of the UTF-8 unit that ends at `end` (end > 0): steps back over continuation bytes.
size_t UnitStartBefore(std::string_view text, size_t end) {
  size_t pos = end - 1;
  for (int k = 0; k < 3 && pos > 0 && (static_cast<uint8_t>(text[pos]) & 0xC0) == 0x80; ++k) {
    --pos;
  }
  return pos;
}

// Offset where the run of whitespace that ends at `end` begins (tokenizers' lstrip).
size_t WhitespaceRunStart(std::string_view text, size_t end) {
  while (end > 0) {
    const size_t start = UnitStartBefore(text, end);
    const byte_level::Utf8Sequence seq = byte_level::ScanUtf8(text, start);
    if (!seq.valid || start + seq.length != end ||
        !byte_level::IsUnicodeWhitespace(seq.codepoint)) {
      break;
    }
    end = start;
  }
  return end;
}

// Offset where the run of whitespace that starts at `begin` ends (tokenizers' rstrip).
size_t WhitespaceRunEnd(std::string_view text, size_t begin) {
  while (begin < text.size()) {
    const byte_level::Utf8Sequence seq = byte_level::ScanUtf8(text, begin);
    if (!seq.valid || !byte_level::IsUnicodeWhitespace(seq.codepoint)) break;
    begin += seq.length;
  }
  return begin;
}

}  // namespace

void BpeAddedVocab::Trie::Insert(std::string_view key, int32_t value) {
  int32_t node = 0;
  for (char c : key) {
    const uint64_t edge = (static_cast<uint64_t>(node) << 8) | static_cast<uint8_t>(c);
    const auto it = edges_.find(edge);
    if (it != edges_.end()) {
      node = it->second;
    } else {
      nodes_.push_back(Node{});
      const int32_t child = static_cast<int32_t>(nodes_.size()) - 1;
      edges_.emplace(edge, child);
      node = child;
    }
  }
  nodes_[node].terminal = value;
  first_byte_[static_cast<uint8_t>(key[0])] = true;
}

std::pair<size_t, int32_t> BpeAddedVocab::Trie::LongestAt(std::string_view text, size_t pos) const {
  std::pair<size_t, int32_t> best{0, -1};
  int32_t node = 0;
  for (size_t i = pos; i < text.size(); ++i) {
    const uint64_t edge = (static_cast<uint64_t>(node) << 8) | static_cast<uint8_t>(text[i]);
    const auto it = edges_.find(edge);
    if (it == edges_.end()) break;
    node = it->second;
    if (nodes_[node].terminal >= 0) best = {i + 1 - pos, nodes_[node].terminal};
  }
  return best;
}

absl::StatusOr<std::unique_ptr<BpeAddedVocab>> BpeAddedVocab::Create(
    std::vector<AddedToken> tokens, const Normalizer* normalizer) {
  std::unique_ptr<BpeAddedVocab> vocab(new BpeAddedVocab());
  vocab->tokens_ = std::move(tokens);
  vocab->normalizer_ = normalizer;
  bool any_single_word = false;
  for (size_t i = 0; i < vocab->tokens_.size(); ++i) {
    AddedToken& t = vocab->tokens_[i];
    if (t.content.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("added token ", t.id, " has no content"));
    }
    if (t.id < 0 || !vocab->by_id_.emplace(t.id, i).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("added token id ", t.id, " is negative or duplicated"));
    }
    vocab->by_content_.try_emplace(t.content, t.id);
    if (t.normalized && normalizer != nullptr) {
      // Matched in normalized text, so the trie holds the normalized content (as HF does).
      std::string buffer;
      const std::string_view normalized = normalizer->Normalize(t.content, &buffer);
      t.normalized_content = std::string(normalized);
      if (!normalized.empty()) vocab->normalized_trie_.Insert(normalized, static_cast<int32_t>(i));
    } else {
      (t.normalized ? vocab->normalized_trie_ : vocab->raw_trie_)
          .Insert(t.content, static_cast<int32_t>(i));
    }
    vocab->max_id_ = std::max(vocab->max_id_, t.id);
    any_single_word |= t.single_word;
  }
  if (any_single_word) {
    // Rust regex's Unicode \w (HF's single_word test), which also counts marks (Mn/Mc/Me)
    // and Nl letters; PCRE2's UCP \w stops at \p{L}, \p{N} and '_'.
    absl::StatusOr<std::unique_ptr<BpeRegex>> word_char = BpeRegex::Compile(
        R"([\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\x{200C}\x{200D}])", /*literal=*/false);
    if (!word_char.ok()) return word_char.status();
    vocab->word_char_ = *std::move(word_char);
  }
  return vocab;
}

const AddedToken* BpeAddedVocab::FindById(int32_t id) const {
  const auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &tokens_[it->second];
}

std::optional<int32_t> BpeAddedVocab::FindByContent(std::string_view content) const {
  const auto it = by_content_.find(absl::string_view(content.data(), content.size()));
  if (it == by_content_.end()) return std::nullopt;
  return it->second;
}

void BpeAddedVocab::Split(std::string_view text, bool parse_special,
                          absl::FunctionRef<void(std::string_view, bool)> on_text,
                          absl::FunctionRef<void(int32_t)> on_token) const {
  SplitWith(
      raw_trie_, text, parse_special,
      [&](std::string_view segment) {
        const bool segment_at_start = segment.data() == text.data();
        std::string buffer;
        const std::string_view normalized =
            normalizer_ != nullptr ? normalizer_->Normalize(segment, &buffer) : segment;
        if (normalized_trie_.empty()) {
          if (!normalized.empty()) on_text(normalized, segment_at_start);
          return;
        }
        SplitWith(
            normalized_trie_, normalized, parse_special,
            [&](std::string_view piece) {
              on_text(piece, segment_at_start && piece.data() == normalized.data());
            },
            on_token);
      },
      on_token);
}

void BpeAddedVocab::SplitWith(const Trie& trie, std::string_view text, bool parse_special,
                              absl::FunctionRef<void(std::string_view)> on_text,
                              absl::FunctionRef<void(int32_t)> on_token) const {
  size_t start_offset = 0;  // end of the last emitted token (text before it is emitted)
  size_t pos = 0;
  while (!trie.empty() && pos < text.size()) {
    if (!trie.MayStartWith(static_cast<uint8_t>(text[pos]))) {
      ++pos;
      continue;
    }
    const auto [length, index] = trie.LongestAt(text, pos);
    if (index < 0) {
      ++pos;
      continue;
    }
    const size_t match_begin = pos;
    const size_t match_end = pos + length;
    // Like aho-corasick's iterator, the search resumes after the match even if it is rejected.
    pos = match_end;
    const AddedToken& token = tokens_[index];
    if (token.special && !parse_special) continue;
    if (token.single_word) {
      const bool word_before =
          match_begin > 0 && word_char_->MatchesAt(text, UnitStartBefore(text, match_begin));
      const bool word_after = match_end < text.size() && word_char_->MatchesAt(text, match_end);
      if (word_before || word_after) continue;
    }
    size_t begin = match_begin;
    size_t end = match_end;
    if (token.lstrip) begin = WhitespaceRunStart(text, begin);
    if (token.rstrip) end = WhitespaceRunEnd(text, end);
    begin = std::max(begin, start_offset);  // whitespace already absorbed by a previous token
    if (begin > start_offset) on_text(text.substr(start_offset, begin - start_offset));
    on_token(token.id);
    start_offset = std::max(end, start_offset);
  }
  if (start_offset < text.size()) on_text(text.substr(start_offset));
}

}  // namespace sluice
