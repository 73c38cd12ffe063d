#include "engine/parallel/expert_parallel.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "engine/parallel/sharding.h"

namespace sluice {

ExpertParallelMoe::ExpertParallelMoe(Communicator* comm, ExpertPlacement placement)
    : comm_(comm),
      placement_(std::move(placement)),
      router_(&placement_, ReplicaPolicy::kTokenIndex),
      load_(static_cast<size_t>(placement_.num_logical_experts), 0) {}

absl::Status ExpertParallelMoe::Run(const float* x, int64_t num_tokens, int64_t hidden,
                                    int64_t intermediate, const int32_t* topk_ids,
                                    const float* topk_weights, int64_t top_k,
                                    absl::Span<const kernels::MoeExpertWeights> local_experts,
                                    float* out) {
  const int32_t world = comm_->world_size(), rank = comm_->rank();
  const int32_t spr = placement_.slots_per_rank;
  // Every rank checks every token's ids (not just its own share) so all reach the same verdict
  // before the first collective.
  for (int64_t i = 0; i < num_tokens * top_k; ++i) {
    if (topk_ids[i] < 0 || topk_ids[i] >= placement_.num_logical_experts) {
      return absl::InvalidArgumentError(absl::StrCat("expert parallel: expert id ", topk_ids[i],
                                                     " outside [0, ",
                                                     placement_.num_logical_experts, ")"));
    }
  }
  if (static_cast<int32_t>(local_experts.size()) != spr) {
    return absl::InvalidArgumentError(absl::StrCat("expert parallel: ", local_experts.size(),
                                                   " local experts for ", spr, " slots"));
  }
  const Range mine = TokenShard(num_tokens, rank, world);
  const int64_t entries = mine.count * top_k;  // (token, k) pairs of this rank's share

  // 1. Destination rank and local slot of every entry; rows grouped by destination.
  entry_dest_.resize(entries);
  entry_pos_.resize(entries);
  send_slot_.resize(entries);
  send_counts_.assign(world, 0);
  std::vector<int32_t> local_slot(entries);
  for (int64_t i = 0; i < entries; ++i) {
    const int64_t t = mine.begin + i / top_k;
    const int32_t e = topk_ids[t * top_k + i % top_k];
    const int32_t slot = router_.PhysicalSlot(e, t);
    entry_dest_[i] = slot / spr;
    local_slot[i] = slot % spr;
    ++send_counts_[entry_dest_[i]];
    ++load_[e];
  }
  std::vector<int64_t> next(world, 0);
  for (int32_t d = 1; d < world; ++d) next[d] = next[d - 1] + send_counts_[d - 1];
  send_x_.resize(entries * hidden);
  for (int64_t i = 0; i < entries; ++i) {
    const int64_t pos = next[entry_dest_[i]]++;
    entry_pos_[i] = static_cast<int32_t>(pos);
    send_slot_[pos] = local_slot[i];
    std::memcpy(send_x_.data() + pos * hidden, x + (mine.begin + i / top_k) * hidden,
                hidden * sizeof(float));
  }

  // 2. Dispatch.
  auto recv_counts = ExchangeCounts(*comm_, send_counts_);
  if (!recv_counts.ok()) return recv_counts.status();
  const int64_t received = std::accumulate(recv_counts->begin(), recv_counts->end(), int64_t{0});
  send_rows_.resize(world);
  recv_rows_.resize(world);
  for (int32_t d = 0; d < world; ++d) {
    send_rows_[d] = send_counts_[d] * hidden;
    recv_rows_[d] = (*recv_counts)[d] * hidden;
  }
  recv_x_.resize(std::max<int64_t>(received * hidden, 1));
  recv_slot_.resize(std::max<int64_t>(received, 1));
  if (absl::Status s = comm_->AllToAllV(send_x_.data(), send_rows_, recv_x_.data(), recv_rows_,
                                        CommDataType::kFloat32);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = comm_->AllToAllV(send_slot_.data(), send_counts_, recv_slot_.data(),
                                        *recv_counts, CommDataType::kInt32);
      !s.ok()) {
    return s;
  }

  // 3. Local experts, each received row with weight 1 (the origin applies the router weight).
  expert_out_.resize(std::max<int64_t>(received * hidden, 1));
  absl::Status expert_status = absl::OkStatus();
  if (received > 0) {
    ones_.assign(received, 1.0f);
    expert_status =
        kernels::MoeExpertsCpu(recv_x_.data(), received, hidden, intermediate, recv_slot_.data(),
                               ones_.data(), 1, local_experts, expert_out_.data(), moe_);
  }
  // A local failure must not strand the peers in the combine: still take part, then report.

  // 4. Combine: the reverse exchange, then Σ_k w · y in k order (as MoeExpertsCpu does).
  returned_.resize(std::max<int64_t>(entries * hidden, 1));
  if (absl::Status s = comm_->AllToAllV(expert_out_.data(), recv_rows_, returned_.data(),
                                        send_rows_, CommDataType::kFloat32);
      !s.ok()) {
    return s;
  }
  local_out_.resize(std::max<int64_t>(mine.count * hidden, 1));
  for (int64_t tl = 0; tl < mine.count; ++tl) {
    float* o = local_out_.data() + tl * hidden;
    for (int64_t k = 0; k < top_k; ++k) {
      const int64_t i = tl * top_k + k;
      const float w = topk_weights[(mine.begin + tl) * top_k + k];
      const float* y = returned_.data() + int64_t{entry_pos_[i]} * hidden;
      if (k == 0) {
        for (int64_t j = 0; j < hidden; ++j) o[j] = w * y[j];
      } else {
        for (int64_t j = 0; j < hidden; ++j) o[j] += w * y[j];
      }
    }
  }

  // 5. Every rank gets every token's output.
  std::vector<int64_t> share_rows(world);
  for (int32_t r = 0; r < world; ++r)
    share_rows[r] = TokenShard(num_tokens, r, world).count * hidden;
  if (absl::Status s = comm_->AllGatherV(local_out_.data(), mine.count * hidden, out, share_rows,
                                         CommDataType::kFloat32);
      !s.ok()) {
    return s;
  }
  return expert_status;
}

namespace {

// Holds reports whether `rank` holds logical expert `e` under `p`.
bool Holds(const ExpertPlacement& p, int32_t rank, int32_t e) {
  for (int32_t slot : p.logical_to_physical[e]) {
    if (p.RankOfSlot(slot) == rank) return true;
  }
  return false;
}

// Source is the rank that sends expert `e` to a rank that lacks it: its first replica's owner.
int32_t Source(const ExpertPlacement& p, int32_t e) {
  return p.RankOfSlot(p.logical_to_physical[e].front());
}

}  // namespace

absl::StatusOr<std::vector<float>> RedistributeExperts(Communicator& comm,
                                                       const ExpertPlacement& from,
                                                       const ExpertPlacement& to,
                                                       absl::Span<const float> local,
                                                       int64_t floats_per_expert) {
  const int32_t world = comm.world_size(), me = comm.rank();
  if (from.num_logical_experts != to.num_logical_experts || from.num_ranks != world ||
      to.num_ranks != world ||
      static_cast<int64_t>(local.size()) != from.slots_per_rank * floats_per_expert) {
    return absl::InvalidArgumentError(
        absl::StrCat("RedistributeExperts: placements of ", from.num_logical_experts, "/",
                     to.num_logical_experts, " experts over ", from.num_ranks, "/", to.num_ranks,
                     " ranks, world ", world, ", ", local.size(), " local floats"));
  }
  // Transfers in a fixed order: destination rank, then destination slot. Rank d receives, for
  // each of its new slots whose expert it lacks, that expert from Source().
  std::vector<int64_t> send_counts(world, 0), recv_counts(world, 0);
  std::vector<float> send;
  for (int32_t d = 0; d < world; ++d) {
    if (d == me) continue;
    for (int32_t e : to.RankExperts(d)) {
      if (Holds(from, d, e) || Source(from, e) != me) continue;
      // My copy: the first of my old slots holding e.
      const std::vector<int32_t> mine = from.RankExperts(me);
      const int64_t j = std::find(mine.begin(), mine.end(), e) - mine.begin();
      send.insert(send.end(), local.begin() + j * floats_per_expert,
                  local.begin() + (j + 1) * floats_per_expert);
      send_counts[d] += floats_per_expert;
    }
  }
  const std::vector<int32_t> old_mine = from.RankExperts(me), new_mine = to.RankExperts(me);
  for (int32_t e : new_mine) {
    if (!Holds(from, me, e)) recv_counts[Source(from, e)] += floats_per_expert;
  }
  const int64_t received = std::accumulate(recv_counts.begin(), recv_counts.end(), int64_t{0});
  std::vector<float> recv(std::max<int64_t>(received, 1));
  send.resize(std::max<size_t>(send.size(), 1));
  if (absl::Status s = comm.AllToAllV(send.data(), send_counts, recv.data(), recv_counts,
                                      CommDataType::kFloat32);
      !s.ok()) {
    return s;
  }
  // Received experts arrive grouped by source rank, each group in my new-slot order.
  std::vector<int64_t> next(world, 0);
  for (int32_t r = 1; r < world; ++r) next[r] = next[r - 1] + recv_counts[r - 1];
  std::vector<float> out(new_mine.size() * floats_per_expert);
  for (size_t j = 0; j < new_mine.size(); ++j) {
    const int32_t e = new_mine[j];
    const float* src = nullptr;
    if (Holds(from, me, e)) {
      const int64_t k = std::find(old_mine.begin(), old_mine.end(), e) - old_mine.begin();
      src = local.data() + k * floats_per_expert;
    } else {
      int64_t& pos = next[Source(from, e)];
      src = recv.data() + pos;
      pos += floats_per_expert;
    }
    std::copy(src, src + floats_per_expert, out.begin() + j * floats_per_expert);
  }
  return out;
}

}  // namespace sluice
