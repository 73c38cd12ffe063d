// TokenVocab: a tokenizer's vocabulary as byte strings, sorted into a prefix tree for the
// grammar mask walk (tokens sharing a prefix are checked once for that prefix).
#ifndef SLUICE_ENGINE_GRAMMAR_TOKEN_VOCAB_H_
#define SLUICE_ENGINE_GRAMMAR_TOKEN_VOCAB_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/tokenizer/tokenizer.h"

namespace sluice::grammar {

// TrieNode: one byte of a token prefix, in preorder. Node 0 is the root (empty prefix). The
// nodes of the subtree under node i are [i, subtree_end); tokens whose bytes end exactly here
// are sorted_token_ids[token_begin, token_end).
struct TrieNode {
  uint8_t byte = 0;
  int32_t depth = 0;
  int32_t subtree_end = 0;
  int32_t token_begin = 0;
  int32_t token_end = 0;
};

class TokenVocab {
 public:
  // FromTokenizer reads every id's bytes (byte-level decoding, no UTF-8 repair). Special
  // tokens never match grammar text; `eos_token_ids` are allowed exactly where the grammar may
  // end. `vocab_size` is the logits width (>= tokenizer.vocab_size(); ids past the tokenizer's
  // are never allowed; 0: the tokenizer's).
  // Tokens whose text has the form <...> (special tokens and the like) are also found by that
  // text (FindToken), for the grammar's token terminals.
  static std::shared_ptr<const TokenVocab> FromTokenizer(const Tokenizer& tokenizer,
                                                         std::vector<int32_t> eos_token_ids,
                                                         int32_t vocab_size = 0);
  // FromTokens: token i has bytes tokens[i]; an empty string is a token that never matches
  // text. `named_tokens`: (text, id) pairs FindToken finds (e.g. special tokens).
  static std::shared_ptr<const TokenVocab> FromTokens(
      std::vector<std::string> tokens, std::vector<int32_t> eos_token_ids,
      std::vector<std::pair<std::string, int32_t>> named_tokens = {});

  int32_t vocab_size() const { return vocab_size_; }
  std::string_view token_bytes(int32_t id) const {
    return std::string_view(bytes_).substr(offsets_[id], offsets_[id + 1] - offsets_[id]);
  }
  const std::vector<int32_t>& eos_token_ids() const { return eos_token_ids_; }
  // FindToken: the id of the token written `text` (a special token's content); -1 if none.
  int32_t FindToken(std::string_view text) const {
    auto it = named_tokens_.find(absl::string_view(text.data(), text.size()));
    return it == named_tokens_.end() ? -1 : it->second;
  }
  const std::vector<TrieNode>& trie() const { return trie_; }
  const std::vector<int32_t>& sorted_token_ids() const { return sorted_token_ids_; }
  // Trie statistics the grammar compiler sizes its walks with, built once per vocabulary:
  // sorted_position()[id]: the token's place in sorted_token_ids() (-1: empty token);
  // subtree_depth()[node]: the deepest level in the node's subtree;
  // nodes_deeper()[l]: trie nodes (not the root) whose subtree goes deeper than l;
  // NodesUnderFirstBytes(lo, hi): trie nodes under first bytes lo..hi (inclusive).
  const std::vector<int32_t>& sorted_position() const { return sorted_position_; }
  const std::vector<int32_t>& subtree_depth() const { return subtree_depth_; }
  const std::vector<int64_t>& nodes_deeper() const { return nodes_deeper_; }
  int64_t NodesUnderFirstBytes(int lo, int hi) const {
    return first_byte_nodes_below_[hi + 1] - first_byte_nodes_below_[lo];
  }
  // num_bitmask_words: uint32 words of a token bitmask (bit i of word i/32 is token i).
  int32_t num_bitmask_words() const { return (vocab_size_ + 31) / 32; }

 private:
  void Build();

  int32_t vocab_size_ = 0;
  std::string bytes_;
  std::vector<uint32_t> offsets_;  // [vocab_size + 1]
  std::vector<int32_t> eos_token_ids_;
  absl::flat_hash_map<std::string, int32_t> named_tokens_;
  std::vector<TrieNode> trie_;
  std::vector<int32_t> sorted_token_ids_;
  std::vector<int32_t> sorted_position_;
  std::vector<int32_t> subtree_depth_;
  std::vector<int64_t> nodes_deeper_;
  std::array<int64_t, 257> first_byte_nodes_below_{};  // [b]: nodes under first bytes < b
};

}  // namespace sluice::grammar

#endif  // SLUICE_ENGINE_GRAMMAR_TOKEN_VOCAB_H_
