// DramTier: the kvstore's fast tier: a host arena (registered with UCX by the service, so clients
// read and write slots with one-sided RMA) cut into fixed-size block slots, with an index and
// per-layout LRU lists.
//
// The arena is divided into pages of `page_bytes`. A page is given to one layout (one block size)
// when that layout first needs room and is then cut into floor(page_bytes / block_bytes) slots,
// so blocks of a page are contiguous (slot i at page base + i * block_bytes) and a page is one
// transfer::KvRegion. A page whose blocks are all unpinned can be taken back for another layout.
//
// Slot life: kFree -> Allocate -> kWriting (filled by the caller or a client's RMA push) ->
// Publish -> kReady (indexed, in the LRU) -> evicted/freed -> kFree. Pins (leases held by
// readers and writers) keep a slot from being evicted or reused; a slot dropped while pinned is
// freed when its last pin goes (Release).
//
// Thread safety: none; BlockStore guards it with its mutex.
#ifndef SLUICE_SERVICES_KVSTORE_DRAM_TIER_H_
#define SLUICE_SERVICES_KVSTORE_DRAM_TIER_H_

#include <cstdint>
#include <functional>
#include <list>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "services/kvstore/block_key.h"

namespace sluice::kvstore {

struct SlotId {
  int32_t page = -1;
  int32_t index = -1;
  bool operator==(const SlotId&) const = default;
};

struct DramTierOptions {
  uint8_t* arena = nullptr;  // not owned; must outlive the tier
  int64_t arena_bytes = 0;
  int64_t page_bytes = 64ll << 20;  // the largest block size the tier accepts
};

class DramTier {
 public:
  enum class State { kFree, kWriting, kReady };

  struct Slot {
    State state = State::kFree;
    BlockKey key;
    uint64_t checksum = 0;
    int32_t pins = 0;
    bool on_ssd = false;     // a copy is on the SSD tier (eviction needs no write)
    bool doomed = false;     // dropped while pinned: free at the last Unpin
    absl::Time last_access;
    std::list<SlotId>::iterator lru;  // valid while kReady and not doomed
  };

  // Page: geometry of one page (for descriptors). layout_id/block_bytes are 0 while unassigned.
  struct Page {
    uint8_t* base = nullptr;
    uint64_t layout_id = 0;
    int64_t block_bytes = 0;
    int32_t num_slots = 0;
  };

  // Called with a kReady slot just before it is evicted (capacity) or expired, while its bytes
  // are still valid (e.g. to write it to the SSD tier first).
  using EvictFn = std::function<void(SlotId, const Slot&)>;

  explicit DramTier(const DramTierOptions& options);

  int32_t num_pages() const { return static_cast<int32_t>(pages_.size()); }
  Page page(int32_t p) const;
  const Slot& slot(SlotId id) const { return pages_[id.page].slots[id.index]; }
  Slot& slot(SlotId id) { return pages_[id.page].slots[id.index]; }
  uint8_t* data(SlotId id) const;
  int64_t block_bytes(SlotId id) const { return pages_[id.page].geometry.block_bytes; }

  // Find: the kReady (not doomed) slot holding `key`.
  std::optional<SlotId> Find(const BlockKey& key) const;

  // Allocate: a kWriting slot with one pin for a block of `key.layout_id` and `block_bytes`
  // (1 <= block_bytes <= page_bytes). Takes a free slot of the layout, else an unassigned page,
  // else evicts the layout's least recently used unpinned block, else takes back another layout's
  // page with no pinned slot (evicting its blocks). nullopt if everything is pinned.
  std::optional<SlotId> Allocate(const BlockKey& key, int64_t block_bytes, const EvictFn& on_evict);

  // Publish: kWriting -> kReady under its key with `checksum`, most recently used at `now`.
  // Returns false (and frees nothing) if another slot already holds the key.
  bool Publish(SlotId id, uint64_t checksum, bool on_ssd, absl::Time now);

  void Pin(SlotId id) { slot(id).pins++; }
  // Unpin: drops one pin; frees the slot if it was doomed or still kWriting and this was the last.
  void Unpin(SlotId id);
  // Drop: removes a slot from the index (e.g. its checksum failed); freed now if unpinned,
  // else at the last Unpin.
  void Drop(SlotId id);
  void Touch(SlotId id, absl::Time now);

  // ExpireOlderThan: evicts (through on_evict) every unpinned kReady block last used before
  // `cutoff`; returns how many.
  int64_t ExpireOlderThan(absl::Time cutoff, const EvictFn& on_evict);

  int64_t num_blocks() const { return num_ready_; }
  int64_t num_bytes() const { return ready_bytes_; }
  int64_t num_evicted() const { return num_evicted_; }
  int64_t capacity_bytes() const { return options_.arena_bytes; }

 private:
  struct PageState {
    Page geometry;
    std::vector<Slot> slots;
    std::vector<int32_t> free;  // free slot indices
  };

  void Free(SlotId id);
  // Evicts a kReady slot (calls on_evict, then frees it).
  void Evict(SlotId id, const EvictFn& on_evict);
  void AssignPage(int32_t p, uint64_t layout_id, int64_t block_bytes);
  std::optional<SlotId> TakeFree(uint64_t layout_id);

  const DramTierOptions options_;
  std::vector<PageState> pages_;
  std::vector<int32_t> unassigned_pages_;
  absl::flat_hash_map<uint64_t, std::vector<int32_t>> layout_pages_;
  absl::flat_hash_map<uint64_t, std::list<SlotId>> lru_;  // per layout, front = most recent
  absl::flat_hash_map<BlockKey, SlotId> index_;
  int64_t num_ready_ = 0;
  int64_t ready_bytes_ = 0;
  int64_t num_evicted_ = 0;
};

}  // namespace sluice::kvstore

#endif  // SLUICE_SERVICES_KVSTORE_DRAM_TIER_H_
