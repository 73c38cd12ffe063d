#include "engine/grammar/compiled_grammar.h"

#include <algorithm>
#include <array>
#include <limits>
#include <optional>
#include <string_view>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "engine/grammar/partition_refinement.h"
#include "engine/grammar/stack_walk.h"

namespace sluice::grammar {
namespace {

// BoundedClasses: Of(k, s) numbers the states so that two states share a number iff no string
// of at most k bytes tells them apart: the same rule, both accepting or neither, the same calls
// to the same return states, the same token edges, and for each byte either no edge or edges
// into states of one class at k - 1 (Moore's refinement stopped after k rounds). A walk that
// stays within k bytes from either sees the same tops, returns and contexts.
class BoundedClasses {
 public:
  static constexpr int32_t kMaxDepth = 12;

  explicit BoundedClasses(const Pda& pda) : pda_(pda) {}

  // Affordable: refining to `level` stays within a budget of state signatures (deep levels
  // only pay off for small automata with long chains, e.g. capped key lengths).
  bool Affordable(int32_t level) const {
    return static_cast<int64_t>(level + 1) * static_cast<int64_t>(pda_.states.size()) <=
           (int64_t{1} << 22);
  }

  int32_t Of(int32_t level, int32_t state) {
    while (static_cast<int32_t>(levels_.size()) <= level) Refine();
    return levels_[level][state];
  }

 private:
  void Refine() {
    if (levels_.empty()) {
      const int32_t n = static_cast<int32_t>(pda_.states.size());
      absl::flat_hash_map<std::vector<int32_t>, int32_t> ids;
      std::vector<int32_t> out(n), sig;
      std::vector<std::vector<int32_t>> preds(n);
      for (int32_t s = 0; s < n; ++s) {
        const PdaState& st = pda_.states[s];
        sig = {st.rule, st.accepting ? 1 : 0, pda_.HasByteEdges(s) ? 1 : 0, -1};
        for (uint32_t e = st.call_begin; e < st.call_end; ++e) {
          sig.insert(sig.end(), {pda_.call_edges[e].rule, pda_.call_edges[e].next});
        }
        sig.push_back(-1);
        for (uint32_t e = st.token_begin; e < st.token_end; ++e) {
          sig.insert(sig.end(), {pda_.token_edges[e].token, pda_.token_edges[e].next});
        }
        out[s] = ids.try_emplace(sig, static_cast<int32_t>(ids.size())).first->second;
        for (uint32_t e = st.byte_begin; e < st.byte_end; ++e) {
          std::vector<int32_t>& p = preds[pda_.byte_edges[e].next];
          if (p.empty() || p.back() != s) p.push_back(s);
        }
      }
      refinement_.emplace(out, static_cast<int32_t>(ids.size()), std::move(preds));
      levels_.push_back(std::move(out));
      return;
    }
    // Level k + 1 splits each class of level k by the classes its bytes lead to at level k:
    // one round of refinement (numbers differ from a fresh numbering, classes do not).
    refinement_->Round([&](int32_t s, std::vector<int32_t>* sig) {
      const std::vector<int32_t>& prev = refinement_->classes();
      const PdaState& st = pda_.states[s];
      sig->clear();
      sig->push_back(prev[s]);
      for (uint32_t e = st.byte_begin; e < st.byte_end; ++e) {
        const ByteEdge& edge = pda_.byte_edges[e];
        const int32_t c = prev[edge.next];
        // Adjacent ranges into one class read as one (as MinimizeStates writes them).
        if (sig->size() >= 4 && sig->back() == c && (*sig)[sig->size() - 2] + 1 == edge.lo) {
          (*sig)[sig->size() - 2] = edge.hi;
        } else {
          sig->insert(sig->end(), {edge.lo, edge.hi, c});
        }
      }
    });
    levels_.push_back(refinement_->classes());
  }

  const Pda& pda_;
  std::vector<std::vector<int32_t>> levels_;
  std::optional<PartitionRefinement> refinement_;  // at the last level
};

// BitCount: set bits of a word, without a library call (builds for any x86-64 have no popcnt
// instruction).
inline int32_t BitCount(uint32_t x) {
  x = x - ((x >> 1) & 0x55555555u);
  x = (x & 0x33333333u) + ((x >> 2) & 0x33333333u);
  x = (x + (x >> 4)) & 0x0f0f0f0fu;
  return static_cast<int32_t>((x * 0x01010101u) >> 24);
}

// DominantSuccessor: the state most of `s`'s bytes lead to (-1: none), the key under which
// states that differ only in a few bytes find each other.
int32_t DominantSuccessor(const Pda& pda, int32_t s) {
  const PdaState& st = pda.states[s];
  int32_t best = -1, best_width = 0;
  // Edges are sorted by byte and few: sum each target's widths over the later edges.
  for (uint32_t e = st.byte_begin; e < st.byte_end; ++e) {
    const int32_t next = pda.byte_edges[e].next;
    bool seen = false;
    for (uint32_t f = st.byte_begin; f < e && !seen; ++f) seen = pda.byte_edges[f].next == next;
    if (seen) continue;
    int32_t w = 0;
    for (uint32_t f = e; f < st.byte_end; ++f) {
      const ByteEdge& edge = pda.byte_edges[f];
      if (edge.next == next) w += edge.hi - edge.lo + 1;
    }
    if (w > best_width || (w == best_width && next < best)) {
      best = next;
      best_width = w;
    }
  }
  return best;
}

// NextRange: the state after byte b from q (-1: none), and in *end the last byte with that
// answer.
int32_t NextRange(const Pda& pda, int32_t q, int b, int* end) {
  const PdaState& st = pda.states[q];
  for (uint32_t e = st.byte_begin; e < st.byte_end; ++e) {
    const ByteEdge& edge = pda.byte_edges[e];
    if (b < edge.lo) {
      *end = edge.lo - 1;
      return -1;
    }
    if (b <= edge.hi) {
      *end = edge.hi;
      return edge.next;
    }
  }
  *end = 255;
  return -1;
}

// Truncation: whether state `s` is a truncated copy of state `r`: walking any bytes from both
// in lockstep, the two stay pure byte states (no accepting, call or token edge) until they
// enter one same state (from there the walks are one) or `s` has no edge where `r` has one
// (`s` rejects there), and `r` never lacks an edge that `s` has. The state `s` is in after a
// byte must follow from the state `r` is in (so a node of `r`'s walk tells `s`'s), and no
// state where `s` died may be entered again after the walks became one. Then every token
// takes `r`'s class except those whose bytes enter a state of `dead` from `r`'s in-step walk,
// which `s` rejects. A chain of capped characters (k left vs 64 left) is such a pair: a walk
// of `r`'s vocabulary names every token longer than k characters. At most `budget` pairs.
class Truncation {
 public:
  explicit Truncation(const Pda& pda)
      : pda_(pda),
        partner_(pda.states.size(), -1),
        mark_(pda.states.size(), 0),
        kind_(pda.states.size(), kPaired),
        seen_(pda.states.size(), 0) {}

  bool Check(int32_t s, int32_t r, int32_t budget, std::vector<int32_t>* dead) {
    dead->clear();
    ++epoch_;
    paired_late_ = false;
    merged_.clear();
    pending_.clear();
    if (s == r || !Pure(s) || !Pure(r)) return false;
    Pair(r, s);
    while (!pending_.empty()) {
      const int32_t y = pending_.back();
      pending_.pop_back();
      const int32_t x = partner_[y];
      for (int b = 0; b < 256;) {
        int end_x = 255, end_y = 255;
        const int32_t nx = NextRange(pda_, x, b, &end_x);
        const int32_t ny = NextRange(pda_, y, b, &end_y);
        b = std::min(end_x, end_y) + 1;
        if (ny < 0) {
          if (nx >= 0) return false;
          continue;
        }
        if (nx < 0) {
          if (Marked(ny) && kind_[ny] != kDead) return false;
          if (!Marked(ny)) {
            Mark(ny, kDead);
            dead->push_back(ny);
          }
          continue;
        }
        if (nx == ny) {
          if (Marked(ny) && kind_[ny] != kMerged) return false;
          if (!Marked(ny)) {
            Mark(ny, kMerged);
            merged_.push_back(ny);
          }
          continue;
        }
        if (Marked(ny)) {
          if (kind_[ny] != kPaired || partner_[ny] != nx) return false;
          continue;
        }
        if (!Pure(nx) || !Pure(ny) || --budget < 0) return false;
        Pair(ny, nx);
      }
    }
    // No dead state after the walks met: follow bytes, tokens and returns from calls.
    for (size_t k = 0; k < merged_.size(); ++k) {
      const PdaState& st = pda_.states[merged_[k]];
      auto reach = [&](int32_t q) {
        if (q < 0) return true;
        if (Marked(q) && kind_[q] == kDead) return false;
        if (Marked(q) && kind_[q] == kReached) return true;
        // A paired state reached after the meeting is fine: only dead states are looked up.
        if (Marked(q) && kind_[q] == kPaired) {
          paired_late_ = true;
          if (seen_[q] == epoch_) return true;
          seen_[q] = epoch_;
        } else if (Marked(q) && kind_[q] == kMerged) {
          return true;  // queued already
        } else {
          Mark(q, kReached);
        }
        merged_.push_back(q);
        return true;
      };
      for (uint32_t e = st.byte_begin; e < st.byte_end; ++e) {
        if (!reach(pda_.byte_edges[e].next)) return false;
      }
      for (uint32_t e = st.token_begin; e < st.token_end; ++e) {
        if (!reach(pda_.token_edges[e].next)) return false;
      }
      for (uint32_t e = st.call_begin; e < st.call_end; ++e) {
        if (!reach(pda_.call_edges[e].next)) return false;
      }
      if (--budget < 0) return false;
    }
    return true;
  }

  // Shift: after a Check(s, r) that returned true, the map f it proved, for every state the
  // walk from r reaches in step with the copy: (*next)[q] = the copy's state beside q (q
  // itself once the walks are one), kShiftDead where the copy rejects, kShiftUnknown for states
  // the check never saw (those past a dead state). f is a simulation that may only lose edges,
  // so applying it j times gives a truncated copy of any state it maps, whose walk rejects
  // exactly the tokens that enter a state where f^j is undefined. False if a paired state is
  // entered again after the walks became one (a later copy might die there).
  bool PureState(int32_t q) const { return Pure(q); }
  static constexpr int32_t kShiftDead = -2;
  static constexpr int32_t kShiftUnknown = -1;
  bool Shift(std::vector<int32_t>* next) const {
    if (paired_late_) return false;
    next->assign(pda_.states.size(), kShiftUnknown);
    for (size_t q = 0; q < next->size(); ++q) {
      if (!Marked(static_cast<int32_t>(q))) continue;
      switch (kind_[q]) {
        case kPaired: (*next)[q] = partner_[q]; break;
        case kDead: (*next)[q] = kShiftDead; break;
        default: (*next)[q] = static_cast<int32_t>(q);
      }
    }
    return true;
  }

 private:
  enum Kind : uint8_t { kPaired, kDead, kMerged, kReached };
  // Pure: only byte edges, at least one (a token that ends here is accepted in both).
  bool Pure(int32_t q) const {
    const PdaState& st = pda_.states[q];
    return !st.accepting && st.call_begin == st.call_end && st.token_begin == st.token_end &&
           st.byte_begin < st.byte_end;
  }
  bool Marked(int32_t q) const { return mark_[q] == epoch_; }
  void Mark(int32_t q, Kind k) {
    mark_[q] = epoch_;
    kind_[q] = k;
  }
  void Pair(int32_t y, int32_t x) {
    Mark(y, kPaired);
    partner_[y] = x;
    pending_.push_back(y);
  }
  const Pda& pda_;
  std::vector<int32_t> partner_;  // [r's state] the state s is in beside it
  std::vector<uint32_t> mark_;    // [state] epoch_ when kind_ is this check's
  std::vector<Kind> kind_;
  std::vector<uint32_t> seen_;    // [state] paired states queued after the meeting
  uint32_t epoch_ = 0;
  bool paired_late_ = false;  // a paired state was reached after the walks met
  std::vector<int32_t> merged_, pending_;
};

}  // namespace

// WalkScratch: Precompute's buffers, kept across states (their capacity is reused).
struct WalkScratch {
  std::vector<int32_t> exact, context, next_exact, next_context, accepted, uncertain_pos, shadow;
  std::vector<uint32_t> accepted_mask;  // a walk without a reference: its accepted tokens, by id
  std::vector<size_t> exact_begin, context_begin, pool;
  // With a reference table: the sorted positions the walk decided, as [begin, end) ranges.
  std::vector<std::pair<int32_t, int32_t>> decided;
  std::vector<int32_t> merged;
  // The in-rule run (Precompute's inner loop): per trie depth, the one top's state, its
  // parent node and the reference's state beside it.
  std::vector<int32_t> run_state, run_parent, run_shadow;
  std::vector<uint8_t> run_context;  // the level's context tops are the rule's closure
  // Byte transitions as 256-entry rows, filled the first time a run steps from a state:
  // row[state] (-1: not yet) into next (-1: no edge).
  std::vector<int32_t> row, next;
  // A reference table's accepted tokens as a bitmask over sorted positions (Precompute).
  absl::flat_hash_map<const StateTokens*, std::vector<uint64_t>> by_position;
  int32_t Next(const Pda& pda, int32_t q, uint8_t byte) {
    if (row[q] < 0) {
      row[q] = static_cast<int32_t>(next.size());
      next.resize(next.size() + 256, -1);
      const PdaState& st = pda.states[q];
      for (uint32_t e = st.byte_begin; e < st.byte_end; ++e) {
        const ByteEdge& edge = pda.byte_edges[e];
        std::fill(next.begin() + row[q] + edge.lo, next.begin() + row[q] + edge.hi + 1, edge.next);
      }
    }
    return next[row[q] + byte];
  }
};

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
  const Pda& built = g->pda_;
  // Only states a match can reach get tables, and only their calls are contexts: rules a
  // schema's construction leaves unused (e.g. the "nothing emitted yet" variant of an object
  // tail after a required property) cost no vocabulary walk and widen no context.
  std::vector<char> reachable(n, 0);
  std::vector<int32_t> stack;
  auto reach = [&](int32_t s) {
    if (s >= 0 && !reachable[s]) {
      reachable[s] = 1;
      stack.push_back(s);
    }
  };
  reach(built.rule_start[built.root_rule]);
  g->return_sites_.assign(built.rule_start.size(), {});
  while (!stack.empty()) {
    const PdaState& st = built.states[stack.back()];
    stack.pop_back();
    for (uint32_t e = st.byte_begin; e < st.byte_end; ++e) reach(built.byte_edges[e].next);
    for (uint32_t e = st.token_begin; e < st.token_end; ++e) reach(built.token_edges[e].next);
    for (uint32_t e = st.call_begin; e < st.call_end; ++e) {
      const CallEdge& c = built.call_edges[e];
      reach(c.next);
      reach(built.rule_start[c.rule]);
      std::vector<int32_t>& sites = g->return_sites_[c.rule];
      if (std::find(sites.begin(), sites.end(), c.next) == sites.end()) sites.push_back(c.next);
    }
  }
  g->plain_.assign(n, 0);
  g->returning_.assign(n, 0);
  for (int32_t s = 0; s < n; ++s) {
    const PdaState& st = built.states[s];
    g->plain_[s] = st.call_begin == st.call_end && !st.accepting && built.CanConsume(s);
    g->returning_[s] = st.call_begin == st.call_end && st.accepting && built.CanConsume(s);
  }
  // A state whose calls only return at once (an empty rule such as an object's "nothing
  // follows" tail) and then leave the rule, consuming nothing on the way, steps like a
  // returning one: its expansion from the rule's bottom is itself plus a return.
  {
    StackWalk probe(&g->pda_);
    std::vector<int32_t> tops;
    for (int32_t s = 0; s < n; ++s) {
      const PdaState& st = built.states[s];
      if (st.call_begin == st.call_end || !built.CanConsume(s)) continue;
      probe.nodes().clear();
      probe.ResetVisited();
      probe.context_returns().clear();
      tops.clear();
      StackWalk::Flags flags;
      probe.Expand(probe.NewNode(s, kSentinelParent), &tops, &flags);
      g->returning_[s] = flags.reached_sentinel && !flags.reached_root &&
                         probe.context_returns().empty() && tops.size() == 1 && tops[0] == 0;
    }
  }
  g->rule_epoch_.assign(built.rule_start.size(), 0);
  g->closures_.assign(built.rule_start.size(), {});
  g->tables_.resize(n);
  g->stats_.num_states = n;
  StackWalk walk(&g->pda_);
  // A state whose walk looked at most D bytes deep has the same table as every state that no
  // string of up to D bytes tells apart from it (same rule, the same returns and calls, and so
  // on for D bytes: BoundedClasses): the D-th byte of each path was its walk's last. Chains of
  // bounded repetitions (the 16 digits of a number) share one walk that way.
  BoundedClasses classes(built);
  WalkScratch scratch;
  scratch.row.assign(n, -1);
  absl::flat_hash_map<std::pair<int32_t, int32_t>, int32_t> walked;  // (depth, class) -> state
  std::vector<int32_t> depths;  // the depths in `walked`
  // A state that no string of up to L bytes tells apart from an earlier one (whose walk went
  // deeper: a chain of capped key characters, the last ones too) classifies every token of at
  // most L bytes as that one does: only the trie subtrees that go deeper are walked.
  const bool share = options.share_table_walks;
  constexpr int32_t kMinShared = 4;  // below, nearly every subtree is deeper: a walk is as fast
  // Above, few tokens are longer (a few hundred in 128k-token vocabularies): refining further
  // would cost more than walking them.
  constexpr int32_t kMaxSharedDepth = 32;
  // last_in_class[l - kMinShared]: class at level l -> the last tabled state in it
  std::vector<absl::flat_hash_map<int32_t, int32_t>> last_in_class(
      BoundedClasses::kMaxDepth - kMinShared + 1);
  // (rule, dominant successor) -> the last tabled state with them
  absl::flat_hash_map<std::pair<int32_t, int32_t>, int32_t> by_successor;
  // Vocabulary-wide trie statistics (built once per vocabulary): the walks' sizes.
  const std::vector<int32_t>& subtree_depth = g->vocab_->subtree_depth();
  const std::vector<int64_t>& nodes_deeper = g->vocab_->nodes_deeper();
  const std::vector<int32_t>& position = g->vocab_->sorted_position();
  const std::vector<TrieNode>& trie = g->vocab_->trie();
  // States walked in full, with the (state entered, trie node) pairs their walks recorded.
  struct Root {
    int32_t state;
    std::vector<std::pair<int32_t, int32_t>> entered;
    std::vector<int32_t> node_begin, nodes;  // entered's nodes grouped by state, once used
    // Its chain's token levels (orbit_levels, at the first copy). Bitmask roots: the accepted
    // ids of level below the chain's length, by level (accepted_begin[l]: the first of level
    // l); id-list roots: accepted_level[k] of accepted_ids[k] (accepted_begin counts alike).
    // uncertain_level[k] of uncertain_ids[k].
    bool levels_built = false, levels_ok = false;
    std::vector<int32_t> accepted_begin, accepted_by_level, accepted_level, uncertain_level;
    int64_t accepted_count = 0;
    int32_t last_j = -1, last_state = -1;  // the last copy built: the next one's base
  };
  std::vector<Root> roots;
  absl::flat_hash_map<int32_t, std::vector<int32_t>> roots_of_rule;  // rule -> into roots
  Truncation truncation(built);
  std::vector<int32_t> dead, dead_nodes;
  std::vector<std::pair<int32_t, int32_t>> rejected;
  // Below, a walk costs about as much as looking for a truncation's root.
  constexpr int64_t kMinTruncationCost = 4096;
  // Chains (Truncation::Shift): a truncation check of a root's main successor against the root
  // (a capped key's "63 characters left" against "64 left") proves a shift f over every state
  // the root's walk reaches. Each root f maps heads a chain root, f(root), f(f(root)), ...
  // (that key character state at 63, 62, ... left; likewise the states inside an escape or a
  // UTF-8 sequence); the j-th takes the root's table minus the tokens whose walk from the root
  // enters a state where f^j is undefined: those of level below j, a token's level being the
  // least, over the states its bytes enter, of how often f applies there. One pass over the
  // root's recorded walk buckets its tokens by level, and each copy clears one bucket from the
  // previous copy's bitmask: no walk, no subtree search, no state-pair check per copy.
  constexpr int32_t kEndless = std::numeric_limits<int32_t>::max();
  std::vector<int32_t> shift_next;   // f (Truncation::Shift), empty until one is proved
  std::vector<int32_t> shift_depth;  // [state] how often f applies (kEndless: forever)
  absl::flat_hash_map<int32_t, int32_t> shift_tries;  // rule -> checks tried
  constexpr int32_t kMaxShiftTries = 4;  // per rule: failed checks cost up to their budget each
  struct Orbit {
    int32_t root;  // into roots
    int32_t j;     // the state is f^j(root)
  };
  absl::flat_hash_map<int32_t, Orbit> orbit_of;
  constexpr int32_t kMinChainHead = 8;  // shorter chains need not pay for a full walk
  auto add_orbit = [&](int32_t root) {
    int32_t x = roots[root].state;
    const int32_t length = shift_depth[x];
    if (length == kEndless) return;
    for (int32_t j = 1; j <= length; ++j) {
      x = shift_next[x];
      orbit_of.try_emplace(x, Orbit{root, j});
    }
  };
  // Proves a shift from root `root` (its main successor a truncated copy of it), if any.
  auto try_shift = [&](int32_t root) {
    const int32_t r = roots[root].state;
    const int32_t next = DominantSuccessor(built, r);
    if (next < 0 || next == r || !truncation.PureState(r) || !truncation.PureState(next)) return;
    ++shift_tries[built.states[r].rule];
    const int32_t budget = static_cast<int32_t>(std::min<int64_t>(trie.size() / 8, 1 << 16));
    if (!truncation.Check(next, r, budget, &dead) || !truncation.Shift(&shift_next)) {
      shift_next.clear();
      return;
    }
    // f applied along each state's chain until a state where it is undefined (0: dead, or
    // one the check never saw) or one where the walks are one (kEndless); a cycle voids the
    // shift. A state the check never saw is no copy's state: the copy that would be there
    // died on the way already (it follows a dead state, or f^j of a path's states runs into
    // it only where f^(j-1) of an earlier state was dead).
    constexpr int32_t kPending = -1, kOnChain = -2;
    shift_depth.assign(n, kPending);
    std::vector<int32_t> chain;
    for (int32_t q = 0; q < n; ++q) {
      if (shift_depth[q] != kPending) continue;
      chain.clear();
      int32_t x = q, depth = 0;
      while (true) {
        if (shift_depth[x] >= 0) {
          depth = shift_depth[x];
          break;
        }
        if (shift_depth[x] == kOnChain) {
          shift_next.clear();
          shift_depth.clear();
          return;
        }
        const int32_t f = shift_next[x];
        if (f < 0 || f == x) {
          depth = f == x ? kEndless : 0;
          shift_depth[x] = depth;
          break;
        }
        shift_depth[x] = kOnChain;
        chain.push_back(x);
        x = f;
      }
      for (size_t k = chain.size(); k-- > 0;) {
        if (depth != kEndless) ++depth;
        shift_depth[chain[k]] = depth;
      }
    }
    for (size_t k = 0; k < roots.size(); ++k) add_orbit(static_cast<int32_t>(k));
  };
  const int32_t num_sorted = static_cast<int32_t>(g->vocab_->sorted_token_ids().size());
  const int32_t num_trie = static_cast<int32_t>(trie.size());
  const int32_t words = g->vocab_->num_bitmask_words();
  const std::vector<int32_t>& sorted_ids = g->vocab_->sorted_token_ids();
  // The root's tokens by level, from its recorded walk (preorder), in one pass: a node's level
  // is the least of its parent's and its state's shift depth, a token's that of its deepest
  // recorded node (its own node for every accepted token of a bitmask root: bytes consumed
  // inside the rule; an uncertain token may end past the rule's return, below that node).
  std::vector<int32_t> level_at, node_at, end_at;  // by trie depth: the recorded path
  std::vector<int32_t> by_level_ids, by_level_levels;
  auto orbit_levels = [&](Root& r) -> bool {
    r.levels_built = true;
    if (r.entered.empty()) return false;  // grouped by state for truncated copies already
    const int32_t length = shift_depth[r.state];
    const StateTokens& t = g->tables_[r.state];
    const bool bits = !t.accepted_bits.empty();
    r.accepted_begin.assign(static_cast<size_t>(length) + 2, 0);  // counts first
    by_level_ids.clear();
    by_level_levels.clear();
    int32_t top = 0;  // depth of the last recorded node (the path is level_at[1..top])
    // Sorted-order queries (uncertain ids, an id-list root's accepted ids), answered once the
    // walk is past their position: the deepest node on the path whose subtree holds it.
    size_t next_uncertain = 0, next_accepted = 0;
    bool ok = true;
    auto answer = [&](int32_t pos) {
      for (int32_t d = top; d >= 1; --d) {
        const int32_t end = end_at[d] < num_trie ? trie[end_at[d]].token_begin : num_sorted;
        if (pos < end) return level_at[d];
      }
      return -1;
    };
    auto answer_before = [&](int32_t limit) {
      for (; next_uncertain < t.uncertain_ids.size(); ++next_uncertain) {
        const int32_t pos = position[t.uncertain_ids[next_uncertain]];
        if (pos >= limit) break;
        const int32_t level = answer(pos);
        ok = ok && level >= 0;
        r.uncertain_level.push_back(level);
      }
      for (; !bits && next_accepted < t.accepted_ids.size(); ++next_accepted) {
        const int32_t pos = position[t.accepted_ids[next_accepted]];
        if (pos >= limit) break;
        const int32_t level = answer(pos);
        ok = ok && level >= 0;
        r.accepted_level.push_back(level);
        if (level >= 0 && level < length) ++r.accepted_begin[level + 1];
      }
    };
    int64_t covered = 0;
    for (const auto& [state, node] : r.entered) {
      const TrieNode& v = trie[node];
      answer_before(v.token_begin);
      const int32_t d = v.depth;
      if (static_cast<int32_t>(level_at.size()) <= d) {
        level_at.resize(d + 1, kEndless);
        node_at.resize(d + 1, -1);
        end_at.resize(d + 1, -1);
      }
      int32_t level = kEndless;
      if (d > 1) {
        if (d - 1 > top || node_at[d - 1] >= node || node >= end_at[d - 1]) return false;  // parent unrecorded
        level = level_at[d - 1];
      }
      level = std::min(level, shift_depth[state]);
      level_at[d] = level;
      node_at[d] = node;
      end_at[d] = v.subtree_end;
      top = d;
      if (!bits) continue;
      for (int32_t p = v.token_begin; p < v.token_end; ++p) {
        const int32_t id = sorted_ids[p];
        if (((t.accepted_bits[id >> 5] >> (id & 31)) & 1) == 0) continue;
        ++covered;
        if (level < length) {
          by_level_ids.push_back(id);
          by_level_levels.push_back(level);
          ++r.accepted_begin[level + 1];
        }
      }
    }
    answer_before(num_sorted);
    if (!ok) return false;
    for (size_t l = 1; l < r.accepted_begin.size(); ++l) r.accepted_begin[l] += r.accepted_begin[l - 1];
    if (!bits) return true;
    for (uint32_t w : t.accepted_bits) r.accepted_count += BitCount(w);
    if (covered != r.accepted_count) return false;
    r.accepted_by_level.resize(by_level_ids.size());
    std::vector<int32_t> fill(r.accepted_begin.begin(), r.accepted_begin.end() - 1);
    for (size_t k = 0; k < by_level_ids.size(); ++k) {
      r.accepted_by_level[fill[by_level_levels[k]]++] = by_level_ids[k];
    }
    return true;
  };
  std::vector<uint64_t> by_position;  // orbit_table's scratch, all clear between uses
  // The table of f^j(root) (orbit_of), or false where the root's levels are not known.
  auto orbit_table = [&](int32_t s, const Orbit& orbit) -> bool {
    Root& r = roots[orbit.root];
    if (!r.levels_built) r.levels_ok = orbit_levels(r);
    if (!r.levels_ok) return false;
    const int32_t j = orbit.j;
    const StateTokens& rt = g->tables_[r.state];
    StateTokens& t = g->tables_[s];
    std::string_view prev;
    for (size_t k = 0; k < rt.uncertain_ids.size(); ++k) {
      if (r.uncertain_level[k] < j) continue;
      const std::string_view b = g->vocab_->token_bytes(rt.uncertain_ids[k]);
      size_t lcp = 0;
      while (lcp < prev.size() && lcp < b.size() && prev[lcp] == b[lcp]) ++lcp;
      t.uncertain_ids.push_back(rt.uncertain_ids[k]);
      t.uncertain_lcp.push_back(static_cast<int32_t>(lcp));
      prev = b;
    }
    if (rt.accepted_bits.empty()) {
      if (r.last_j >= 0 && r.last_j < j && r.accepted_begin[r.last_j] == r.accepted_begin[j]) {
        t.accepted_ids = g->tables_[r.last_state].accepted_ids;  // no token of levels [last_j, j)
      } else {
        for (size_t k = 0; k < rt.accepted_ids.size(); ++k) {
          if (r.accepted_level[k] >= j) t.accepted_ids.push_back(rt.accepted_ids[k]);
        }
      }
      r.last_j = j;
      r.last_state = s;
      return true;
    }
    int32_t from = 0;  // levels [from, j) to clear
    if (r.last_j >= 0 && r.last_j < j) {
      t.accepted_bits = g->tables_[r.last_state].accepted_bits;
      from = r.last_j;
    } else {
      t.accepted_bits = rt.accepted_bits;
    }
    for (int32_t k = r.accepted_begin[from]; k < r.accepted_begin[j]; ++k) {
      const int32_t id = r.accepted_by_level[k];
      t.accepted_bits[id >> 5] &= ~(1u << (id & 31));
    }
    if (r.accepted_count - r.accepted_begin[j] > words) {
      r.last_j = j;
      r.last_state = s;
      return true;
    }
    // Few enough for an id list, in trie order (as a walk lists them): through a bitmask over
    // sorted positions, left clear again.
    by_position.resize((num_sorted + 63) / 64, 0);
    for (size_t w = 0; w < t.accepted_bits.size(); ++w) {
      for (uint32_t bits = t.accepted_bits[w]; bits != 0; bits &= bits - 1) {
        const int32_t p = position[static_cast<int32_t>(w * 32) + __builtin_ctz(bits)];
        by_position[p >> 6] |= uint64_t{1} << (p & 63);
      }
    }
    t.accepted_ids.reserve(static_cast<size_t>(r.accepted_count - r.accepted_begin[j]));
    for (size_t w = 0; w < by_position.size(); ++w) {
      for (uint64_t bits = by_position[w]; bits != 0; bits &= bits - 1) {
        t.accepted_ids.push_back(sorted_ids[static_cast<int32_t>(w * 64) + __builtin_ctzll(bits)]);
      }
      by_position[w] = 0;
    }
    t.accepted_bits.clear();
    return true;
  };
  for (int32_t s = 0; s < n; ++s) {
    if (!reachable[s] || !g->pda_.HasByteEdges(s)) continue;
    const bool keyed = share && classes.Affordable(BoundedClasses::kMaxDepth);
    const auto successor_key = std::make_pair(built.states[s].rule, DominantSuccessor(built, s));
    auto orbit = orbit_of.find(s);
    const bool chain_copy = orbit != orbit_of.end() && orbit_table(s, orbit->second);
    g->stats_.num_chain_copies += chain_copy ? 1 : 0;
    if (!chain_copy) {
    // The head of a long chain not yet walked (a UTF-8 continuation byte state of the first
    // level, which would walk beside another state) is walked in full instead: the rest of
    // its chain then copies its table.
    // (Not a member of a chain whose root's levels are unknown: it would walk in full in vain.)
    const bool chain_head = !shift_next.empty() && orbit == orbit_of.end() &&
                            shift_depth[s] >= kMinChainHead && shift_depth[s] != kEndless;
    int32_t ref = -1;
    int32_t shared_depth = 0;  // ref's table holds for tokens up to this many bytes
    for (int32_t l = BoundedClasses::kMaxDepth; keyed && !chain_head && l >= kMinShared && ref < 0;
         --l) {
      auto it = last_in_class[l - kMinShared].find(classes.Of(l, s));
      if (it != last_in_class[l - kMinShared].end()) {
        ref = it->second;
        shared_depth = l;
      }
    }
    int32_t same = -1;
    for (int32_t d : share ? depths : std::vector<int32_t>{}) {
      auto it = walked.find({d, classes.Of(d, s)});
      if (it != walked.end()) {
        same = it->second;
        break;
      }
    }
    if (same < 0 && ref >= 0) {
      while (shared_depth < std::min(subtree_depth[0], kMaxSharedDepth) &&
             classes.Affordable(shared_depth + 1) &&
             classes.Of(shared_depth + 1, s) == classes.Of(shared_depth + 1, ref)) {
        ++shared_depth;
      }
      if (shared_depth >= subtree_depth[0]) same = ref;  // no token tells them apart
    }
    // A state whose bytes mostly lead where an earlier state's of its rule lead (a node of the
    // declared names' prefix tree in an additional key, beside the plain key character chain)
    // walks beside that state's path and only where the two differ (Reuse::ref_state): a
    // token's class depends only on the states its bytes enter (and the rule's contexts).
    // Of the two kinds of reference, the one whose walk looks cheaper is taken: the first
    // bytes that differ bound the in-step walk from above.
    int32_t byte_ref = -1;
    int64_t byte_cost = 0;
    if (share && same < 0 && !chain_head) {
      auto it = by_successor.find(successor_key);
      if (it != by_successor.end()) {
        for (int b = 0; b < 256;) {  // by ranges of bytes where both states answer alike
          int end_s = 255, end_ref = 255;
          const int32_t next_s = NextRange(built, s, b, &end_s);
          const int32_t next_ref = NextRange(built, it->second, b, &end_ref);
          const int end = std::min(end_s, end_ref);
          if (next_s != next_ref) byte_cost += g->vocab_->NodesUnderFirstBytes(b, end);
          b = end + 1;
        }
        if (shared_depth == 0 || byte_cost < nodes_deeper[shared_depth]) {
          byte_ref = it->second;
          shared_depth = 0;
        }
      }
    }
    // A truncated copy of a state walked in full (the k-characters-left states of a capped
    // key against the first) takes that walk's table minus the subtrees where it stops, found
    // among the nodes the walk recorded: no walk at all. Tried only where the walk it saves
    // is large, within a budget of state pairs that stays well below it.
    int32_t root = -1;
    if (share && same < 0 && !chain_head) {
      const int64_t cost = shared_depth > 0 ? nodes_deeper[shared_depth]
                           : byte_ref >= 0  ? byte_cost
                                            : static_cast<int64_t>(trie.size());
      auto it = roots_of_rule.find(built.states[s].rule);
      if (cost >= kMinTruncationCost && it != roots_of_rule.end()) {
        const int32_t budget = static_cast<int32_t>(std::min<int64_t>(cost / 8, 1 << 16));
        // The largest walks first: a truncated copy of a large walk is what saves one.
        const std::vector<int32_t>& candidates = it->second;
        for (size_t k = 0; k < candidates.size() && k < 8; ++k) {
          if (truncation.Check(s, roots[candidates[k]].state, budget, &dead)) {
            root = candidates[k];
            break;
          }
        }
      }
    }
    // A walk beside another state that may cost a full walk is taken in full instead, so
    // that the state becomes a root its truncated copies derive from (the last hex digit of a
    // \uXXXX escape, beside the UTF-8 continuation byte, in every k-characters-left copy).
    if (root < 0 && byte_ref >= 0 && byte_cost >= kMinTruncationCost) {
      int64_t full_cost = 0;
      const PdaState& st = built.states[s];
      for (uint32_t e = st.byte_begin; e < st.byte_end; ++e) {
        const ByteEdge& edge = built.byte_edges[e];
        full_cost += g->vocab_->NodesUnderFirstBytes(edge.lo, edge.hi);
      }
      if (full_cost <= byte_cost) byte_ref = -1;  // no byte leads where the reference's does
    }
    if (same >= 0) {
      g->tables_[s] = g->tables_[same];
    } else if (root >= 0) {
      Root& r = roots[root];
      if (r.node_begin.empty()) {  // nodes by the state entered (a counting sort, node order kept)
        r.node_begin.assign(n + 1, 0);
        for (const auto& [state, node] : r.entered) ++r.node_begin[state + 1];
        for (int32_t q = 0; q < n; ++q) r.node_begin[q + 1] += r.node_begin[q];
        r.nodes.resize(r.entered.size());
        std::vector<int32_t> fill(r.node_begin.begin(), r.node_begin.end() - 1);
        for (const auto& [state, node] : r.entered) r.nodes[fill[state]++] = node;
        r.entered = {};
      }
      // Each dead state's nodes are in trie order: merge the lists, then their subtrees'
      // token ranges (a subtree nests in an earlier one or starts after it).
      dead_nodes.clear();
      for (int32_t y : dead) {
        const size_t before = dead_nodes.size();
        dead_nodes.insert(dead_nodes.end(), r.nodes.begin() + r.node_begin[y],
                          r.nodes.begin() + r.node_begin[y + 1]);
        std::inplace_merge(dead_nodes.begin(), dead_nodes.begin() + before, dead_nodes.end());
      }
      rejected.clear();
      for (int32_t i : dead_nodes) {
        const TrieNode& node = trie[i];
        const int32_t end =
            node.subtree_end < num_trie ? trie[node.subtree_end].token_begin : num_sorted;
        if (node.token_begin >= end) continue;
        if (!rejected.empty() && node.token_begin <= rejected.back().second) {
          rejected.back().second = std::max(rejected.back().second, end);
        } else {
          rejected.emplace_back(node.token_begin, end);
        }
      }
      const Reuse reuse{0, -1, &g->tables_[r.state], nullptr, &position, &rejected};
      g->Precompute(s, walk, scratch, &reuse);
    } else if (shared_depth > 0) {
      const Reuse reuse{shared_depth, -1, &g->tables_[ref], &subtree_depth, &position};
      g->Precompute(s, walk, scratch, &reuse);  // its depth covers only the walked subtrees
    } else if (byte_ref >= 0) {
      const Reuse reuse{0, byte_ref, &g->tables_[byte_ref], nullptr, &position};
      g->Precompute(s, walk, scratch, &reuse);
    } else {
      Root r{s, {}, {}, {}};
      if (share) {  // at most the nodes under its first bytes: one allocation, no regrowth
        int64_t bound = 0;
        const PdaState& st = built.states[s];
        for (uint32_t e = st.byte_begin; e < st.byte_end; ++e) {
          bound += g->vocab_->NodesUnderFirstBytes(built.byte_edges[e].lo, built.byte_edges[e].hi);
        }
        r.entered.reserve(static_cast<size_t>(std::min<int64_t>(bound, num_trie)));
      }
      const int32_t depth = g->Precompute(s, walk, scratch, nullptr, share ? &r.entered : nullptr);
      if (share) {
        std::vector<int32_t>& list = roots_of_rule[built.states[s].rule];
        const size_t size = r.entered.size();
        roots.push_back(std::move(r));
        list.insert(std::find_if(list.begin(), list.end(),
                                 [&](int32_t k) { return roots[k].entered.size() < size; }),
                    static_cast<int32_t>(roots.size()) - 1);
        const int32_t root = static_cast<int32_t>(roots.size()) - 1;
        if (!shift_next.empty()) {
          if (shift_next[s] >= 0) add_orbit(root);
        } else if (shift_tries[built.states[s].rule] < kMaxShiftTries) {
          try_shift(root);
        }
      }
      if (depth <= BoundedClasses::kMaxDepth) {
        if (walked.try_emplace({depth, classes.Of(depth, s)}, s).second &&
            std::find(depths.begin(), depths.end(), depth) == depths.end()) {
          depths.push_back(depth);
        }
      }
    }
    }  // not a chain copy
    for (int32_t l = kMinShared; keyed && l <= BoundedClasses::kMaxDepth; ++l) {
      last_in_class[l - kMinShared][classes.Of(l, s)] = s;
    }
    if (share) by_successor[successor_key] = s;
    const StateTokens& t = g->tables_[s];
    ++g->stats_.num_byte_states;
    g->stats_.num_uncertain += static_cast<int64_t>(t.uncertain_ids.size());
    g->stats_.table_bytes += static_cast<int64_t>(
        t.accepted_bits.size() * 4 + t.accepted_ids.size() * 4 + t.uncertain_ids.size() * 8);
  }
  return std::shared_ptr<const CompiledGrammar>(std::move(g));
}

void CompiledGrammar::BuildClosures(int32_t rule, StackWalk& walk) {
  std::vector<int32_t> pending = {rule};
  std::vector<int32_t>& returned = walk.context_returns();
  while (!pending.empty()) {
    const int32_t q = pending.back();
    pending.pop_back();
    Closure& c = closures_[q];
    if (c.built) continue;
    c.built = true;
    // The rules that return in turn, outwards from q (each once).
    ++epoch_;
    std::vector<int32_t> rules = {q};
    rule_epoch_[q] = epoch_;
    walk.ResetVisited();
    StackWalk::Flags flags;
    for (size_t k = 0; k < rules.size(); ++k) {
      const int32_t r = rules[k];
      if (r == pda_.root_rule) c.may_end = true;
      returned.clear();
      for (int32_t site : return_sites_[r]) {
        walk.Expand(walk.NewNode(site, kContextParent), &c.tops, &flags);
        // A walk that reaches this site may see its rule return later: it needs its closure.
        const int32_t site_rule = pda_.states[site].rule;
        if (!closures_[site_rule].built) pending.push_back(site_rule);
      }
      for (int32_t x : returned) {
        if (rule_epoch_[x] != epoch_) {
          rule_epoch_[x] = epoch_;
          rules.push_back(x);
        }
      }
    }
  }
  returned.clear();
  persistent_nodes_ = walk.nodes().size();
}

const CompiledGrammar::Closure& CompiledGrammar::ContextClosure(int32_t rule, StackWalk& walk) {
  if (!closures_[rule].built) BuildClosures(rule, walk);
  return closures_[rule];
}

int32_t CompiledGrammar::Precompute(int32_t state, StackWalk& walk, WalkScratch& scratch,
                                    const Reuse* reuse,
                                    std::vector<std::pair<int32_t, int32_t>>* entered) {
  const std::vector<TrieNode>& trie = vocab_->trie();
  const std::vector<int32_t>& sorted = vocab_->sorted_token_ids();
  const int32_t own_rule = pda_.states[state].rule;
  std::vector<int32_t>& accepted = scratch.accepted;
  std::vector<int32_t>& uncertain_pos = scratch.uncertain_pos;  // positions in `sorted`
  accepted.clear();
  uncertain_pos.clear();
  walk.nodes().resize(persistent_nodes_);  // drop the previous walk's stacks, keep the closures'
  // Every closure this walk can need, built before it (they extend the persistent prefix).
  const Closure& own_closure = ContextClosure(own_rule, walk);
  // Two top sets per depth d (0 = before the first byte): `exact` tops still inside the rule
  // (their stacks end at kSentinelParent) and `context` tops past its return (kContextParent).
  // Level d is exact[exact_begin[d], exact_begin[d + 1]) and the same for context; pool[d] is
  // the node pool size to roll back to.
  std::vector<int32_t>& exact = scratch.exact;
  std::vector<int32_t>& context = scratch.context;
  std::vector<size_t>& exact_begin = scratch.exact_begin;
  std::vector<size_t>& context_begin = scratch.context_begin;
  std::vector<size_t>& pool = scratch.pool;
  std::vector<int32_t>& next_exact = scratch.next_exact;
  std::vector<int32_t>& next_context = scratch.next_context;
  exact.assign(1, walk.NewNode(state, kSentinelParent));
  context.clear();
  exact_begin.assign({0, 1});
  context_begin.assign({0, 0});
  pool.assign(1, walk.nodes().size());
  // shadow[d]: the reference state's walk after d bytes (-1: no longer comparable).
  std::vector<int32_t>& shadow = scratch.shadow;
  shadow.assign(1, reuse != nullptr ? reuse->ref_state : -1);
  std::vector<int32_t>& returned = walk.context_returns();
  // A walk without a reference sets accepted tokens in a bitmask as it goes and lists them
  // only while they are few enough for an id list (most of a large set is never listed).
  const int32_t words = vocab_->num_bitmask_words();
  const bool direct = reuse == nullptr;
  std::vector<uint32_t>& mask = scratch.accepted_mask;
  int64_t num_accepted = 0;
  if (direct) mask.resize(words, 0);
  auto add_accepted = [&](int32_t begin, int32_t end) {
    if (!direct) {
      for (int32_t k = begin; k < end; ++k) accepted.push_back(sorted[k]);
      return;
    }
    for (int32_t k = begin; k < end; ++k) {
      const int32_t id = sorted[k];
      mask[id >> 5] |= 1u << (id & 31);
      if (num_accepted++ <= words) accepted.push_back(id);
    }
  };
  auto add_range = [&](std::vector<int32_t>* out, int32_t begin, int32_t end, bool ids) {
    for (int32_t k = begin; k < end; ++k) out->push_back(ids ? sorted[k] : k);
  };
  const int32_t num_nodes = static_cast<int32_t>(trie.size());
  std::vector<std::pair<int32_t, int32_t>>& decided = scratch.decided;
  decided.clear();
  auto decide = [&](int32_t begin, int32_t end) {  // ranges come in preorder: merge as we go
    if (begin >= end) return;
    if (!decided.empty() && begin <= decided.back().second) {
      decided.back().second = std::max(decided.back().second, end);
    } else {
      decided.emplace_back(begin, end);
    }
  };
  auto reject_subtree = [&](const TrieNode& node) {
    if (reuse == nullptr) return;
    // Within reuse->depth bytes the reference dies where this walk does: its table rejects
    // the subtree already.
    if (reuse->ref_state < 0 && node.depth <= reuse->depth) return;
    decide(node.token_begin, node.subtree_end < num_nodes ? trie[node.subtree_end].token_begin
                                                          : static_cast<int32_t>(sorted.size()));
  };
  int32_t i = 1;
  int32_t max_depth = 0;
  if (reuse != nullptr && reuse->rejected != nullptr) {
    decided = *reuse->rejected;  // no walk: the reference's classes, minus these subtrees
    i = num_nodes;
  }
  // The bulk of a walk is one top moving inside its rule through states that neither call nor
  // return (a string's characters): those nodes are walked by the inner loop below with one
  // state per depth, and the level structures above are written only where the walk leaves
  // that run (a byte that enters a calling or accepting state), for the general step.
  const bool runs = reuse == nullptr || reuse->rejected == nullptr;
  std::vector<int32_t>& run_state = scratch.run_state;
  std::vector<int32_t>& run_parent = scratch.run_parent;
  std::vector<int32_t>& run_shadow = scratch.run_shadow;
  std::vector<uint8_t>& run_context = scratch.run_context;
  if (runs && run_state.size() < static_cast<size_t>(vocab_->subtree_depth()[0]) + 2) {
    const size_t levels = static_cast<size_t>(vocab_->subtree_depth()[0]) + 2;
    run_state.resize(levels);
    run_parent.resize(levels);
    run_shadow.resize(levels);
    run_context.resize(levels);
  }
  // A run also goes through states where the rule may return (a loop such as [A-Za-z ]*,
  // with nothing below the rule's own bottom): the level's context tops are then the rule's
  // closure, and a byte none of them takes leaves only the one top (closure_bytes).
  const std::vector<int32_t>& closure_tops = own_closure.tops;
  std::array<uint64_t, 4> closure_bytes{};
  for (int32_t top : closure_tops) {
    const PdaState& st = pda_.states[walk.nodes()[top].state];
    for (uint32_t e = st.byte_begin; e < st.byte_end; ++e) {
      for (int b = pda_.byte_edges[e].lo; b <= pda_.byte_edges[e].hi; ++b) {
        closure_bytes[b >> 6] |= uint64_t{1} << (b & 63);
      }
    }
  }
  const std::vector<int32_t>* reuse_depths = reuse != nullptr ? reuse->subtree_depth : nullptr;
  // Drops the levels below level d (the tops after d bytes stay, their children go).
  auto truncate_levels = [&](int32_t d) {
    exact_begin.resize(d + 2);
    context_begin.resize(d + 2);
    pool.resize(d + 1);
    exact.resize(exact_begin[d + 1]);
    context.resize(context_begin[d + 1]);
    walk.nodes().resize(pool[d]);
  };
  const bool with_ref = reuse != nullptr && reuse->ref_state >= 0;
  while (i < num_nodes) {
    if (runs) {
      const int32_t base = trie[i].depth - 1;
      const size_t num_context = context_begin[base + 1] - context_begin[base];
      const StackNode top = exact_begin[base + 1] - exact_begin[base] == 1
                                ? walk.nodes()[exact[exact_begin[base]]]
                                : StackNode{-1, kRootParent};
      if (top.state >= 0 &&
          (num_context == 0 ||
           (top.parent == kSentinelParent && num_context == closure_tops.size() &&
            std::equal(closure_tops.begin(), closure_tops.end(),
                       context.begin() + context_begin[base])))) {
        run_context[base] = num_context != 0;
        run_state[base] = top.state;
        run_parent[base] = top.parent;
        run_shadow[base] = with_ref ? (base < static_cast<int32_t>(shadow.size()) ? shadow[base] : -1)
                                    : -1;
        const bool sentinel = top.parent == kSentinelParent;
        int32_t j = i;
        while (j < num_nodes) {
          const TrieNode& node = trie[j];
          const int32_t pd = node.depth - 1;
          if (pd < base) break;  // past the run's first parent's subtree
          const bool in_context = run_context[pd];
          if (in_context && ((closure_bytes[node.byte >> 6] >> (node.byte & 63)) & 1)) break;
          const int32_t ns = scratch.Next(pda_, run_state[pd], node.byte);
          uint8_t next_context = 0;
          if (ns >= 0 && !plain_[ns]) {
            // A return from the rule's own bottom: the closure follows (else the general step).
            if (!sentinel || returning_[ns] == 0) break;
            next_context = !closure_tops.empty();
          }
          int32_t next_shadow = -1;
          if (reuse != nullptr) {
            if (with_ref) {
              const int32_t y = run_shadow[pd];
              if (y >= 0 && sentinel && !in_context) {
                const int32_t ny = scratch.Next(pda_, y, node.byte);
                if (ns == ny) {
                  j = node.subtree_end;
                  continue;
                }
                if (ny >= 0 && pda_.states[ny].call_begin == pda_.states[ny].call_end &&
                    !pda_.states[ny].accepting) {
                  next_shadow = ny;
                }
              }
            } else if ((*reuse_depths)[j] <= reuse->depth) {
              j = node.subtree_end;
              continue;
            }
            decide(node.token_begin, node.token_end);
          }
          max_depth = std::max(max_depth, node.depth);
          if (ns < 0) {
            reject_subtree(node);
            j = node.subtree_end;
            continue;
          }
          if (entered != nullptr && sentinel && !in_context) entered->emplace_back(ns, j);
          add_accepted(node.token_begin, node.token_end);
          run_state[pd + 1] = ns;
          run_parent[pd + 1] = run_parent[pd];
          run_shadow[pd + 1] = next_shadow;
          run_context[pd + 1] = next_context;
          ++j;
        }
        if (j < num_nodes && trie[j].depth - 1 > base) {
          // The general step takes node j: write the run's levels above base for it.
          const int32_t pd = trie[j].depth - 1;
          truncate_levels(base);
          shadow.resize(base + 1);
          for (int32_t l = base + 1; l <= pd; ++l) {
            exact.push_back(walk.NewNode(run_state[l], run_parent[l]));
            if (run_context[l]) context.insert(context.end(), closure_tops.begin(), closure_tops.end());
            exact_begin.push_back(exact.size());
            context_begin.push_back(context.size());
            pool.push_back(walk.nodes().size());
            shadow.push_back(run_shadow[l]);
          }
        }
        i = j;
        if (i >= num_nodes || trie[i].depth - 1 < base) continue;
        // Node i is the run's first node the general step takes (its parent level written).
        // Fall through to the general step, which must not restart the run at this node.
      }
    }
    const TrieNode& node = trie[i];
    int32_t next_shadow = -1;  // the reference's state after this node's byte, while in step
    if (reuse != nullptr) {
      // A subtree no deeper than reuse->depth, or where the reference's walk enters the state
      // this one does, keeps the reference's classes; the rest is walked, and decides the
      // node's own tokens, or every token below where it rejects.
      const int32_t pd = node.depth - 1;
      if (reuse->ref_state >= 0) {
        shadow.resize(pd + 1);
        const int32_t y = shadow[pd];
        if (y >= 0 && exact_begin[pd + 1] - exact_begin[pd] == 1 &&
            context_begin[pd + 1] == context_begin[pd]) {
          const StackNode top = walk.nodes()[exact[exact_begin[pd]]];
          if (top.parent == kSentinelParent) {
            const int32_t ny = pda_.Next(y, node.byte);
            if (pda_.Next(top.state, node.byte) == ny) {
              i = node.subtree_end;
              continue;
            }
            // The reference's walk stays one top with nothing returned only through states
            // that neither call nor return.
            if (ny >= 0 && pda_.states[ny].call_begin == pda_.states[ny].call_end &&
                !pda_.states[ny].accepting) {
              next_shadow = ny;
            }
          }
        }
      } else if ((*reuse->subtree_depth)[i] <= reuse->depth) {
        i = node.subtree_end;
        continue;
      }
      decide(node.token_begin, node.token_end);
    }
    const int32_t d = node.depth - 1;  // the parent's level
    max_depth = std::max(max_depth, node.depth);
    if (d == 0 && pda_.Next(state, node.byte) < 0) {
      reject_subtree(node);
      i = node.subtree_end;  // the state has no edge for this first byte
      continue;
    }
    truncate_levels(d);
    if (entered != nullptr && exact.size() - exact_begin[d] == 1 &&
        context.size() == context_begin[d]) {
      const StackNode top = walk.nodes()[exact[exact_begin[d]]];
      const int32_t ns = top.parent == kSentinelParent ? pda_.Next(top.state, node.byte) : -1;
      if (ns >= 0) entered->emplace_back(ns, i);
    }
    StackWalk::Flags flags;
    next_exact.clear();
    next_context.clear();
    bool may_end = false;  // the whole grammar may end right after this byte
    bool stepped = false;
    if (exact.size() - exact_begin[d] == 1 && context.size() == context_begin[d]) {
      // Fast paths for the bulk of the walk: one top, and the byte leads to a state that does
      // not call: a plain DFA move, or a move into a state where the rule may return (a loop
      // such as [a-z]*), whose continuations are the rule's context closure.
      const StackNode top = walk.nodes()[exact[exact_begin[d]]];
      const int32_t ns = pda_.Next(top.state, node.byte);
      if (ns < 0) {
        reject_subtree(node);
        i = node.subtree_end;
        continue;
      }
      const PdaState& st = pda_.states[ns];
      if (st.call_begin == st.call_end && !st.accepting && pda_.CanConsume(ns)) {
        add_accepted(node.token_begin, node.token_end);
        exact.push_back(walk.NewNode(ns, top.parent));
        exact_begin.push_back(exact.size());
        context_begin.push_back(context.size());
        pool.push_back(walk.nodes().size());
        shadow.push_back(next_shadow);
        ++i;
        continue;
      }
      if (st.call_begin == st.call_end && st.accepting && top.parent == kSentinelParent) {
        if (pda_.CanConsume(ns)) next_exact.push_back(walk.NewNode(ns, kSentinelParent));
        next_context = own_closure.tops;
        may_end = own_closure.may_end;
        stepped = true;
      }
    }
    if (!stepped) {
      const size_t num_exact = exact.size() - exact_begin[d];
      const StackNode top = num_exact == 1 ? walk.nodes()[exact[exact_begin[d]]] : StackNode{};
      const int32_t ns = num_exact == 1 ? pda_.Next(top.state, node.byte) : -1;
      if (num_exact == 1 && (ns < 0 || (top.parent == kSentinelParent &&
                                        pda_.states[ns].call_begin == pda_.states[ns].call_end))) {
        // One top in the rule's own automaton and no call: move it without a stack walk.
        if (ns >= 0) {
          if (pda_.CanConsume(ns)) next_exact.push_back(walk.NewNode(ns, kSentinelParent));
          flags.reached_sentinel = pda_.states[ns].accepting;
        }
      } else {
        walk.Step(exact.data() + exact_begin[d], num_exact, node.byte, &next_exact, &flags);
      }
      returned.clear();
      // Context tops mostly have no edge for the byte (e.g. "," after a word): skip the walk then.
      bool any_context = false;
      for (size_t k = context_begin[d]; k < context.size() && !any_context; ++k) {
        any_context = pda_.Next(walk.nodes()[context[k]].state, node.byte) >= 0;
      }
      if (any_context) {
        walk.Step(context.data() + context_begin[d], context.size() - context_begin[d], node.byte,
                  &next_context, &flags);
      }
      if (flags.reached_sentinel) returned.push_back(own_rule);
      // Every rule that returned continues at its return sites, and outwards (its closure).
      ++epoch_;
      for (size_t k = 0; k < returned.size(); ++k) {  // the fallback below may append
        const int32_t r = returned[k];
        if (rule_epoch_[r] == epoch_) continue;
        rule_epoch_[r] = epoch_;
        const Closure& c = closures_[r];
        if (!c.built) {  // not expected (BuildClosures covers every site rule): expand here
          if (r == pda_.root_rule) may_end = true;
          for (int32_t site : return_sites_[r]) {
            walk.Expand(walk.NewNode(site, kContextParent), &next_context, &flags);
          }
          continue;
        }
        may_end = may_end || c.may_end;
        next_context.insert(next_context.end(), c.tops.begin(), c.tops.end());
      }
    }
    if (!next_exact.empty()) {
      add_accepted(node.token_begin, node.token_end);
    } else if (!next_context.empty() || may_end) {
      add_range(&uncertain_pos, node.token_begin, node.token_end, false);
    }
    if (next_exact.empty() && next_context.empty()) {
      reject_subtree(node);
      i = node.subtree_end;  // no token under this prefix fits anywhere
      continue;
    }
    exact.insert(exact.end(), next_exact.begin(), next_exact.end());
    context.insert(context.end(), next_context.begin(), next_context.end());
    exact_begin.push_back(exact.size());
    context_begin.push_back(context.size());
    pool.push_back(walk.nodes().size());
    shadow.push_back(next_shadow);
    ++i;
  }
  StateTokens& t = tables_[state];
  if (direct) {
    if (num_accepted > words) {
      t.accepted_bits.swap(mask);  // the scratch mask starts clear again at the next walk
      mask.clear();
    } else {
      for (int32_t id : accepted) mask[id >> 5] = 0;
    }
  }
  if (reuse != nullptr) {
    // The reference's classes outside the decided ranges, the walk's inside them.
    const StateTokens& ref = *reuse->table;
    const std::vector<int32_t>& position = *reuse->position;
    auto undecided = [&](size_t* r, int32_t pos) {  // positions asked in increasing order
      while (*r < decided.size() && decided[*r].second <= pos) ++*r;
      return *r == decided.size() || pos < decided[*r].first;
    };
    std::vector<int32_t>& merged = scratch.merged;
    merged.clear();
    size_t r = 0;
    for (int32_t id : ref.uncertain_ids) {
      if (undecided(&r, position[id])) merged.push_back(position[id]);
    }
    const size_t num_ref = merged.size();
    merged.insert(merged.end(), uncertain_pos.begin(), uncertain_pos.end());
    std::inplace_merge(merged.begin(), merged.begin() + num_ref, merged.end());
    uncertain_pos.swap(merged);
    merged.clear();
    int64_t num_decided = 0;
    for (const auto& [begin, end] : decided) num_decided += end - begin;
    if (!ref.accepted_bits.empty() && 2 * num_decided > static_cast<int64_t>(sorted.size())) {
      // Most tokens decided (a short truncated copy): gather the few kept, in trie order,
      // instead of clearing the many.
      // The reference's accepted set by sorted position (built once per reference): the kept
      // tokens of a range are its set bits, so the walk over them skips the rejected ones 64
      // at a time.
      std::vector<uint64_t>& by_position = scratch.by_position[&ref];
      if (by_position.empty()) {
        by_position.assign((sorted.size() + 63) / 64, 0);
        for (size_t w = 0; w < ref.accepted_bits.size(); ++w) {
          for (uint32_t bits = ref.accepted_bits[w]; bits != 0; bits &= bits - 1) {
            const int32_t p = position[static_cast<int32_t>(w * 32) + __builtin_ctz(bits)];
            if (p >= 0) by_position[p >> 6] |= uint64_t{1} << (p & 63);
          }
        }
      }
      auto keep = [&](int32_t begin, int32_t end) {
        for (int32_t w = begin >> 6; w << 6 < end; ++w) {
          uint64_t bits = by_position[w];
          if (w << 6 < begin) bits &= ~uint64_t{0} << (begin & 63);
          if ((w + 1) << 6 > end) bits &= ~(~uint64_t{0} << (end & 63));
          for (; bits != 0; bits &= bits - 1) merged.push_back(sorted[(w << 6) + __builtin_ctzll(bits)]);
        }
      };
      int32_t pos = 0;
      for (const auto& [begin, end] : decided) {
        keep(pos, begin);
        pos = end;
      }
      keep(pos, static_cast<int32_t>(sorted.size()));
      const size_t num_kept = merged.size();
      merged.insert(merged.end(), accepted.begin(), accepted.end());
      std::inplace_merge(merged.begin(), merged.begin() + num_kept, merged.end(),
                         [&](int32_t a, int32_t b) { return position[a] < position[b]; });
      accepted.swap(merged);
    } else if (!ref.accepted_bits.empty()) {
      t.accepted_bits = ref.accepted_bits;
      for (const auto& [begin, end] : decided) {
        for (int32_t k = begin; k < end; ++k) {
          t.accepted_bits[sorted[k] >> 5] &= ~(1u << (sorted[k] & 31));
        }
      }
      for (int32_t id : accepted) t.accepted_bits[id >> 5] |= 1u << (id & 31);
      // Only whether more tokens than words are set matters: stop counting there (a bitmask
      // of a large set passes it within its first words).
      int64_t count = 0;
      for (size_t w = 0; w < t.accepted_bits.size() && count <= words; ++w) {
        count += BitCount(t.accepted_bits[w]);
      }
      if (count > words) {
        accepted.clear();
      } else {  // few enough for an id list (in trie order, as a walk lists them)
        accepted.clear();
        for (size_t w = 0; w < t.accepted_bits.size(); ++w) {
          for (uint32_t bits = t.accepted_bits[w]; bits != 0; bits &= bits - 1) {
            accepted.push_back(static_cast<int32_t>(w * 32) + __builtin_ctz(bits));
          }
        }
        std::sort(accepted.begin(), accepted.end(),
                  [&](int32_t a, int32_t b) { return position[a] < position[b]; });
        t.accepted_bits.clear();
      }
    } else {
      r = 0;
      for (int32_t id : ref.accepted_ids) {
        if (undecided(&r, position[id])) merged.push_back(id);
      }
      const size_t num_kept = merged.size();
      merged.insert(merged.end(), accepted.begin(), accepted.end());
      std::inplace_merge(merged.begin(), merged.begin() + num_kept, merged.end(),
                         [&](int32_t a, int32_t b) { return position[a] < position[b]; });
      accepted.swap(merged);
    }
  }
  // Preorder visits the trie in sorted order, so uncertain_pos is sorted by bytes already.
  t.uncertain_ids.reserve(uncertain_pos.size());
  t.uncertain_lcp.reserve(uncertain_pos.size());
  std::string_view prev;
  for (int32_t k : uncertain_pos) {
    const std::string_view b = vocab_->token_bytes(sorted[k]);
    size_t lcp = 0;
    while (lcp < prev.size() && lcp < b.size() && prev[lcp] == b[lcp]) ++lcp;
    t.uncertain_ids.push_back(sorted[k]);
    t.uncertain_lcp.push_back(static_cast<int32_t>(lcp));
    prev = b;
  }
  if (!t.accepted_bits.empty()) {
    // A reference's bitmask, already final.
  } else if (static_cast<int64_t>(accepted.size()) > words) {
    t.accepted_bits.assign(words, 0);
    for (int32_t id : accepted) t.accepted_bits[id >> 5] |= 1u << (id & 31);
  } else {
    t.accepted_ids = accepted;  // trie order: the matcher only sets their bits
  }
  return max_depth;
}

}  // namespace sluice::grammar
