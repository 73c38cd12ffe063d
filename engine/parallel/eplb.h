// EPLB: expert-parallel load balancing. Pure placement logic, no model or communicator.
//
// Under expert parallelism each rank holds `slots_per_rank` expert slots; a token routed to logical
// expert e is sent to one of e's replicas. With a skewed router (a few hot experts), the rank
// holding a hot expert bounds the step time. EPLB (DeepSeek-V3 technical report, arXiv:2412.19437
// §3.4 "redundant experts"; the algorithm description of DeepSeek's open EPLB project) adds R
// redundant replicas of the heaviest experts and packs all replicas over the ranks so that per-rank
// load evens out:
//   1. Replicate: start with one replica per logical expert; R times, give one more replica to
//      the expert with the largest load per replica (load / replicas; ties: lowest id).
//   2. Pack: sort replicas by load per replica, descending (ties: lowest expert id), and put
//      each on the least-loaded rank that still has a free slot (every rank ends with exactly
//      slots_per_rank replicas), preferring ranks that do not hold that expert yet.
//   Hierarchical variant (num_nodes > 1; DeepSeek applies it when nodes divide expert groups,
//   to keep routed tokens inside a node): first pack the logical experts evenly onto nodes
//   (same balanced packing, E / num_nodes experts per node), then replicate and pack within
//   each node with its share of the redundant slots.
// Load is tokens routed per expert over a measurement window (any non-negative unit). The per-rank
// load model assumes a logical expert's tokens split evenly over its replicas, which the dispatch
// policies below realize (up to rounding).
//
// Periodic rebalance (PlanRebalance): from the current placement and freshly measured load
// (Model::TakeExpertLoad), compute a new placement and a short list of expert-weight copies that
// turns the old one into it (new packs are matched to the ranks with the largest overlap, and
// slots that keep their expert stay). It is applied between two steps
// (Model::UpdateExpertPlacement moves the weights between ranks, engine/parallel/
// expert_parallel.h RedistributeExperts), so requests in flight keep their KV cache and go on.
#ifndef SLUICE_ENGINE_PARALLEL_EPLB_H_
#define SLUICE_ENGINE_PARALLEL_EPLB_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace sluice {

// ExpertPlacement maps physical expert slots to logical experts for one MoE layer. Physical slot p
// lives on rank p / slots_per_rank.
struct ExpertPlacement {
  int32_t num_logical_experts = 0;
  int32_t num_ranks = 0;
  int32_t slots_per_rank = 0;
  // [num_ranks * slots_per_rank]: the logical expert held by each physical slot.
  std::vector<int32_t> physical_to_logical;
  // [num_logical_experts][replicas]: the physical slots holding each logical expert, ascending.
  // Every logical expert has at least one replica.
  std::vector<std::vector<int32_t>> logical_to_physical;

  int32_t RankOfSlot(int32_t physical) const { return physical / slots_per_rank; }
  // RankExperts returns the logical experts of `rank`'s slots, in slot order.
  std::vector<int32_t> RankExperts(int32_t rank) const;
};

// ContiguousPlacement: the naive layout without redundancy — rank r holds experts [r·E/N,
// (r+1)·E/N). Errors: InvalidArgument unless 1 <= num_ranks and E % num_ranks == 0.
absl::StatusOr<ExpertPlacement> ContiguousPlacement(int32_t num_logical_experts, int32_t num_ranks);

// PlacementFromSlots builds an ExpertPlacement from physical_to_logical [num_ranks ·
// slots_per_rank] (rank-major, e.g. ParallelShard::expert_slots); an empty span means
// ContiguousPlacement. Errors: InvalidArgument when the size is not a multiple of num_ranks, an id
// is outside [0, num_logical_experts), or some logical expert has no slot.
absl::StatusOr<ExpertPlacement> PlacementFromSlots(absl::Span<const int32_t> physical_to_logical,
                                                   int32_t num_logical_experts, int32_t num_ranks);

struct EplbOptions {
  int32_t num_ranks = 1;
  int32_t num_redundant_experts = 0;  // R; (E + R) must be divisible by num_ranks
  int32_t num_nodes = 1;              // > 1: hierarchical; must divide num_ranks and E
};

// PlanEplb places E = load.size() logical experts plus R replicas over the ranks (the steps in the
// file comment). Deterministic: the same load gives the same placement. Errors: InvalidArgument for
// an empty or negative/non-finite load, num_ranks < 1, R < 0, (E + R) % num_ranks != 0, (E + R) /
// num_ranks < 1, or a num_nodes that does not divide num_ranks and E (or leaves a node fewer slots
// than experts).
absl::StatusOr<ExpertPlacement> PlanEplb(absl::Span<const double> load, const EplbOptions& options);

// RankLoads returns [num_ranks] load per rank under `placement` (each logical expert's load split
// evenly over its replicas). Errors: InvalidArgument when load.size() differs from the placement's
// number of logical experts.
absl::StatusOr<std::vector<double>> RankLoads(const ExpertPlacement& placement,
                                              absl::Span<const double> load);

// Imbalance returns max / mean of `rank_loads` (1 = perfectly balanced; 1 for all-zero loads).
double Imbalance(absl::Span<const double> rank_loads);

// ReplicaPolicy picks which replica of a logical expert a routed token goes to.
enum class ReplicaPolicy {
  kRoundRobin,  // the i-th token routed to the expert in a step takes replica i
                // % replicas
  kTokenIndex,  // token t takes replica t % replicas (stateless; same token →
                // same replica)
};

// ReplicaRouter turns logical expert ids into physical slots for one step. Not thread-safe.
class ReplicaRouter {
 public:
  ReplicaRouter(const ExpertPlacement* placement, ReplicaPolicy policy);
  // Reset starts a new step (clears the round-robin counters).
  void Reset();
  // PhysicalSlot returns the slot serving logical expert `logical` for token `token_index`.
  // `logical` must be in [0, num_logical_experts).
  int32_t PhysicalSlot(int32_t logical, int64_t token_index);

 private:
  const ExpertPlacement* placement_;
  ReplicaPolicy policy_;
  std::vector<int64_t> next_;  // [num_logical_experts] round-robin counters
};

// ExpertMove: copy logical expert `logical`'s weights from physical slot `src_slot` (of the old
// placement) into physical slot `dst_slot` (of the new placement).
struct ExpertMove {
  int32_t dst_slot = 0;
  int32_t src_slot = 0;
  int32_t logical = 0;
  bool operator==(const ExpertMove& o) const {
    return dst_slot == o.dst_slot && src_slot == o.src_slot && logical == o.logical;
  }
};

struct RebalancePlan {
  bool changed = false;           // false: keep the current placement (moves empty)
  ExpertPlacement placement;      // the placement to use from the next step
  std::vector<ExpertMove> moves;  // copies to apply before switching; sources read old slots
  double old_imbalance = 0;       // max/mean rank load of the old placement under the new load
  double new_imbalance = 0;
};

// PlanRebalance computes PlanEplb(load, options) and, when it lowers the imbalance by at least
// `min_improvement` (e.g. 0.05 = five percentage points of max/mean), the placement relabelled to
// minimize weight copies plus the copies themselves; otherwise changed = false and the old
// placement is returned. A source slot prefers the destination's own rank (a local copy). Errors:
// those of PlanEplb; InvalidArgument when `current` does not match the load size or options' rank
// and slot counts.
absl::StatusOr<RebalancePlan> PlanRebalance(const ExpertPlacement& current,
                                            absl::Span<const double> load,
                                            const EplbOptions& options,
                                            double min_improvement = 0.05);

}  // namespace sluice

#endif  // SLUICE_ENGINE_PARALLEL_EPLB_H_
