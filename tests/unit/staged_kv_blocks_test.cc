// StagedKvBlockCopier (engine/kv/staged_kv_blocks.h) on host memory: HostMemcpyCopier stands in
// for the CUDA copier and runs each lane's copies only at its Wait, so a pipeline that repacks
// a slot before waiting for it, or refills a slot still being copied, reads stale bytes here.
// Checked: the serialization (per block, arrays in order), coalesced runs per array, chunking
// over the slots, the round trip, slot growth for large blocks, array selection by layer, and
// the error paths (bad block, bad buffer, a failing copy: every lane drained on return), and
// the device fences each lane waits for before its first copy.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "engine/kv/staged_kv_blocks.h"
#include "transfer/device_copier.h"

namespace sluice {
namespace {

using transfer::CopyDirection;
using transfer::HostMemcpyCopier;

// FakeDeviceCache: `arrays` arrays of `num_blocks` blocks, array a's blocks of piece_bytes[a];
// byte j of block b of array a holds a recognizable value.
struct FakeDeviceCache {
  std::vector<std::vector<uint8_t>> memory;
  std::vector<DeviceKvArray> arrays;
  FakeDeviceCache(int64_t num_blocks, const std::vector<int64_t>& piece_bytes) {
    memory.resize(piece_bytes.size());
    for (size_t a = 0; a < piece_bytes.size(); ++a) {
      memory[a].resize(static_cast<size_t>(num_blocks * piece_bytes[a]));
      for (size_t j = 0; j < memory[a].size(); ++j) memory[a][j] = Value(a, j);
      arrays.push_back({memory[a].data(), num_blocks, piece_bytes[a]});
    }
  }
  static uint8_t Value(size_t a, size_t j) { return static_cast<uint8_t>(a * 61 + j * 7 + 1); }
  // The serialization of `block`: every array's piece, in order.
  std::vector<uint8_t> Serialized(int32_t block) const {
    std::vector<uint8_t> out;
    for (size_t a = 0; a < arrays.size(); ++a) {
      const uint8_t* p = memory[a].data() + block * arrays[a].block_bytes;
      out.insert(out.end(), p, p + arrays[a].block_bytes);
    }
    return out;
  }
};

std::unique_ptr<StagedKvBlockCopier> MakeCopier(int64_t slot_bytes, int lanes = 2,
                                                HostMemcpyCopier** raw = nullptr) {
  auto copier = std::make_unique<HostMemcpyCopier>(lanes);
  if (raw != nullptr) *raw = copier.get();
  StagedKvBlocksOptions options;
  options.slot_bytes = slot_bytes;
  options.num_slots = lanes;
  auto staged = StagedKvBlockCopier::Create(std::move(copier), options);
  EXPECT_TRUE(staged.ok()) << staged.status();
  return staged.ok() ? *std::move(staged) : nullptr;
}

TEST(StagedKvBlocksTest, PlanChunksFillsSlotsWithWholeBlocks) {
  auto chunks = StagedKvBlockCopier::PlanChunks(10, 100, 350);
  ASSERT_EQ(chunks.size(), 4u);
  const std::vector<std::pair<size_t, size_t>> want = {{0, 3}, {3, 3}, {6, 3}, {9, 1}};
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(chunks[i].first, want[i].first);
    EXPECT_EQ(chunks[i].count, want[i].second);
  }
  // A block larger than the slot still moves, one per chunk.
  chunks = StagedKvBlockCopier::PlanChunks(3, 500, 350);
  ASSERT_EQ(chunks.size(), 3u);
  EXPECT_EQ(chunks[2].first, 2u);
  EXPECT_EQ(chunks[2].count, 1u);
  EXPECT_TRUE(StagedKvBlockCopier::PlanChunks(0, 100, 350).empty());
}

TEST(StagedKvBlocksTest, GatherSerializesBlocksInOrderWithCoalescedRuns) {
  // 2 layers x (K 12 B, V 8 B) per block: a 40-byte block; slots of 2 blocks.
  FakeDeviceCache cache(8, {12, 8, 12, 8});
  HostMemcpyCopier* raw = nullptr;
  auto copier = MakeCopier(80, 2, &raw);
  ASSERT_NE(copier, nullptr);
  const std::vector<int32_t> blocks = {4, 5, 0, 2, 3};
  std::vector<uint8_t> out(blocks.size() * 40, 0xee);
  ASSERT_TRUE(copier->Gather(cache.arrays, blocks, absl::MakeSpan(out)).ok());
  for (size_t i = 0; i < blocks.size(); ++i) {
    const std::vector<uint8_t> want = cache.Serialized(blocks[i]);
    EXPECT_TRUE(std::equal(want.begin(), want.end(), out.begin() + i * 40)) << "block " << i;
  }
  // Chunks {4,5} (one run), {0,2} (two runs), {3} (one run), each run one copy per array.
  const StagedKvBlocksStats s = copier->stats();
  EXPECT_EQ(s.num_chunks, 3);
  EXPECT_EQ(s.num_device_copies, 4 * (1 + 2 + 1));
  EXPECT_EQ(raw->num_copies(), 16);
  EXPECT_EQ(s.bytes_gathered, 200);
  EXPECT_EQ(copier->slot_bytes(), 80);
}

TEST(StagedKvBlocksTest, ScatterRoundTripsAndLeavesOtherBlocksAlone) {
  FakeDeviceCache src(8, {6, 6, 6, 6});
  FakeDeviceCache dst(8, {6, 6, 6, 6});
  for (auto& m : dst.memory) std::fill(m.begin(), m.end(), 0);
  auto copier = MakeCopier(48);  // 2 blocks of 24 B per slot
  ASSERT_NE(copier, nullptr);
  const std::vector<int32_t> from = {1, 2, 3, 7, 6, 5, 0};
  std::vector<uint8_t> bytes(from.size() * 24);
  ASSERT_TRUE(copier->Gather(src.arrays, from, absl::MakeSpan(bytes)).ok());
  const std::vector<int32_t> to = {0, 1, 2, 3, 4, 5, 7};  // block 6 of dst stays untouched
  ASSERT_TRUE(copier->Scatter(dst.arrays, bytes, to).ok());
  for (size_t i = 0; i < to.size(); ++i) {
    EXPECT_EQ(dst.Serialized(to[i]), src.Serialized(from[i])) << "block " << to[i];
  }
  EXPECT_EQ(dst.Serialized(6), std::vector<uint8_t>(24, 0));
  EXPECT_EQ(copier->stats().bytes_scattered, 7 * 24);
}

TEST(StagedKvBlocksTest, SlotsGrowToABlockLargerThanTheSlot) {
  // The MLA latent cache: one array per layer, no V.
  FakeDeviceCache cache(4, {100, 100, 100});
  auto copier = MakeCopier(64);
  ASSERT_NE(copier, nullptr);
  std::vector<uint8_t> out(2 * 300);
  ASSERT_TRUE(copier->Gather(cache.arrays, std::vector<int32_t>{3, 1}, absl::MakeSpan(out)).ok());
  EXPECT_EQ(copier->slot_bytes(), 300);
  const std::vector<uint8_t> want = cache.Serialized(1);
  EXPECT_TRUE(std::equal(want.begin(), want.end(), out.begin() + 300));
}

TEST(StagedKvBlocksTest, BadCallsCopyNothing) {
  FakeDeviceCache cache(4, {8, 8});
  HostMemcpyCopier* raw = nullptr;
  auto copier = MakeCopier(64, 2, &raw);
  ASSERT_NE(copier, nullptr);
  std::vector<uint8_t> out(2 * 16);
  absl::Status s = copier->Gather(cache.arrays, std::vector<int32_t>{1, 4}, absl::MakeSpan(out));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "block 4 outside a KV array of 4 blocks");
  s = copier->Scatter(cache.arrays, std::vector<uint8_t>(31), std::vector<int32_t>{0, 1});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "host buffer of 31 bytes for 2 blocks of 16");
  s = copier->Gather({}, std::vector<int32_t>{0}, absl::MakeSpan(out));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(raw->num_copies(), 0);
  // Nothing to copy is fine.
  EXPECT_TRUE(copier->Gather(cache.arrays, {}, absl::Span<uint8_t>()).ok());
  EXPECT_EQ(StagedKvBlockCopier::Create(std::make_unique<HostMemcpyCopier>(1), {}).status().code(),
            absl::StatusCode::kInvalidArgument);  // 2 slots need 2 lanes
  EXPECT_EQ(StagedKvBlockCopier::Create(nullptr, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// FailingCopier: HostMemcpyCopier whose Wait fails once `fail_after` copies have run, and
// which records whether any lane still had copies pending when the caller returned.
class FailingCopier final : public transfer::DeviceCopier {
 public:
  FailingCopier(int lanes, int64_t fail_after) : inner_(lanes), fail_after_(fail_after) {}
  int num_lanes() const override { return inner_.num_lanes(); }
  absl::StatusOr<void*> AllocateStaging(int64_t bytes) override {
    return inner_.AllocateStaging(bytes);
  }
  void FreeStaging(void* staging) override { inner_.FreeStaging(staging); }
  absl::Status CopyAsync(int lane, void* dst, const void* src, int64_t bytes,
                         CopyDirection direction) override {
    ++pending_;
    return inner_.CopyAsync(lane, dst, src, bytes, direction);
  }
  absl::Status Wait(int lane) override {
    absl::Status s = inner_.Wait(lane);
    pending_ = 0;  // approximate per lane: the tests only check "all drained" after WaitAll
    if (s.ok() && inner_.num_copies() > fail_after_) {
      return absl::InternalError("cudaMemcpyAsync: an illegal memory access was encountered");
    }
    return s;
  }
  int64_t pending() const { return pending_; }

 private:
  HostMemcpyCopier inner_;
  int64_t fail_after_;
  int64_t pending_ = 0;
};

TEST(StagedKvBlocksTest, ACopyErrorIsReturnedAfterEveryLaneDrained) {
  FakeDeviceCache cache(8, {8, 8});
  auto failing = std::make_unique<FailingCopier>(2, 3);
  FailingCopier* raw = failing.get();
  StagedKvBlocksOptions options;
  options.slot_bytes = 16;  // one block per chunk: several waits
  auto copier = StagedKvBlockCopier::Create(std::move(failing), options);
  ASSERT_TRUE(copier.ok());
  std::vector<uint8_t> out(6 * 16);
  const std::vector<int32_t> blocks = {0, 1, 2, 3, 4, 5};
  absl::Status s = (*copier)->Gather(cache.arrays, blocks, absl::MakeSpan(out));
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(raw->pending(), 0);
  s = (*copier)->Scatter(cache.arrays, out, blocks);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(raw->pending(), 0);
}

// RecordingCopier: HostMemcpyCopier that logs, per lane, each fence it was ordered after
// ("F<fence>") and each copy ("C"), in call order.
class RecordingCopier final : public transfer::DeviceCopier {
 public:
  explicit RecordingCopier(int lanes) : inner_(lanes), log_(static_cast<size_t>(lanes)) {}
  int num_lanes() const override { return inner_.num_lanes(); }
  absl::StatusOr<void*> AllocateStaging(int64_t bytes) override {
    return inner_.AllocateStaging(bytes);
  }
  void FreeStaging(void* staging) override { inner_.FreeStaging(staging); }
  absl::Status CopyAsync(int lane, void* dst, const void* src, int64_t bytes,
                         CopyDirection direction) override {
    log_.at(static_cast<size_t>(lane)) += "C";
    return inner_.CopyAsync(lane, dst, src, bytes, direction);
  }
  absl::Status WaitFence(int lane, const void* fence) override {
    if (lane < 0 || lane >= num_lanes()) return absl::InvalidArgumentError("bad lane");
    absl::StrAppend(&log_[static_cast<size_t>(lane)], "F", reinterpret_cast<uintptr_t>(fence));
    return absl::OkStatus();
  }
  absl::Status Wait(int lane) override { return inner_.Wait(lane); }
  std::vector<std::string> TakeLog() {
    std::vector<std::string> log = log_;
    for (std::string& l : log_) l.clear();
    return log;
  }

 private:
  HostMemcpyCopier inner_;
  std::vector<std::string> log_;
};

TEST(StagedKvBlocksTest, EveryLaneWaitsForTheFenceBeforeItsFirstCopy) {
  FakeDeviceCache cache(8, {8, 8});
  auto recording = std::make_unique<RecordingCopier>(2);
  RecordingCopier* raw = recording.get();
  StagedKvBlocksOptions options;
  options.slot_bytes = 16;  // one block per chunk: chunks alternate between the lanes
  auto copier = StagedKvBlockCopier::Create(std::move(recording), options);
  ASSERT_TRUE(copier.ok());
  const std::vector<int32_t> blocks = {0, 2, 4};
  std::vector<uint8_t> out(3 * 16);
  const void* fence = reinterpret_cast<const void*>(uintptr_t{7});
  ASSERT_TRUE((*copier)->Gather(cache.arrays, blocks, absl::MakeSpan(out), fence).ok());
  // Lane 0 carries chunks 0 and 2, lane 1 chunk 1: two arrays, one copy each per chunk.
  EXPECT_EQ(raw->TakeLog(), (std::vector<std::string>{"F7CCCC", "F7CC"}));
  for (size_t i = 0; i < blocks.size(); ++i) {
    EXPECT_EQ(std::vector<uint8_t>(out.begin() + i * 16, out.begin() + (i + 1) * 16),
              cache.Serialized(blocks[i]));
  }
  const void* later = reinterpret_cast<const void*>(uintptr_t{9});
  std::vector<uint8_t> in(out.rbegin(), out.rend());
  ASSERT_TRUE((*copier)->Scatter(cache.arrays, in, {1, 3, 5}, later).ok());
  EXPECT_EQ(raw->TakeLog(), (std::vector<std::string>{"F9CCCC", "F9CC"}));
  EXPECT_EQ(cache.Serialized(3), std::vector<uint8_t>(in.begin() + 16, in.begin() + 32));
  // No fence: no wait.
  ASSERT_TRUE((*copier)->Gather(cache.arrays, blocks, absl::MakeSpan(out)).ok());
  EXPECT_EQ(raw->TakeLog(), (std::vector<std::string>{"CCCC", "CC"}));
}

// StallingCopier: HostMemcpyCopier whose copies hang while `stall` is set: WaitUntil sleeps to
// its deadline and leaves them pending; a plain Wait (the device finishing) runs them.
class StallingCopier final : public transfer::DeviceCopier {
 public:
  explicit StallingCopier(int lanes) : inner_(lanes) {}
  int num_lanes() const override { return inner_.num_lanes(); }
  absl::StatusOr<void*> AllocateStaging(int64_t bytes) override {
    return inner_.AllocateStaging(bytes);
  }
  void FreeStaging(void* staging) override { inner_.FreeStaging(staging); }
  absl::Status CopyAsync(int lane, void* dst, const void* src, int64_t bytes,
                         CopyDirection direction) override {
    ++num_enqueued;
    return inner_.CopyAsync(lane, dst, src, bytes, direction);
  }
  absl::Status Wait(int lane) override { return inner_.Wait(lane); }
  absl::Status WaitUntil(int lane, absl::Time deadline) override {
    if (stall) {
      absl::SleepFor(deadline - absl::Now());
      return absl::DeadlineExceededError("copies still running");
    }
    return inner_.Wait(lane);
  }
  absl::StatusOr<const void*> RecordFence(int lane) override {
    return reinterpret_cast<const void*>(static_cast<uintptr_t>(100 + lane));
  }
  bool stall = false;
  int64_t num_enqueued = 0;

 private:
  HostMemcpyCopier inner_;
};

TEST(StagedKvBlocksTest, CopiesPastTheDeadlineFailAndDrainAtTheNextCall) {
  FakeDeviceCache cache(8, {8, 8});
  auto stalling = std::make_unique<StallingCopier>(2);
  StallingCopier* raw = stalling.get();
  StagedKvBlocksOptions options;
  options.slot_bytes = 16;
  options.copy_timeout = absl::Milliseconds(20);
  auto copier = StagedKvBlockCopier::Create(std::move(stalling), options);
  ASSERT_TRUE(copier.ok());
  const std::vector<int32_t> blocks = {0, 1, 2};
  std::vector<uint8_t> out(3 * 16);
  ASSERT_TRUE((*copier)->StalledFences()->empty());

  raw->stall = true;
  std::vector<uint8_t> in(3 * 16, 0xab);
  absl::Status s = (*copier)->Scatter(cache.arrays, in, {5, 6, 7});
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_EQ((*copier)->stats().num_deadline_exceeded, 1);
  // The late copies (chunks 0 and 1, one per lane) may still land: their lanes' fences.
  EXPECT_EQ(*(*copier)->StalledFences(),
            (std::vector<const void*>{reinterpret_cast<const void*>(uintptr_t{100}),
                                      reinterpret_cast<const void*>(uintptr_t{101})}));
  EXPECT_NE(cache.Serialized(5), std::vector<uint8_t>(16, 0xab));  // pending, not landed
  // Still stalled: the next call fails at its own deadline and copies nothing.
  const int64_t enqueued = raw->num_enqueued;
  s = (*copier)->Gather(cache.arrays, blocks, absl::MakeSpan(out));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(s.message(),
            "device copies of an earlier call that exceeded its deadline are still running");
  EXPECT_EQ(raw->num_enqueued, enqueued);
  EXPECT_EQ((*copier)->stats().num_deadline_exceeded, 2);

  // The device recovers: the next call drains the late copies first, then runs.
  raw->stall = false;
  ASSERT_TRUE((*copier)->Gather(cache.arrays, blocks, absl::MakeSpan(out)).ok());
  for (size_t i = 0; i < blocks.size(); ++i) {
    EXPECT_EQ(std::vector<uint8_t>(out.begin() + i * 16, out.begin() + (i + 1) * 16),
              cache.Serialized(blocks[i]));
  }
  EXPECT_EQ(cache.Serialized(5), std::vector<uint8_t>(16, 0xab));  // the late copies landed
  EXPECT_EQ(cache.Serialized(6), std::vector<uint8_t>(16, 0xab));
  EXPECT_TRUE((*copier)->StalledFences()->empty());
}

TEST(StagedKvBlocksTest, SelectKvArraysPicksLayersKThenV) {
  std::vector<DeviceKvArray> arrays;
  std::vector<uint8_t> mem(8);
  for (int i = 0; i < 8; ++i) arrays.push_back({&mem[i], 5, 2});
  const KvCacheSpec kv{4, 3, 3};  // K and V: two arrays per layer
  auto all = SelectKvArrays(arrays, kv, {});
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->size(), 8u);
  auto some = SelectKvArrays(arrays, kv, std::vector<int32_t>{1, 3});
  ASSERT_TRUE(some.ok());
  ASSERT_EQ(some->size(), 4u);
  EXPECT_EQ((*some)[0].base, &mem[2]);
  EXPECT_EQ((*some)[1].base, &mem[3]);
  EXPECT_EQ((*some)[2].base, &mem[6]);
  EXPECT_EQ((*some)[3].base, &mem[7]);
  const KvCacheSpec mla{8, 5, 0};  // the latent cache: one array per layer
  auto latent = SelectKvArrays(arrays, mla, std::vector<int32_t>{0, 7});
  ASSERT_TRUE(latent.ok());
  ASSERT_EQ(latent->size(), 2u);
  EXPECT_EQ((*latent)[1].base, &mem[7]);
  EXPECT_EQ(SelectKvArrays(arrays, KvCacheSpec{3, 3, 3}, {}).status().message(),
            "device KV cache has 8 arrays; a cache of 3 layers with V has 6");
  EXPECT_EQ(SelectKvArrays(arrays, kv, std::vector<int32_t>{2, 1}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SelectKvArrays(arrays, kv, std::vector<int32_t>{4}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace sluice
