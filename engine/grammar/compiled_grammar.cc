#include "engine/grammar/compiled_grammar.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/grammar/stack_walk.h"

namespace sluice::grammar {

absl::StatusOr<std::shared_ptr<const CompiledGrammar>> CompiledGrammar::Create(
    const Grammar& grammar, std::shared_ptr<const TokenVocab> vocab, const PdaOptions& options) {
  absl::StatusOr<Pda> pda = BuildPda(grammar, options);
  if (!pda.ok()) return pda.status();
  auto g = std::shared_ptr<CompiledGrammar>(new CompiledGrammar());
  g->pda_ = *std::move(pda);
  g->vocab_ = std::move(vocab);
  g->ebnf_ = grammar.ToString();
  for (const PdaToken& t : g->pda_.tokens) {
    const int32_t id = t.id >= 0 ? t.id : g->vocab_->FindToken(t.text);
    if (id < 0 || id >= g->vocab_->vocab_size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "grammar token ", t.id >= 0 ? absl::StrCat("<[", t.id, "]>") : t.text,
          " is not in the model's vocabulary"));
    }
    g->token_ids_.push_back(id);
  }
  const int32_t n = static_cast<int32_t>(g->pda_.states.size());
  g->tables_.resize(n);
  g->stats_.num_states = n;
  StackWalk walk(&g->pda_);
  for (int32_t s = 0; s < n; ++s) {
    if (!g->pda_.HasByteEdges(s)) continue;
    g->Precompute(s, walk);
    const StateTokens& t = g->tables_[s];
    ++g->stats_.num_byte_states;
    g->stats_.num_uncertain += static_cast<int64_t>(t.uncertain_ids.size());
    g->stats_.table_bytes += static_cast<int64_t>(
        t.accepted_bits.size() * 4 + t.accepted_ids.size() * 4 + t.uncertain_ids.size() * 4);
  }
  return std::shared_ptr<const CompiledGrammar>(std::move(g));
}

void CompiledGrammar::Precompute(int32_t state, StackWalk& walk) {
  const std::vector<TrieNode>& trie = vocab_->trie();
  const std::vector<int32_t>& sorted = vocab_->sorted_token_ids();
  std::vector<int32_t> accepted, uncertain;
  walk.nodes().clear();
  // Per depth d (0 = before the first byte): tops in tops[begin[d], begin[d + 1]), whether a
  // path already returned from the rule, and the node pool size to roll back to.
  std::vector<int32_t> tops = {walk.NewNode(state, kSentinelParent)};
  std::vector<size_t> level_begin = {0, 1};
  std::vector<char> level_end_reached = {0};
  std::vector<size_t> level_pool = {walk.nodes().size()};
  auto add_range = [&](std::vector<int32_t>* out, int32_t begin, int32_t end) {
    for (int32_t k = begin; k < end; ++k) out->push_back(sorted[k]);
  };
  const int32_t num_nodes = static_cast<int32_t>(trie.size());
  std::vector<int32_t> next;
  int32_t i = 1;
  while (i < num_nodes) {
    const TrieNode& node = trie[i];
    const int32_t parent_depth = node.depth - 1;
    // Roll back to the parent's level.
    level_begin.resize(parent_depth + 2);
    level_end_reached.resize(parent_depth + 1);
    level_pool.resize(parent_depth + 1);
    tops.resize(level_begin[parent_depth + 1]);
    walk.nodes().resize(level_pool[parent_depth]);
    const size_t from = level_begin[parent_depth];
    const size_t count = tops.size() - from;
    StackWalk::Flags flags;
    next.clear();
    walk.Step(tops.data() + from, count, node.byte, &next, &flags);
    const bool end_reached = level_end_reached[parent_depth] || flags.reached_sentinel;
    if (next.empty()) {
      if (end_reached) {
        // Every token under this prefix depends on the callers.
        for (int32_t j = i; j < node.subtree_end; ++j) {
          add_range(&uncertain, trie[j].token_begin, trie[j].token_end);
        }
      }
      i = node.subtree_end;
      continue;
    }
    add_range(&accepted, node.token_begin, node.token_end);
    tops.insert(tops.end(), next.begin(), next.end());
    level_begin.push_back(tops.size());
    level_end_reached.push_back(end_reached ? 1 : 0);
    level_pool.push_back(walk.nodes().size());
    ++i;
  }
  std::sort(uncertain.begin(), uncertain.end());
  StateTokens& t = tables_[state];
  const int32_t words = vocab_->num_bitmask_words();
  if (static_cast<int64_t>(accepted.size()) > words) {
    t.accepted_bits.assign(words, 0);
    for (int32_t id : accepted) t.accepted_bits[id >> 5] |= 1u << (id & 31);
  } else {
    std::sort(accepted.begin(), accepted.end());
    t.accepted_ids = std::move(accepted);
  }
  t.uncertain_ids = std::move(uncertain);
}

}  // namespace sluice::grammar
