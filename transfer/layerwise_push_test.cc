#include "transfer/layerwise_push.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"

namespace sluice::transfer {
namespace {

constexpr int kLayers = 4;
constexpr int64_t kBlockBytes = 32;
constexpr int64_t kBlocks = 16;

// One call of the fake push: which layers' regions it moved and the runs.
struct PushCall {
  std::vector<int32_t> layers;  // layer of each local region (k then v)
  std::vector<BlockRun> remote_runs, local_runs;
  absl::Time deadline;
};

// Layout: per layer a k and a v region (as KvRegionsOf), region i's memory tagged by its index.
class LayerwisePushTest : public ::testing::Test {
 protected:
  LayerwisePushTest() : memory_(2 * kLayers * kBlocks * kBlockBytes) {
    remote_.worker_address = "peer";
    for (int i = 0; i < 2 * kLayers; ++i) {
      local_.push_back({memory_.data() + i * kBlocks * kBlockBytes, kBlocks, kBlockBytes});
      remote_.regions.push_back({static_cast<uint64_t>(0x10000 * (i + 1)), kBlocks, kBlockBytes,
                                 "rkey"});
      region_layers_.push_back(i / 2);
    }
  }
  ~LayerwisePushTest() override {
    for (std::thread& t : threads_) t.join();
  }

  // Create with a push that records its calls and answers with `result(call_index)`.
  std::shared_ptr<LayerwisePush> Make(int layers_per_group, absl::Time deadline,
                                      std::function<absl::Status(int)> result = nullptr) {
    LayerwisePush::Options options;
    options.num_layers = kLayers;
    options.layers_per_group = layers_per_group;
    options.deadline = deadline;
    auto push = [this, result](const RemoteKvDescriptor& remote,
                               absl::Span<const BlockRun> remote_runs,
                               absl::Span<const KvRegion> local,
                               absl::Span<const BlockRun> local_runs,
                               absl::Time d) -> absl::Status {
      EXPECT_EQ(remote.regions.size(), local.size());
      EXPECT_EQ(remote.worker_address, "peer");
      PushCall call;
      for (const KvRegion& r : local) {
        const int64_t index = (static_cast<char*>(r.base) - memory_.data()) / (kBlocks * kBlockBytes);
        call.layers.push_back(static_cast<int32_t>(index / 2));
      }
      call.remote_runs.assign(remote_runs.begin(), remote_runs.end());
      call.local_runs.assign(local_runs.begin(), local_runs.end());
      call.deadline = d;
      int index;
      {
        absl::MutexLock lock(&mu_);
        index = static_cast<int>(calls_.size());
        calls_.push_back(call);
      }
      return result ? result(index) : absl::OkStatus();
    };
    // Each job on a thread of its own: pushes never run on the reporting thread.
    auto executor = [this](std::function<void()> job) {
      absl::MutexLock lock(&mu_);
      threads_.emplace_back(std::move(job));
    };
    auto made = LayerwisePush::Create(push, executor, remote_, {{8, 2}, {3, 4}}, local_,
                                      region_layers_, options);
    EXPECT_TRUE(made.ok()) << made.status();
    return *made;
  }

  // Waits for the push's outcome.
  static absl::Status Outcome(LayerwisePush& push) {
    absl::Notification done;
    absl::Status result;
    push.OnDone([&](absl::Status s) {
      result = s;
      done.Notify();
    });
    EXPECT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
    return result;
  }

  std::vector<PushCall> Calls() {
    absl::MutexLock lock(&mu_);
    return calls_;
  }

  std::vector<char> memory_;
  RemoteKvDescriptor remote_;
  std::vector<KvRegion> local_;
  std::vector<int32_t> region_layers_;
  absl::Mutex mu_;
  std::vector<PushCall> calls_;
  std::vector<std::thread> threads_;
};

TEST_F(LayerwisePushTest, PushesEveryLayerOnceInOrder) {
  auto push = Make(1, absl::Now() + absl::Seconds(30));
  ASSERT_TRUE(push->Start({5, 6, 7, 0}).ok());
  for (int l = 0; l < kLayers; ++l) push->LayerReady(l, nullptr);
  ASSERT_TRUE(Outcome(*push).ok());
  const std::vector<PushCall> calls = Calls();
  ASSERT_EQ(calls.size(), kLayers);
  for (int l = 0; l < kLayers; ++l) {
    EXPECT_EQ(calls[l].layers, (std::vector<int32_t>{l, l})) << "push " << l;
    // The peer's first 4 reserved blocks (8, 9, then 3, 4) take local 5, 6, 7, 0.
    EXPECT_EQ(calls[l].remote_runs, (std::vector<BlockRun>{{8, 2}, {3, 2}}));
    EXPECT_EQ(calls[l].local_runs, (std::vector<BlockRun>{{5, 3}, {0, 1}}));
  }
  EXPECT_EQ(push->num_groups_pushed(), kLayers);
  EXPECT_EQ(push->bytes_pushed(), 2 * kLayers * 4 * kBlockBytes);
}

TEST_F(LayerwisePushTest, GroupsOfLayersMoveTogether) {
  auto push = Make(3, absl::Now() + absl::Seconds(30));  // groups {0,1,2}, {3}
  EXPECT_EQ(push->num_groups(), 2);
  ASSERT_TRUE(push->Start({1, 2}).ok());
  push->LayerReady(0, nullptr);
  push->LayerReady(1, nullptr);
  EXPECT_TRUE(Calls().empty());  // the group is not complete yet
  push->LayerReady(2, nullptr);
  push->LayerReady(3, nullptr);
  ASSERT_TRUE(Outcome(*push).ok());
  const std::vector<PushCall> calls = Calls();
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0].layers, (std::vector<int32_t>{0, 0, 1, 1, 2, 2}));
  EXPECT_EQ(calls[1].layers, (std::vector<int32_t>{3, 3}));
}

TEST_F(LayerwisePushTest, WaitsForEachLayersEventBeforeItsPush) {
  auto push = Make(1, absl::Now() + absl::Seconds(30));
  ASSERT_TRUE(push->Start({0}).ok());
  std::vector<int> waited;
  absl::Mutex wm;
  for (int l = 0; l < kLayers; ++l) {
    push->LayerReady(l, [&, l] {
      absl::MutexLock lock(&wm);
      // The push of layer l - 1 is recorded before layer l's wait runs: one at a time, in order.
      EXPECT_EQ(Calls().size(), static_cast<size_t>(l));
      waited.push_back(l);
      return absl::OkStatus();
    });
  }
  ASSERT_TRUE(Outcome(*push).ok());
  EXPECT_EQ(waited, (std::vector<int>{0, 1, 2, 3}));
}

TEST_F(LayerwisePushTest, FailedLayerStopsTheRest) {
  auto push = Make(1, absl::Now() + absl::Seconds(30), [](int call) {
    return call == 1 ? absl::UnavailableError("peer gone") : absl::OkStatus();
  });
  ASSERT_TRUE(push->Start({0, 1}).ok());
  for (int l = 0; l < kLayers; ++l) push->LayerReady(l, nullptr);
  const absl::Status s = Outcome(*push);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(s.message().find("layer group 1 of 4: peer gone"), std::string::npos) << s;
  EXPECT_EQ(Calls().size(), 2u);  // layers 2 and 3 never posted
  EXPECT_EQ(push->num_groups_pushed(), 1);
}

TEST_F(LayerwisePushTest, FailedWaitFailsWithoutPushing) {
  auto push = Make(1, absl::Now() + absl::Seconds(30));
  ASSERT_TRUE(push->Start({0}).ok());
  push->LayerReady(0, [] { return absl::InternalError("event failed"); });
  EXPECT_EQ(Outcome(*push).code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(Calls().empty());
}

TEST_F(LayerwisePushTest, DeadlinePassesEveryPushAndStopsLateOnes) {
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  auto push = Make(2, deadline);
  ASSERT_TRUE(push->Start({0}).ok());
  for (int l = 0; l < kLayers; ++l) push->LayerReady(l, nullptr);
  ASSERT_TRUE(Outcome(*push).ok());
  for (const PushCall& c : Calls()) EXPECT_EQ(c.deadline, deadline);

  auto late = Make(1, absl::Now() - absl::Milliseconds(1));
  ASSERT_TRUE(late->Start({0}).ok());
  late->LayerReady(0, nullptr);
  EXPECT_EQ(Outcome(*late).code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(Calls().size(), 2u);  // only the first push's two groups
}

TEST_F(LayerwisePushTest, CancelMidwayEndsAfterThePushInFlight) {
  absl::Notification in_flight, release;
  auto push = Make(1, absl::Now() + absl::Seconds(30), [&](int call) {
    if (call == 0) {
      in_flight.Notify();
      release.WaitForNotification();
    }
    return absl::OkStatus();
  });
  ASSERT_TRUE(push->Start({0, 1, 2}).ok());
  push->LayerReady(0, nullptr);
  push->LayerReady(1, nullptr);
  ASSERT_TRUE(in_flight.WaitForNotificationWithTimeout(absl::Seconds(10)));
  push->Cancel(absl::CancelledError("client went away"));
  absl::Notification done;
  absl::Status outcome;
  push->OnDone([&](absl::Status s) {
    outcome = s;
    done.Notify();
  });
  // Not done while layer 0's push may still touch the buffers.
  EXPECT_FALSE(done.WaitForNotificationWithTimeout(absl::Milliseconds(50)));
  release.Notify();
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(outcome.code(), absl::StatusCode::kCancelled);
  push->LayerReady(2, nullptr);  // after the cancel: ignored
  push->LayerReady(3, nullptr);
  EXPECT_EQ(Calls().size(), 1u);
}

TEST_F(LayerwisePushTest, CancelBeforeAnyLayerIsDoneAtOnce) {
  auto push = Make(1, absl::Now() + absl::Seconds(30));
  ASSERT_TRUE(push->Start({0}).ok());
  push->Cancel(absl::AbortedError("forward failed"));
  EXPECT_EQ(Outcome(*push).code(), absl::StatusCode::kAborted);
  EXPECT_TRUE(Calls().empty());
}

TEST_F(LayerwisePushTest, EveryDoneCallbackRunsOnceInOrder) {
  auto push = Make(2, absl::Now() + absl::Seconds(30));
  std::vector<int> order;
  absl::Mutex om;
  for (int i = 0; i < 2; ++i) {
    push->OnDone([&, i](absl::Status s) {
      absl::MutexLock lock(&om);
      EXPECT_TRUE(s.ok()) << s;
      order.push_back(i);
    });
  }
  ASSERT_TRUE(push->Start({0}).ok());
  for (int l = 0; l < kLayers; ++l) push->LayerReady(l, nullptr);
  ASSERT_TRUE(Outcome(*push).ok());  // a callback given after the end runs at once
  push->Cancel(absl::CancelledError("too late"));  // every group landed: no effect
  absl::MutexLock lock(&om);
  EXPECT_EQ(order, (std::vector<int>{0, 1}));
  EXPECT_EQ(push->num_groups_pushed(), 2);
}

TEST_F(LayerwisePushTest, OutOfOrderOrRepeatedLayerFails) {
  auto push = Make(1, absl::Now() + absl::Seconds(30));
  ASSERT_TRUE(push->Start({0}).ok());
  push->LayerReady(0, nullptr);
  push->LayerReady(0, nullptr);  // repeated
  const absl::Status s = Outcome(*push);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_LE(Calls().size(), 1u);

  auto early = Make(1, absl::Now() + absl::Seconds(30));
  early->LayerReady(0, nullptr);  // before Start
  EXPECT_EQ(Outcome(*early).code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(LayerwisePushTest, StartRejectsTooFewReservedBlocks) {
  auto push = Make(1, absl::Now() + absl::Seconds(30));
  std::vector<int32_t> seven(7, 0);  // the peer reserved 6
  EXPECT_EQ(push->Start(seven).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Outcome(*push).code(), absl::StatusCode::kInvalidArgument);
  auto bad_block = Make(1, absl::Now() + absl::Seconds(30));
  EXPECT_EQ(bad_block->Start({kBlocks}).code(), absl::StatusCode::kInvalidArgument);
}

TEST(LayerwisePushCreateTest, RejectsBadLayout) {
  auto push = [](const RemoteKvDescriptor&, absl::Span<const BlockRun>,
                 absl::Span<const KvRegion>, absl::Span<const BlockRun>,
                 absl::Time) { return absl::OkStatus(); };
  auto executor = [](std::function<void()> job) { job(); };
  LayerwisePush::Options options;
  options.num_layers = 2;
  char mem[64];
  RemoteKvDescriptor remote{"p", {{1, 2, 32, "k"}}};
  std::vector<KvRegion> local = {{mem, 2, 32}};
  EXPECT_FALSE(LayerwisePush::Create(push, executor, remote, {{0, 1}}, local, {2}, options).ok());
  EXPECT_FALSE(LayerwisePush::Create(push, executor, remote, {{0, 1}}, local, {}, options).ok());
  options.layers_per_group = 0;
  EXPECT_FALSE(LayerwisePush::Create(push, executor, remote, {{0, 1}}, local, {0}, options).ok());
}

}  // namespace
}  // namespace sluice::transfer
