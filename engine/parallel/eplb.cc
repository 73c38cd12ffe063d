#include "engine/parallel/eplb.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace sluice {
namespace {

// Finish fills logical_to_physical from physical_to_logical.
ExpertPlacement Finish(int32_t num_logical, int32_t num_ranks, int32_t slots_per_rank,
                       std::vector<int32_t> physical_to_logical) {
  ExpertPlacement p;
  p.num_logical_experts = num_logical;
  p.num_ranks = num_ranks;
  p.slots_per_rank = slots_per_rank;
  p.physical_to_logical = std::move(physical_to_logical);
  p.logical_to_physical.assign(static_cast<size_t>(num_logical), {});
  for (size_t slot = 0; slot < p.physical_to_logical.size(); ++slot) {
    p.logical_to_physical[p.physical_to_logical[slot]].push_back(static_cast<int32_t>(slot));
  }
  return p;
}

// Replicate returns replicas per expert (>= 1 each, summing to num_slots): each extra replica goes
// to the expert with the largest load per replica (ties: lowest index).
std::vector<int32_t> Replicate(const std::vector<double>& load, int32_t num_slots) {
  std::vector<int32_t> count(load.size(), 1);
  for (int32_t extra = static_cast<int32_t>(load.size()); extra < num_slots; ++extra) {
    size_t best = 0;
    for (size_t e = 1; e < load.size(); ++e) {
      // a/ca > b/cb  <=>  a·cb > b·ca (counts are positive; avoids division ties drifting).
      if (load[e] * count[best] > load[best] * count[e]) best = e;
    }
    ++count[best];
  }
  return count;
}

struct Item {
  int32_t logical;
  double weight;
};

// Pack assigns items to num_packs packs of exactly `capacity` items (items.size() == num_packs ·
// capacity): heaviest first, each to the lightest pack with room, preferring packs without that
// logical id (ties: lowest pack). Returns the pack of each item, in input order.
std::vector<int32_t> Pack(const std::vector<Item>& items, int32_t num_packs, int32_t capacity) {
  std::vector<size_t> order(items.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (items[a].weight != items[b].weight) return items[a].weight > items[b].weight;
    return items[a].logical < items[b].logical;
  });
  std::vector<double> pack_load(num_packs, 0.0);
  std::vector<int32_t> pack_size(num_packs, 0);
  std::vector<std::vector<int32_t>> pack_ids(num_packs);
  std::vector<int32_t> assignment(items.size(), -1);
  for (size_t i : order) {
    int32_t best = -1;
    bool best_fresh = false;
    for (int32_t p = 0; p < num_packs; ++p) {
      if (pack_size[p] >= capacity) continue;
      const bool fresh =
          std::find(pack_ids[p].begin(), pack_ids[p].end(), items[i].logical) == pack_ids[p].end();
      if (best < 0 || (fresh && !best_fresh) ||
          (fresh == best_fresh && pack_load[p] < pack_load[best])) {
        best = p;
        best_fresh = fresh;
      }
    }
    assignment[i] = best;
    pack_load[best] += items[i].weight;
    ++pack_size[best];
    pack_ids[best].push_back(items[i].logical);
  }
  return assignment;
}

// ReplicateAndPack places `experts` (logical ids) with their loads onto `num_ranks` ranks of
// `slots_per_rank` slots starting at rank `first_rank`, writing physical_to_logical.
void ReplicateAndPack(const std::vector<int32_t>& experts, absl::Span<const double> load,
                      int32_t first_rank, int32_t num_ranks, int32_t slots_per_rank,
                      std::vector<int32_t>* physical_to_logical) {
  std::vector<double> local_load;
  for (int32_t e : experts) local_load.push_back(load[e]);
  const std::vector<int32_t> count = Replicate(local_load, num_ranks * slots_per_rank);
  std::vector<Item> items;
  for (size_t i = 0; i < experts.size(); ++i) {
    for (int32_t c = 0; c < count[i]; ++c) items.push_back({experts[i], local_load[i] / count[i]});
  }
  const std::vector<int32_t> pack = Pack(items, num_ranks, slots_per_rank);
  std::vector<std::vector<int32_t>> per_rank(num_ranks);
  for (size_t i = 0; i < items.size(); ++i) per_rank[pack[i]].push_back(items[i].logical);
  for (int32_t r = 0; r < num_ranks; ++r) {
    std::sort(per_rank[r].begin(),
              per_rank[r].end());  // slot order: ascending logical id
    std::copy(per_rank[r].begin(), per_rank[r].end(),
              physical_to_logical->begin() + static_cast<int64_t>(first_rank + r) * slots_per_rank);
  }
}

absl::Status ValidateLoad(absl::Span<const double> load) {
  if (load.empty()) return absl::InvalidArgumentError("EPLB: no experts");
  for (size_t e = 0; e < load.size(); ++e) {
    if (!std::isfinite(load[e]) || load[e] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("EPLB: load of expert ", e, " is ", load[e], " (must be finite, >= 0)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<int32_t> ExpertPlacement::RankExperts(int32_t rank) const {
  return std::vector<int32_t>(
      physical_to_logical.begin() + static_cast<int64_t>(rank) * slots_per_rank,
      physical_to_logical.begin() + static_cast<int64_t>(rank + 1) * slots_per_rank);
}

absl::StatusOr<ExpertPlacement> ContiguousPlacement(int32_t num_logical_experts,
                                                    int32_t num_ranks) {
  if (num_ranks < 1 || num_logical_experts < 1 || num_logical_experts % num_ranks != 0) {
    return absl::InvalidArgumentError(absl::StrCat("ContiguousPlacement: ", num_logical_experts,
                                                   " experts do not split over ", num_ranks,
                                                   " ranks"));
  }
  std::vector<int32_t> p2l(static_cast<size_t>(num_logical_experts));
  std::iota(p2l.begin(), p2l.end(), 0);
  return Finish(num_logical_experts, num_ranks, num_logical_experts / num_ranks, std::move(p2l));
}

absl::StatusOr<ExpertPlacement> PlacementFromSlots(absl::Span<const int32_t> physical_to_logical,
                                                   int32_t num_logical_experts, int32_t num_ranks) {
  if (physical_to_logical.empty()) return ContiguousPlacement(num_logical_experts, num_ranks);
  const int64_t n = static_cast<int64_t>(physical_to_logical.size());
  if (num_ranks < 1 || n % num_ranks != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("expert slots: ", n, " slots do not split over ", num_ranks, " ranks"));
  }
  std::vector<bool> seen(static_cast<size_t>(std::max(num_logical_experts, 0)), false);
  for (int64_t slot = 0; slot < n; ++slot) {
    const int32_t e = physical_to_logical[slot];
    if (e < 0 || e >= num_logical_experts) {
      return absl::InvalidArgumentError(absl::StrCat("expert slots: slot ", slot, " holds expert ",
                                                     e, " outside [0, ", num_logical_experts, ")"));
    }
    seen[e] = true;
  }
  for (int32_t e = 0; e < num_logical_experts; ++e) {
    if (!seen[e])
      return absl::InvalidArgumentError(absl::StrCat("expert slots: expert ", e, " has no slot"));
  }
  return Finish(num_logical_experts, num_ranks, static_cast<int32_t>(n / num_ranks),
                std::vector<int32_t>(physical_to_logical.begin(), physical_to_logical.end()));
}

absl::StatusOr<ExpertPlacement> PlanEplb(absl::Span<const double> load,
                                         const EplbOptions& options) {
  if (absl::Status s = ValidateLoad(load); !s.ok()) return s;
  const int32_t num_logical = static_cast<int32_t>(load.size());
  const int32_t n = options.num_ranks, r = options.num_redundant_experts, m = options.num_nodes;
  if (n < 1 || r < 0 || (num_logical + r) % n != 0) {
    return absl::InvalidArgumentError(absl::StrCat("EPLB: ", num_logical, " experts + ", r,
                                                   " redundant do not fill ", n, " ranks evenly"));
  }
  const int32_t slots_per_rank = (num_logical + r) / n;
  if (m < 1 || n % m != 0 || num_logical % m != 0 || (n / m) * slots_per_rank < num_logical / m) {
    return absl::InvalidArgumentError(absl::StrCat("EPLB: ", m, " nodes must divide ", n,
                                                   " ranks and ", num_logical, " experts"));
  }
  std::vector<int32_t> p2l(static_cast<size_t>(n) * slots_per_rank, -1);
  if (m == 1) {
    std::vector<int32_t> all(static_cast<size_t>(num_logical));
    std::iota(all.begin(), all.end(), 0);
    ReplicateAndPack(all, load, 0, n, slots_per_rank, &p2l);
  } else {
    // Node level: logical experts (no replicas) packed evenly by load.
    std::vector<Item> items;
    for (int32_t e = 0; e < num_logical; ++e) items.push_back({e, load[e]});
    const std::vector<int32_t> node = Pack(items, m, num_logical / m);
    for (int32_t k = 0; k < m; ++k) {
      std::vector<int32_t> experts;
      for (int32_t e = 0; e < num_logical; ++e) {
        if (node[e] == k) experts.push_back(e);
      }
      ReplicateAndPack(experts, load, k * (n / m), n / m, slots_per_rank, &p2l);
    }
  }
  return Finish(num_logical, n, slots_per_rank, std::move(p2l));
}

absl::StatusOr<std::vector<double>> RankLoads(const ExpertPlacement& placement,
                                              absl::Span<const double> load) {
  if (static_cast<int32_t>(load.size()) != placement.num_logical_experts) {
    return absl::InvalidArgumentError(absl::StrCat("RankLoads: ", load.size(),
                                                   " loads for a placement of ",
                                                   placement.num_logical_experts, " experts"));
  }
  std::vector<double> rank_load(static_cast<size_t>(placement.num_ranks), 0.0);
  for (size_t slot = 0; slot < placement.physical_to_logical.size(); ++slot) {
    const int32_t e = placement.physical_to_logical[slot];
    rank_load[placement.RankOfSlot(static_cast<int32_t>(slot))] +=
        load[e] / static_cast<double>(placement.logical_to_physical[e].size());
  }
  return rank_load;
}

double Imbalance(absl::Span<const double> rank_loads) {
  if (rank_loads.empty()) return 1.0;
  double sum = 0, max = 0;
  for (double x : rank_loads) {
    sum += x;
    max = std::max(max, x);
  }
  if (sum <= 0) return 1.0;
  return max / (sum / static_cast<double>(rank_loads.size()));
}

ReplicaRouter::ReplicaRouter(const ExpertPlacement* placement, ReplicaPolicy policy)
    : placement_(placement),
      policy_(policy),
      next_(static_cast<size_t>(placement->num_logical_experts), 0) {}

void ReplicaRouter::Reset() { std::fill(next_.begin(), next_.end(), 0); }

int32_t ReplicaRouter::PhysicalSlot(int32_t logical, int64_t token_index) {
  const std::vector<int32_t>& replicas = placement_->logical_to_physical[logical];
  const int64_t n = static_cast<int64_t>(replicas.size());
  const int64_t pick =
      policy_ == ReplicaPolicy::kRoundRobin ? next_[logical]++ % n : token_index % n;
  return replicas[pick];
}

absl::StatusOr<RebalancePlan> PlanRebalance(const ExpertPlacement& current,
                                            absl::Span<const double> load,
                                            const EplbOptions& options, double min_improvement) {
  auto fresh = PlanEplb(load, options);
  if (!fresh.ok()) return fresh.status();
  if (current.num_logical_experts != fresh->num_logical_experts ||
      current.num_ranks != fresh->num_ranks || current.slots_per_rank != fresh->slots_per_rank) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PlanRebalance: current placement (", current.num_logical_experts, " experts, ",
        current.num_ranks, " ranks x ", current.slots_per_rank, " slots) does not match (",
        fresh->num_logical_experts, ", ", fresh->num_ranks, " x ", fresh->slots_per_rank, ")"));
  }
  RebalancePlan plan;
  auto old_loads = RankLoads(current, load);
  auto new_loads = RankLoads(*fresh, load);
  if (!old_loads.ok()) return old_loads.status();
  if (!new_loads.ok()) return new_loads.status();
  plan.old_imbalance = Imbalance(*old_loads);
  plan.new_imbalance = Imbalance(*new_loads);
  if (plan.new_imbalance > plan.old_imbalance - min_improvement) {
    plan.placement = current;
    return plan;
  }
  const int32_t n = current.num_ranks, slots = current.slots_per_rank;
  // Match each new pack to the old rank it overlaps most (multiset intersection), greedily by
  // overlap; packs are interchangeable, so this relabelling changes no rank load.
  auto overlap = [&](int32_t new_rank, int32_t old_rank) {
    std::vector<int32_t> a = fresh->RankExperts(new_rank), b = current.RankExperts(old_rank);
    std::sort(b.begin(), b.end());
    std::vector<int32_t> common;
    std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(common));
    return static_cast<int32_t>(common.size());
  };
  std::vector<int32_t> target(n, -1);  // new pack → old rank
  std::vector<bool> used(n, false);
  for (int32_t round = 0; round < n; ++round) {
    int32_t best_new = -1, best_old = -1, best = -1;
    for (int32_t a = 0; a < n; ++a) {
      if (target[a] >= 0) continue;
      for (int32_t b = 0; b < n; ++b) {
        if (used[b]) continue;
        const int32_t o = overlap(a, b);
        if (o > best) {
          best = o;
          best_new = a;
          best_old = b;
        }
      }
    }
    target[best_new] = best_old;
    used[best_old] = true;
  }
  // Within each rank keep slots whose expert stays; fill the others in slot order.
  std::vector<int32_t> p2l(current.physical_to_logical.size(), -1);
  for (int32_t a = 0; a < n; ++a) {
    const int32_t rank = target[a];
    std::vector<int32_t> wanted = fresh->RankExperts(a);
    const int32_t base = rank * slots;
    for (int32_t s = 0; s < slots; ++s) {
      auto it = std::find(wanted.begin(), wanted.end(), current.physical_to_logical[base + s]);
      if (it != wanted.end()) {
        p2l[base + s] = *it;
        wanted.erase(it);
      }
    }
    size_t next = 0;
    for (int32_t s = 0; s < slots; ++s) {
      if (p2l[base + s] < 0) p2l[base + s] = wanted[next++];
    }
  }
  plan.placement = Finish(current.num_logical_experts, n, slots, std::move(p2l));
  plan.changed = true;
  for (int32_t slot = 0; slot < n * slots; ++slot) {
    const int32_t e = plan.placement.physical_to_logical[slot];
    if (current.physical_to_logical[slot] == e) continue;
    const std::vector<int32_t>& sources = current.logical_to_physical[e];
    int32_t src = sources.front();
    for (int32_t s : sources) {
      if (current.RankOfSlot(s) == current.RankOfSlot(slot)) {
        src = s;
        break;
      }
    }
    plan.moves.push_back({slot, src, e});
  }
  return plan;
}

}  // namespace sluice
