// The batch-invariant mode's MoE (the DeepSeek runner in CudaRunnerOptions::batch_invariant):
// MoeRouterLogitsCuda → MoeRoutingCuda → MoeExpertsCuda on the grouped path at every step size.
// A probe token's routing, router logits and expert output are bit for bit the same alone
// (m = 1) and as one of 7, 64 and 256 tokens of random others (which change how the rows are
// sorted into expert tiles); the output is also checked against MoeExpertsCpu. Needs a GPU:
// part of kernels_cuda_test, skipped without one.
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/moe/moe_cuda.h"
#include "kernels/moe/moe_experts.h"

namespace sluice::kernels {
namespace {

using cuda_test::Download;
using cuda_test::ExpectClose;
using cuda_test::FirstBitMismatch;
using cuda_test::RandomBf16;
using cuda_test::ToFloat;
using cuda_test::Upload;

constexpr int64_t kHidden = 256, kInter = 128, kExperts = 16, kTopK = 4;

struct MoeRun {
  std::vector<float> out, logits, weights;
  std::vector<int32_t> ids;
};

template <typename T>
std::vector<T> DownloadRaw(const DeviceBuffer<T>& b) {
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<T> host(b.size());
  EXPECT_TRUE(b.CopyToHost(host.data()).ok());
  return host;
}

class MoeBatchInvariantTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SLUICE_SKIP_WITHOUT_CUDA();
    rng_ = cuda_test::Rng();
    gate_ = RandomBf16(kExperts * kHidden, rng_, -0.1f, 0.1f);
    gate_up_ = RandomBf16(kExperts * 2 * kInter * kHidden, rng_, -0.06f, 0.06f);
    down_ = RandomBf16(kExperts * kHidden * kInter, rng_, -0.08f, 0.08f);
    d_gate_ = Upload(gate_);
    d_gate_up_ = Upload(gate_up_);
    d_down_ = Upload(down_);
    params_.num_experts = kExperts;
    params_.top_k = kTopK;
    params_.scoring = MoeScoring::kSigmoid;
    params_.norm_topk_prob = true;
    params_.n_group = 1;
    params_.topk_group = 1;
  }

  MoeRun Run(const std::vector<bf16>& x_host) {
    const int64_t T = static_cast<int64_t>(x_host.size()) / kHidden;
    auto x = Upload(x_host);
    auto logits = DeviceBuffer<float>::Create(T * kExperts);
    auto ids = DeviceBuffer<int32_t>::Create(T * kTopK);
    auto weights = DeviceBuffer<float>::Create(T * kTopK);
    auto ws = DeviceBuffer<uint8_t>::Create(
        MoeCudaWorkspaceBytes(T, kTopK, kExperts, kHidden, kInter));
    auto out = cuda_test::NanBuffer(static_cast<size_t>(T * kHidden));
    EXPECT_TRUE(logits.ok() && ids.ok() && weights.ok() && ws.ok());
    EXPECT_TRUE(
        MoeRouterLogitsCuda(x.data(), d_gate_.data(), T, kHidden, kExperts, logits->data(), nullptr)
            .ok());
    EXPECT_TRUE(MoeRoutingCuda(static_cast<const float*>(logits->data()), nullptr, T, params_,
                               ids->data(), weights->data(), nullptr)
                    .ok());
    const absl::Status s = MoeExpertsCuda(
        x.data(), ids->data(), weights->data(), T, kHidden, kInter, kTopK, kExperts,
        d_gate_up_.data(), d_down_.data(), out.data(), MoeCudaWorkspace{ws->data(), ws->bytes()},
        nullptr, MoeExpertsPath::kGrouped);
    EXPECT_TRUE(s.ok()) << s;
    return {Download(out), DownloadRaw(*logits), DownloadRaw(*weights), DownloadRaw(*ids)};
  }

  std::mt19937 rng_;
  std::vector<bf16> gate_, gate_up_, down_;
  DeviceBuffer<bf16> d_gate_, d_gate_up_, d_down_;
  MoeRoutingParams params_;
};

TEST_F(MoeBatchInvariantTest, GroupedExpertsRowsAreBatchInvariant) {
  const std::vector<bf16> probe = RandomBf16(kHidden, rng_, -1.0f, 1.0f);
  const MoeRun alone = Run(probe);
  // The expert output against the CPU reference with the device's routing.
  {
    std::vector<float> gu = ToFloat(gate_up_), dn = ToFloat(down_);
    std::vector<MoeExpertWeights> experts(kExperts);
    for (int64_t e = 0; e < kExperts; ++e) {
      experts[e] = {gu.data() + e * 2 * kInter * kHidden, dn.data() + e * kHidden * kInter};
    }
    std::vector<float> ref(kHidden);
    MoeWorkspace ws;
    const std::vector<float> x = ToFloat(probe);
    ASSERT_TRUE(MoeExpertsCpu(x.data(), 1, kHidden, kInter, alone.ids.data(),
                              alone.weights.data(), kTopK, experts, ref.data(), ws)
                    .ok());
    ExpectClose("grouped experts vs MoeExpertsCpu", alone.out, ref, 1.0 / 32, 1.0 / 64);
  }
  for (int64_t m : {7, 64, 256}) {
    for (int64_t at : {int64_t{0}, m - 1}) {
      SCOPED_TRACE(absl::StrCat("m=", m, " probe at ", at));
      std::vector<bf16> x = RandomBf16(static_cast<size_t>(m * kHidden), rng_, -1.0f, 1.0f);
      std::copy(probe.begin(), probe.end(), x.begin() + at * kHidden);
      const MoeRun run = Run(x);
      auto slice = [&](const std::vector<float>& v, int64_t w) {
        return std::vector<float>(v.begin() + at * w, v.begin() + (at + 1) * w);
      };
      EXPECT_EQ(FirstBitMismatch(slice(run.logits, kExperts), alone.logits), -1) << "logits";
      EXPECT_EQ(FirstBitMismatch(slice(run.weights, kTopK), alone.weights), -1) << "weights";
      EXPECT_EQ(std::vector<int32_t>(run.ids.begin() + at * kTopK,
                                     run.ids.begin() + (at + 1) * kTopK),
                alone.ids);
      EXPECT_EQ(FirstBitMismatch(slice(run.out, kHidden), alone.out), -1) << "expert output";
    }
  }
}

}  // namespace
}  // namespace sluice::kernels
