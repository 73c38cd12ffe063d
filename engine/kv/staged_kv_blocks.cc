#include "engine/kv/staged_kv_blocks.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace sluice {

absl::StatusOr<std::vector<DeviceKvArray>> SelectKvArrays(absl::Span<const DeviceKvArray> arrays,
                                                          const KvCacheSpec& spec,
                                                          absl::Span<const int32_t> layers) {
  const int64_t per_layer = spec.v_floats_per_token > 0 ? 2 : 1;
  if (spec.num_layers <= 0 || static_cast<int64_t>(arrays.size()) != spec.num_layers * per_layer) {
    return absl::InvalidArgumentError(
        absl::StrCat("device KV cache has ", arrays.size(), " arrays; a cache of ",
                     spec.num_layers, " layers with", per_layer == 2 ? "" : "out", " V has ",
                     spec.num_layers * per_layer));
  }
  for (const DeviceKvArray& a : arrays) {
    if (a.num_blocks != arrays[0].num_blocks) {
      return absl::InvalidArgumentError("device KV arrays differ in block count");
    }
  }
  if (layers.empty()) return std::vector<DeviceKvArray>(arrays.begin(), arrays.end());
  std::vector<DeviceKvArray> out;
  int32_t previous = -1;
  for (int32_t layer : layers) {
    if (layer <= previous || layer >= spec.num_layers) {
      return absl::InvalidArgumentError(absl::StrCat(
          "stored layer ", layer, " is out of range or out of order (", spec.num_layers,
          " layers)"));
    }
    previous = layer;
    for (int64_t j = 0; j < per_layer; ++j) out.push_back(arrays[layer * per_layer + j]);
  }
  return out;
}

absl::StatusOr<std::unique_ptr<StagedKvBlockCopier>> StagedKvBlockCopier::Create(
    std::unique_ptr<transfer::DeviceCopier> copier, const StagedKvBlocksOptions& options) {
  if (copier == nullptr) return absl::InvalidArgumentError("StagedKvBlockCopier needs a copier");
  if (options.slot_bytes <= 0 || options.num_slots < 1) {
    return absl::InvalidArgumentError(absl::StrCat("staging of ", options.num_slots,
                                                   " slots of ", options.slot_bytes, " bytes"));
  }
  if (copier->num_lanes() < options.num_slots) {
    return absl::InvalidArgumentError(absl::StrCat("copier has ", copier->num_lanes(),
                                                   " lanes for ", options.num_slots, " slots"));
  }
  return std::unique_ptr<StagedKvBlockCopier>(
      new StagedKvBlockCopier(std::move(copier), options));
}

StagedKvBlockCopier::~StagedKvBlockCopier() {
  (void)WaitAll(absl::OkStatus());  // no deadline: the staging is freed after
  if (staging_ != nullptr) copier_->FreeStaging(staging_);
}

std::vector<StagedKvBlockCopier::Chunk> StagedKvBlockCopier::PlanChunks(size_t num_blocks,
                                                                        int64_t block_bytes,
                                                                        int64_t slot_bytes) {
  const size_t per_chunk =
      static_cast<size_t>(std::max<int64_t>(1, block_bytes > 0 ? slot_bytes / block_bytes : 1));
  std::vector<Chunk> chunks;
  for (size_t first = 0; first < num_blocks; first += per_chunk) {
    chunks.push_back(Chunk{first, std::min(per_chunk, num_blocks - first)});
  }
  return chunks;
}

absl::StatusOr<int64_t> StagedKvBlockCopier::Validate(absl::Span<const DeviceKvArray> arrays,
                                                      absl::Span<const int32_t> blocks,
                                                      size_t buffer_bytes) const {
  if (arrays.empty()) return absl::InvalidArgumentError("no KV arrays to copy blocks of");
  int64_t block_bytes = 0;
  for (size_t a = 0; a < arrays.size(); ++a) {
    if (arrays[a].base == nullptr || arrays[a].block_bytes <= 0 || arrays[a].num_blocks <= 0) {
      return absl::InvalidArgumentError(absl::StrCat("KV array ", a, " has no memory"));
    }
    block_bytes += arrays[a].block_bytes;
  }
  for (int32_t b : blocks) {
    for (const DeviceKvArray& array : arrays) {
      if (b < 0 || b >= array.num_blocks) {
        return absl::InvalidArgumentError(
            absl::StrCat("block ", b, " outside a KV array of ", array.num_blocks, " blocks"));
      }
    }
  }
  const int64_t want = static_cast<int64_t>(blocks.size()) * block_bytes;
  if (static_cast<int64_t>(buffer_bytes) != want) {
    return absl::InvalidArgumentError(absl::StrCat("host buffer of ", buffer_bytes, " bytes for ",
                                                   blocks.size(), " blocks of ", block_bytes));
  }
  return block_bytes;
}

absl::Status StagedKvBlockCopier::EnsureSlots(int64_t block_bytes) {
  const int64_t want = std::max(options_.slot_bytes, block_bytes);
  if (staging_ != nullptr && slot_bytes_ >= want) return absl::OkStatus();
  if (staging_ != nullptr) {  // every call waits for its lanes before returning
    copier_->FreeStaging(staging_);
    staging_ = nullptr;
    slot_bytes_ = 0;
  }
  absl::StatusOr<void*> staging = copier_->AllocateStaging(want * options_.num_slots);
  if (!staging.ok()) return staging.status();
  staging_ = static_cast<uint8_t*>(*staging);
  slot_bytes_ = want;
  return absl::OkStatus();
}

absl::Status StagedKvBlockCopier::EnqueueChunk(absl::Span<const DeviceKvArray> arrays,
                                               absl::Span<const int32_t> blocks,
                                               const Chunk& chunk, int slot, bool to_device) {
  // Slot layout (array-major): array a's pieces of the chunk's blocks, in chunk order, at
  // chunk.count * (Σ block_bytes of the arrays before a).
  const transfer::CopyDirection direction =
      to_device ? transfer::CopyDirection::kHostToDevice : transfer::CopyDirection::kDeviceToHost;
  int64_t array_offset = 0;
  for (const DeviceKvArray& array : arrays) {
    uint8_t* const staged = Slot(slot) + static_cast<int64_t>(chunk.count) * array_offset;
    uint8_t* const base = static_cast<uint8_t*>(array.base);
    size_t i = 0;
    while (i < chunk.count) {
      // A run: consecutive block ids, one copy.
      size_t n = 1;
      const int32_t first = blocks[chunk.first + i];
      while (i + n < chunk.count && blocks[chunk.first + i + n] == first + static_cast<int32_t>(n)) {
        ++n;
      }
      uint8_t* const device = base + static_cast<int64_t>(first) * array.block_bytes;
      uint8_t* const host = staged + static_cast<int64_t>(i) * array.block_bytes;
      const int64_t bytes = static_cast<int64_t>(n) * array.block_bytes;
      absl::Status s = to_device ? copier_->CopyAsync(slot, device, host, bytes, direction)
                                 : copier_->CopyAsync(slot, host, device, bytes, direction);
      if (!s.ok()) return s;
      ++stats_.num_device_copies;
      i += n;
    }
    array_offset += array.block_bytes;
  }
  ++stats_.num_chunks;
  return absl::OkStatus();
}

absl::Status StagedKvBlockCopier::OrderAfter(const void* after) {
  if (after == nullptr) return absl::OkStatus();
  for (int lane = 0; lane < options_.num_slots; ++lane) {
    if (absl::Status s = copier_->WaitFence(lane, after); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status StagedKvBlockCopier::WaitLane(int lane, absl::Time deadline) {
  absl::Status s = deadline == absl::InfiniteFuture() ? copier_->Wait(lane)
                                                      : copier_->WaitUntil(lane, deadline);
  if (absl::IsDeadlineExceeded(s)) stalled_ = true;
  return s;
}

absl::Status StagedKvBlockCopier::WaitAll(absl::Status status, absl::Time deadline) {
  for (int lane = 0; lane < options_.num_slots; ++lane) {
    absl::Status s = WaitLane(lane, deadline);
    if (status.ok() && !s.ok()) status = s;
  }
  if (absl::IsDeadlineExceeded(status)) ++stats_.num_deadline_exceeded;
  return status;
}

absl::Status StagedKvBlockCopier::Begin(absl::Time& deadline) {
  deadline = options_.copy_timeout == absl::InfiniteDuration()
                 ? absl::InfiniteFuture()
                 : absl::Now() + options_.copy_timeout;
  if (!stalled_) return absl::OkStatus();
  stalled_ = false;
  absl::Status s = WaitAll(absl::OkStatus(), deadline);
  if (absl::IsDeadlineExceeded(s)) {
    return absl::DeadlineExceededError(
        "device copies of an earlier call that exceeded its deadline are still running");
  }
  return s;
}

absl::StatusOr<std::vector<const void*>> StagedKvBlockCopier::StalledFences() {
  std::vector<const void*> fences;
  if (!stalled_) return fences;
  for (int lane = 0; lane < options_.num_slots; ++lane) {
    absl::StatusOr<const void*> f = copier_->RecordFence(lane);
    if (!f.ok()) return f.status();
    if (*f != nullptr) fences.push_back(*f);
  }
  return fences;
}

absl::StatusOr<StagedKvBlockCopier::CopyPlan> StagedKvBlockCopier::Open(
    absl::Span<const DeviceKvArray> arrays, absl::Span<const int32_t> blocks,
    size_t buffer_bytes) {
  absl::StatusOr<int64_t> block_bytes = Validate(arrays, blocks, buffer_bytes);
  if (!block_bytes.ok()) return block_bytes.status();
  CopyPlan plan;
  plan.block_bytes = *block_bytes;
  if (blocks.empty()) return plan;
  if (absl::Status s = Begin(plan.deadline); !s.ok()) return s;
  if (absl::Status s = EnsureSlots(plan.block_bytes); !s.ok()) return s;
  plan.chunks = PlanChunks(blocks.size(), plan.block_bytes, slot_bytes_);
  return plan;
}

namespace {

// Repack moves one chunk between its array-major slot and the block-major host buffer.
void Repack(absl::Span<const DeviceKvArray> arrays, size_t count, int64_t block_bytes,
            uint8_t* slot, uint8_t* host, bool to_slot) {
  int64_t array_offset = 0;
  for (const DeviceKvArray& array : arrays) {
    const int64_t piece = array.block_bytes;
    for (size_t i = 0; i < count; ++i) {
      uint8_t* s = slot + static_cast<int64_t>(count) * array_offset + static_cast<int64_t>(i) * piece;
      uint8_t* h = host + static_cast<int64_t>(i) * block_bytes + array_offset;
      if (to_slot) {
        std::memcpy(s, h, static_cast<size_t>(piece));
      } else {
        std::memcpy(h, s, static_cast<size_t>(piece));
      }
    }
    array_offset += piece;
  }
}

}  // namespace

absl::Status StagedKvBlockCopier::Gather(absl::Span<const DeviceKvArray> arrays,
                                         absl::Span<const int32_t> blocks,
                                         absl::Span<uint8_t> out, const void* after) {
  absl::StatusOr<CopyPlan> plan = Open(arrays, blocks, out.size());
  if (!plan.ok() || plan->chunks.empty()) return plan.status();
  const std::vector<Chunk>& chunks = plan->chunks;
  const size_t slots = static_cast<size_t>(options_.num_slots);
  absl::Status status = OrderAfter(after);
  size_t next = 0;  // next chunk to enqueue
  for (; next < chunks.size() && next < slots && status.ok(); ++next) {
    status = EnqueueChunk(arrays, blocks, chunks[next], static_cast<int>(next % slots), false);
  }
  // Chunk k's slot is repacked once its lane is done; then chunk k + slots takes the slot.
  for (size_t k = 0; k < chunks.size() && status.ok(); ++k) {
    const int slot = static_cast<int>(k % slots);
    status = WaitLane(slot, plan->deadline);
    if (!status.ok()) break;
    Repack(arrays, chunks[k].count, plan->block_bytes, Slot(slot),
           out.data() + static_cast<int64_t>(chunks[k].first) * plan->block_bytes, false);
    if (next < chunks.size()) {
      status = EnqueueChunk(arrays, blocks, chunks[next], slot, false);
      ++next;
    }
  }
  status = WaitAll(std::move(status), plan->deadline);
  if (status.ok()) stats_.bytes_gathered += static_cast<int64_t>(out.size());
  return status;
}

absl::Status StagedKvBlockCopier::Scatter(absl::Span<const DeviceKvArray> arrays,
                                          absl::Span<const uint8_t> in,
                                          absl::Span<const int32_t> blocks,
                                          const void* after) {
  absl::StatusOr<CopyPlan> plan = Open(arrays, blocks, in.size());
  if (!plan.ok() || plan->chunks.empty()) return plan.status();
  const std::vector<Chunk>& chunks = plan->chunks;
  const size_t slots = static_cast<size_t>(options_.num_slots);
  absl::Status status = OrderAfter(after);
  // Chunk k is packed into its slot once the chunk before it in that slot (k - slots) has
  // reached the device, while the other lanes' copies run.
  for (size_t k = 0; k < chunks.size() && status.ok(); ++k) {
    const int slot = static_cast<int>(k % slots);
    if (k >= slots) {
      status = WaitLane(slot, plan->deadline);
      if (!status.ok()) break;
    }
    uint8_t* host = const_cast<uint8_t*>(in.data()) +
                    static_cast<int64_t>(chunks[k].first) * plan->block_bytes;
    Repack(arrays, chunks[k].count, plan->block_bytes, Slot(slot), host, true);
    status = EnqueueChunk(arrays, blocks, chunks[k], slot, true);
  }
  status = WaitAll(std::move(status), plan->deadline);
  if (status.ok()) stats_.bytes_scattered += static_cast<int64_t>(in.size());
  return status;
}

}  // namespace sluice
