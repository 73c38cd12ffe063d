// Pda: a grammar compiled to byte-level automata, one deterministic finite automaton per rule
// whose edges consume a byte range or call another rule (a pushdown automaton over bytes).
//
// States are numbered globally. A state's byte edges are disjoint (determinized and minimized per
// rule: no two states of a rule have the same future);
// a state may also have token edges (a whole vocabulary token, grammar.h kToken), rule-call edges (a call pushes the return state and enters the callee's
// start state) and be accepting (the rule may return there). Left recursion is refused at
// build time: it would push forever without consuming a byte.
#ifndef SLUICE_ENGINE_GRAMMAR_PDA_H_
#define SLUICE_ENGINE_GRAMMAR_PDA_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/grammar/grammar.h"

namespace sluice::grammar {

struct ByteEdge {
  uint8_t lo = 0;
  uint8_t hi = 0;  // inclusive
  int32_t next = -1;
};

// TokenEdge consumes one whole token: Pda::tokens[token], resolved to a vocabulary id when the
// grammar is compiled.
struct TokenEdge {
  int32_t token = -1;
  int32_t next = -1;
};

struct PdaToken {
  std::string text;  // the token's content, or empty with id >= 0
  int32_t id = -1;
};

struct CallEdge {
  int32_t rule = -1;
  int32_t next = -1;  // the state to return to after the rule matched
};

struct PdaState {
  int32_t rule = -1;
  bool accepting = false;
  uint32_t byte_begin = 0, byte_end = 0;  // into Pda::byte_edges, sorted by lo
  uint32_t call_begin = 0, call_end = 0;  // into Pda::call_edges
  uint32_t token_begin = 0, token_end = 0;  // into Pda::token_edges
};

struct PdaOptions {
  int64_t max_states = 2000000;  // NFA states over all rules before the build gives up
  int64_t max_rule_dfa_states = 100000;
  // CompiledGrammar::Create shares vocabulary walks among states that short strings cannot
  // tell apart; false walks every state's vocabulary in full (the reference the sharing is
  // tested against, same tables, only slower).
  bool share_table_walks = true;
};

struct Pda {
  std::vector<PdaState> states;
  std::vector<ByteEdge> byte_edges;
  std::vector<CallEdge> call_edges;
  std::vector<TokenEdge> token_edges;
  std::vector<PdaToken> tokens;  // distinct token terminals
  std::vector<int32_t> rule_start;  // [num_rules] start state of each rule
  std::vector<std::string> rule_names;
  int32_t root_rule = 0;

  // Next is the state after consuming `byte` from `state`, or -1.
  int32_t Next(int32_t state, uint8_t byte) const {
    const PdaState& s = states[state];
    for (uint32_t e = s.byte_begin; e < s.byte_end; ++e) {
      const ByteEdge& edge = byte_edges[e];
      if (byte < edge.lo) return -1;
      if (byte <= edge.hi) return edge.next;
    }
    return -1;
  }
  bool HasByteEdges(int32_t state) const {
    return states[state].byte_end > states[state].byte_begin;
  }
  bool HasTokenEdges(int32_t state) const {
    return states[state].token_end > states[state].token_begin;
  }
  // CanConsume: the state has byte or token edges (a stack top).
  bool CanConsume(int32_t state) const { return HasByteEdges(state) || HasTokenEdges(state); }
};

// BuildPda compiles `grammar`. Errors: InvalidArgument for a left-recursive rule (named by its
// Rule::origin when it has one), ResourceExhausted when the automata exceed the option limits.
absl::StatusOr<Pda> BuildPda(const Grammar& grammar, const PdaOptions& options = {});

// Utf8ByteRanges splits code points [lo, hi] into UTF-8 byte-range sequences: every string of
// the set matches exactly one sequence (the split used by RE2 and Rust's utf8-ranges; our code).
// Surrogates are skipped.
std::vector<std::vector<std::pair<uint8_t, uint8_t>>> Utf8ByteRanges(char32_t lo, char32_t hi);

}  // namespace sluice::grammar

#endif  // SLUICE_ENGINE_GRAMMAR_PDA_H_
