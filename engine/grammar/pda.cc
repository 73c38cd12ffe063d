#include "engine/grammar/pda.h"

#include <algorithm>
#include <deque>
#include <tuple>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "engine/grammar/partition_refinement.h"
#include "engine/grammar/regex_to_grammar.h"
#include "engine/grammar/text_escapes.h"

namespace sluice::grammar {

namespace {

void Utf8Split(char32_t lo, char32_t hi, std::vector<std::vector<std::pair<uint8_t, uint8_t>>>* out) {
  // Split at the encoded-length boundaries first.
  static constexpr char32_t kMaxForLen[] = {0x7F, 0x7FF, 0xFFFF, 0x10FFFF};
  for (char32_t max : kMaxForLen) {
    if (lo <= max && hi > max) {
      Utf8Split(lo, max, out);
      Utf8Split(max + 1, hi, out);
      return;
    }
  }
  if (hi < 0x80) {
    out->push_back({{static_cast<uint8_t>(lo), static_cast<uint8_t>(hi)}});
    return;
  }
  // Same length: split until lo and hi differ only in a suffix that spans full continuation
  // ranges, so the bytes can be ranged position by position.
  const int len = hi <= 0x7FF ? 2 : hi <= 0xFFFF ? 3 : 4;
  for (int i = 1; i < len; ++i) {
    const char32_t m = (char32_t{1} << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        Utf8Split(lo, lo | m, out);
        Utf8Split((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        Utf8Split(lo, (hi & ~m) - 1, out);
        Utf8Split(hi & ~m, hi, out);
        return;
      }
    }
  }
  std::string a, b;
  AppendCodepoint(lo, &a);
  AppendCodepoint(hi, &b);
  std::vector<std::pair<uint8_t, uint8_t>> seq;
  for (size_t i = 0; i < a.size(); ++i) {
    seq.emplace_back(static_cast<uint8_t>(a[i]), static_cast<uint8_t>(b[i]));
  }
  out->push_back(std::move(seq));
}

// Nfa: Thompson construction for one rule body.
struct NfaState {
  std::vector<int32_t> eps;
  std::vector<ByteEdge> bytes;
  std::vector<CallEdge> calls;
  std::vector<TokenEdge> tokens;
};

class NfaBuilder {
 public:
  NfaBuilder(int64_t* budget, std::vector<PdaToken>* tokens) : budget_(budget), tokens_(tokens) {}

  int32_t NewState() {
    states.emplace_back();
    --*budget_;
    return static_cast<int32_t>(states.size()) - 1;
  }

  // Build adds a fragment for `e` from `from`; returns its end state.
  absl::StatusOr<int32_t> Build(const Expr& e, int32_t from) {
    if (*budget_ < 0) return absl::ResourceExhaustedError("grammar too large: too many automaton states");
    switch (e.kind) {
      case ExprKind::kEmpty:
        return from;
      case ExprKind::kLiteral: {
        int32_t cur = from;
        for (unsigned char c : e.text) {
          const int32_t next = NewState();
          states[cur].bytes.push_back(ByteEdge{c, c, next});
          cur = next;
        }
        return cur;
      }
      case ExprKind::kCharClass: {
        std::vector<CodepointRange> ranges =
            e.negated ? ComplementRanges(e.ranges) : NormalizeRanges(e.ranges);
        const int32_t end = NewState();
        for (const CodepointRange& r : ranges) {
          const char32_t lo = r.lo, hi = std::min<char32_t>(r.hi, 0x10FFFF);
          if (lo > hi) continue;
          // Skip surrogates.
          std::vector<std::pair<char32_t, char32_t>> parts;
          if (lo < 0xD800 && hi > 0xDFFF) {
            parts = {{lo, 0xD7FF}, {0xE000, hi}};
          } else if (hi >= 0xD800 && lo <= 0xDFFF) {
            if (lo < 0xD800) parts.push_back({lo, 0xD7FF});
            if (hi > 0xDFFF) parts.push_back({0xE000, hi});
          } else {
            parts = {{lo, hi}};
          }
          for (auto [a, b] : parts) {
            std::vector<std::vector<std::pair<uint8_t, uint8_t>>> seqs;
            Utf8Split(a, b, &seqs);
            for (const auto& seq : seqs) {
              int32_t cur = from;
              for (size_t i = 0; i < seq.size(); ++i) {
                const int32_t next = i + 1 == seq.size() ? end : NewState();
                states[cur].bytes.push_back(ByteEdge{seq[i].first, seq[i].second, next});
                cur = next;
              }
            }
          }
        }
        return end;
      }
      case ExprKind::kRuleRef: {
        const int32_t next = NewState();
        states[from].calls.push_back(CallEdge{e.rule, next});
        return next;
      }
      case ExprKind::kToken: {
        int32_t index = 0;
        while (index < static_cast<int32_t>(tokens_->size()) &&
               ((*tokens_)[index].text != e.text || (*tokens_)[index].id != e.token_id)) {
          ++index;
        }
        if (index == static_cast<int32_t>(tokens_->size())) {
          tokens_->push_back(PdaToken{e.token_id >= 0 ? std::string() : e.text, e.token_id});
        }
        const int32_t next = NewState();
        states[from].tokens.push_back(TokenEdge{index, next});
        return next;
      }
      case ExprKind::kSequence: {
        int32_t cur = from;
        for (const Expr& c : e.children) {
          absl::StatusOr<int32_t> r = Build(c, cur);
          if (!r.ok()) return r;
          cur = *r;
        }
        return cur;
      }
      case ExprKind::kChoice: {
        const int32_t end = NewState();
        absl::StatusOr<int32_t> start = StartInto(e, end);
        if (!start.ok()) return start;
        states[from].eps.push_back(*start);
        return end;
      }
      case ExprKind::kRepeat: {
        const Expr& child = e.children[0];
        int32_t cur = from;
        for (int32_t i = 0; i < e.min_count; ++i) {
          absl::StatusOr<int32_t> r = Build(child, cur);
          if (!r.ok()) return r;
          cur = *r;
        }
        if (e.max_count < 0) {
          // cur -> loop start -> child -> back to loop start; loop start -> end.
          const int32_t loop = NewState();
          states[cur].eps.push_back(loop);
          absl::StatusOr<int32_t> r = Build(child, loop);
          if (!r.ok()) return r;
          states[*r].eps.push_back(loop);
          return loop;
        }
        const int32_t end = NewState();
        absl::StatusOr<int32_t> chain = Chain(child, end, e.max_count - e.min_count);
        if (!chain.ok()) return chain;
        states[cur].eps.push_back(*chain);
        return end;
      }
    }
    return absl::InternalError("unknown expression kind");
  }

  // StartInto builds `e` backwards from the existing state `into` and returns the state it
  // starts in: every element is built knowing what follows it, so fragments with one future
  // are one set of states. Bounded repeats of one expression into one state share a chain
  // (Chain), and a literal or character class into one state is built once (the memo): the
  // key of an additional property minus the declared names has an alternative per
  // prefix-tree node, each ending in "any character, up to 64 - depth times" (and the hex
  // digits of its escapes), and subset construction would otherwise give each node its own
  // copy of them (tens of thousands of states).
  absl::StatusOr<int32_t> StartInto(const Expr& e, int32_t into) {
    if (*budget_ < 0) return absl::ResourceExhaustedError("grammar too large: too many automaton states");
    switch (e.kind) {
      case ExprKind::kEmpty:
        return into;
      case ExprKind::kLiteral:
      case ExprKind::kCharClass: {
        std::vector<std::pair<const Expr*, int32_t>>& built = leaves_by_into_[into];
        for (const auto& [leaf, start] : built) {
          if (ExprEquals(*leaf, e)) return start;
        }
        int32_t start = into;
        if (e.kind == ExprKind::kLiteral) {
          for (size_t i = e.text.size(); i-- > 0;) {
            const int32_t prev = NewState();
            const uint8_t c = static_cast<uint8_t>(e.text[i]);
            states[prev].bytes.push_back(ByteEdge{c, c, start});
            start = prev;
          }
        } else {
          start = NewState();
          absl::StatusOr<int32_t> r = Build(e, start);
          if (!r.ok()) return r;
          states[*r].eps.push_back(into);
        }
        leaves_by_into_[into].emplace_back(&e, start);
        return start;
      }
      case ExprKind::kSequence: {
        int32_t cur = into;
        for (size_t i = e.children.size(); i-- > 0;) {
          absl::StatusOr<int32_t> r = StartInto(e.children[i], cur);
          if (!r.ok()) return r;
          cur = *r;
        }
        return cur;
      }
      case ExprKind::kChoice: {
        const int32_t start = NewState();
        for (const Expr& c : e.children) {
          absl::StatusOr<int32_t> r = StartInto(c, into);
          if (!r.ok()) return r;
          states[start].eps.push_back(*r);
        }
        return start;
      }
      case ExprKind::kRepeat: {
        const Expr& x = e.children[0];
        int32_t cur = into;
        if (e.max_count < 0) {
          // loop -> into; loop -> x -> loop.
          const int32_t loop = NewState();
          states[loop].eps.push_back(into);
          absl::StatusOr<int32_t> r = StartInto(x, loop);
          if (!r.ok()) return r;
          states[loop].eps.push_back(*r);
          cur = loop;
        } else if (e.max_count > e.min_count) {
          absl::StatusOr<int32_t> r = Chain(x, into, e.max_count - e.min_count);
          if (!r.ok()) return r;
          cur = *r;
        }
        for (int32_t i = 0; i < e.min_count; ++i) {
          absl::StatusOr<int32_t> r = StartInto(x, cur);
          if (!r.ok()) return r;
          cur = *r;
        }
        return cur;
      }
      default: {  // rule calls and tokens
        const int32_t start = NewState();
        absl::StatusOr<int32_t> r = Build(e, start);
        if (!r.ok()) return r;
        states[*r].eps.push_back(into);
        return start;
      }
    }
  }

  // Chain: a state from which `x` matches 0..count times and then `into` follows. Position k
  // of the chain for (x, into) is "up to k more x": it reaches `into` directly or through one
  // x to position k - 1; positions are built once and extended on demand.
  absl::StatusOr<int32_t> Chain(const Expr& x, int32_t into, int32_t count) {
    ChainStates* chain = nullptr;
    std::vector<ChainStates*>& same_into = chains_by_into_[into];
    for (ChainStates* c : same_into) {
      if (ExprEquals(c->x, x)) {
        chain = c;
        break;
      }
    }
    if (chain == nullptr) {
      chains_.push_back(ChainStates{x, {into}});
      chain = &chains_.back();  // a deque: stays valid while x's own chains are added
      same_into.push_back(chain);
    }
    while (static_cast<int32_t>(chain->positions.size()) <= count) {
      const int32_t p = NewState();
      states[p].eps.push_back(into);
      absl::StatusOr<int32_t> r = StartInto(chain->x, chain->positions.back());
      if (!r.ok()) return r;
      states[p].eps.push_back(*r);
      chain->positions.push_back(p);
    }
    return chain->positions[count];
  }

  std::vector<NfaState> states;

 private:
  struct ChainStates {
    Expr x;
    std::vector<int32_t> positions;  // [k]: up to k more x, then `into`; [0] = into
  };

  int64_t* budget_;
  std::deque<ChainStates> chains_;
  absl::flat_hash_map<int32_t, std::vector<ChainStates*>> chains_by_into_;
  // (leaf, start) of the literals and classes built into a state (the leaf lives in the
  // grammar or in chains_, both unchanged while the builder runs)
  absl::flat_hash_map<int32_t, std::vector<std::pair<const Expr*, int32_t>>> leaves_by_into_;
  std::vector<PdaToken>* tokens_;
};

// RuleLabel: how errors name rule `r`: its Rule::origin, else "grammar rule 'NAME'".
std::string RuleLabel(const Grammar& grammar, int32_t r) {
  const Rule& rule = grammar.rule(r);
  return rule.origin.empty() ? absl::StrCat("grammar rule '", rule.name, "'") : rule.origin;
}

// Determinize: subset construction over byte ranges and call labels. `label`: the rule's
// RuleLabel.
absl::Status Determinize(const NfaBuilder& nfa, int32_t start, int32_t accept, int32_t rule,
                         const std::string& label, int64_t max_dfa_states, Pda* pda) {
  // A closure keeps only the states that matter for what follows: those with byte, call or
  // token edges, and the accepting one. States that only pass epsilon moves on (the ends of
  // alternatives, of repeats) would otherwise tell apart subsets with the same future, e.g.
  // every prefix-tree branch of a key that joins the shared chain (Chain) through its own end.
  std::vector<uint32_t> seen(nfa.states.size(), 0);
  uint32_t epoch = 0;
  std::vector<int32_t> stack;
  auto closure = [&](std::vector<int32_t> set) {
    ++epoch;
    stack = set;
    for (int32_t s : set) seen[s] = epoch;
    while (!stack.empty()) {
      const int32_t s = stack.back();
      stack.pop_back();
      for (int32_t t : nfa.states[s].eps) {
        if (seen[t] != epoch) {
          seen[t] = epoch;
          set.push_back(t);
          stack.push_back(t);
        }
      }
    }
    set.erase(std::remove_if(set.begin(), set.end(),
                             [&](int32_t s) {
                               const NfaState& st = nfa.states[s];
                               return s != accept && st.bytes.empty() && st.calls.empty() && st.tokens.empty();
                             }),
              set.end());
    std::sort(set.begin(), set.end());
    return set;
  };
  absl::flat_hash_map<std::vector<int32_t>, int32_t> ids;
  std::vector<std::vector<int32_t>> sets;
  auto intern = [&](std::vector<int32_t> set) -> int32_t {
    auto it = ids.find(set);
    if (it != ids.end()) return it->second;
    const int32_t id = static_cast<int32_t>(pda->states.size());
    pda->states.push_back(PdaState{rule, false, 0, 0, 0, 0, 0, 0});
    ids.emplace(set, id);
    sets.push_back(std::move(set));
    return id;
  };
  const int32_t base = static_cast<int32_t>(pda->states.size());
  pda->rule_start[rule] = intern(closure({start}));
  // States are finalized in creation order, so their edge ranges are contiguous.
  for (size_t k = 0; k < sets.size(); ++k) {
    if (static_cast<int64_t>(sets.size()) > max_dfa_states) {
      return absl::ResourceExhaustedError(absl::StrCat(
          label, " needs more than ", max_dfa_states,
          " automaton states (a pattern or repetition is too complex)"));
    }
    const std::vector<int32_t> set = sets[k];
    const int32_t id = base + static_cast<int32_t>(k);
    // Byte edges: cut the byte axis at every range boundary.
    std::vector<int> cuts = {0, 256};
    std::vector<const ByteEdge*> edges;
    absl::flat_hash_map<int32_t, std::vector<int32_t>> calls;
    std::vector<int32_t> call_order;
    absl::flat_hash_map<int32_t, std::vector<int32_t>> token_targets;
    std::vector<int32_t> token_order;
    bool accepting = false;
    for (int32_t s : set) {
      if (s == accept) accepting = true;
      for (const ByteEdge& e : nfa.states[s].bytes) {
        edges.push_back(&e);
        cuts.push_back(e.lo);
        cuts.push_back(e.hi + 1);
      }
      for (const CallEdge& c : nfa.states[s].calls) {
        auto [it, inserted] = calls.try_emplace(c.rule);
        if (inserted) call_order.push_back(c.rule);
        it->second.push_back(c.next);
      }
      for (const TokenEdge& t : nfa.states[s].tokens) {
        auto [it, inserted] = token_targets.try_emplace(t.token);
        if (inserted) token_order.push_back(t.token);
        it->second.push_back(t.next);
      }
    }
    std::sort(cuts.begin(), cuts.end());
    cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
    std::vector<ByteEdge> out_edges;
    for (size_t c = 0; c + 1 < cuts.size(); ++c) {
      const int lo = cuts[c], hi = cuts[c + 1] - 1;
      std::vector<int32_t> targets;
      for (const ByteEdge* e : edges) {
        if (e->lo <= lo && hi <= e->hi) targets.push_back(e->next);
      }
      if (targets.empty()) continue;
      std::sort(targets.begin(), targets.end());
      targets.erase(std::unique(targets.begin(), targets.end()), targets.end());
      const int32_t next = intern(closure(std::move(targets)));
      if (!out_edges.empty() && out_edges.back().next == next && out_edges.back().hi + 1 == lo) {
        out_edges.back().hi = static_cast<uint8_t>(hi);
      } else {
        out_edges.push_back(ByteEdge{static_cast<uint8_t>(lo), static_cast<uint8_t>(hi), next});
      }
    }
    std::vector<CallEdge> out_calls;
    for (int32_t r : call_order) {
      std::vector<int32_t> targets = calls[r];
      std::sort(targets.begin(), targets.end());
      targets.erase(std::unique(targets.begin(), targets.end()), targets.end());
      out_calls.push_back(CallEdge{r, intern(closure(std::move(targets)))});
    }
    std::vector<TokenEdge> out_tokens;
    for (int32_t t : token_order) {
      std::vector<int32_t> targets = token_targets[t];
      std::sort(targets.begin(), targets.end());
      targets.erase(std::unique(targets.begin(), targets.end()), targets.end());
      out_tokens.push_back(TokenEdge{t, intern(closure(std::move(targets)))});
    }
    PdaState& st = pda->states[id];
    st.accepting = accepting;
    st.byte_begin = static_cast<uint32_t>(pda->byte_edges.size());
    pda->byte_edges.insert(pda->byte_edges.end(), out_edges.begin(), out_edges.end());
    st.byte_end = static_cast<uint32_t>(pda->byte_edges.size());
    st.call_begin = static_cast<uint32_t>(pda->call_edges.size());
    pda->call_edges.insert(pda->call_edges.end(), out_calls.begin(), out_calls.end());
    st.call_end = static_cast<uint32_t>(pda->call_edges.size());
    st.token_begin = static_cast<uint32_t>(pda->token_edges.size());
    pda->token_edges.insert(pda->token_edges.end(), out_tokens.begin(), out_tokens.end());
    st.token_end = static_cast<uint32_t>(pda->token_edges.size());
  }
  return absl::OkStatus();
}

// MinimizeStates merges states with the same future (Moore's partition refinement): the same
// rule, both accepting or neither, and byte, call and token edges into the same classes. Subset
// construction leaves such duplicates (inside a string: after the opening quote, after a plain
// character, after an escape); each costs a walk of the whole vocabulary at compile time.
void MinimizeStates(Pda* pda) {
  const int32_t n = static_cast<int32_t>(pda->states.size());
  std::vector<int32_t> cls(n);
  int32_t num_classes = 0;
  {
    absl::flat_hash_map<std::pair<int32_t, bool>, int32_t> initial;
    for (int32_t s = 0; s < n; ++s) {
      const PdaState& st = pda->states[s];
      cls[s] = initial.try_emplace(std::make_pair(st.rule, st.accepting), initial.size()).first->second;
    }
    num_classes = static_cast<int32_t>(initial.size());
  }
  // Refinement by worklist (partition_refinement.h): a capped key's character chain splits
  // one state per round, so signing every state in every round cost rounds x states.
  std::vector<std::vector<int32_t>> preds(n);
  for (int32_t s = 0; s < n; ++s) {
    const PdaState& st = pda->states[s];
    auto add = [&](int32_t t) {
      if (preds[t].empty() || preds[t].back() != s) preds[t].push_back(s);
    };
    for (uint32_t e = st.byte_begin; e < st.byte_end; ++e) add(pda->byte_edges[e].next);
    for (uint32_t e = st.call_begin; e < st.call_end; ++e) add(pda->call_edges[e].next);
    for (uint32_t e = st.token_begin; e < st.token_end; ++e) add(pda->token_edges[e].next);
  }
  PartitionRefinement refinement(std::move(cls), num_classes, std::move(preds));
  // Signature of a state under the current classes: its class, then its edges by target class
  // (adjacent byte ranges into one class merged, calls and tokens sorted).
  std::vector<std::pair<int32_t, int32_t>> pairs;
  auto signature = [&](int32_t s, std::vector<int32_t>* out) {
    const std::vector<int32_t>& now = refinement.classes();
    std::vector<int32_t>& sig = *out;
    const PdaState& st = pda->states[s];
    sig.clear();
    sig.push_back(now[s]);
    int32_t lo = -1, hi = -2, c = -1;
    for (uint32_t e = st.byte_begin; e < st.byte_end; ++e) {
      const ByteEdge& edge = pda->byte_edges[e];
      const int32_t ec = now[edge.next];
      if (ec == c && hi + 1 == edge.lo) {
        hi = edge.hi;
        continue;
      }
      if (c >= 0) sig.insert(sig.end(), {lo, hi, c});
      lo = edge.lo;
      hi = edge.hi;
      c = ec;
    }
    if (c >= 0) sig.insert(sig.end(), {lo, hi, c});
    for (auto [begin, end, is_call] : {std::tuple{st.call_begin, st.call_end, true},
                                       std::tuple{st.token_begin, st.token_end, false}}) {
      pairs.clear();
      for (uint32_t e = begin; e < end; ++e) {
        pairs.push_back(is_call ? std::make_pair(pda->call_edges[e].rule, now[pda->call_edges[e].next])
                                : std::make_pair(pda->token_edges[e].token, now[pda->token_edges[e].next]));
      }
      std::sort(pairs.begin(), pairs.end());
      sig.push_back(-1);  // separator
      for (auto [a, b] : pairs) sig.insert(sig.end(), {a, b});
    }
  };
  while (!refinement.stable()) refinement.Round(signature);
  cls = refinement.classes();
  num_classes = refinement.num_classes();
  if (num_classes == n) return;
  // Rebuild with one state per class, numbered by first occurrence.
  std::vector<int32_t> id_of_class(num_classes, -1), rep;
  for (int32_t s = 0; s < n; ++s) {
    if (id_of_class[cls[s]] < 0) {
      id_of_class[cls[s]] = static_cast<int32_t>(rep.size());
      rep.push_back(s);
    }
  }
  auto map = [&](int32_t s) { return id_of_class[cls[s]]; };
  Pda out;
  out.tokens = std::move(pda->tokens);
  out.rule_names = std::move(pda->rule_names);
  out.root_rule = pda->root_rule;
  for (int32_t r : pda->rule_start) out.rule_start.push_back(r < 0 ? r : map(r));
  for (int32_t s : rep) {
    const PdaState& st = pda->states[s];
    PdaState ns{st.rule, st.accepting, 0, 0, 0, 0, 0, 0};
    ns.byte_begin = static_cast<uint32_t>(out.byte_edges.size());
    for (uint32_t e = st.byte_begin; e < st.byte_end; ++e) {
      ByteEdge edge = pda->byte_edges[e];
      edge.next = map(edge.next);
      if (out.byte_edges.size() > ns.byte_begin && out.byte_edges.back().next == edge.next &&
          out.byte_edges.back().hi + 1 == edge.lo) {
        out.byte_edges.back().hi = edge.hi;
      } else {
        out.byte_edges.push_back(edge);
      }
    }
    ns.byte_end = static_cast<uint32_t>(out.byte_edges.size());
    ns.call_begin = static_cast<uint32_t>(out.call_edges.size());
    for (uint32_t e = st.call_begin; e < st.call_end; ++e) {
      out.call_edges.push_back(CallEdge{pda->call_edges[e].rule, map(pda->call_edges[e].next)});
    }
    ns.call_end = static_cast<uint32_t>(out.call_edges.size());
    ns.token_begin = static_cast<uint32_t>(out.token_edges.size());
    for (uint32_t e = st.token_begin; e < st.token_end; ++e) {
      out.token_edges.push_back(TokenEdge{pda->token_edges[e].token, map(pda->token_edges[e].next)});
    }
    ns.token_end = static_cast<uint32_t>(out.token_edges.size());
    out.states.push_back(ns);
  }
  *pda = std::move(out);
}

// CheckLeftRecursion refuses rules that can call themselves before consuming a byte.
absl::Status CheckLeftRecursion(const Pda& pda, const Grammar& grammar) {
  const int32_t n = static_cast<int32_t>(pda.rule_start.size());
  // Nullable rules (match ""), to a fixpoint.
  std::vector<char> nullable(n, 0);
  // Left corners: rules callable from a rule's start without consuming bytes.
  auto scan = [&](int32_t r, std::vector<int32_t>* corners) {
    std::vector<int32_t> stack = {pda.rule_start[r]};
    std::vector<int32_t> seen = stack;
    bool reaches_accept = false;
    while (!stack.empty()) {
      const int32_t s = stack.back();
      stack.pop_back();
      const PdaState& st = pda.states[s];
      if (st.accepting) reaches_accept = true;
      for (uint32_t c = st.call_begin; c < st.call_end; ++c) {
        const CallEdge& e = pda.call_edges[c];
        if (corners != nullptr) corners->push_back(e.rule);
        if (nullable[e.rule] &&
            std::find(seen.begin(), seen.end(), e.next) == seen.end()) {
          seen.push_back(e.next);
          stack.push_back(e.next);
        }
      }
    }
    return reaches_accept;
  };
  for (bool changed = true; changed;) {
    changed = false;
    for (int32_t r = 0; r < n; ++r) {
      if (!nullable[r] && scan(r, nullptr)) {
        nullable[r] = 1;
        changed = true;
      }
    }
  }
  std::vector<std::vector<int32_t>> corners(n);
  for (int32_t r = 0; r < n; ++r) scan(r, &corners[r]);
  // Cycle search (0 unvisited, 1 on the path, 2 done).
  std::vector<char> color(n, 0);
  std::vector<std::pair<int32_t, size_t>> stack;
  for (int32_t r0 = 0; r0 < n; ++r0) {
    if (color[r0]) continue;
    stack.push_back({r0, 0});
    color[r0] = 1;
    while (!stack.empty()) {
      auto& [r, i] = stack.back();
      if (i < corners[r].size()) {
        const int32_t c = corners[r][i++];
        if (color[c] == 1) {
          // The cycle is c and the rules above it on the path: name one with an origin (what
          // the user wrote) over a helper rule of the compiler's.
          int32_t named = c;
          bool on_cycle = false;
          for (const auto& frame : stack) {
            on_cycle = on_cycle || frame.first == c;
            if (on_cycle && grammar.rule(named).origin.empty() &&
                !grammar.rule(frame.first).origin.empty()) {
              named = frame.first;
            }
          }
          return absl::InvalidArgumentError(absl::StrCat(
              RuleLabel(grammar, named),
              " is left-recursive (it can reach itself before matching any character)"));
        }
        if (color[c] == 0) {
          color[c] = 1;
          stack.push_back({c, 0});
        }
      } else {
        color[r] = 2;
        stack.pop_back();
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<std::vector<std::pair<uint8_t, uint8_t>>> Utf8ByteRanges(char32_t lo, char32_t hi) {
  std::vector<std::vector<std::pair<uint8_t, uint8_t>>> out;
  std::vector<CodepointRange> parts = NormalizeRanges({{lo, hi}});
  for (const CodepointRange& r : ComplementRanges(ComplementRanges(parts))) {
    Utf8Split(r.lo, r.hi, &out);
  }
  return out;
}

absl::StatusOr<Pda> BuildPda(const Grammar& grammar, const PdaOptions& options) {
  Pda pda;
  const int32_t n = grammar.num_rules();
  if (n == 0) return absl::InvalidArgumentError("grammar has no rules");
  pda.rule_start.assign(n, -1);
  pda.root_rule = grammar.root();
  for (int32_t r = 0; r < n; ++r) pda.rule_names.push_back(grammar.rule(r).name);
  // Token terminals are numbered in the order the grammar writes them (rules are built back
  // to front), so a vocabulary without them is told about the first one written.
  auto add_tokens = [&](auto& self, const Expr& e) -> void {
    if (e.kind == ExprKind::kToken) {
      const PdaToken t{e.token_id >= 0 ? std::string() : e.text, e.token_id};
      if (std::none_of(pda.tokens.begin(), pda.tokens.end(),
                       [&](const PdaToken& x) { return x.text == t.text && x.id == t.id; })) {
        pda.tokens.push_back(t);
      }
    }
    for (const Expr& c : e.children) self(self, c);
  };
  for (int32_t r = 0; r < n; ++r) add_tokens(add_tokens, grammar.rule(r).body);
  int64_t budget = options.max_states;
  for (int32_t r = 0; r < n; ++r) {
    NfaBuilder nfa(&budget, &pda.tokens);
    const int32_t start = nfa.NewState();
    absl::StatusOr<int32_t> accept = nfa.NewState();
    absl::StatusOr<int32_t> body = nfa.StartInto(grammar.rule(r).body, *accept);
    if (!body.ok()) return body.status();
    nfa.states[start].eps.push_back(*body);
    if (budget < 0) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "grammar too large: more than ", options.max_states, " automaton states"));
    }
    absl::Status st = Determinize(nfa, start, *accept, r, RuleLabel(grammar, r),
                                  options.max_rule_dfa_states, &pda);
    if (!st.ok()) return st;
  }
  absl::Status st = CheckLeftRecursion(pda, grammar);
  if (!st.ok()) return st;
  MinimizeStates(&pda);
  return pda;
}

}  // namespace sluice::grammar
