// PartitionRefinement: splits classes of automaton states by a signature (Moore's refinement),
// signing again after the first round only the states a move can have changed.
//
// A state's signature may depend only on its own class and the classes of the states its edges
// lead to (`preds` lists the reverse of those edges). A round splits every class that has a
// dirty state by the signatures under the classes the round started with (moves apply at its
// end), a member keeping its class number while it stays; the predecessors of moved states are
// the next round's dirty ones. The members of a class left clean share one signature, so a
// round signs one clean member and the dirty ones only. Round k gives the partition of k full
// Moore rounds (where no state is dirty, the stable one): a chain of n states that splits one
// state per round costs about n signatures in all, not n per round.
#ifndef SLUICE_ENGINE_GRAMMAR_PARTITION_REFINEMENT_H_
#define SLUICE_ENGINE_GRAMMAR_PARTITION_REFINEMENT_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"

namespace sluice::grammar {

class PartitionRefinement {
 public:
  // classes[s] in [0, num_classes); every state is dirty for the first round.
  PartitionRefinement(std::vector<int32_t> classes, int32_t num_classes,
                      std::vector<std::vector<int32_t>> preds)
      : classes_(std::move(classes)),
        preds_(std::move(preds)),
        members_(num_classes),
        dirty_(classes_.size(), 1) {
    for (int32_t s = 0; s < static_cast<int32_t>(classes_.size()); ++s) {
      members_[classes_[s]].push_back(s);
      dirty_list_.push_back(s);
    }
  }

  const std::vector<int32_t>& classes() const { return classes_; }
  int32_t num_classes() const { return static_cast<int32_t>(members_.size()); }
  bool stable() const { return dirty_list_.empty(); }

  // Round refines once. sign(state, &sig) writes the state's signature under classes().
  template <typename Sign>
  void Round(Sign&& sign) {
    std::vector<int32_t> hit_classes, cur, kept, ref_sig, sig;
    std::vector<char> hit(members_.size(), 0);
    for (int32_t s : dirty_list_) {
      if (!hit[classes_[s]]) {
        hit[classes_[s]] = 1;
        hit_classes.push_back(classes_[s]);
      }
    }
    std::vector<std::pair<int32_t, int32_t>> moved;  // (state, new class)
    absl::flat_hash_map<std::vector<int32_t>, int32_t> groups;  // signature -> new class
    for (int32_t c : hit_classes) {
      cur = members_[c];  // a copy: new classes grow members_
      int32_t ref = cur[0];
      for (int32_t x : cur) {
        if (!dirty_[x]) {
          ref = x;
          break;
        }
      }
      if (cur.size() == 1) {
        dirty_[ref] = 0;
        continue;
      }
      sign(ref, &ref_sig);
      groups.clear();
      kept.clear();
      for (int32_t x : cur) {
        const bool check = dirty_[x] && x != ref;
        dirty_[x] = 0;
        if (check) {
          sign(x, &sig);
          if (sig != ref_sig) {
            auto [it, fresh] = groups.try_emplace(sig, 0);
            if (fresh) {
              it->second = static_cast<int32_t>(members_.size());
              members_.emplace_back();
            }
            members_[it->second].push_back(x);
            moved.emplace_back(x, it->second);
            continue;
          }
        }
        kept.push_back(x);
      }
      members_[c].swap(kept);
    }
    dirty_list_.clear();
    for (const auto& [x, c] : moved) classes_[x] = c;
    for (const auto& [x, c] : moved) {
      for (int32_t p : preds_[x]) {
        if (!dirty_[p]) {
          dirty_[p] = 1;
          dirty_list_.push_back(p);
        }
      }
    }
  }

 private:
  std::vector<int32_t> classes_;
  std::vector<std::vector<int32_t>> preds_;
  std::vector<std::vector<int32_t>> members_;  // [class] its states
  std::vector<char> dirty_;                    // [state] to sign in the next round
  std::vector<int32_t> dirty_list_;
};

}  // namespace sluice::grammar

#endif  // SLUICE_ENGINE_GRAMMAR_PARTITION_REFINEMENT_H_
