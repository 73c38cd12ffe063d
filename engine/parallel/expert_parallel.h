// Expert parallelism for one MoE layer on the CPU backend: routed tokens are dispatched to the
// ranks that hold their experts and the expert outputs combined back, both with AllToAllV
// (the dispatch/combine pattern of GShard, Lepikhin et al. 2020, arXiv:2006.16668 §2.2, and
// DeepSeek-V3's EP deployment, arXiv:2412.19437 §3.4).
//
// Setting: every rank holds the full layer input x [T, hidden] (attention ran tensor-parallel
// or replicated) and the same routing (topk_ids/weights). Rank r
//   1. takes its share of the tokens (TokenShard) and, for each (token, k), the physical slot
//      that serves expert topk_ids[t, k] (ReplicaRouter, kTokenIndex: the same token always
//      picks the same replica, so routing needs no shared state);
//   2. sends each such row x[t] (plus the slot index on the owner) to the slot's owner;
//   3. runs its local experts on the rows it received (kernels::MoeExpertsCpu, weight 1);
//   4. sends the outputs back; combines out[t] = Σ_k w[t, k] · y[t, k] in k order — the
//      order MoeExpertsCpu uses, so results match the unsharded layer bit for bit given the
//      batch-invariant GEMM;
//   5. all-gathers the token shares so every rank again holds the full [T, hidden] output.
// Per-expert token counts are accumulated (load()) as EPLB's input (engine/parallel/eplb.h).
#ifndef SLUICE_ENGINE_PARALLEL_EXPERT_PARALLEL_H_
#define SLUICE_ENGINE_PARALLEL_EXPERT_PARALLEL_H_

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/parallel/communicator.h"
#include "engine/parallel/eplb.h"
#include "kernels/moe/moe_experts.h"

namespace sluice {

// ExpertParallelMoe runs the routed experts of one MoE layer for one rank. Not thread-safe;
// one instance per rank and layer (it keeps that layer's load counters and scratch).
class ExpertParallelMoe {
 public:
  // comm: the expert-parallel group (not owned). placement: rank comm->rank()'s slots are
  // placement.RankExperts(rank).
  ExpertParallelMoe(Communicator* comm, ExpertPlacement placement);

  const ExpertPlacement& placement() const { return placement_; }

  // Run computes the routed-expert output of all tokens (collective over the group).
  //   x:             [num_tokens, hidden] float32, identical on every rank
  //   topk_ids:      [num_tokens, top_k] logical expert ids; topk_weights the same shape
  //   local_experts: [slots_per_rank] weights of this rank's slots, in slot order
  //   out:           [num_tokens, hidden] float32, overwritten; identical on every rank
  // Errors: InvalidArgument for an expert id out of range; those of the communicator and of
  // MoeExpertsCpu.
  absl::Status Run(const float* x, int64_t num_tokens, int64_t hidden, int64_t intermediate,
                   const int32_t* topk_ids, const float* topk_weights, int64_t top_k,
                   absl::Span<const kernels::MoeExpertWeights> local_experts, float* out);

  // load()[e]: tokens this rank dispatched to logical expert e since the last ResetLoad (sum
  // over ranks for the layer's total; the ranks' token shares do not overlap).
  const std::vector<int64_t>& load() const { return load_; }
  void ResetLoad() { std::fill(load_.begin(), load_.end(), 0); }
  // AddLoad adds `load` [num_logical_experts] to the counters (carried over a placement swap).
  void AddLoad(absl::Span<const int64_t> load) {
    for (size_t e = 0; e < load_.size() && e < load.size(); ++e) load_[e] += load[e];
  }

 private:
  Communicator* comm_;
  ExpertPlacement placement_;
  ReplicaRouter router_;
  std::vector<int64_t> load_;
  // Scratch, reused across steps.
  std::vector<int32_t> entry_dest_, entry_pos_, send_slot_, recv_slot_;
  std::vector<int64_t> send_counts_, send_rows_, recv_rows_;
  std::vector<float> send_x_, recv_x_, expert_out_, returned_, ones_, local_out_;
  kernels::MoeWorkspace moe_;
};

// RedistributeExperts moves expert weights from placement `from` to placement `to` (same
// logical experts and ranks; collective over `comm`, run between steps). `local` holds this
// rank's experts under `from`: [from.slots_per_rank, floats_per_expert] float32 in slot order.
// Returns this rank's experts under `to`: [to.slots_per_rank, floats_per_expert]. An expert the
// rank already holds is copied locally; any other comes from the rank holding its first
// replica under `from`, in one AllToAllV (every rank derives the same transfer plan from the
// two placements, so no count exchange is needed).
// Errors: InvalidArgument when the placements' experts or ranks differ from each other or the
// communicator, or `local` has the wrong size; those of AllToAllV.
absl::StatusOr<std::vector<float>> RedistributeExperts(Communicator& comm,
                                                       const ExpertPlacement& from,
                                                       const ExpertPlacement& to,
                                                       absl::Span<const float> local,
                                                       int64_t floats_per_expert);

}  // namespace sluice

#endif  // SLUICE_ENGINE_PARALLEL_EXPERT_PARALLEL_H_
