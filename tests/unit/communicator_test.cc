// CpuCommunicator: every collective on 2, 3 and 4 ranks (threads), exact expected values, error
// cases reported consistently on every rank, and the abort/deadline path.
#include <functional>
#include <thread>
#include <vector>

#include "engine/model/safetensors.h"
#include "engine/parallel/cpu_communicator.h"
#include "gtest/gtest.h"

namespace sluice {
namespace {

// RunRanks runs body(rank, comm) on one thread per rank and returns each rank's status.
std::vector<absl::Status> RunRanks(CpuCommunicatorGroup& group,
                                   const std::function<absl::Status(int, Communicator&)>& body) {
  const int n = group.world_size();
  std::vector<absl::Status> status(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] { status[r] = body(r, *group.communicator(r)); });
  }
  for (std::thread& t : threads) t.join();
  return status;
}

std::unique_ptr<CpuCommunicatorGroup> MakeGroup(int n, absl::Duration timeout = absl::Seconds(20)) {
  auto group = CpuCommunicatorGroup::Create(n, timeout);
  EXPECT_TRUE(group.ok()) << group.status();
  return std::move(*group);
}

class CommunicatorTest : public ::testing::TestWithParam<int> {};

TEST_P(CommunicatorTest, AllReduceSumF32IsRankOrderedAndIdenticalOnAllRanks) {
  const int n = GetParam();
  auto group = MakeGroup(n);
  std::vector<std::vector<float>> data(n);
  auto status = RunRanks(*group, [&](int r, Communicator& c) {
    EXPECT_EQ(c.rank(), r);
    EXPECT_EQ(c.world_size(), n);
    // Element 0 is chosen so the summation order matters in float32: 1e8 + 1 + ... rounds
    // differently from 1 + ... + 1e8; element 1 checks a plain sum.
    data[r] = {r == 0 ? 1e8f : 1.0f, static_cast<float>(r + 1), -0.5f};
    return c.AllReduceSum(absl::MakeSpan(data[r]));
  });
  float expect0 = 1e8f;
  for (int r = 1; r < n; ++r) expect0 += 1.0f;  // rank order 0..N-1
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(status[r].ok()) << status[r];
    EXPECT_EQ(data[r][0], expect0);
    EXPECT_EQ(data[r][1], static_cast<float>(n * (n + 1) / 2));
    EXPECT_EQ(data[r][2], -0.5f * n);
  }
}

TEST_P(CommunicatorTest, AllReduceSumBf16) {
  const int n = GetParam();
  auto group = MakeGroup(n);
  std::vector<std::vector<uint16_t>> data(n);
  auto status = RunRanks(*group, [&](int r, Communicator& c) {
    data[r] = {FloatToBf16(1.5f), FloatToBf16(static_cast<float>(r))};
    return c.AllReduceSum(data[r].data(), 2, CommDataType::kBFloat16);
  });
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(status[r].ok()) << status[r];
    EXPECT_EQ(Bf16ToFloat(data[r][0]), 1.5f * n);
    EXPECT_EQ(Bf16ToFloat(data[r][1]), static_cast<float>(n * (n - 1) / 2));
  }
}

TEST_P(CommunicatorTest, AllGatherAndAllGatherV) {
  const int n = GetParam();
  auto group = MakeGroup(n);
  std::vector<std::vector<int32_t>> equal(n), varied(n);
  // Rank r contributes r + 1 elements valued 10 r + i to the V variant.
  std::vector<int64_t> counts;
  for (int r = 0; r < n; ++r) counts.push_back(r + 1);
  auto status = RunRanks(*group, [&](int r, Communicator& c) {
    const int32_t mine[2] = {r, -r};
    equal[r].assign(2 * n, 0);
    if (absl::Status s = c.AllGather(mine, 2, equal[r].data(), CommDataType::kInt32); !s.ok()) {
      return s;
    }
    std::vector<int32_t> send;
    for (int i = 0; i <= r; ++i) send.push_back(10 * r + i);
    varied[r].assign(n * (n + 1) / 2, -1);
    return c.AllGatherV(send.data(), r + 1, varied[r].data(), counts, CommDataType::kInt32);
  });
  std::vector<int32_t> want_equal, want_varied;
  for (int r = 0; r < n; ++r) {
    want_equal.push_back(r);
    want_equal.push_back(-r);
    for (int i = 0; i <= r; ++i) want_varied.push_back(10 * r + i);
  }
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(status[r].ok()) << status[r];
    EXPECT_EQ(equal[r], want_equal);
    EXPECT_EQ(varied[r], want_varied);
  }
}

TEST_P(CommunicatorTest, AllToAllVDispatchAndCombineRoundTrip) {
  const int n = GetParam();
  auto group = MakeGroup(n);
  // Rank s sends (s + d) % 3 elements to rank d, valued 1000 s + 100 d + i.
  auto count = [](int s, int d) { return static_cast<int64_t>((s + d) % 3); };
  std::vector<std::vector<float>> received(n), returned(n);
  std::vector<std::vector<int64_t>> learned(n);
  auto status = RunRanks(*group, [&](int r, Communicator& c) {
    std::vector<int64_t> send_counts;
    std::vector<float> send;
    for (int d = 0; d < n; ++d) {
      send_counts.push_back(count(r, d));
      for (int64_t i = 0; i < count(r, d); ++i) send.push_back(1000.0f * r + 100.0f * d + i);
    }
    auto recv_counts = ExchangeCounts(c, send_counts);
    if (!recv_counts.ok()) return recv_counts.status();
    learned[r] = *recv_counts;
    int64_t total = 0;
    for (int64_t k : *recv_counts) total += k;
    received[r].assign(total, -1.0f);
    if (absl::Status s = c.AllToAllV(send.data(), send_counts, received[r].data(), *recv_counts,
                                     CommDataType::kFloat32);
        !s.ok()) {
      return s;
    }
    // Combine: send everything back (counts swap roles); the origin gets its rows in order.
    returned[r].assign(send.size(), -1.0f);
    return c.AllToAllV(received[r].data(), *recv_counts, returned[r].data(), send_counts,
                       CommDataType::kFloat32);
  });
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(status[r].ok()) << status[r];
    std::vector<int64_t> want_counts;
    std::vector<float> want_recv, want_back;
    for (int s = 0; s < n; ++s) {
      want_counts.push_back(count(s, r));
      for (int64_t i = 0; i < count(s, r); ++i) want_recv.push_back(1000.0f * s + 100.0f * r + i);
    }
    for (int d = 0; d < n; ++d) {
      for (int64_t i = 0; i < count(r, d); ++i) want_back.push_back(1000.0f * r + 100.0f * d + i);
    }
    EXPECT_EQ(learned[r], want_counts);
    EXPECT_EQ(received[r], want_recv);
    EXPECT_EQ(returned[r], want_back);
  }
}

TEST_P(CommunicatorTest, MismatchedAllReduceSizesAreInvalidArgumentOnEveryRank) {
  const int n = GetParam();
  auto group = MakeGroup(n);
  auto status = RunRanks(*group, [&](int r, Communicator& c) {
    std::vector<float> data(r == n - 1 ? 3 : 4, 1.0f);
    absl::Status s = c.AllReduceSum(absl::MakeSpan(data));
    // The group stays usable after a validation error.
    std::vector<float> ok(2, 1.0f);
    if (absl::Status again = c.AllReduceSum(absl::MakeSpan(ok)); !again.ok()) return again;
    EXPECT_EQ(ok[0], static_cast<float>(n));
    return s;
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(status[r].code(), absl::StatusCode::kInvalidArgument) << status[r];
    EXPECT_NE(status[r].message().find("AllReduceSum: rank 0 has 4 elements"), std::string::npos)
        << status[r];
  }
}

TEST_P(CommunicatorTest, InconsistentAllToAllCountsAreInvalidArgument) {
  const int n = GetParam();
  auto group = MakeGroup(n);
  auto status = RunRanks(*group, [&](int r, Communicator& c) {
    std::vector<int64_t> send_counts(n, 1), recv_counts(n, 1);
    if (r == 1) recv_counts[0] = 2;  // rank 0 sends 1, rank 1 expects 2
    std::vector<float> send(n, 0.0f), recv(n + 1, 0.0f);
    return c.AllToAllV(send.data(), send_counts, recv.data(), recv_counts, CommDataType::kFloat32);
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(status[r].code(), absl::StatusCode::kInvalidArgument) << status[r];
  }
}

TEST_P(CommunicatorTest, MismatchedOperationsAndDtypesAreInvalidArgument) {
  const int n = GetParam();
  auto group = MakeGroup(n);
  auto ops = RunRanks(*group, [&](int r, Communicator& c) {
    std::vector<float> data(2, 1.0f);
    if (r == 0) return c.Barrier();
    return c.AllReduceSum(absl::MakeSpan(data));
  });
  auto dtypes = RunRanks(*group, [&](int r, Communicator& c) {
    std::vector<float> data(2, 1.0f);
    return c.AllReduceSum(data.data(), 2,
                          r == 0 ? CommDataType::kBFloat16 : CommDataType::kFloat32);
  });
  auto ints = RunRanks(*group, [&](int r, Communicator& c) {
    int32_t x[2] = {1, 2};
    return c.AllReduceSum(x, 2, CommDataType::kInt32);
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(ops[r].code(), absl::StatusCode::kInvalidArgument) << ops[r];
    EXPECT_EQ(dtypes[r].code(), absl::StatusCode::kInvalidArgument) << dtypes[r];
    EXPECT_EQ(ints[r].code(), absl::StatusCode::kInvalidArgument) << ints[r];
  }
}

TEST_P(CommunicatorTest, BarrierAndWrongCountLengths) {
  const int n = GetParam();
  auto group = MakeGroup(n);
  auto status = RunRanks(*group, [&](int r, Communicator& c) {
    if (absl::Status s = c.Barrier(); !s.ok()) return s;
    std::vector<int64_t> short_counts(n - 1, 1);
    int32_t x = r;
    std::vector<int32_t> recv(n, 0);
    return c.AllGatherV(&x, 1, recv.data(), short_counts, CommDataType::kInt32);
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(status[r].code(), absl::StatusCode::kInvalidArgument) << status[r];
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, CommunicatorTest, ::testing::Values(2, 3, 4));

TEST(CpuCommunicatorGroupTest, CreateRejectsBadArguments) {
  EXPECT_EQ(CpuCommunicatorGroup::Create(0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CpuCommunicatorGroup::Create(2, absl::ZeroDuration()).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto single = CpuCommunicatorGroup::Create(1);
  ASSERT_TRUE(single.ok());
  std::vector<float> x = {2.5f};
  ASSERT_TRUE((*single)->communicator(0)->AllReduceSum(absl::MakeSpan(x)).ok());
  EXPECT_EQ(x[0], 2.5f);
}

// A rank that never arrives: the waiting rank gets DeadlineExceeded after the (short) timeout, and
// the group is then aborted for everyone.
TEST(CpuCommunicatorGroupTest, MissingPeerIsDeadlineExceededThenAborted) {
  auto group = MakeGroup(2, absl::Milliseconds(50));
  std::vector<float> x = {1.0f};
  absl::Status s = group->communicator(0)->AllReduceSum(absl::MakeSpan(x));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_EQ(group->communicator(1)->Barrier().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(x[0], 1.0f);  // untouched
}

TEST(CpuCommunicatorGroupTest, AbortWakesWaitingRanks) {
  auto group = MakeGroup(2, absl::Seconds(30));
  absl::Status waiting;
  std::thread t([&] { waiting = group->communicator(0)->Barrier(); });
  // No timing assumption: Abort either reaches the waiter or precedes its arrival; both fail.
  group->Abort();
  t.join();
  EXPECT_EQ(waiting.code(), absl::StatusCode::kFailedPrecondition) << waiting;
}

}  // namespace
}  // namespace sluice
