// SkinnyGemmCuda / SkinnyGemmSiluMulCuda (tensor-core weight-streaming GEMM for decode
// batches) against LinearCpu on fresh random bf16 inputs, and LinearCuda's autotuner choosing
// it. Needs a GPU (kernels_cuda_test).
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/activation/activation.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/linear/linear.h"
#include "kernels/linear/linear_cuda.h"
#include "kernels/linear/skinny_gemm.h"

namespace sluice::kernels {
namespace {

using cuda_test::Download;
using cuda_test::ExpectClose;
using cuda_test::NanBuffer;
using cuda_test::RandomBf16;
using cuda_test::ToFloat;
using cuda_test::Upload;

constexpr std::pair<int, int> kVariants[] = {{1, 3}, {2, 3}, {4, 3}, {8, 3},
                                             {1, 4}, {2, 4}, {4, 4}, {8, 4}};
// Elements past the output that must stay NaN (no write outside y).
constexpr size_t kGuard = 256;

// Splits a download of [m·n + kGuard] into the output and counts guard elements overwritten.
std::vector<float> OutputAndGuard(const DeviceBuffer<bf16>& buf, size_t outputs,
                                  int* guard_written) {
  std::vector<float> all = Download(buf);
  *guard_written = 0;
  for (size_t i = outputs; i < all.size(); ++i) *guard_written += std::isnan(all[i]) ? 0 : 1;
  all.resize(outputs);
  return all;
}

// Every (split, stages) whose shared memory fits (the others are InvalidArgument) on row counts
// of each 8-token group size (1, 2, 4 and 8 groups, full and partial), column tails inside a warp's 32 rows and a CTA's 256, k tails inside a 64-wide
// block (k = 1032, 1000, 8), k shorter than a split's share, bias, and a Llama-3-8B o_proj /
// down_proj row count. Each run twice: bit-equal (deterministic).
TEST(SkinnyGemmCudaTest, MatchesCpuReference) {
  SLUICE_SKIP_WITHOUT_CUDA();
  auto rng = cuda_test::Rng();
  struct Shape {
    int64_t m, n, k;
    bool bias;
  };
  const Shape shapes[] = {{64, 4096, 4096, false}, {64, 333, 1032, true}, {9, 100, 520, true},
                          {33, 1000, 1000, false}, {1, 77, 64, false},    {16, 31, 8, true},
                          {40, 520, 14336, false}, {5, 2048, 128, true},  {24, 64, 2048, false}};
  for (const Shape& s : shapes) {
    const auto x = RandomBf16(static_cast<size_t>(s.m * s.k), rng, -1.0f, 1.0f);
    const auto w = RandomBf16(static_cast<size_t>(s.n * s.k), rng, -1.0f, 1.0f);
    const auto b = RandomBf16(static_cast<size_t>(s.n), rng, -4.0f, 4.0f);
    auto d_x = Upload(x);
    auto d_w = Upload(w);
    auto d_b = Upload(b);
    const auto xf = ToFloat(x), wf = ToFloat(w), bf = ToFloat(b);
    std::vector<float> want(static_cast<size_t>(s.m * s.n));
    LinearCpu(xf.data(), wf.data(), s.bias ? bf.data() : nullptr, want.data(), s.m, s.n, s.k);
    const size_t outputs = static_cast<size_t>(s.m * s.n);
    for (const auto& [split, stages] : kVariants) {
      const std::string what = absl::StrCat("skinny split ", split, " stages ", stages, " m=",
                                            s.m, " n=", s.n, " k=", s.k, s.bias ? " +bias" : "");
      if (!skinny_detail::SkinnyVariantSupported(s.m, split, stages)) {
        auto d_y = NanBuffer(outputs);
        EXPECT_EQ(SkinnyGemmCuda(d_x.data(), d_w.data(), nullptr, d_y.data(), s.m, s.n, s.k,
                                 nullptr, split, stages)
                      .code(),
                  absl::StatusCode::kInvalidArgument)
            << what;
        continue;
      }
      std::vector<float> first;
      for (int rep = 0; rep < 2; ++rep) {
        auto d_y = NanBuffer(outputs + kGuard);
        const absl::Status st = SkinnyGemmCuda(d_x.data(), d_w.data(), s.bias ? d_b.data() : nullptr,
                                               d_y.data(), s.m, s.n, s.k, nullptr, split, stages);
        ASSERT_TRUE(st.ok()) << what << ": " << st;
        int guard = 0;
        std::vector<float> got = OutputAndGuard(d_y, outputs, &guard);
        EXPECT_EQ(guard, 0) << what;
        if (rep == 0) {
          ExpectClose(what, got, want, 1.0 / 128, 1e-3);
          first = std::move(got);
        } else {
          EXPECT_EQ(cuda_test::FirstBitMismatch(got, first), -1) << what << " (second run)";
        }
      }
    }
  }
}

// The SiLU·mul form equals the product into a bf16 [m, 2n] buffer followed by SiluMulCpu,
// within two bf16 roundings: Llama-3-8B's gate/up at 64 rows (scaled down in n), bias, column
// tails and a short k.
TEST(SkinnyGemmCudaTest, SiluMulMatchesReference) {
  SLUICE_SKIP_WITHOUT_CUDA();
  auto rng = cuda_test::Rng();
  struct Shape {
    int64_t m, n, k;  // n: outputs per row (w has 2n rows)
    bool bias;
  };
  const Shape shapes[] = {{64, 1792, 4096, false}, {9, 77, 264, true}, {33, 5, 64, false},
                          {2, 100, 8, true}};
  for (const Shape& s : shapes) {
    const auto x = RandomBf16(static_cast<size_t>(s.m * s.k), rng, -1.0f, 1.0f);
    const auto w = RandomBf16(static_cast<size_t>(2 * s.n * s.k), rng, -1.0f, 1.0f);
    const auto b = RandomBf16(static_cast<size_t>(2 * s.n), rng, -1.0f, 1.0f);
    auto d_x = Upload(x);
    auto d_w = Upload(w);
    auto d_b = Upload(b);
    const auto xf = ToFloat(x), wf = ToFloat(w), bf = ToFloat(b);
    std::vector<float> gate_up(static_cast<size_t>(s.m * 2 * s.n));
    LinearCpu(xf.data(), wf.data(), s.bias ? bf.data() : nullptr, gate_up.data(), s.m, 2 * s.n,
              s.k);
    gate_up = cuda_test::RoundTrip(gate_up);
    std::vector<float> want(static_cast<size_t>(s.m * s.n));
    SiluMulCpu(gate_up.data(), want.data(), s.m, s.n);
    const size_t outputs = static_cast<size_t>(s.m * s.n);
    for (const auto& [split, stages] : kVariants) {
      if (!skinny_detail::SkinnyVariantSupported(s.m, split, stages)) continue;
      const std::string what = absl::StrCat("skinny+silu split ", split, " stages ", stages,
                                            " m=", s.m, " n=", s.n, " k=", s.k,
                                            s.bias ? " +bias" : "");
      auto d_y = NanBuffer(outputs + kGuard);
      const absl::Status st =
          SkinnyGemmSiluMulCuda(d_x.data(), d_w.data(), s.bias ? d_b.data() : nullptr,
                                d_y.data(), s.m, s.n, s.k, nullptr, split, stages);
      ASSERT_TRUE(st.ok()) << what << ": " << st;
      int guard = 0;
      const std::vector<float> got = OutputAndGuard(d_y, outputs, &guard);
      EXPECT_EQ(guard, 0) << what;
      ExpectClose(what, got, want, 1.0 / 64, 1e-3);
    }
  }
}

// Launched as programmatic dependents (`pdl`, on sm_90+), eagerly and captured in a graph, a chain
// y1 = x·w1ᵀ, y2 = y1·w2ᵀ, y3 = SiLU·mul(y2·w3ᵀ) where each kernel reads what the one before
// wrote gives the plain launches' bits.
TEST(SkinnyGemmCudaTest, ProgrammaticChainMatchesPlainLaunches) {
  SLUICE_SKIP_WITHOUT_CUDA();
  auto rng = cuda_test::Rng();
  const int64_t m = 48, d = 1024, inter = 1536;
  auto d_x = Upload(RandomBf16(static_cast<size_t>(m * d), rng, -1.0f, 1.0f));
  auto d_w1 = Upload(RandomBf16(static_cast<size_t>(d * d), rng, -0.05f, 0.05f));
  auto d_w2 = Upload(RandomBf16(static_cast<size_t>(d * d), rng, -0.05f, 0.05f));
  auto d_w3 = Upload(RandomBf16(static_cast<size_t>(2 * inter * d), rng, -0.05f, 0.05f));
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  auto run = [&](bool chained, bool graph) {
    const bool pdl = chained && PdlSupported();
    auto y1 = NanBuffer(static_cast<size_t>(m * d));
    auto y2 = NanBuffer(static_cast<size_t>(m * d));
    auto y3 = NanBuffer(static_cast<size_t>(m * inter));
    cuda_test::RunOnStream(stream, graph, [&]() -> absl::Status {
      absl::Status st = SkinnyGemmCuda(d_x.data(), d_w1.data(), nullptr, y1.data(), m, d, d,
                                       stream, 4, 3, pdl);
      if (st.ok()) {
        st = SkinnyGemmCuda(y1.data(), d_w2.data(), nullptr, y2.data(), m, d, d, stream, 1, 4,
                            pdl);
      }
      if (st.ok()) {
        st = SkinnyGemmSiluMulCuda(y2.data(), d_w3.data(), nullptr, y3.data(), m, inter, d,
                                   stream, 2, 4, pdl);
      }
      return st;
    });
    return Download(y3);
  };
  const std::vector<float> plain = run(false, false);
  int64_t finite = 0;
  for (float v : plain) finite += std::isfinite(v) ? 1 : 0;
  EXPECT_EQ(finite, static_cast<int64_t>(plain.size()));
  EXPECT_EQ(cuda_test::FirstBitMismatch(run(true, false), plain), -1) << "eager chain";
  EXPECT_EQ(cuda_test::FirstBitMismatch(run(true, true), plain), -1) << "graph chain";
  cudaStreamDestroy(stream);
}

// With autotune on at a row count it is timed at (kSkinnyTuneMinRows..kSkinnyTuneMaxRows) the
// tuner times the skinny kernel (its time shows in DescribePlans) and whichever kernel wins
// matches LinearCpu, on the tuning call and after; with LinearOptions::skinny_tuning false,
// and at m = 1 and m = 16, it is not timed.
TEST(SkinnyGemmCudaTest, AutotuneTimesSkinnyAndMatches) {
  SLUICE_SKIP_WITHOUT_CUDA();
  auto rng = cuda_test::Rng();
  const int64_t n = 2048, k = 4096;
  struct Case {
    int64_t m;
    bool tuning_on, timed;
  };
  for (const Case& c : {Case{8, true, true}, Case{2, true, true}, Case{8, false, false},
                        Case{1, true, false}, Case{16, true, false}}) {
    LinearOptions options;
    options.skinny_tuning = c.tuning_on;
    auto lt = CublasLt::Create(CublasLt::kDefaultWorkspaceBytes, options);
    ASSERT_TRUE(lt.ok()) << lt.status();
    (*lt)->set_autotune(64);
    const auto x = RandomBf16(static_cast<size_t>(c.m * k), rng, -1.0f, 1.0f);
    const auto w = RandomBf16(static_cast<size_t>(n * k), rng, -1.0f, 1.0f);
    auto d_x = Upload(x);
    auto d_w = Upload(w);
    const auto xf = ToFloat(x), wf = ToFloat(w);
    std::vector<float> want(static_cast<size_t>(c.m * n));
    LinearCpu(xf.data(), wf.data(), nullptr, want.data(), c.m, n, k);
    for (int rep = 0; rep < 2; ++rep) {
      auto d_y = NanBuffer(static_cast<size_t>(c.m * n));
      ASSERT_TRUE(
          LinearCuda(**lt, d_x.data(), d_w.data(), nullptr, d_y.data(), c.m, n, k, nullptr).ok());
      ExpectClose(absl::StrCat("autotuned m=", c.m, " skinny tuning ", c.tuning_on, " rep ", rep),
                  Download(d_y), want, 1.0 / 128, 1e-3);
    }
    const std::string plans = (*lt)->DescribePlans();
    std::printf("%s", plans.c_str());
    EXPECT_NE(plans.find("tuned 1"), std::string::npos) << plans;
    EXPECT_EQ(plans.find("skinny 0.0 us") == std::string::npos, c.timed) << plans;
  }
}

TEST(SkinnyGemmCudaTest, RejectsBadArguments) {
  SLUICE_SKIP_WITHOUT_CUDA();
  auto v = NanBuffer(1 << 12);
  bf16* p = v.data();
  const auto code = [](absl::Status s) { return s.code(); };
  EXPECT_EQ(code(SkinnyGemmCuda(p, p, nullptr, p, 65, 8, 8, nullptr)),
            absl::StatusCode::kInvalidArgument);  // m > kSkinnyGemmMaxRows
  EXPECT_EQ(code(SkinnyGemmCuda(p, p, nullptr, p, 0, 8, 8, nullptr)),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(SkinnyGemmCuda(p, p, nullptr, p, 2, 8, 12, nullptr)),
            absl::StatusCode::kInvalidArgument);  // k % 8 != 0
  EXPECT_EQ(code(SkinnyGemmCuda(p + 1, p, nullptr, p, 2, 8, 8, nullptr)),
            absl::StatusCode::kInvalidArgument);  // x not 16-byte aligned
  EXPECT_EQ(code(SkinnyGemmCuda(p, p, nullptr, nullptr, 2, 8, 8, nullptr)),
            absl::StatusCode::kInvalidArgument);  // no output
  EXPECT_EQ(code(SkinnyGemmCuda(p, p, nullptr, p, 2, 8, 8, nullptr, 3, 2)),
            absl::StatusCode::kInvalidArgument);  // split 3
  EXPECT_EQ(code(SkinnyGemmCuda(p, p, nullptr, p, 2, 8, 8, nullptr, 1, 2)),
            absl::StatusCode::kInvalidArgument);  // stages 2
  EXPECT_EQ(code(SkinnyGemmCuda(p, p, nullptr, p, 64, 8, 8, nullptr, 8, 4)),
            absl::StatusCode::kInvalidArgument);  // rings of 384 KB do not fit
  EXPECT_EQ(code(SkinnyGemmSiluMulCuda(p, p, nullptr, p, 2, 0, 8, nullptr)),
            absl::StatusCode::kInvalidArgument);  // no outputs per row
}

}  // namespace
}  // namespace sluice::kernels
