#include "services/kvstore/dram_tier.h"

#include <cassert>

namespace sluice::kvstore {

DramTier::DramTier(const DramTierOptions& options) : options_(options) {
  const int64_t n = options.page_bytes > 0 ? options.arena_bytes / options.page_bytes : 0;
  pages_.resize(static_cast<size_t>(n));
  for (int64_t p = n - 1; p >= 0; --p) {
    pages_[p].geometry.base = options.arena + p * options.page_bytes;
    unassigned_pages_.push_back(static_cast<int32_t>(p));
  }
}

DramTier::Page DramTier::page(int32_t p) const { return pages_[p].geometry; }

uint8_t* DramTier::data(SlotId id) const {
  const Page& g = pages_[id.page].geometry;
  return g.base + static_cast<int64_t>(id.index) * g.block_bytes;
}

std::optional<SlotId> DramTier::Find(const BlockKey& key) const {
  auto it = index_.find(key);
  if (it == index_.end()) return std::nullopt;
  return it->second;
}

void DramTier::AssignPage(int32_t p, uint64_t layout_id, int64_t block_bytes) {
  PageState& ps = pages_[p];
  ps.geometry.layout_id = layout_id;
  ps.geometry.block_bytes = block_bytes;
  ps.geometry.num_slots = static_cast<int32_t>(options_.page_bytes / block_bytes);
  ps.slots.assign(static_cast<size_t>(ps.geometry.num_slots), Slot{});
  ps.free.clear();
  for (int32_t i = ps.geometry.num_slots - 1; i >= 0; --i) ps.free.push_back(i);
  layout_pages_[layout_id].push_back(p);
}

std::optional<SlotId> DramTier::TakeFree(uint64_t layout_id) {
  auto it = layout_pages_.find(layout_id);
  if (it == layout_pages_.end()) return std::nullopt;
  for (int32_t p : it->second) {
    PageState& ps = pages_[p];
    if (ps.free.empty()) continue;
    const int32_t i = ps.free.back();
    ps.free.pop_back();
    return SlotId{p, i};
  }
  return std::nullopt;
}

std::optional<SlotId> DramTier::Allocate(const BlockKey& key, int64_t block_bytes,
                                         const EvictFn& on_evict) {
  if (block_bytes <= 0 || block_bytes > options_.page_bytes) return std::nullopt;
  const uint64_t layout = key.layout_id;
  std::optional<SlotId> id = TakeFree(layout);
  if (!id && !unassigned_pages_.empty()) {
    const int32_t p = unassigned_pages_.back();
    unassigned_pages_.pop_back();
    AssignPage(p, layout, block_bytes);
    id = TakeFree(layout);
  }
  if (!id) {
    // The layout's least recently used unpinned block.
    auto lru = lru_.find(layout);
    if (lru != lru_.end()) {
      for (auto it = lru->second.rbegin(); it != lru->second.rend(); ++it) {
        if (slot(*it).pins == 0) {
          Evict(*it, on_evict);
          id = TakeFree(layout);
          break;
        }
      }
    }
  }
  if (!id) {
    // Take back a page of another layout that nobody reads or writes right now.
    for (int32_t p = 0; p < num_pages() && !id; ++p) {
      PageState& ps = pages_[p];
      if (ps.geometry.layout_id == layout) continue;
      bool busy = false;
      for (const Slot& s : ps.slots) busy = busy || s.pins > 0 || s.state == State::kWriting;
      if (busy) continue;
      for (int32_t i = 0; i < ps.geometry.num_slots; ++i) {
        if (ps.slots[i].state == State::kReady) Evict(SlotId{p, i}, on_evict);
      }
      auto& owner = layout_pages_[ps.geometry.layout_id];
      std::erase(owner, p);
      if (owner.empty()) layout_pages_.erase(ps.geometry.layout_id);
      AssignPage(p, layout, block_bytes);
      id = TakeFree(layout);
    }
  }
  if (!id) return std::nullopt;
  Slot& s = slot(*id);
  s = Slot{};
  s.state = State::kWriting;
  s.key = key;
  s.pins = 1;
  return id;
}

bool DramTier::Publish(SlotId id, uint64_t checksum, bool on_ssd, absl::Time now) {
  Slot& s = slot(id);
  assert(s.state == State::kWriting);
  if (index_.contains(s.key)) return false;
  s.state = State::kReady;
  s.checksum = checksum;
  s.on_ssd = on_ssd;
  s.last_access = now;
  auto& list = lru_[s.key.layout_id];
  list.push_front(id);
  s.lru = list.begin();
  index_[s.key] = id;
  num_ready_++;
  ready_bytes_ += block_bytes(id);
  return true;
}

void DramTier::Touch(SlotId id, absl::Time now) {
  Slot& s = slot(id);
  if (s.state != State::kReady || s.doomed) return;
  s.last_access = now;
  auto& list = lru_[s.key.layout_id];
  list.splice(list.begin(), list, s.lru);
}

void DramTier::Drop(SlotId id) {
  Slot& s = slot(id);
  if (s.state == State::kFree) return;
  if (s.state == State::kReady && !s.doomed) {
    index_.erase(s.key);
    lru_[s.key.layout_id].erase(s.lru);
    num_ready_--;
    ready_bytes_ -= block_bytes(id);
  }
  s.doomed = true;
  if (s.pins == 0) Free(id);
}

void DramTier::Free(SlotId id) {
  Slot& s = slot(id);
  if (s.state == State::kReady && !s.doomed) {
    Drop(id);  // unindexes, then (pins == 0) comes back here doomed
    return;
  }
  s = Slot{};
  pages_[id.page].free.push_back(id.index);
}

void DramTier::Unpin(SlotId id) {
  Slot& s = slot(id);
  if (s.pins > 0) s.pins--;
  if (s.pins == 0 && (s.doomed || s.state == State::kWriting)) Free(id);
}

void DramTier::Evict(SlotId id, const EvictFn& on_evict) {
  if (on_evict) on_evict(id, slot(id));
  num_evicted_++;
  Drop(id);
}

int64_t DramTier::ExpireOlderThan(absl::Time cutoff, const EvictFn& on_evict) {
  int64_t n = 0;
  for (auto& [layout, list] : lru_) {
    // Back = least recent; pinned blocks are skipped (they expire after their lease).
    for (auto it = list.end(); it != list.begin();) {
      --it;
      const SlotId id = *it;
      if (slot(id).last_access >= cutoff) break;
      if (slot(id).pins > 0) continue;
      it = std::next(it);
      if (on_evict) on_evict(id, slot(id));
      Drop(id);
      ++n;
    }
  }
  return n;
}

}  // namespace sluice::kvstore
