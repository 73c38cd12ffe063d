#include "services/router/kv_index.h"

#include <algorithm>
#include <utility>

namespace sluice {

KvIndex::KvIndex(KvIndexOptions options, Clock clock)
    : options_(options), clock_(std::move(clock)) {}

int32_t KvIndex::SlotFor(const std::string& worker_id) {
  auto it = slot_of_.find(worker_id);
  if (it != slot_of_.end()) return it->second;
  int32_t slot;
  if (!free_slots_.empty()) {
    slot = free_slots_.back();
    free_slots_.pop_back();
    workers_[slot].id = worker_id;
  } else {
    slot = static_cast<int32_t>(workers_.size());
    workers_.push_back(Worker{worker_id, {}, {}, {}});
  }
  slot_of_.emplace(worker_id, slot);
  return slot;
}

void KvIndex::Confirm(int32_t slot, const BlockHash& hash) {
  Worker& worker = workers_[slot];
  std::vector<Holder>& holders = holders_[hash];
  for (Holder& holder : holders) {
    if (holder.slot != slot) continue;
    holder.confirmed = true;
    holder.expiry = absl::InfiniteFuture();
    worker.provisional.erase(hash);
    worker.confirmed.insert(hash);
    return;
  }
  holders.push_back(Holder{slot, true, absl::InfiniteFuture()});
  worker.confirmed.insert(hash);
}

void KvIndex::Drop(int32_t slot, const BlockHash& hash) {
  Worker& worker = workers_[slot];
  worker.confirmed.erase(hash);
  worker.provisional.erase(hash);
  auto it = holders_.find(hash);
  if (it == holders_.end()) return;
  std::vector<Holder>& holders = it->second;
  holders.erase(std::remove_if(holders.begin(), holders.end(),
                               [slot](const Holder& h) { return h.slot == slot; }),
                holders.end());
  if (holders.empty()) holders_.erase(it);
}

void KvIndex::DropAll(int32_t slot, bool keep_provisional) {
  Worker& worker = workers_[slot];
  std::vector<BlockHash> hashes(worker.confirmed.begin(), worker.confirmed.end());
  if (!keep_provisional) {
    hashes.insert(hashes.end(), worker.provisional.begin(), worker.provisional.end());
  }
  for (const BlockHash& hash : hashes) Drop(slot, hash);
}

bool KvIndex::ApplyEvents(const std::string& worker_id, const KvEventBatch& batch) {
  std::lock_guard<std::mutex> lock(mu_);
  const int32_t slot = SlotFor(worker_id);
  Worker& worker = workers_[slot];
  KvIndexWorkerState& state = worker.state;
  if (state.needs_resync) return false;
  if (batch.fell_behind || batch.log_id != state.log_id) {
    state.needs_resync = true;
    return false;
  }
  for (const KvEvent& event : batch.events) {
    if (event.seq <= state.last_seq) continue;  // already applied (a re-read)
    if (event.seq != state.last_seq + 1) {
      state.needs_resync = true;
      return false;
    }
    switch (event.type) {
      case KvEventType::kStored:
        for (const BlockHash& hash : event.block_hashes) Confirm(slot, hash);
        break;
      case KvEventType::kRemoved:
        // A removed block is gone whether we knew it from an event or only from our own
        // routing decision.
        for (const BlockHash& hash : event.block_hashes) Drop(slot, hash);
        break;
      case KvEventType::kAllCleared:
        DropAll(slot, /*keep_provisional=*/false);
        break;
    }
    state.last_seq = event.seq;
  }
  return true;
}

void KvIndex::ApplySnapshot(const std::string& worker_id, const KvSnapshot& snapshot) {
  std::lock_guard<std::mutex> lock(mu_);
  const int32_t slot = SlotFor(worker_id);
  Worker& worker = workers_[slot];
  DropAll(slot, /*keep_provisional=*/true);
  for (const BlockHash& hash : snapshot.block_hashes) Confirm(slot, hash);
  worker.state.log_id = snapshot.log_id;
  worker.state.last_seq = snapshot.seq;
  worker.state.needs_resync = false;
  ++worker.state.num_resyncs;
}

void KvIndex::MarkForResync(const std::string& worker_id) {
  std::lock_guard<std::mutex> lock(mu_);
  workers_[SlotFor(worker_id)].state.needs_resync = true;
}

void KvIndex::RecordRouting(const std::string& worker_id, absl::Span<const BlockHash> hashes) {
  bool prune = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const int32_t slot = SlotFor(worker_id);
    Worker& worker = workers_[slot];
    const absl::Time expiry = clock_() + options_.provisional_ttl;
    for (const BlockHash& hash : hashes) {
      std::vector<Holder>& holders = holders_[hash];
      auto it = std::find_if(holders.begin(), holders.end(),
                             [slot](const Holder& h) { return h.slot == slot; });
      if (it == holders.end()) {
        holders.push_back(Holder{slot, false, expiry});
        worker.provisional.insert(hash);
      } else if (!it->confirmed) {
        it->expiry = std::max(it->expiry, expiry);
      }
    }
    prune = ++records_since_prune_ >= kPruneEvery;
    if (prune) records_since_prune_ = 0;
  }
  if (prune) PruneExpired();
}

void KvIndex::RemoveWorker(const std::string& worker_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = slot_of_.find(worker_id);
  if (it == slot_of_.end()) return;
  const int32_t slot = it->second;
  DropAll(slot, /*keep_provisional=*/false);
  // No Holder names the slot any more. Assigning a fresh Worker also frees the hash sets'
  // capacity (erase never shrinks them); a worker that comes back under the same id starts
  // fresh, marked for resync.
  workers_[slot] = Worker{};
  free_slots_.push_back(slot);
  slot_of_.erase(it);
}

std::map<std::string, int64_t> KvIndex::MatchPrefix(absl::Span<const BlockHash> hashes) const {
  std::lock_guard<std::mutex> lock(mu_);
  const absl::Time now = clock_();
  std::map<std::string, int64_t> matched;
  if (hashes.empty()) return matched;
  // Workers still matching after block i; a worker drops out at its first missing block.
  std::vector<int32_t> alive;
  auto first = holders_.find(hashes[0]);
  if (first == holders_.end()) return matched;
  for (const Holder& holder : first->second) {
    if (Holds(holder, now)) alive.push_back(holder.slot);
  }
  int64_t depth = 1;
  auto record = [&](int32_t slot, int64_t blocks) { matched[workers_[slot].id] = blocks; };
  for (; depth < static_cast<int64_t>(hashes.size()) && !alive.empty(); ++depth) {
    auto it = holders_.find(hashes[depth]);
    std::vector<int32_t> next;
    for (int32_t slot : alive) {
      bool holds = false;
      if (it != holders_.end()) {
        for (const Holder& holder : it->second) {
          if (holder.slot == slot && Holds(holder, now)) {
            holds = true;
            break;
          }
        }
      }
      if (holds) {
        next.push_back(slot);
      } else {
        record(slot, depth);
      }
    }
    alive.swap(next);
  }
  for (int32_t slot : alive) record(slot, depth);
  return matched;
}

int64_t KvIndex::PruneExpired() {
  std::lock_guard<std::mutex> lock(mu_);
  const absl::Time now = clock_();
  int64_t pruned = 0;
  for (Worker& worker : workers_) {
    std::vector<BlockHash> expired;
    const int32_t slot = static_cast<int32_t>(&worker - workers_.data());
    for (const BlockHash& hash : worker.provisional) {
      auto it = holders_.find(hash);
      if (it == holders_.end()) {
        expired.push_back(hash);
        continue;
      }
      for (const Holder& holder : it->second) {
        if (holder.slot == slot && !Holds(holder, now)) expired.push_back(hash);
      }
    }
    for (const BlockHash& hash : expired) Drop(slot, hash);
    pruned += static_cast<int64_t>(expired.size());
  }
  return pruned;
}

KvIndexWorkerState KvIndex::WorkerState(const std::string& worker_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = slot_of_.find(worker_id);
  if (it == slot_of_.end()) return KvIndexWorkerState{};
  const Worker& worker = workers_[it->second];
  KvIndexWorkerState state = worker.state;
  state.num_confirmed_blocks = static_cast<int64_t>(worker.confirmed.size());
  state.num_provisional_blocks = static_cast<int64_t>(worker.provisional.size());
  return state;
}

std::vector<std::string> KvIndex::Workers() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> ids;
  ids.reserve(slot_of_.size());
  for (const auto& [id, slot] : slot_of_) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  return ids;
}

int64_t KvIndex::NumHashes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(holders_.size());
}

int64_t KvIndex::NumSlots() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(workers_.size());
}

}  // namespace sluice
