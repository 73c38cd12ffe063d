#include "engine/grammar/stack_walk.h"

#include <algorithm>

namespace sluice::grammar {

bool StackWalk::Visit(int32_t state, int32_t parent) {
  const std::pair<int32_t, int32_t> key{state, parent};
  if (std::find(visited_.begin(), visited_.end(), key) != visited_.end()) return false;
  visited_.push_back(key);
  return true;
}

void StackWalk::Expand(int32_t node, std::vector<int32_t>* tops, Flags* flags) {
  work_.clear();
  work_.push_back(node);
  while (!work_.empty()) {
    const int32_t n = work_.back();
    work_.pop_back();
    const StackNode sn = nodes_[n];
    if (!Visit(sn.state, sn.parent)) continue;
    const PdaState& st = pda_->states[sn.state];
    if (pda_->CanConsume(sn.state)) tops->push_back(n);
    for (uint32_t c = st.call_begin; c < st.call_end; ++c) {
      const CallEdge& e = pda_->call_edges[c];
      const int32_t ret = NewNode(e.next, sn.parent);
      work_.push_back(NewNode(pda_->rule_start[e.rule], ret));
    }
    if (st.accepting) {
      if (sn.parent == kRootParent) {
        flags->reached_root = true;
      } else if (sn.parent == kSentinelParent) {
        flags->reached_sentinel = true;
      } else if (sn.parent == kContextParent) {
        context_returns_.push_back(pda_->states[sn.state].rule);
      } else {
        work_.push_back(sn.parent);
      }
    }
  }
}

void StackWalk::Step(const int32_t* tops, size_t num_tops, uint8_t byte,
                     std::vector<int32_t>* out, Flags* flags) {
  visited_.clear();
  for (size_t i = 0; i < num_tops; ++i) {
    const StackNode sn = nodes_[tops[i]];
    const int32_t next = pda_->Next(sn.state, byte);
    if (next < 0) continue;
    Expand(NewNode(next, sn.parent), out, flags);
  }
}

}  // namespace sluice::grammar
