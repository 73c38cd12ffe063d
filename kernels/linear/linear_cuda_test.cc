// LinearCuda (cuBLASLt, bf16 in/out, fp32 accumulation) against LinearCpu on fresh random
// bf16 inputs. Needs a GPU (kernels_cuda_test).
#include "kernels/linear/linear_cuda.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <functional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "kernels/activation/activation.h"
#include "kernels/activation/activation_cuda.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/linear/gemm_algo_search.h"
#include "kernels/linear/gemm_tuning_table.h"
#include "kernels/linear/linear.h"
#include "kernels/rms_norm/rms_norm_cuda.h"

namespace sluice::kernels {
namespace {

using cuda_test::Download;
using cuda_test::ExpectClose;
using cuda_test::NanBuffer;
using cuda_test::RandomBf16;
using cuda_test::ToFloat;
using cuda_test::Upload;

TEST(LinearCudaTest, MatchesCpuReference) {
  SLUICE_SKIP_WITHOUT_CUDA();
  auto lt = CublasLt::Create();
  ASSERT_TRUE(lt.ok()) << lt.status();
  auto rng = cuda_test::Rng();
  struct Shape {
    int64_t m, n, k;
    bool bias;
  };
  // Decode (m = 1), prefill-sized, bias epilogue, and odd sizes (unaligned leading dims).
  const Shape shapes[] = {{1, 4096, 4096, false}, {128, 4096, 4096, false}, {16, 1024, 512, true},
                          {33, 1000, 999, false}, {3, 77, 64, true},        {256, 512, 4096, true}};
  for (const Shape& s : shapes) {
    const auto x = RandomBf16(static_cast<size_t>(s.m * s.k), rng, -1.0f, 1.0f);
    const auto w = RandomBf16(static_cast<size_t>(s.n * s.k), rng, -1.0f, 1.0f);
    const auto b = RandomBf16(static_cast<size_t>(s.n), rng, -4.0f, 4.0f);
    auto d_x = Upload(x);
    auto d_w = Upload(w);
    auto d_b = Upload(b);
    auto d_y = NanBuffer(static_cast<size_t>(s.m * s.n));
    const absl::Status st = LinearCuda(**lt, d_x.data(), d_w.data(), s.bias ? d_b.data() : nullptr,
                                       d_y.data(), s.m, s.n, s.k, nullptr);
    ASSERT_TRUE(st.ok()) << st;
    const auto xf = ToFloat(x), wf = ToFloat(w), bf = ToFloat(b);
    std::vector<float> want(static_cast<size_t>(s.m * s.n));
    LinearCpu(xf.data(), wf.data(), s.bias ? bf.data() : nullptr, want.data(), s.m, s.n, s.k);
    // One bf16 rounding of the output plus fp32 accumulation-order differences.
    ExpectClose(absl::StrCat("linear m=", s.m, " n=", s.n, " k=", s.k, s.bias ? " +bias" : ""),
                Download(d_y), want, 1.0 / 128, 1e-3);
  }
}

// Runs `s` through `run` (LinearCuda or GemvCuda) and compares with LinearCpu.
template <typename Run>
void CheckShape(const std::string& what, int64_t m, int64_t n, int64_t k, bool bias,
                std::mt19937& rng, Run&& run) {
  const auto x = RandomBf16(static_cast<size_t>(m * k), rng, -1.0f, 1.0f);
  const auto w = RandomBf16(static_cast<size_t>(n * k), rng, -1.0f, 1.0f);
  const auto b = RandomBf16(static_cast<size_t>(n), rng, -4.0f, 4.0f);
  auto d_x = Upload(x);
  auto d_w = Upload(w);
  auto d_b = Upload(b);
  auto d_y = NanBuffer(static_cast<size_t>(m * n));
  const absl::Status st = run(d_x.data(), d_w.data(), bias ? d_b.data() : nullptr, d_y.data());
  ASSERT_TRUE(st.ok()) << st;
  const auto xf = ToFloat(x), wf = ToFloat(w), bf = ToFloat(b);
  std::vector<float> want(static_cast<size_t>(m * n));
  LinearCpu(xf.data(), wf.data(), bias ? bf.data() : nullptr, want.data(), m, n, k);
  ExpectClose(absl::StrCat(what, " m=", m, " n=", n, " k=", k, bias ? " +bias" : ""),
              Download(d_y), want, 1.0 / 128, 1e-3);
}

// GemvCuda for every row count it serves, k not a multiple of the unrolled stride (tail loop),
// bias, and Llama-3-8B decode shapes (o_proj, down).
TEST(LinearCudaTest, GemvMatchesCpuReference) {
  SLUICE_SKIP_WITHOUT_CUDA();
  auto rng = cuda_test::Rng();
  struct Shape {
    int64_t m, n, k;
    bool bias;
  };
  const Shape shapes[] = {{1, 4096, 4096, false}, {2, 333, 1032, true}, {3, 77, 64, true},
                          {4, 1000, 8, false},    {5, 129, 4104, true}, {8, 4096, 14336, false},
                          {7, 31, 256, false}};
  // Every served (unroll, split); split > 1 also covers k slices shorter than a warp round
  // (k = 8, 64) and a column count that leaves part of the last CTA idle (n = 77, 31).
  const std::pair<int, int> variants[] = {{4, 1}, {8, 1}, {16, 1}, {4, 2},
                                          {8, 2}, {4, 4}, {8, 4},  {4, 8}};
  for (const auto& [unroll, split] : variants) {
    for (const Shape& sh : shapes) {
      CheckShape(absl::StrCat("gemv unroll ", unroll, " split ", split), sh.m, sh.n, sh.k,
                 sh.bias, rng, [&](const bf16* x, const bf16* w, const bf16* b, bf16* y) {
                   return GemvCuda(x, w, b, y, sh.m, sh.n, sh.k, nullptr, unroll, split);
                 });
    }
  }
  auto v = NanBuffer(64);
  EXPECT_EQ(GemvCuda(v.data(), v.data(), nullptr, v.data(), 1, 4, 16, nullptr, 5).code(),
            absl::StatusCode::kInvalidArgument);  // unroll not 4, 8 or 16
  EXPECT_EQ(GemvCuda(v.data(), v.data(), nullptr, v.data(), 1, 4, 16, nullptr, 16, 2).code(),
            absl::StatusCode::kInvalidArgument);  // split 2 serves unroll 4 and 8 only
  EXPECT_EQ(GemvCuda(v.data(), v.data(), nullptr, v.data(), 1, 4, 16, nullptr, 4, 3).code(),
            absl::StatusCode::kInvalidArgument);  // split not 1, 2, 4 or 8
  EXPECT_EQ(GemvCuda(nullptr, nullptr, nullptr, nullptr, 9, 8, 8, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  auto w = NanBuffer(64);
  EXPECT_EQ(GemvCuda(w.data(), w.data(), nullptr, w.data(), 1, 4, 12, nullptr).code(),
            absl::StatusCode::kInvalidArgument);  // k % 8 != 0
}

// With autotune on, whichever kernel wins (cuBLASLt algorithm or GEMV), results stay within
// tolerance, on the tuning call and on the cached plan's next call; every plan is tuned.
TEST(LinearCudaTest, AutotuneMatchesCpuReference) {
  SLUICE_SKIP_WITHOUT_CUDA();
  auto lt = CublasLt::Create();
  ASSERT_TRUE(lt.ok()) << lt.status();
  (*lt)->set_autotune(64);
  auto rng = cuda_test::Rng();
  for (int rep = 0; rep < 2; ++rep) {
    for (const auto& sh : {std::tuple<int64_t, int64_t, int64_t, bool>{1, 6144, 4096, false},
                           {4, 512, 1024, true},
                           {64, 1024, 512, false},
                           {3, 77, 999, true}}) {
      const int64_t m = std::get<0>(sh), n = std::get<1>(sh), k = std::get<2>(sh);
      CheckShape("autotuned", m, n, k, std::get<3>(sh), rng,
                 [&](const bf16* x, const bf16* w, const bf16* b, bf16* y) {
                   return LinearCuda(**lt, x, w, b, y, m, n, k, nullptr);
                 });
    }
  }
  const std::string plans = (*lt)->DescribePlans();
  EXPECT_EQ(std::count(plans.begin(), plans.end(), '\n'), 4) << plans;
  EXPECT_EQ(plans.find("tuned 0"), std::string::npos) << plans;
}

// More tuning candidates (LinearOptions::tune_candidates) still give the reference's values;
// the count is bounded to 1..64, the search mask to the kGemmSearch* bits.
TEST(LinearCudaTest, TuneCandidatesOption) {
  SLUICE_SKIP_WITHOUT_CUDA();
  LinearOptions bad;
  for (const int n : {0, 65}) {
    bad.tune_candidates = n;
    EXPECT_EQ(CublasLt::Create(CublasLt::kDefaultWorkspaceBytes, bad).status().code(),
              absl::StatusCode::kInvalidArgument)
        << n;
  }
  bad = LinearOptions();
  for (const int mask : {-1, 8}) {
    bad.algo_search = mask;
    EXPECT_EQ(CublasLt::Create(CublasLt::kDefaultWorkspaceBytes, bad).status().code(),
              absl::StatusCode::kInvalidArgument)
        << mask;
  }
  LinearOptions options;
  options.tune_candidates = 32;
  auto lt = CublasLt::Create(CublasLt::kDefaultWorkspaceBytes, options);
  ASSERT_TRUE(lt.ok()) << lt.status();
  EXPECT_EQ((*lt)->options().tune_candidates, 32);
  (*lt)->set_autotune(256);
  auto rng = cuda_test::Rng();
  const int64_t m = 256, n = 768, k = 512;
  CheckShape("32 candidates", m, n, k, false, rng,
             [&](const bf16* x, const bf16* w, const bf16* b, bf16* y) {
               return LinearCuda(**lt, x, w, b, y, m, n, k, nullptr);
             });
  EXPECT_NE((*lt)->DescribePlans().find("tuned 1"), std::string::npos);
}

// GemvSiluMulCuda equals GemvCuda (same variant) into a [m, 2n] buffer followed by SiluMulCuda
// bit for bit, and SiluMulCpu of LinearCpu's bf16-rounded gate/up within two roundings;
// LinearSiluMulCuda (fused when the tuned plan is a served GEMV, GEMM + SiLU·mul otherwise)
// matches the same reference with tuning on and off. Shapes: a Llama-3-8B-like m = 1 row
// (n = 1792, k = 4096), bias, a tail of columns in the last CTA, k shorter than a warp round.
TEST(LinearCudaTest, GemvSiluMulMatchesUnfused) {
  SLUICE_SKIP_WITHOUT_CUDA();
  auto rng = cuda_test::Rng();
  struct Shape {
    int64_t m, n, k;  // n: outputs per row (w has 2n rows)
    bool bias;
  };
  const Shape shapes[] = {{1, 1792, 4096, false}, {3, 77, 264, true}, {8, 5, 64, false},
                          {2, 100, 8, true}};
  const std::pair<int, int> variants[] = {{4, 1}, {8, 1}, {16, 1}, {4, 2},
                                          {8, 2}, {4, 4}, {8, 4}};
  auto tuned = CublasLt::Create();
  auto untuned = CublasLt::Create();
  ASSERT_TRUE(tuned.ok() && untuned.ok());
  (*tuned)->set_autotune(64);
  for (const Shape& sh : shapes) {
    const int64_t m = sh.m, n = sh.n, k = sh.k;
    const auto x = RandomBf16(static_cast<size_t>(m * k), rng, -1.0f, 1.0f);
    const auto w = RandomBf16(static_cast<size_t>(2 * n * k), rng, -1.0f, 1.0f);
    const auto b = RandomBf16(static_cast<size_t>(2 * n), rng, -1.0f, 1.0f);
    auto d_x = Upload(x);
    auto d_w = Upload(w);
    auto d_b = Upload(b);
    const bf16* bias = sh.bias ? d_b.data() : nullptr;
    const auto xf = ToFloat(x), wf = ToFloat(w), bf = ToFloat(b);
    std::vector<float> gate_up(static_cast<size_t>(m * 2 * n));
    LinearCpu(xf.data(), wf.data(), sh.bias ? bf.data() : nullptr, gate_up.data(), m, 2 * n, k);
    gate_up = cuda_test::RoundTrip(gate_up);  // the bf16 intermediate of the unfused path
    std::vector<float> want(static_cast<size_t>(m * n));
    SiluMulCpu(gate_up.data(), want.data(), m, n);
    const std::string shape = absl::StrCat(" m=", m, " n=", n, " k=", k, sh.bias ? " +bias" : "");
    for (const auto& [unroll, split] : variants) {
      auto d_gu = NanBuffer(static_cast<size_t>(m * 2 * n));
      auto d_unfused = NanBuffer(static_cast<size_t>(m * n));
      auto d_fused = NanBuffer(static_cast<size_t>(m * n));
      ASSERT_TRUE(GemvCuda(d_x.data(), d_w.data(), bias, d_gu.data(), m, 2 * n, k, nullptr,
                           unroll, split)
                      .ok());
      ASSERT_TRUE(SiluMulCuda(d_gu.data(), d_unfused.data(), m, n, nullptr).ok());
      ASSERT_TRUE(GemvSiluMulCuda(d_x.data(), d_w.data(), bias, d_fused.data(), m, n, k, nullptr,
                                  unroll, split)
                      .ok());
      const std::string what = absl::StrCat("gemv+silu unroll ", unroll, " split ", split, shape);
      const auto fused = Download(d_fused);
      EXPECT_EQ(fused, Download(d_unfused)) << what;
      ExpectClose(what, fused, want, 1.0 / 64, 1e-3);
    }
    for (auto* lt : {&*tuned, &*untuned}) {
      for (int rep = 0; rep < 2; ++rep) {  // the tuning call, then the cached plan
        auto d_gu = NanBuffer(static_cast<size_t>(m * 2 * n));
        auto d_out = NanBuffer(static_cast<size_t>(m * n));
        ASSERT_TRUE(LinearSiluMulCuda(**lt, d_x.data(), d_w.data(), bias, d_gu.data(),
                                      d_out.data(), m, n, k, nullptr)
                        .ok());
        ExpectClose(absl::StrCat("linear+silu tuned ", lt == &*tuned ? 1 : 0, shape),
                    Download(d_out), want, 1.0 / 64, 1e-3);
      }
    }
  }
  auto v = NanBuffer(64);
  EXPECT_EQ(GemvSiluMulCuda(v.data(), v.data(), nullptr, v.data(), 1, 2, 16, nullptr, 4, 8).code(),
            absl::StatusCode::kInvalidArgument);  // split 8: one column per CTA, no pairs
  auto lt = CublasLt::Create(1 << 20);
  ASSERT_TRUE(lt.ok());
  EXPECT_EQ(LinearSiluMulCuda(**lt, v.data(), v.data(), nullptr, v.data(), v.data(), 1, 0, 8,
                              nullptr)
                .code(),
            absl::StatusCode::kInvalidArgument);
}

// The GEMV and RMSNorm kernels as decode layers (RMSNorm → GEMV → add + RMSNorm → GEMV with
// SiLU·mul → GEMV, three times, then a final add + RMSNorm; every kernel reads what the one
// before wrote and writes what an earlier one read) launched as one programmatic chain
// (each launcher's `pdl`) give the same bits as plain launches — eagerly on a stream and
// replayed from a CUDA graph, in each GEMV variant the fused SiLU·mul form serves (as
// programmatic dependents the GEMVs load their first weight vectors before the dependency
// wait). A missing dependency wait would let a kernel read a buffer before the kernel before it
// wrote it.
TEST(LinearCudaTest, DecodePdlChainMatchesPlainLaunches) {
  SLUICE_SKIP_WITHOUT_CUDA();
  if (!PdlSupported()) GTEST_SKIP() << "programmatic dependent launch needs sm_90";
  auto rng = cuda_test::Rng();
  constexpr int64_t kH = 2048, kInter = 2816, kLayers = 3;
  constexpr float kEps = 1e-5f, kW = 0.04f;
  auto stream = CudaStream::Create();
  ASSERT_TRUE(stream.ok()) << stream.status();
  const cudaStream_t st = stream->get();
  struct Layer {
    DeviceBuffer<bf16> g1, g2, w_o, w_gu, w_down;
  };
  std::vector<Layer> layers;
  for (int64_t l = 0; l < kLayers; ++l) {
    layers.push_back({Upload(RandomBf16(kH, rng, 0.5f, 1.5f)),
                      Upload(RandomBf16(kH, rng, 0.5f, 1.5f)),
                      Upload(RandomBf16(static_cast<size_t>(kH * kH), rng, -kW, kW)),
                      Upload(RandomBf16(static_cast<size_t>(2 * kInter * kH), rng, -kW, kW)),
                      Upload(RandomBf16(static_cast<size_t>(kH * kInter), rng, -kW, kW))});
  }
  for (const int64_t m : {1, 2}) {
    const auto x0 = RandomBf16(static_cast<size_t>(m * kH), rng, -1.0f, 1.0f);
    // The residual stream and the last normed rows after the chain.
    auto run = [&](bool pdl, bool graph, int unroll, int split) {
      auto res = Upload(x0);
      auto normed = NanBuffer(static_cast<size_t>(m * kH));
      auto a = NanBuffer(static_cast<size_t>(m * kH));
      auto tmp = NanBuffer(static_cast<size_t>(m * kH));
      auto act = NanBuffer(static_cast<size_t>(m * kInter));
      cuda_test::RunOnStream(st, graph, [&]() -> absl::Status {
        for (int64_t l = 0; l < kLayers; ++l) {
          const Layer& L = layers[static_cast<size_t>(l)];
          absl::Status s =
              l == 0 ? RmsNormCuda(res.data(), kH, L.g1.data(), normed.data(), kH, m, kH, kEps, st,
                                   pdl)
                     : AddRmsNormCuda(tmp.data(), res.data(), L.g1.data(), normed.data(), m, kH,
                                      kEps, st, pdl);
          if (s.ok()) s = GemvCuda(normed.data(), L.w_o.data(), nullptr, a.data(), m, kH, kH, st,
                                   unroll, split, pdl);
          if (s.ok()) s = AddRmsNormCuda(a.data(), res.data(), L.g2.data(), normed.data(), m, kH,
                                         kEps, st, pdl);
          if (s.ok()) s = GemvSiluMulCuda(normed.data(), L.w_gu.data(), nullptr, act.data(), m,
                                          kInter, kH, st, unroll, split, pdl);
          if (s.ok()) s = GemvCuda(act.data(), L.w_down.data(), nullptr, tmp.data(), m, kH,
                                   kInter, st, unroll, split, pdl);
          if (!s.ok()) return s;
        }
        return AddRmsNormCuda(tmp.data(), res.data(), layers[0].g1.data(), normed.data(), m, kH,
                              kEps, st, pdl);
      });
      std::vector<float> out = Download(res);
      const std::vector<float> n = Download(normed);
      out.insert(out.end(), n.begin(), n.end());
      return out;
    };
    for (const auto& [unroll, split] :
         {std::pair{4, 1}, std::pair{16, 1}, std::pair{8, 2}, std::pair{4, 4}}) {
      const std::vector<float> want = run(false, false, unroll, split);
      for (float v : want) ASSERT_TRUE(std::isfinite(v)) << "reference not finite";
      for (const bool graph : {false, true}) {
        EXPECT_EQ(cuda_test::FirstBitMismatch(run(true, graph, unroll, split), want), -1)
            << "m=" << m << " unroll " << unroll << " split " << split
            << (graph ? " graph" : " eager");
      }
      EXPECT_EQ(cuda_test::FirstBitMismatch(run(false, true, unroll, split), want), -1)
          << "plain launches in a graph, m=" << m << " unroll " << unroll << " split " << split;
    }
  }
}

// With the wider search on (enumerated algorithms, N splits, two streams), LinearCuda on the
// Llama-3-8B decode shapes at m = 256 (qkv, o, down, gate/up with and without the SiLU·mul
// epilogue) and an odd shape with a bias matches LinearCpu on every element, on the tuning call
// and on the cached plan; every plan is tuned and named in DescribePlans.
// (First: the mask parser of cuda_decode_bench --gemm-algo-search, no GPU needed.)
TEST(GemmAlgoSearchArgsTest, ParsesMasks) {
  EXPECT_EQ(*ParseGemmAlgoSearchMask("0"), 0);
  EXPECT_EQ(*ParseGemmAlgoSearchMask("3"), 3);
  EXPECT_EQ(*ParseGemmAlgoSearchMask("7"), 7);
  for (const char* bad : {"", "8", "-1", "x", "3x", "1.5"}) {
    EXPECT_EQ(ParseGemmAlgoSearchMask(bad).status().code(), absl::StatusCode::kInvalidArgument)
        << bad;
  }
}

TEST(LinearCudaTest, GemmAlgoSearchMatchesCpuReference) {
  SLUICE_SKIP_WITHOUT_CUDA();
  LinearOptions options;
  options.algo_search = kGemmSearchAlgos | kGemmSearchSplitN | kGemmSearchStreams;
  auto lt = CublasLt::Create(CublasLt::kDefaultWorkspaceBytes, options);
  ASSERT_TRUE(lt.ok()) << lt.status();
  (*lt)->set_autotune(256);
  auto rng = cuda_test::Rng();
  struct Shape {
    int64_t m, n, k;
    bool bias;
  };
  const Shape shapes[] = {{256, 6144, 4096, false}, {256, 4096, 4096, false},
                          {256, 4096, 14336, false}, {256, 28672, 4096, false},
                          {200, 9000, 264, true}};
  for (const Shape& sh : shapes) {
    for (int rep = 0; rep < 2; ++rep) {
      CheckShape(absl::StrCat("searched rep ", rep), sh.m, sh.n, sh.k, sh.bias, rng,
                 [&](const bf16* x, const bf16* w, const bf16* b, bf16* y) {
                   return LinearCuda(**lt, x, w, b, y, sh.m, sh.n, sh.k, nullptr);
                 });
    }
  }
  // gate/up with the SiLU·mul epilogue (the tuner times the product and SiluMulCuda together).
  const int64_t m = 256, inter = 14336, k = 4096;
  const auto x = RandomBf16(static_cast<size_t>(m * k), rng, -1.0f, 1.0f);
  const auto w = RandomBf16(static_cast<size_t>(2 * inter * k), rng, -1.0f, 1.0f);
  auto d_x = Upload(x);
  auto d_w = Upload(w);
  const auto xf = ToFloat(x), wf = ToFloat(w);
  std::vector<float> gate_up(static_cast<size_t>(m * 2 * inter));
  LinearCpu(xf.data(), wf.data(), nullptr, gate_up.data(), m, 2 * inter, k);
  gate_up = cuda_test::RoundTrip(gate_up);
  std::vector<float> want(static_cast<size_t>(m * inter));
  SiluMulCpu(gate_up.data(), want.data(), m, inter);
  for (int rep = 0; rep < 2; ++rep) {
    auto d_gu = NanBuffer(static_cast<size_t>(m * 2 * inter));
    auto d_out = NanBuffer(static_cast<size_t>(m * inter));
    ASSERT_TRUE(LinearSiluMulCuda(**lt, d_x.data(), d_w.data(), nullptr, d_gu.data(),
                                  d_out.data(), m, inter, k, nullptr)
                    .ok());
    ExpectClose(absl::StrCat("searched linear+silu rep ", rep), Download(d_out), want, 1.0 / 64,
                1e-3);
  }
  const std::string plans = (*lt)->DescribePlans();
  std::printf("%s", plans.c_str());
  EXPECT_EQ(plans.find("tuned 0"), std::string::npos) << plans;
  // Each plan names its pick: one algorithm, or a split with one per part.
  const std::vector<std::string> lines = absl::StrSplit(plans, '\n', absl::SkipEmpty());
  for (const std::string& line : lines) {
    EXPECT_TRUE(absl::StrContains(line, "; algo ") || absl::StrContains(line, "; split n1="))
        << line;
  }
}

// SplitGemm on its own, whichever way it is tuned: serial and two-stream runs (the latter also
// captured in a CUDA graph and replayed) match LinearCpu on an odd shape with a bias.
TEST(LinearCudaTest, SplitGemmMatchesCpuReference) {
  SLUICE_SKIP_WITHOUT_CUDA();
  cublasLtHandle_t handle = nullptr;
  ASSERT_EQ(cublasLtCreate(&handle), CUBLAS_STATUS_SUCCESS);
  auto ws = DeviceBuffer<uint8_t>::Create(size_t{32} << 20);
  ASSERT_TRUE(ws.ok());
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  std::unique_ptr<gemm_search::SplitResources> res;
  auto rng = cuda_test::Rng();
  const int64_t m = 136, n = 3000, k = 520, n1 = 1088;
  EXPECT_FALSE(gemm_search::SplitGemm::Make(m, n, k, 0, true).ok());
  EXPECT_FALSE(gemm_search::SplitGemm::Make(m, n, k, n, true).ok());
  EXPECT_FALSE(gemm_search::SplitGemm::Make(m, n, k, 1001, true).ok());
  for (bool two_streams : {false, true}) {
    CheckShape(absl::StrCat("split gemm streams ", two_streams), m, n, k, true, rng,
               [&](const bf16* x, const bf16* w, const bf16* b, bf16* y) -> absl::Status {
                 auto split = gemm_search::SplitGemm::Make(m, n, k, n1, true);
                 if (!split.ok()) return split.status();
                 if (two_streams && res == nullptr) {
                   res = std::make_unique<gemm_search::SplitResources>();
                   auto rws = DeviceBuffer<uint8_t>::Create(ws->bytes());
                   if (!rws.ok()) return rws.status();
                   res->workspace = *std::move(rws);
                   cudaStreamCreateWithFlags(&res->side, cudaStreamNonBlocking);
                   cudaEventCreateWithFlags(&res->fork, cudaEventDisableTiming);
                   cudaEventCreateWithFlags(&res->join, cudaEventDisableTiming);
                 }
                 // One run per candidate is enough here (results only); the "time" falls
                 // with each call so the last timed choice wins: the last candidate of each
                 // part and, given resources, the two-stream mode (timed after the serial one).
                 float fake_us = 1e6f;
                 const gemm_search::TimeFn once = [&](const std::function<bool()>& run) {
                   if (!run() || cudaStreamSynchronize(stream) != cudaSuccess) return -1.0f;
                   return fake_us -= 1.0f;
                 };
                 const float us = (*split)->Tune(handle, x, w, b, y, ws->data(), ws->bytes(),
                                                 two_streams ? res.get() : nullptr, stream, 4, 8,
                                                 once, {});
                 if (us < 0.0f) return absl::InternalError("SplitGemm::Tune found nothing");
                 if ((*split)->two_streams() != two_streams) {
                   return absl::InternalError("unexpected SplitGemm mode");
                 }
                 cudaMemsetAsync(y, 0xff, static_cast<size_t>(m * n) * sizeof(bf16), stream);
                 if (!two_streams) {
                   if ((*split)->Run(handle, x, w, b, y, ws->data(), ws->bytes(), nullptr,
                                     stream) != CUBLAS_STATUS_SUCCESS) {
                     return absl::InternalError("SplitGemm::Run");
                   }
                   return CudaStatus(cudaStreamSynchronize(stream), "sync");
                 }
                 // Captured (the fork/join become graph edges), then replayed.
                 cudaGraph_t graph = nullptr;
                 cudaGraphExec_t exec = nullptr;
                 SLUICE_CUDA_RETURN_IF_ERROR(
                     cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "capture");
                 const cublasStatus_t rs = (*split)->Run(handle, x, w, b, y, ws->data(),
                                                         ws->bytes(), res.get(), stream);
                 SLUICE_CUDA_RETURN_IF_ERROR(cudaStreamEndCapture(stream, &graph), "end capture");
                 if (rs != CUBLAS_STATUS_SUCCESS) return absl::InternalError("captured Run");
                 SLUICE_CUDA_RETURN_IF_ERROR(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
                 SLUICE_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(exec, stream), "launch");
                 SLUICE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream), "sync");
                 cudaGraphExecDestroy(exec);
                 cudaGraphDestroy(graph);
                 return absl::OkStatus();
               });
  }
  res.reset();
  cudaStreamDestroy(stream);
  cublasLtDestroy(handle);
}

// The DescribePlans line of the plan for (m, n, k) ("m=.. n=.. k=..:" prefix), or "".
std::string PlanLine(CublasLt& lt, int64_t m, int64_t n, int64_t k) {
  const std::string prefix = absl::StrCat("m=", m, " n=", n, " k=", k, ":");
  for (absl::string_view line : absl::StrSplit(lt.DescribePlans(), '\n')) {
    if (absl::StartsWith(line, prefix)) return std::string(line);
  }
  return "";
}

std::string ReadText(const std::filesystem::path& file) {
  std::ifstream in(file);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

void WriteText(const std::filesystem::path& file, const std::string& text) {
  std::ofstream out(file, std::ios::trunc);
  out << text;
}

// GEMM tuning tables (LoadGemmTuning / SaveGemmTuning): timed choices are saved for this GPU;
// a loaded table's choices run without timing (named in DescribePlans) and match LinearCpu; a
// saved cuBLASLt algorithm that cuBLASLt rejects is timed instead; tables of another GPU model
// are skipped; bad paths and tables are errors.
TEST(LinearCudaTest, GemmTuningTableSavesAndApplies) {
  SLUICE_SKIP_WITHOUT_CUDA();
  auto rng = cuda_test::Rng();
  const std::filesystem::path dir =
      std::filesystem::path(::testing::TempDir()) / "sluice_gemm_tuning_test";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  // 1. Tune two shapes and save: the file holds them, for this device.
  auto lt = CublasLt::Create();
  ASSERT_TRUE(lt.ok()) << lt.status();
  (*lt)->set_autotune(64);
  for (const auto& [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{64, 1024, 512}, {2, 1536, 1024}}) {
    CheckShape("timed", m, n, k, false, rng, [&](const bf16* x, const bf16* w, const bf16* b, bf16* y) {
      return LinearCuda(**lt, x, w, b, y, m, n, k, nullptr);
    });
  }
  absl::StatusOr<std::string> saved = SaveGemmTuning(dir.string());
  ASSERT_TRUE(saved.ok()) << saved.status();
  int device = 0;
  cudaDeviceProp prop{};
  ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
  ASSERT_EQ(cudaGetDeviceProperties(&prop, device), cudaSuccess);
  EXPECT_EQ(*saved, (dir / GemmTuningFileName(prop.name)).string());
  absl::StatusOr<GemmTuningTable> table = GemmTuningTable::Parse(ReadText(*saved));
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ(table->device().name, prop.name);
  EXPECT_EQ(table->device().sms, prop.multiProcessorCount);
  GemmTuningKey tuned_key;
  tuned_key.m = 64;
  tuned_key.n = 1024;
  tuned_key.k = 512;
  const GemmTuningChoice* tuned = table->Find(tuned_key, 0);
  ASSERT_NE(tuned, nullptr) << ReadText(*saved);
  GemmTuningKey gemv_key = tuned_key;
  gemv_key.m = 2;
  gemv_key.n = 1536;
  gemv_key.k = 1024;
  ASSERT_NE(table->Find(gemv_key, 0), nullptr);

  // m = 2 was timed with the skinny kernel among the candidates (kSkinnyTuneMinRows..
  // kSkinnyTuneMaxRows), m = 64 without it, and their search bits say so.
  EXPECT_NE(table->Find(gemv_key, kGemmTunedSkinny), nullptr);
  EXPECT_EQ(table->Find(tuned_key, kGemmTunedSkinny), nullptr);

  // 2. A table for fresh shapes: a GEMV variant the timing would not necessarily pick, the
  // tuned shape's choice for m = 48, an all-zero cuBLASLt algorithm (rejected → timed), and an
  // entry made before the skinny kernel existed (search bits without kGemmTunedSkinny → timed).
  GemmTuningTable made(table->device());
  GemmTuningChoice gemv;
  gemv.kind = GemmTuningChoice::Kind::kGemv;
  gemv.gemv_unroll = 8;
  gemv.gemv_split = 2;
  gemv.search_mask = kGemmTunedSkinny;
  GemmTuningKey k_gemv = gemv_key;
  k_gemv.m = 3;
  made.Insert(k_gemv, gemv);
  GemmTuningKey k_reuse = tuned_key;
  k_reuse.m = 48;
  if (tuned->kind == GemmTuningChoice::Kind::kCublasLt) made.Insert(k_reuse, *tuned);
  GemmTuningChoice zero;  // kCublasLt, all-zero words
  zero.search_mask = kGemmTunedSkinny;
  GemmTuningKey k_zero = tuned_key;
  k_zero.m = 40;
  made.Insert(k_zero, zero);
  GemmTuningChoice old_gemv = gemv;
  old_gemv.search_mask = 0;
  GemmTuningKey k_old = gemv_key;
  k_old.m = 5;
  made.Insert(k_old, old_gemv);
  const std::filesystem::path file = dir / "made.json";
  WriteText(file, made.Serialize());
  absl::StatusOr<int> taken = LoadGemmTuning(file.string());
  ASSERT_TRUE(taken.ok()) << taken.status();
  EXPECT_EQ(*taken, static_cast<int>(made.size()));
  auto lt2 = CublasLt::Create();
  ASSERT_TRUE(lt2.ok()) << lt2.status();
  (*lt2)->set_autotune(64);
  for (const GemmTuningKey& key : {k_gemv, k_reuse, k_zero, k_old}) {
    for (int rep = 0; rep < 2; ++rep) {
      CheckShape(absl::StrCat("table rep ", rep), key.m, key.n, key.k, false, rng,
                 [&](const bf16* x, const bf16* w, const bf16* b, bf16* y) {
                   return LinearCuda(**lt2, x, w, b, y, key.m, key.n, key.k, nullptr);
                 });
    }
  }
  const std::string gemv_line = PlanLine(**lt2, k_gemv.m, k_gemv.n, k_gemv.k);
  EXPECT_TRUE(absl::StrContains(gemv_line, "GEMV")) << gemv_line;
  EXPECT_TRUE(absl::StrContains(gemv_line, "unroll 8 split 2")) << gemv_line;
  EXPECT_TRUE(absl::StrContains(gemv_line, "(GEMM tuning table)")) << gemv_line;
  if (tuned->kind == GemmTuningChoice::Kind::kCublasLt) {
    const std::string reuse_line = PlanLine(**lt2, k_reuse.m, k_reuse.n, k_reuse.k);
    EXPECT_TRUE(absl::StrContains(reuse_line, "(GEMM tuning table)")) << reuse_line;
  }
  const std::string zero_line = PlanLine(**lt2, k_zero.m, k_zero.n, k_zero.k);
  EXPECT_TRUE(absl::StrContains(zero_line, "tuned 1")) << zero_line;
  EXPECT_FALSE(absl::StrContains(zero_line, "(GEMM tuning table)")) << zero_line;
  const std::string old_line = PlanLine(**lt2, k_old.m, k_old.n, k_old.k);
  EXPECT_TRUE(absl::StrContains(old_line, "tuned 1")) << old_line;
  EXPECT_FALSE(absl::StrContains(old_line, "(GEMM tuning table)")) << old_line;

  // 3. Another GPU model's table is skipped; bad paths and tables are errors.
  GemmTuningDevice other = table->device();
  other.name = "Some Other GPU";
  GemmTuningTable foreign(other);
  foreign.Insert(k_gemv, gemv);
  WriteText(dir / "foreign.json", foreign.Serialize());
  absl::StatusOr<int> none = LoadGemmTuning((dir / "foreign.json").string());
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(*none, 0);
  const std::filesystem::path empty_dir = dir / "empty";
  std::filesystem::create_directories(empty_dir);
  absl::StatusOr<int> empty = LoadGemmTuning(empty_dir.string());
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(*empty, 0);
  EXPECT_EQ(LoadGemmTuning((dir / "missing.json").string()).status().code(),
            absl::StatusCode::kNotFound);
  WriteText(dir / "bad.json", "{\"format\": \"sluice-gemm-tuning-v1\"}");
  const absl::Status bad = LoadGemmTuning((dir / "bad.json").string()).status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(bad.message(), "bad.json")) << bad;
  std::filesystem::remove_all(dir);
}

TEST(LinearCudaTest, RejectsBadShapes) {
  SLUICE_SKIP_WITHOUT_CUDA();
  auto lt = CublasLt::Create(1 << 20);
  ASSERT_TRUE(lt.ok()) << lt.status();
  EXPECT_EQ(LinearCuda(**lt, nullptr, nullptr, nullptr, nullptr, 0, 8, 8, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace sluice::kernels
