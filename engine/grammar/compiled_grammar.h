// CompiledGrammar: a grammar's pushdown automaton bound to a token vocabulary, with the token
// tables the mask needs precomputed per automaton state.
//
// For each state that can consume a byte, every token is classified by walking the vocabulary
// trie from that state with only the state's own rule on the stack (XGrammar's adaptive token
// mask cache, Dong et al. 2024, arXiv:2411.15100; our implementation):
//   accepted  - the token's bytes are consumed entirely inside the rule: allowed whatever the
//               rest of the stack is;
//   uncertain - a path returned from the rule before the token's bytes ran out and the rest
//               fits some context the rule is called from: whether it is allowed depends on
//               the real callers, so the matcher checks it at run time;
//   rejected  - everything else (not stored).
// Context expansion (the paper's term): where the rule returns, the walk goes on in every state
// a call of that rule returns to (with any caller below, and so on outwards), so a token that
// fits no context is rejected here instead of checked at every step.
// Immutable after Create; shared by every matcher of the grammar (thread-safe reads).
#ifndef SLUICE_ENGINE_GRAMMAR_COMPILED_GRAMMAR_H_
#define SLUICE_ENGINE_GRAMMAR_COMPILED_GRAMMAR_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/grammar/grammar.h"
#include "engine/grammar/pda.h"
#include "engine/grammar/token_vocab.h"

namespace sluice::grammar {

// StateTokens: one state's token classification. Accepted tokens are a bitmask when they are
// many (accepted_bits, num_bitmask_words words) and an id list otherwise (in trie order).
// Uncertain tokens are in the vocabulary trie's order (sorted by bytes), with the length of
// the prefix each shares with the one before, so the run-time check walks shared prefixes once.
struct StateTokens {
  std::vector<uint32_t> accepted_bits;
  std::vector<int32_t> accepted_ids;
  std::vector<int32_t> uncertain_ids;  // sorted by bytes
  std::vector<int32_t> uncertain_lcp;  // [k]: bytes shared with uncertain_ids[k - 1] (0 at k = 0)
};

struct CompileStats {
  int32_t num_states = 0;
  int32_t num_byte_states = 0;  // states with precomputed tables
  int64_t num_uncertain = 0;    // sum over states
  int64_t table_bytes = 0;
  int32_t num_chain_copies = 0;  // tables taken from a chain root's by token level (no walk)
};

class CompiledGrammar {
 public:
  // Create builds the automaton and the per-state tables. Errors: those of BuildPda;
  // InvalidArgument naming a token terminal the vocabulary does not have.
  static absl::StatusOr<std::shared_ptr<const CompiledGrammar>> Create(
      const Grammar& grammar, std::shared_ptr<const TokenVocab> vocab,
      const PdaOptions& options = {});

  const Pda& pda() const { return pda_; }
  const TokenVocab& vocab() const { return *vocab_; }
  // tokens(state) is meaningful for states with byte edges.
  const StateTokens& tokens(int32_t state) const { return tables_[state]; }
  const CompileStats& stats() const { return stats_; }
  // The vocabulary id of token terminal `pda_token` (TokenEdge::token).
  int32_t token_id(int32_t pda_token) const { return token_ids_[pda_token]; }
  // The grammar as GBNF text (Grammar::ToString, root rule first): how a grammar travels to
  // another process (the router's workers), which compiles it with ParseEbnf.
  const std::string& ebnf() const { return ebnf_; }

 private:
  CompiledGrammar() = default;
  // Precompute fills tables_[state]; returns the deepest trie level its walk looked at.
  // With `reuse`, the tokens of every trie subtree no deeper than reuse->depth keep their
  // class in reuse->table (a state no string of that many bytes tells apart) without a walk.
  // With reuse->ref_state (the state whose table is reuse->table) instead, the walk follows
  // that state's path beside its own, and a subtree where both enter the same state with
  // nothing returned yet keeps the reference's classes (from there the two walks are one).
  struct Reuse {
    int32_t depth = 0;
    int32_t ref_state = -1;
    const StateTokens* table = nullptr;
    const std::vector<int32_t>* subtree_depth = nullptr;  // [trie node] deepest level below
    const std::vector<int32_t>* position = nullptr;       // [token id] place in sorted order
    // Instead of a walk: the sorted, disjoint ranges of sorted positions this state rejects;
    // every other token keeps its class in `table` (a truncated copy's, Truncation).
    const std::vector<std::pair<int32_t, int32_t>>* rejected = nullptr;
  };
  // With `entered`, a walk without `reuse` appends (state, trie node) wherever the walk is
  // one top at the bottom of its rule with nothing returned and the node's byte enters state.
  int32_t Precompute(int32_t state, class StackWalk& walk, struct WalkScratch& scratch,
                     const Reuse* reuse = nullptr,
                     std::vector<std::pair<int32_t, int32_t>>* entered = nullptr);
  // ContextClosure: the tops a return of rule `r` continues at (its return sites, and the
  // sites of every rule that returns from there, outwards), built once into the walk's
  // persistent node prefix: a return costs an append at every trie node instead of a fresh
  // expansion. Only before a vocabulary walk (it grows the persistent prefix).
  struct Closure {
    bool built = false;
    bool may_end = false;  // the root rule returns in it: the grammar may end
    std::vector<int32_t> tops;
  };
  const Closure& ContextClosure(int32_t rule, class StackWalk& walk);
  void BuildClosures(int32_t rule, class StackWalk& walk);

  Pda pda_;
  std::shared_ptr<const TokenVocab> vocab_;
  std::vector<StateTokens> tables_;
  std::vector<int32_t> token_ids_;  // [pda_.tokens.size()]
  // return_sites_[r]: the states calls of rule r return to (CallEdge::next), distinct.
  std::vector<std::vector<int32_t>> return_sites_;
  // plain_[s]: s can consume and neither calls nor accepts (a walk moves through it as a DFA).
  std::vector<uint8_t> plain_;
  // returning_[s]: s can consume, may return (accepting) and does not call.
  std::vector<uint8_t> returning_;
  std::vector<uint32_t> rule_epoch_;  // Precompute scratch: rules expanded at this trie node
  uint32_t epoch_ = 0;
  std::vector<Closure> closures_;  // [rule]
  size_t persistent_nodes_ = 0;    // walk nodes [0, persistent_nodes_) are closure tops' stacks
  CompileStats stats_;
  std::string ebnf_;
};

}  // namespace sluice::grammar

#endif  // SLUICE_ENGINE_GRAMMAR_COMPILED_GRAMMAR_H_
