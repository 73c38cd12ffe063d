#include "engine/grammar/grammar_matcher.h"

#include <algorithm>
#include <cstring>

#include "absl/container/flat_hash_map.h"

namespace sluice::grammar {

GrammarMatcher::GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar,
                               std::optional<std::vector<int32_t>> eos_token_ids)
    : grammar_(std::move(grammar)), walk_(&grammar_->pda()) {
  eos_token_ids_ = eos_token_ids.has_value() ? *std::move(eos_token_ids)
                                             : grammar_->vocab().eos_token_ids();
  const Pda& pda = grammar_->pda();
  StackWalk::Flags flags;
  walk_.ResetVisited();
  walk_.Expand(walk_.NewNode(pda.rule_start[pda.root_rule], kRootParent), &tops_, &flags);
  can_end_ = flags.reached_root;
}

void GrammarMatcher::CheckUncertain(int32_t top, const StateTokens& tokens,
                                    std::vector<int32_t>* fits) {
  const TokenVocab& vocab = grammar_->vocab();
  std::vector<StackNode>& nodes = walk_.nodes();
  const size_t mark = nodes.size();
  // Level d: the tops after the current token's first d bytes, level_tops_[level_begin_[d],
  // level_begin_[d + 1]), with level_pool_[d] the node pool size to roll back to.
  level_tops_.assign(1, top);
  level_begin_.assign({0, 1});
  level_pool_.assign(1, mark);
  int32_t dead_at = -1;  // the byte the previous token failed on (-1: it did not)
  bool prev_ok = false;
  size_t prev_len = 0;
  const size_t n = tokens.uncertain_ids.size();
  for (size_t k = 0; k < n; ++k) {
    const int32_t id = tokens.uncertain_ids[k];
    const std::string_view bytes = vocab.token_bytes(id);
    const size_t lcp = static_cast<size_t>(tokens.uncertain_lcp[k]);
    if (k > 0 && lcp == bytes.size() && lcp == prev_len) {  // the same bytes as the one before
      if (prev_ok) fits->push_back(id);
      continue;
    }
    prev_len = bytes.size();
    if (dead_at >= 0 && lcp > static_cast<size_t>(dead_at)) {
      prev_ok = false;  // it shares the byte the previous token failed on
      continue;
    }
    const size_t have = level_begin_.size() - 2;  // bytes of the previous token walked
    const size_t depth = std::min(lcp, have);
    level_begin_.resize(depth + 2);
    level_pool_.resize(depth + 1);
    level_tops_.resize(level_begin_[depth + 1]);
    nodes.resize(level_pool_[depth]);
    bool ok = true;
    dead_at = -1;
    for (size_t d = depth; d < bytes.size(); ++d) {
      StackWalk::Flags flags;
      next_.clear();
      walk_.Step(level_tops_.data() + level_begin_[d], level_begin_[d + 1] - level_begin_[d],
                 static_cast<uint8_t>(bytes[d]), &next_, &flags);
      if (next_.empty()) {
        // Dead, unless the last byte completed the whole grammar.
        ok = flags.reached_root && d + 1 == bytes.size();
        dead_at = static_cast<int32_t>(d);
        break;
      }
      level_tops_.insert(level_tops_.end(), next_.begin(), next_.end());
      level_begin_.push_back(level_tops_.size());
      level_pool_.push_back(nodes.size());
    }
    if (ok) fits->push_back(id);
    prev_ok = ok;
  }
  nodes.resize(mark);
}

void GrammarMatcher::FillNextTokenBitmask(absl::Span<uint32_t> bitmask) {
  std::fill(bitmask.begin(), bitmask.end(), 0u);
  auto set = [&](int32_t id) { bitmask[id >> 5] |= 1u << (id & 31); };
  if (!terminated_) {
    seen_states_.clear();
    for (int32_t top : tops_) {
      const int32_t state = walk_.nodes()[top].state;
      const StateTokens& t = grammar_->tokens(state);
      const PdaState& ps = grammar_->pda().states[state];
      for (uint32_t e = ps.token_begin; e < ps.token_end; ++e) {
        set(grammar_->token_id(grammar_->pda().token_edges[e].token));
      }
      const bool first = std::find(seen_states_.begin(), seen_states_.end(), state) ==
                         seen_states_.end();
      if (first) {
        seen_states_.push_back(state);
        if (!t.accepted_bits.empty()) {
          const size_t n = std::min(bitmask.size(), t.accepted_bits.size());
          for (size_t w = 0; w < n; ++w) bitmask[w] |= t.accepted_bits[w];
        } else {
          for (int32_t id : t.accepted_ids) set(id);
        }
      }
      if (t.uncertain_ids.empty()) continue;
      // Whether an uncertain token fits depends only on the states of the whole stack: steps
      // with the same stack (e.g. every token inside one JSON string) reuse the result.
      stack_key_.clear();
      for (int32_t n = top; n >= 0; n = walk_.nodes()[n].parent) {
        stack_key_.push_back(walk_.nodes()[n].state);
      }
      auto it = uncertain_cache_.find(stack_key_);
      if (it == uncertain_cache_.end()) {
        if (uncertain_cache_.size() >= kUncertainCacheEntries) uncertain_cache_.clear();
        std::vector<int32_t> fits;
        CheckUncertain(top, t, &fits);
        it = uncertain_cache_.emplace(stack_key_, std::move(fits)).first;
      }
      for (int32_t id : it->second) set(id);
    }
  }
  if (can_end_ || terminated_) {
    for (int32_t id : eos_token_ids_) {
      if (id >= 0 && (id >> 5) < static_cast<int32_t>(bitmask.size())) set(id);
    }
  }
}

bool GrammarMatcher::Advance(std::string_view bytes) {
  const size_t mark = walk_.nodes().size();
  cur_ = tops_;
  bool can_end = can_end_;
  for (size_t i = 0; i < bytes.size(); ++i) {
    StackWalk::Flags flags;
    next_.clear();
    walk_.Step(cur_.data(), cur_.size(), static_cast<uint8_t>(bytes[i]), &next_, &flags);
    can_end = flags.reached_root;
    // Dead, or complete with bytes left over.
    if ((next_.empty() && !can_end) || (next_.empty() && i + 1 < bytes.size())) {
      walk_.nodes().resize(mark);
      return false;
    }
    cur_.swap(next_);
  }
  tops_ = cur_;
  can_end_ = can_end;
  Compact();
  return true;
}

bool GrammarMatcher::AcceptBytes(std::string_view bytes) {
  if (terminated_) return false;
  if (bytes.empty()) return true;
  return Advance(bytes);
}

bool GrammarMatcher::AcceptToken(int32_t token_id) {
  if (terminated_) return false;
  const TokenVocab& vocab = grammar_->vocab();
  const std::vector<int32_t>& eos = eos_token_ids_;
  if (std::find(eos.begin(), eos.end(), token_id) != eos.end()) {
    if (!can_end_) return false;
    terminated_ = true;
    return true;
  }
  if (token_id < 0 || token_id >= vocab.vocab_size()) return false;
  if (AdvanceByTokenEdge(token_id)) return true;
  const std::string_view bytes = vocab.token_bytes(token_id);
  if (bytes.empty()) return false;
  return Advance(bytes);
}

bool GrammarMatcher::AdvanceByTokenEdge(int32_t token_id) {
  const Pda& pda = grammar_->pda();
  const size_t mark = walk_.nodes().size();
  next_.clear();
  StackWalk::Flags flags;
  walk_.ResetVisited();
  bool matched = false;
  for (int32_t top : tops_) {
    const StackNode sn = walk_.nodes()[top];
    const PdaState& st = pda.states[sn.state];
    for (uint32_t e = st.token_begin; e < st.token_end; ++e) {
      const TokenEdge& edge = pda.token_edges[e];
      if (grammar_->token_id(edge.token) != token_id) continue;
      matched = true;
      walk_.Expand(walk_.NewNode(edge.next, sn.parent), &next_, &flags);
    }
  }
  if (!matched) {
    walk_.nodes().resize(mark);
    return false;
  }
  tops_ = next_;
  can_end_ = flags.reached_root;
  Compact();
  return true;
}

void GrammarMatcher::Compact() {
  // Copy the stacks reachable from the tops into a fresh pool so it does not grow with the
  // output length.
  std::vector<StackNode>& nodes = walk_.nodes();
  std::vector<StackNode> fresh;
  absl::flat_hash_map<int32_t, int32_t> remap;
  auto copy = [&](auto& self, int32_t n) -> int32_t {
    if (n < 0) return n;
    auto it = remap.find(n);
    if (it != remap.end()) return it->second;
    const int32_t parent = self(self, nodes[n].parent);
    fresh.push_back(StackNode{nodes[n].state, parent});
    const int32_t id = static_cast<int32_t>(fresh.size()) - 1;
    remap.emplace(n, id);
    return id;
  };
  for (int32_t& top : tops_) top = copy(copy, top);
  nodes.swap(fresh);
}

std::string GrammarMatcher::ForcedBytes() const {
  std::string out;
  if (terminated_) return out;
  // Follow single-successor steps on a copy of the stacks.
  GrammarMatcher copy(*this);
  while (!copy.can_end_ && !copy.tops_.empty() && out.size() < 256) {
    int found = -1;
    for (int b = 0; b < 256 && found != -2; ++b) {
      bool any = false;
      for (int32_t top : copy.tops_) {
        if (copy.grammar_->pda().Next(copy.walk_.nodes()[top].state, static_cast<uint8_t>(b)) >= 0) {
          any = true;
          break;
        }
      }
      if (!any) continue;
      found = found == -1 ? b : -2;
    }
    if (found < 0) break;
    const char c = static_cast<char>(found);
    if (!copy.Advance(std::string_view(&c, 1))) break;
    out.push_back(c);
  }
  return out;
}

}  // namespace sluice::grammar
