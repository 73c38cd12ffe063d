// Test helpers for the CUDA kernel tests (kernels/<op>/<op>_cuda_test.cc): random bf16 inputs,
// host<->device copies, NaN prefill, and comparison against a float32 CPU reference.
#ifndef SLUICE_KERNELS_CUDA_CUDA_TEST_UTIL_H_
#define SLUICE_KERNELS_CUDA_CUDA_TEST_UTIL_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/cuda_common.h"
#include "kernels/rope/rope.h"

namespace sluice::kernels::cuda_test {

// Skips the current test when the machine has no CUDA device (e.g. CI).
#define SLUICE_SKIP_WITHOUT_CUDA()                                             \
  do {                                                                         \
    if (!::sluice::kernels::CudaAvailable()) GTEST_SKIP() << "no CUDA device"; \
  } while (false)

// Rng returns a generator seeded from std::random_device (fresh inputs every run); the seed is
// printed so a failure can be reproduced.
inline std::mt19937 Rng() {
  const uint32_t seed = std::random_device{}();
  std::printf("[seed %u]\n", seed);
  return std::mt19937(seed);
}

// Llama3Rope: Llama-3-8B's RoPE (theta 500000, head_dim 128, llama3 frequency scaling).
inline RopeParams Llama3Rope() {
  RopeParams llama;
  llama.rope_type = "llama3";
  llama.theta = 500000.0;
  llama.rotary_dim = 128;
  llama.factor = 8.0;
  llama.original_max_position_embeddings = 8192;
  return llama;
}

// RandomBf16 returns n values uniform in [lo, hi), rounded to bf16.
inline std::vector<bf16> RandomBf16(size_t n, std::mt19937& rng, float lo, float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<bf16> out(n);
  for (auto& v : out) v = FloatToBf16(dist(rng));
  return out;
}

inline std::vector<float> ToFloat(const std::vector<bf16>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = Bf16ToFloat(v[i]);
  return out;
}

// Upload copies `host` into a new device buffer; fails the test on error.
template <typename T>
DeviceBuffer<T> Upload(const std::vector<T>& host) {
  auto buf = DeviceBuffer<T>::Create(host.size());
  EXPECT_TRUE(buf.ok()) << buf.status();
  if (!buf.ok()) return DeviceBuffer<T>();
  const absl::Status s = buf->CopyFromHost(host.data());
  EXPECT_TRUE(s.ok()) << s;
  return *std::move(buf);
}

// NanBuffer allocates n bf16 filled with NaN (0xFFFF), so unwritten outputs are detectable.
inline DeviceBuffer<bf16> NanBuffer(size_t n) {
  auto buf = DeviceBuffer<bf16>::Create(n);
  EXPECT_TRUE(buf.ok()) << buf.status();
  if (!buf.ok()) return DeviceBuffer<bf16>();
  EXPECT_EQ(cudaMemset(buf->data(), 0xFF, buf->bytes()), cudaSuccess);
  return *std::move(buf);
}

// Download synchronizes the device and copies `buf` to the host as float.
inline std::vector<float> Download(const DeviceBuffer<bf16>& buf) {
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<bf16> host(buf.size());
  const absl::Status s = buf.CopyToHost(host.data());
  EXPECT_TRUE(s.ok()) << s;
  return ToFloat(host);
}

struct Comparison {
  int64_t not_finite = 0;  // NaN/Inf in the CUDA output (unwritten elements are NaN)
  int64_t out_of_tol = 0;  // |got - want| > rtol·|want| + atol·max|want|
  double max_abs_err = 0;  // max |got - want|
  double max_ref = 0;      // max |want|
  double max_rel_err = 0;  // max |got - want| / |want| over |want| >= 1e-2·max|want|
  int64_t first_bad = -1;
};

// Compare checks `got` (CUDA, bf16 widened) against the float32 reference `want` element-wise:
// |got - want| <= rtol·|want| + atol·max|want|. bf16 rounds to 8 significant bits (unit
// roundoff 2^-8), so rtol = 2^-7 allows two roundings.
inline Comparison Compare(const std::vector<float>& got, const std::vector<float>& want,
                          double rtol, double atol) {
  Comparison c;
  for (float w : want) c.max_ref = std::max(c.max_ref, std::fabs(static_cast<double>(w)));
  for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
    const double g = got[i], w = want[i];
    if (!std::isfinite(g)) {
      if (c.first_bad < 0) c.first_bad = static_cast<int64_t>(i);
      ++c.not_finite;
      continue;
    }
    const double err = std::fabs(g - w);
    c.max_abs_err = std::max(c.max_abs_err, err);
    if (std::fabs(w) >= 1e-2 * c.max_ref && w != 0) {
      c.max_rel_err = std::max(c.max_rel_err, err / std::fabs(w));
    }
    if (err > rtol * std::fabs(w) + atol * c.max_ref) {
      if (c.first_bad < 0) c.first_bad = static_cast<int64_t>(i);
      ++c.out_of_tol;
    }
  }
  return c;
}

// ExpectClose runs Compare, prints one summary line tagged `what`, and fails the test on
// size mismatch, non-finite output or elements out of tolerance.
inline void ExpectClose(const std::string& what, const std::vector<float>& got,
                        const std::vector<float>& want, double rtol, double atol) {
  ASSERT_EQ(got.size(), want.size()) << what;
  const Comparison c = Compare(got, want, rtol, atol);
  std::printf(
      "[cuda-check] %s: n=%zu max_abs_err=%.3g max_ref=%.3g max_rel_err=%.3g "
      "not_finite=%lld out_of_tol=%lld\n",
      what.c_str(), got.size(), c.max_abs_err, c.max_ref, c.max_rel_err,
      static_cast<long long>(c.not_finite), static_cast<long long>(c.out_of_tol));
  EXPECT_EQ(c.not_finite, 0) << what << ": first bad index " << c.first_bad;
  EXPECT_EQ(c.out_of_tol, 0) << what << ": first bad index " << c.first_bad << " got "
                             << (c.first_bad >= 0 ? got[c.first_bad] : 0.0f) << " want "
                             << (c.first_bad >= 0 ? want[c.first_bad] : 0.0f);
}

// RoundTrip rounds each float to bf16 and back (what a bf16 tensor of the reference holds).
inline std::vector<float> RoundTrip(const std::vector<float>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = Bf16ToFloat(FloatToBf16(v[i]));
  return out;
}

// FirstBitMismatch returns the first index where the bit patterns of got and want differ (a NaN
// equals only the same NaN), the shorter size when the sizes differ, or -1 when they are equal.
inline int64_t FirstBitMismatch(const std::vector<float>& got, const std::vector<float>& want) {
  const size_t n = std::min(got.size(), want.size());
  for (size_t i = 0; i < n; ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0) return static_cast<int64_t>(i);
  }
  return got.size() == want.size() ? -1 : static_cast<int64_t>(n);
}

// RunOnStream runs `enqueue` (launches on `stream`) and waits for it: eagerly, or (graph) captured
// into a CUDA graph that is then launched once — as a decode step runs, where programmatic
// launches become programmatic graph edges. Fails the test on any error.
inline void RunOnStream(cudaStream_t stream, bool graph,
                        const std::function<absl::Status()>& enqueue) {
  if (!graph) {
    const absl::Status s = enqueue();
    ASSERT_TRUE(s.ok()) << s;
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    return;
  }
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  const absl::Status s = enqueue();
  cudaGraph_t g = nullptr;
  const cudaError_t end = cudaStreamEndCapture(stream, &g);
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_EQ(end, cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  const cudaError_t inst = cudaGraphInstantiate(&exec, g, 0);
  cudaGraphDestroy(g);
  ASSERT_EQ(inst, cudaSuccess);
  const cudaError_t launch = cudaGraphLaunch(exec, stream);
  const cudaError_t sync = cudaStreamSynchronize(stream);
  cudaGraphExecDestroy(exec);
  ASSERT_EQ(launch, cudaSuccess);
  ASSERT_EQ(sync, cudaSuccess);
}

}  // namespace sluice::kernels::cuda_test

#endif  // SLUICE_KERNELS_CUDA_CUDA_TEST_UTIL_H_
