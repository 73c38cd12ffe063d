// MoeExpertsCuda through the cuBLASLt prefill path (moe_prefill_gemm_cuda.h) against the CPU
// reference MoeExpertsCpu (moe_experts.h) on fresh random bf16-valued inputs, every output
// element checked. Needs a GPU: part of kernels_cuda_test (the argument checks run anywhere).
#include "kernels/moe/moe_prefill_gemm_cuda.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/linear/linear_cuda.h"
#include "kernels/moe/moe_cuda.h"
#include "kernels/moe/moe_experts.h"

namespace sluice::kernels {
namespace {

using cuda_test::ExpectClose;
using cuda_test::RandomBf16;
using cuda_test::ToFloat;
using cuda_test::Upload;

// Two GEMMs with bf16-rounded gate/up sums, activations and expert outputs, then a bf16 output
// (moe_cuda_test.cc's tolerances for the other paths).
constexpr double kRtol = 1.0 / 64;
constexpr double kAtol = 1.0 / 256;

// MoeOptions taking steps of at least min_tokens tokens over `streams` streams.
MoeOptions Options(int64_t min_tokens, int streams) {
  MoeOptions o;
  o.prefill_gemm_min_tokens = min_tokens;
  o.prefill_gemm_streams = streams;
  return o;
}

struct Case {
  std::string name;
  int64_t tokens, experts, top_k, hidden, inter;
  std::vector<int32_t> unused;  // experts that receive no token (their weights are NaN)
};

// Weights (NaN for unused experts: reading one would poison outputs), x, routing with distinct
// experts per token; two rows get ids outside [0, E) on the device (they must contribute
// nothing) and a valid id with weight 0 for the CPU reference, which rejects such ids.
struct Inputs {
  std::vector<bf16> x, gate_up, down;
  std::vector<float> gate_up_f, down_f;  // used experts only, per expert [2I·H | H·I]
  std::vector<MoeExpertWeights> cpu;
  std::vector<int32_t> ids, cpu_ids;
  std::vector<float> weights, cpu_weights;

  Inputs(const Case& c, std::mt19937& rng) {
    const int64_t e_n = c.experts, h = c.hidden, i = c.inter, t = c.tokens, k = c.top_k;
    const bf16 nan = FloatToBf16(std::nanf(""));
    gate_up.assign(e_n * 2 * i * h, nan);
    down.assign(e_n * h * i, nan);
    std::vector<int32_t> used;
    for (int32_t e = 0; e < e_n; ++e) {
      if (std::find(c.unused.begin(), c.unused.end(), e) == c.unused.end()) used.push_back(e);
    }
    const float a = 1.0f / std::sqrt(static_cast<float>(h));
    const float b = 1.0f / std::sqrt(static_cast<float>(i));
    gate_up_f.resize(used.size() * 2 * i * h);
    down_f.resize(used.size() * h * i);
    cpu.assign(e_n, MoeExpertWeights{});
    for (size_t u = 0; u < used.size(); ++u) {
      const int64_t e = used[u];
      const auto gu = RandomBf16(2 * i * h, rng, -a, a);
      const auto dn = RandomBf16(h * i, rng, -b, b);
      std::copy(gu.begin(), gu.end(), gate_up.begin() + e * 2 * i * h);
      std::copy(dn.begin(), dn.end(), down.begin() + e * h * i);
      const auto guf = ToFloat(gu), dnf = ToFloat(dn);
      float* g = gate_up_f.data() + u * 2 * i * h;
      float* d = down_f.data() + u * h * i;
      std::copy(guf.begin(), guf.end(), g);
      std::copy(dnf.begin(), dnf.end(), d);
      cpu[e] = MoeExpertWeights{g, d};
    }
    x = RandomBf16(t * h, rng, -1.0f, 1.0f);
    // Skewed: the first used expert takes every token (more rows than any GEMM tile); the other
    // k - 1 picks are distinct draws from the rest.
    ids.resize(t * k);
    std::vector<int32_t> rest(used.begin() + 1, used.end());
    for (int64_t r = 0; r < t; ++r) {
      std::shuffle(rest.begin(), rest.end(), rng);
      ids[r * k] = used[0];
      for (int64_t j = 1; j < k; ++j) ids[r * k + j] = rest[j - 1];
    }
    weights = ToFloat(RandomBf16(t * k, rng, 0.05f, 0.5f));
    cpu_ids = ids;
    cpu_weights = weights;
    ids[3 * k + 1] = static_cast<int32_t>(e_n);
    ids[(t - 1) * k + k - 1] = -1;
    cpu_weights[3 * k + 1] = 0.0f;
    cpu_weights[(t - 1) * k + k - 1] = 0.0f;
  }
};

std::vector<float> RunCpu(const Case& c, const Inputs& in) {
  const auto xf = ToFloat(in.x);
  std::vector<float> out(c.tokens * c.hidden);
  MoeWorkspace ws;
  const absl::Status s = MoeExpertsCpu(xf.data(), c.tokens, c.hidden, c.inter, in.cpu_ids.data(),
                                       in.cpu_weights.data(), c.top_k, in.cpu, out.data(), ws);
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

// Runs MoeExpertsCuda (kAuto: the grouped path at these sizes) with `gemm` in the workspace on
// a fresh stream into a NaN-filled output.
std::vector<float> RunCuda(const Case& c, const Inputs& in, MoePrefillGemm* gemm) {
  auto d_x = Upload(in.x);
  auto d_ids = Upload(in.ids);
  auto d_w = Upload(in.weights);
  auto d_gu = Upload(in.gate_up);
  auto d_down = Upload(in.down);
  auto d_out = cuda_test::NanBuffer(static_cast<size_t>(c.tokens * c.hidden));
  const size_t ws_bytes = MoeCudaWorkspaceBytes(c.tokens, c.top_k, c.experts, c.hidden, c.inter);
  auto d_ws = DeviceBuffer<uint8_t>::Create(ws_bytes);
  EXPECT_TRUE(d_ws.ok());
  EXPECT_EQ(cudaMemset(d_ws->data(), 0xFF, ws_bytes), cudaSuccess);
  auto stream = CudaStream::Create();
  EXPECT_TRUE(stream.ok());
  // The uploads and the memsets ran on the legacy stream, which a non-blocking one does not
  // wait for.
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const absl::Status s =
      MoeExpertsCuda(d_x.data(), d_ids.data(), d_w.data(), c.tokens, c.hidden, c.inter, c.top_k,
                     c.experts, d_gu.data(), d_down.data(), d_out.data(),
                     MoeCudaWorkspace{d_ws->data(), ws_bytes, gemm}, stream->get());
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_TRUE(stream->Synchronize().ok());
  return cuda_test::Download(d_out);
}

// The cuBLASLt path on one stream and spread over kMoePrefillGemmMaxStreams, then (a
// MoePrefillGemm whose threshold is one token above the step) the grouped WMMA fallback, each
// against the CPU reference.
void CheckCase(const Case& c, int64_t max_tokens) {
  auto rng = cuda_test::Rng();
  const Inputs in(c, rng);
  const auto want = RunCpu(c, in);
  auto lt = CublasLt::Create();
  ASSERT_TRUE(lt.ok()) << lt.status();
  for (int streams : {1, kMoePrefillGemmMaxStreams}) {
    auto gemm = MoePrefillGemm::Create(lt->get(), max_tokens, c.top_k, c.experts, c.hidden,
                                       c.inter, Options(c.tokens, streams));
    ASSERT_TRUE(gemm.ok()) << gemm.status();
    ASSERT_EQ((*gemm)->lanes(), streams);
    ASSERT_TRUE((*gemm)->Takes(c.tokens, c.top_k, c.experts, c.hidden, c.inter, nullptr));
    ExpectClose(absl::StrCat("moe prefill gemm ", c.name, " streams=", streams),
                RunCuda(c, in, gemm->get()), want, kRtol, kAtol);
    EXPECT_EQ((*gemm)->runs(), 1);
    if (streams == 1) {
      auto above = MoePrefillGemm::Create(lt->get(), max_tokens, c.top_k, c.experts, c.hidden,
                                          c.inter, Options(c.tokens + 1, 1));
      ASSERT_TRUE(above.ok()) << above.status();
      ExpectClose(absl::StrCat("moe grouped fallback ", c.name), RunCuda(c, in, above->get()),
                  want, kRtol, kAtol);
      EXPECT_EQ((*above)->runs(), 0);
    }
  }
}

// 16 experts top-4, two of which get no token, one of which gets all 300.
TEST(MoePrefillGemmCudaTest, SmallExpertsMatchCpuReference) {
  SLUICE_SKIP_WITHOUT_CUDA();
  CheckCase(Case{"E16 top4 H256 I128 T300", 300, 16, 4, 256, 128, {3, 11}}, 512);
}

// DeepSeek-V2-Lite expert dims (64 experts top-6, hidden 2048, moe_intermediate 1408) at 512
// tokens; 40 experts get no token.
TEST(MoePrefillGemmCudaTest, DeepseekV2LiteDimsMatchCpuReference) {
  SLUICE_SKIP_WITHOUT_CUDA();
  std::vector<int32_t> unused(40);
  std::iota(unused.begin(), unused.end(), 24);
  CheckCase(Case{"E64 top6 H2048 I1408 T512", 512, 64, 6, 2048, 1408, unused}, 512);
}

// Never taken while capturing (the read-back would break the graph), below the threshold, with
// the threshold 0, for other shapes or past max_tokens; options out of range are refused.
TEST(MoePrefillGemmCudaTest, TakesOnlyEligibleSteps) {
  SLUICE_SKIP_WITHOUT_CUDA();
  auto lt = CublasLt::Create();
  ASSERT_TRUE(lt.ok()) << lt.status();
  for (const MoeOptions& bad :
       {Options(-1, 1), Options(256, 0), Options(256, kMoePrefillGemmMaxStreams + 1)}) {
    EXPECT_EQ(MoePrefillGemm::Create(lt->get(), 1024, 4, 16, 256, 128, bad).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
  auto off = MoePrefillGemm::Create(lt->get(), 1024, 4, 16, 256, 128, Options(0, 1));
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_FALSE((*off)->Takes(512, 4, 16, 256, 128, nullptr));
  const int64_t min_tokens = MoeOptions().prefill_gemm_min_tokens;
  auto gemm = MoePrefillGemm::Create(lt->get(), 1024, 4, 16, 256, 128, Options(min_tokens, 1));
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  MoePrefillGemm& g = **gemm;
  EXPECT_TRUE(g.Takes(min_tokens, 4, 16, 256, 128, nullptr));
  EXPECT_FALSE(g.Takes(min_tokens - 1, 4, 16, 256, 128, nullptr));
  EXPECT_FALSE(g.Takes(1025, 4, 16, 256, 128, nullptr));
  EXPECT_FALSE(g.Takes(512, 8, 16, 256, 128, nullptr));
  EXPECT_FALSE(g.Takes(512, 4, 16, 512, 128, nullptr));
  auto stream = CudaStream::Create();
  ASSERT_TRUE(stream.ok());
  ASSERT_EQ(cudaStreamBeginCapture(stream->get(), cudaStreamCaptureModeThreadLocal), cudaSuccess);
  EXPECT_FALSE(g.Takes(512, 4, 16, 256, 128, stream->get()));
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(stream->get(), &graph), cudaSuccess);
  if (graph != nullptr) cudaGraphDestroy(graph);
  EXPECT_TRUE(g.Takes(512, 4, 16, 256, 128, stream->get()));
}

TEST(MoePrefillGemmArgsTest, BadArgumentsAreInvalidArgument) {
  EXPECT_EQ(MoePrefillGemm::Create(nullptr, 16, 2, 8, 64, 64).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MoePrefillGemm::ScratchBytes(0, 2, 64), 0u);
  EXPECT_EQ(MoePrefillGemm::ScratchBytes(10, 2, 64), size_t{10 * 2 * 128 * 2});
}

}  // namespace
}  // namespace sluice::kernels
