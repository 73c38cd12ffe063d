// StackWalk: byte-by-byte simulation of the pushdown automaton over a set of stacks, the core
// shared by the mask precomputation (compiled_grammar.cc) and the matcher.
//
// Stacks are persistent: a node is (state, parent), nodes are shared, and a pop is a move to
// the parent. "Tops" are nodes whose state can consume a byte or a whole token. A pop past the bottom reaches
// kRootParent (the grammar may end here), kSentinelParent (precomputation: the rule the walk
// began in has returned, so what follows depends on the real stack) or kContextParent
// (precomputation: a state entered at one of its rule's return sites, with any caller below,
// returned; the walk records the rule in context_returns()).
#ifndef SLUICE_ENGINE_GRAMMAR_STACK_WALK_H_
#define SLUICE_ENGINE_GRAMMAR_STACK_WALK_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "engine/grammar/pda.h"

namespace sluice::grammar {

inline constexpr int32_t kRootParent = -1;
inline constexpr int32_t kSentinelParent = -2;
inline constexpr int32_t kContextParent = -3;

struct StackNode {
  int32_t state = 0;
  int32_t parent = kRootParent;
};

class StackWalk {
 public:
  explicit StackWalk(const Pda* pda) : pda_(pda) {}

  std::vector<StackNode>& nodes() { return nodes_; }
  const std::vector<StackNode>& nodes() const { return nodes_; }
  int32_t NewNode(int32_t state, int32_t parent) {
    nodes_.push_back(StackNode{state, parent});
    return static_cast<int32_t>(nodes_.size()) - 1;
  }

  // Flags set while expanding: a pop reached the bottom of the grammar / of the walk's rule.
  struct Flags {
    bool reached_root = false;
    bool reached_sentinel = false;
  };

  // ResetVisited starts a new expansion round (Step does it itself).
  void ResetVisited() { visited_.clear(); }

  // Rules whose states returned to kContextParent, appended by Expand (the caller clears).
  std::vector<int32_t>& context_returns() { return context_returns_; }

  // Expand appends to `tops` every top reachable from `node` without consuming bytes (rule
  // calls enter callees, accepting states return to their callers).
  void Expand(int32_t node, std::vector<int32_t>* tops, Flags* flags);

  // Step appends to `out` the tops after consuming `byte` from each of `tops`.
  void Step(const int32_t* tops, size_t num_tops, uint8_t byte, std::vector<int32_t>* out,
            Flags* flags);

 private:
  bool Visit(int32_t state, int32_t parent);

  const Pda* pda_;
  std::vector<StackNode> nodes_;
  std::vector<int32_t> work_;
  std::vector<std::pair<int32_t, int32_t>> visited_;  // (state, parent) this step
  std::vector<int32_t> context_returns_;
};

}  // namespace sluice::grammar

#endif  // SLUICE_ENGINE_GRAMMAR_STACK_WALK_H_
