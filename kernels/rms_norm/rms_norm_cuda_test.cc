// RmsNormCuda / AddRmsNormCuda against the float32 CPU reference (rms_norm.h) on fresh random
// bf16 inputs. Needs a GPU: part of kernels_cuda_test, skipped without a device.
#include "kernels/rms_norm/rms_norm_cuda.h"

#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/rms_norm/rms_norm.h"

namespace sluice::kernels {
namespace {

using cuda_test::Download;
using cuda_test::ExpectClose;
using cuda_test::NanBuffer;
using cuda_test::RandomBf16;
using cuda_test::ToFloat;
using cuda_test::Upload;

constexpr double kRtol = 1.0 / 128;  // two bf16 roundings
constexpr double kAtol = 1e-5;
constexpr float kEps = 1e-6f;

struct Shape {
  int64_t rows, dim, x_stride;
};

// Vector path (dim % 8 == 0, up to 32768), scalar path (odd dims, dims > 32768), padded strides.
const Shape kShapes[] = {{1, 64, 64},       {7, 4096, 4096},   {33, 5120, 5120}, {5, 1001, 1001},
                         {3, 40000, 40000}, {128, 8192, 8192}, {9, 2048, 2056},  {4, 100, 107}};

TEST(RmsNormCudaTest, MatchesCpuReference) {
  SLUICE_SKIP_WITHOUT_CUDA();
  auto rng = cuda_test::Rng();
  for (const Shape& s : kShapes) {
    const auto x = RandomBf16(static_cast<size_t>(s.rows * s.x_stride), rng, -3.0f, 3.0f);
    const auto w = RandomBf16(static_cast<size_t>(s.dim), rng, 0.5f, 1.5f);
    auto d_x = Upload(x);
    auto d_w = Upload(w);
    auto d_out = NanBuffer(static_cast<size_t>(s.rows * s.dim));
    ASSERT_TRUE(RmsNormCuda(d_x.data(), s.x_stride, d_w.data(), d_out.data(), s.dim, s.rows, s.dim,
                            kEps, nullptr)
                    .ok());
    const auto xf = ToFloat(x);
    const auto wf = ToFloat(w);
    std::vector<float> want(static_cast<size_t>(s.rows * s.dim));
    RmsNormCpu(xf.data(), s.x_stride, wf.data(), want.data(), s.dim, s.rows, s.dim, kEps);
    ExpectClose(absl::StrCat("rms_norm rows=", s.rows, " dim=", s.dim, " stride=", s.x_stride),
                Download(d_out), want, kRtol, kAtol);
  }
}

TEST(RmsNormCudaTest, InPlace) {
  SLUICE_SKIP_WITHOUT_CUDA();
  auto rng = cuda_test::Rng();
  const int64_t rows = 6, dim = 4096;
  const auto x = RandomBf16(static_cast<size_t>(rows * dim), rng, -3.0f, 3.0f);
  const auto w = RandomBf16(static_cast<size_t>(dim), rng, 0.5f, 1.5f);
  auto d_x = Upload(x);
  auto d_w = Upload(w);
  ASSERT_TRUE(
      RmsNormCuda(d_x.data(), dim, d_w.data(), d_x.data(), dim, rows, dim, kEps, nullptr).ok());
  const auto xf = ToFloat(x);
  const auto wf = ToFloat(w);
  std::vector<float> want(xf.size());
  RmsNormCpu(xf.data(), dim, wf.data(), want.data(), dim, rows, dim, kEps);
  ExpectClose("rms_norm in-place", Download(d_x), want, kRtol, kAtol);
}

TEST(AddRmsNormCudaTest, MatchesCpuReference) {
  SLUICE_SKIP_WITHOUT_CUDA();
  auto rng = cuda_test::Rng();
  for (const Shape& s : kShapes) {
    if (s.x_stride != s.dim) continue;  // contiguous only
    const size_t n = static_cast<size_t>(s.rows * s.dim);
    const auto x = RandomBf16(n, rng, -3.0f, 3.0f);
    const auto res = RandomBf16(n, rng, -3.0f, 3.0f);
    const auto w = RandomBf16(static_cast<size_t>(s.dim), rng, 0.5f, 1.5f);
    auto d_x = Upload(x);
    auto d_res = Upload(res);
    auto d_w = Upload(w);
    auto d_out = NanBuffer(n);
    ASSERT_TRUE(AddRmsNormCuda(d_x.data(), d_res.data(), d_w.data(), d_out.data(), s.rows, s.dim,
                               kEps, nullptr)
                    .ok());
    const auto xf = ToFloat(x);
    auto res_f = ToFloat(res);
    const auto wf = ToFloat(w);
    std::vector<float> want(n);
    AddRmsNormCpu(xf.data(), res_f.data(), wf.data(), want.data(), s.rows, s.dim, kEps);
    const std::string tag = absl::StrCat("add_rms_norm rows=", s.rows, " dim=", s.dim);
    // Both sides add in fp32 and round once, so the bf16 residual must equal the rounded CPU
    // residual bit for bit; the norm is then taken of that rounded residual.
    const auto rounded = cuda_test::RoundTrip(res_f);
    ExpectClose(tag + " residual", Download(d_res), rounded, 0.0, 0.0);
    RmsNormCpu(rounded.data(), s.dim, wf.data(), want.data(), s.dim, s.rows, s.dim, kEps);
    ExpectClose(tag + " out", Download(d_out), want, kRtol, kAtol);
  }
}

TEST(RmsNormCudaTest, EveryLaunchShapeMatchesCpuReference) {
  SLUICE_SKIP_WITHOUT_CUDA();
  auto rng = cuda_test::Rng();
  const int64_t shapes[][2] = {{7, 4096}, {33, 5120}, {16, 8192}, {3, 16392}, {2, 24}};
  for (const auto& shape : shapes) {
    const int64_t rows = shape[0], dim = shape[1];
    const size_t n = static_cast<size_t>(rows * dim);
    for (const bool add : {false, true}) {
      for (const int vecs_per_thread : {1, 2, 4}) {
        const auto x = RandomBf16(n, rng, -3.0f, 3.0f);
        const auto res = RandomBf16(n, rng, -3.0f, 3.0f);
        const auto w = RandomBf16(static_cast<size_t>(dim), rng, 0.5f, 1.5f);
        auto d_x = Upload(x);
        auto d_res = Upload(res);
        auto d_w = Upload(w);
        auto d_out = NanBuffer(n);
        ASSERT_TRUE(RmsNormCudaTuned(d_x.data(), dim, add ? d_res.data() : nullptr, d_w.data(),
                                     d_out.data(), dim, rows, dim, kEps, vecs_per_thread, nullptr)
                        .ok());
        const auto xf = ToFloat(x);
        auto res_f = ToFloat(res);
        const auto wf = ToFloat(w);
        std::vector<float> want(n);
        if (add) {
          // Norm of the rounded residual (see MatchesCpuReference above).
          AddRmsNormCpu(xf.data(), res_f.data(), wf.data(), want.data(), rows, dim, kEps);
          const auto rounded = cuda_test::RoundTrip(res_f);
          RmsNormCpu(rounded.data(), dim, wf.data(), want.data(), dim, rows, dim, kEps);
        } else {
          RmsNormCpu(xf.data(), dim, wf.data(), want.data(), dim, rows, dim, kEps);
        }
        const std::string tag = absl::StrCat(add ? "add_" : "", "rms_norm rows=", rows,
                                             " dim=", dim, " vecs_per_thread=", vecs_per_thread);
        if (add) {
          ExpectClose(tag + " residual", Download(d_res), cuda_test::RoundTrip(res_f), 0.0, 0.0);
        }
        ExpectClose(tag, Download(d_out), want, kRtol, kAtol);
      }
    }
  }
}

// A chain of RmsNormCuda / AddRmsNormCuda launches, each reading the rows the one before wrote
// and rewriting the residual in place, launched as programmatic dependents
// (the launchers' `pdl`) gives the same bits as plain launches, eagerly and from a CUDA graph:
// the scalar path (odd dim) and the 2- and 4-vector paths, one row (decode) and several.
TEST(RmsNormCudaTest, DecodePdlChainMatchesPlainLaunches) {
  SLUICE_SKIP_WITHOUT_CUDA();
  if (!PdlSupported()) GTEST_SKIP() << "programmatic dependent launch needs sm_90";
  auto rng = cuda_test::Rng();
  auto stream = CudaStream::Create();
  ASSERT_TRUE(stream.ok()) << stream.status();
  const cudaStream_t st = stream->get();
  for (const Shape& sh : {Shape{1, 1001, 1001}, Shape{7, 1001, 1001}, Shape{1, 4096, 4096},
                          Shape{5, 4096, 4096}, Shape{1, 16384, 16384}}) {
    const size_t n = static_cast<size_t>(sh.rows * sh.dim);
    const auto x0 = RandomBf16(n, rng, -2.0f, 2.0f);
    const auto r0 = RandomBf16(n, rng, -2.0f, 2.0f);
    auto d_w = Upload(RandomBf16(static_cast<size_t>(sh.dim), rng, 0.5f, 1.5f));
    auto run = [&](bool pdl, bool graph) {
      auto a = Upload(x0);
      auto res = Upload(r0);
      auto b = NanBuffer(n);
      cuda_test::RunOnStream(st, graph, [&]() -> absl::Status {
        absl::Status s = RmsNormCuda(a.data(), sh.dim, d_w.data(), b.data(), sh.dim, sh.rows,
                                     sh.dim, kEps, st, pdl);
        for (int i = 0; s.ok() && i < 6; ++i) {  // a → b, then b → a, ...
          bf16* in = i % 2 == 0 ? b.data() : a.data();
          bf16* out = i % 2 == 0 ? a.data() : b.data();
          s = AddRmsNormCuda(in, res.data(), d_w.data(), out, sh.rows, sh.dim, kEps, st, pdl);
        }
        return s;
      });
      std::vector<float> out = Download(b);
      const std::vector<float> r = Download(res);
      out.insert(out.end(), r.begin(), r.end());
      return out;
    };
    const std::vector<float> want = run(false, false);
    for (float v : want) ASSERT_TRUE(std::isfinite(v)) << "reference not finite";
    for (const bool graph : {false, true}) {
      EXPECT_EQ(cuda_test::FirstBitMismatch(run(true, graph), want), -1)
          << "rows " << sh.rows << " dim " << sh.dim << (graph ? " graph" : " eager");
    }
  }
}

TEST(RmsNormCudaTest, RejectsBadShapes) {
  SLUICE_SKIP_WITHOUT_CUDA();
  EXPECT_EQ(RmsNormCuda(nullptr, 4, nullptr, nullptr, 8, 1, 0, kEps, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RmsNormCuda(nullptr, 4, nullptr, nullptr, 8, 1, 8, kEps, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(RmsNormCuda(nullptr, 8, nullptr, nullptr, 8, 0, 8, kEps, nullptr).ok());
  EXPECT_EQ(
      RmsNormCudaTuned(nullptr, 8, nullptr, nullptr, nullptr, 8, 1, 8, kEps, 3, nullptr).code(),
      absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace sluice::kernels
