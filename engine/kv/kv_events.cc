#include "engine/kv/kv_events.h"

#include <random>
#include <utility>

namespace sluice {
namespace {

uint64_t RandomLogId() {
  std::random_device rd;
  const uint64_t id = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  return id == 0 ? 1 : id;  // 0 stays "no log"
}

}  // namespace

KvEventLog::KvEventLog(size_t capacity)
    : capacity_(capacity == 0 ? 1 : capacity), log_id_(RandomLogId()) {}

void KvEventLog::Append(KvEvent event) {
  event.seq = ++last_seq_;
  events_.push_back(std::move(event));
  if (events_.size() > capacity_) events_.pop_front();
}

void KvEventLog::Stored(std::optional<BlockHash> parent, std::vector<BlockHash> hashes) {
  if (hashes.empty()) return;
  std::lock_guard<std::mutex> lock(mu_);
  cached_.insert(hashes.begin(), hashes.end());
  KvEvent e;
  e.type = KvEventType::kStored;
  e.parent_hash = parent;
  e.block_hashes = std::move(hashes);
  Append(std::move(e));
}

void KvEventLog::Removed(std::vector<BlockHash> hashes) {
  if (hashes.empty()) return;
  std::lock_guard<std::mutex> lock(mu_);
  for (const BlockHash& h : hashes) cached_.erase(h);
  KvEvent e;
  e.type = KvEventType::kRemoved;
  e.block_hashes = std::move(hashes);
  Append(std::move(e));
}

void KvEventLog::AllCleared() {
  std::lock_guard<std::mutex> lock(mu_);
  cached_.clear();
  KvEvent e;
  e.type = KvEventType::kAllCleared;
  Append(std::move(e));
}

KvEventBatch KvEventLog::Read(uint64_t after_seq, size_t max_events) const {
  std::lock_guard<std::mutex> lock(mu_);
  KvEventBatch batch;
  batch.log_id = log_id_;
  batch.last_seq = last_seq_;
  const uint64_t first_kept = last_seq_ - events_.size() + 1;  // seq of events_.front()
  if (after_seq > last_seq_ || after_seq + 1 < first_kept) {
    batch.fell_behind = true;
    return batch;
  }
  for (uint64_t s = after_seq + 1; s <= last_seq_ && batch.events.size() < max_events; ++s) {
    batch.events.push_back(events_[s - first_kept]);
  }
  return batch;
}

KvSnapshot KvEventLog::Snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  KvSnapshot snap;
  snap.log_id = log_id_;
  snap.seq = last_seq_;
  snap.block_hashes.assign(cached_.begin(), cached_.end());
  return snap;
}

}  // namespace sluice
