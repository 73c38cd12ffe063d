#include "engine/grammar/token_vocab.h"

#include <algorithm>
#include <utility>

#include "engine/grammar/grammar.h"

namespace sluice::grammar {

std::shared_ptr<const TokenVocab> TokenVocab::FromTokenizer(const Tokenizer& tokenizer,
                                                            std::vector<int32_t> eos_token_ids,
                                                            int32_t vocab_size) {
  const int32_t n = std::max(vocab_size, tokenizer.vocab_size());
  std::vector<std::string> tokens(n);
  std::vector<std::pair<std::string, int32_t>> named;
  for (int32_t id = 0; id < tokenizer.vocab_size(); ++id) {
    std::string text = tokenizer.IdToToken(id);
    if (IsTokenText(text)) named.emplace_back(std::move(text), id);
    if (tokenizer.IsSpecial(id)) continue;
    const int32_t ids[1] = {id};
    tokens[id] = tokenizer.DecodeBytes(ids, /*skip_special_tokens=*/false);
  }
  for (int32_t id : eos_token_ids) {
    if (id >= 0 && id < n) tokens[id].clear();
  }
  return FromTokens(std::move(tokens), std::move(eos_token_ids), std::move(named));
}

std::shared_ptr<const TokenVocab> TokenVocab::FromTokens(
    std::vector<std::string> tokens, std::vector<int32_t> eos_token_ids,
    std::vector<std::pair<std::string, int32_t>> named_tokens) {
  auto v = std::shared_ptr<TokenVocab>(new TokenVocab());
  v->vocab_size_ = static_cast<int32_t>(tokens.size());
  v->offsets_.reserve(tokens.size() + 1);
  v->offsets_.push_back(0);
  for (const std::string& t : tokens) {
    v->bytes_ += t;
    v->offsets_.push_back(static_cast<uint32_t>(v->bytes_.size()));
  }
  std::erase_if(eos_token_ids, [&](int32_t id) { return id < 0 || id >= v->vocab_size_; });
  v->eos_token_ids_ = std::move(eos_token_ids);
  for (auto& [text, id] : named_tokens) {
    // The first id wins: a vocabulary lists a text once.
    if (id >= 0 && id < v->vocab_size_) v->named_tokens_.try_emplace(std::move(text), id);
  }
  v->Build();
  return v;
}

void TokenVocab::Build() {
  std::vector<int32_t> ids;
  for (int32_t id = 0; id < vocab_size_; ++id) {
    if (!token_bytes(id).empty()) ids.push_back(id);
  }
  std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) {
    const std::string_view x = token_bytes(a), y = token_bytes(b);
    return x != y ? x < y : a < b;
  });
  sorted_token_ids_ = ids;
  trie_.clear();
  trie_.push_back(TrieNode{});
  std::vector<int32_t> path = {0};  // path[d]: node at depth d
  std::string_view prev;
  auto close_to = [&](size_t depth) {
    while (path.size() > depth + 1) {
      trie_[path.back()].subtree_end = static_cast<int32_t>(trie_.size());
      path.pop_back();
    }
  };
  for (size_t k = 0; k < ids.size(); ++k) {
    const std::string_view b = token_bytes(ids[k]);
    size_t lcp = 0;
    while (lcp < prev.size() && lcp < b.size() && prev[lcp] == b[lcp]) ++lcp;
    close_to(lcp);
    for (size_t d = lcp; d < b.size(); ++d) {
      TrieNode node;
      node.byte = static_cast<uint8_t>(b[d]);
      node.depth = static_cast<int32_t>(d + 1);
      node.token_begin = node.token_end = static_cast<int32_t>(k);
      trie_.push_back(node);
      path.push_back(static_cast<int32_t>(trie_.size()) - 1);
    }
    TrieNode& last = trie_[path.back()];
    if (last.token_end != static_cast<int32_t>(k)) last.token_begin = static_cast<int32_t>(k);
    last.token_end = static_cast<int32_t>(k) + 1;
    prev = b;
  }
  close_to(0);
  trie_[0].subtree_end = static_cast<int32_t>(trie_.size());
  sorted_position_.assign(vocab_size_, -1);
  for (size_t k = 0; k < ids.size(); ++k) sorted_position_[ids[k]] = static_cast<int32_t>(k);
  subtree_depth_.resize(trie_.size());
  for (int32_t i = static_cast<int32_t>(trie_.size()) - 1; i >= 0; --i) {
    int32_t deepest = trie_[i].depth;
    for (int32_t j = i + 1; j < trie_[i].subtree_end; j = trie_[j].subtree_end) {
      deepest = std::max(deepest, subtree_depth_[j]);
    }
    subtree_depth_[i] = deepest;
  }
  nodes_deeper_.assign(subtree_depth_[0] + 2, 0);
  for (size_t i = 1; i < trie_.size(); ++i) ++nodes_deeper_[subtree_depth_[i] - 1];
  for (int32_t l = subtree_depth_[0]; l-- > 0;) nodes_deeper_[l] += nodes_deeper_[l + 1];
  std::array<int64_t, 256> first_byte_nodes{};
  for (int32_t i = 1; i < static_cast<int32_t>(trie_.size()); i = trie_[i].subtree_end) {
    first_byte_nodes[trie_[i].byte] = trie_[i].subtree_end - i;
  }
  first_byte_nodes_below_[0] = 0;
  for (int b = 0; b < 256; ++b) {
    first_byte_nodes_below_[b + 1] = first_byte_nodes_below_[b] + first_byte_nodes[b];
  }
}

}  // namespace sluice::grammar
