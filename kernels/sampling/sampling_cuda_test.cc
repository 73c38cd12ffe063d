// SampleRowsCuda against the CPU reference SampleRowCpu (sampling.h) on the same bf16-widened
// logits and draws. Needs a GPU: part of kernels_cuda_test, skipped without a device (the
// argument checks run everywhere).
#include "kernels/sampling/sampling_cuda.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/sampling/sampling.h"

namespace sluice::kernels {
namespace {

using cuda_test::Upload;

constexpr float kInf = std::numeric_limits<float>::infinity();
// Rows whose reference draw is closer than this (relative) to a CDF boundary may legitimately
// pick a neighbour (fixed-point rounding of each weight, the CPU's float64 summation order);
// they are skipped, and must be rare. Not 1e-4: a flat 150k-token row gives every token
// ~7e-6 of the mass, so almost every draw lies within 1e-4 of a boundary.
constexpr double kMinMargin = 1e-9;
constexpr double kLogprobAtol = 2e-3;

SamplingRow Row(float temperature, int32_t top_k, float top_p, float min_p) {
  SamplingRow row;
  row.temperature = temperature;
  row.top_k = top_k;
  row.top_p = top_p;
  row.min_p = min_p;
  return row;
}

// The parameter mix every test batch cycles through (greedy rows mixed with sampled ones).
const std::vector<SamplingRow>& ParamMix() {
  static const std::vector<SamplingRow> mix = {
      Row(0.0f, 0, 1.0f, 0.0f),      Row(1.0f, 0, 1.0f, 0.0f),     Row(0.7f, 0, 1.0f, 0.0f),
      Row(1.3f, 0, 1.0f, 0.0f),      Row(1.0f, 1, 1.0f, 0.0f),     Row(0.7f, 50, 1.0f, 0.0f),
      Row(1.0f, 0, 0.9f, 0.0f),      Row(1.3f, 0, 0.5f, 0.0f),     Row(1.0f, 0, 1.0f, 0.05f),
      Row(0.7f, 50, 0.9f, 0.05f),    Row(1.3f, 50, 0.5f, 0.0f),    Row(0.0f, 50, 0.9f, 0.05f),
      Row(1.0f, 0, 0.9f, 0.05f),     Row(1.3f, 1, 0.9f, 0.0f),
  };
  return mix;
}

enum class Shape { kPeaked, kFlat };

// rows × vocab bf16 logits: peaked (a handful of tokens far above a wide normal background,
// like a confident LM) or flat (narrow normal: top_p keeps thousands of tokens).
std::vector<bf16> RandomLogits(int64_t rows, int64_t vocab, Shape shape, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, shape == Shape::kPeaked ? 2.0f : 0.3f);
  std::uniform_int_distribution<int64_t> pick(0, vocab - 1);
  std::uniform_real_distribution<float> boost(8.0f, 14.0f);
  std::vector<bf16> logits(rows * vocab);
  for (int64_t r = 0; r < rows; ++r) {
    bf16* row = logits.data() + r * vocab;
    for (int64_t i = 0; i < vocab; ++i) row[i] = FloatToBf16(normal(rng));
    if (shape == Shape::kPeaked) {
      for (int j = 0; j < 5; ++j) row[pick(rng)] = FloatToBf16(boost(rng));
    }
  }
  return logits;
}

struct DeviceResult {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
};

// Runs SampleRowsCuda once on `logits` (already on the device) with outputs pre-filled with
// sentinels (-1 tokens, NaN logprobs) so unwritten rows are visible.
DeviceResult RunDevice(const bf16* d_logits, int64_t rows, int64_t vocab,
                       const std::vector<SamplingRow>& params) {
  DeviceBuffer<SamplingRow> d_params = Upload(params);
  auto d_tokens = DeviceBuffer<int32_t>::Create(rows);
  auto d_logprobs = DeviceBuffer<float>::Create(rows);
  EXPECT_TRUE(d_tokens.ok() && d_logprobs.ok());
  DeviceResult out;
  if (!d_tokens.ok() || !d_logprobs.ok()) return out;
  EXPECT_EQ(cudaMemset(d_tokens->data(), 0xFF, d_tokens->bytes()), cudaSuccess);
  EXPECT_EQ(cudaMemset(d_logprobs->data(), 0xFF, d_logprobs->bytes()), cudaSuccess);
  const absl::Status s =
      SampleRowsCuda(d_logits, rows, vocab, d_params.data(), d_tokens->data(),
                     d_logprobs->data(), nullptr, SampleRowsCudaWorkspaceBytes(rows, vocab), 0);
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  out.tokens.resize(rows);
  out.logprobs.resize(rows);
  EXPECT_TRUE(d_tokens->CopyToHost(out.tokens.data()).ok());
  EXPECT_TRUE(d_logprobs->CopyToHost(out.logprobs.data()).ok());
  return out;
}

// Compares the device result row by row with SampleRowCpu on the widened logits. Returns the
// number of rows skipped for a small margin.
int64_t ExpectMatchesCpu(const std::vector<bf16>& logits, int64_t rows, int64_t vocab,
                         const std::vector<SamplingRow>& params, const DeviceResult& got,
                         const char* what) {
  const std::vector<float> widened = cuda_test::ToFloat(logits);
  int64_t skipped = 0, mismatched = 0;
  double max_logprob_err = 0.0;
  for (int64_t r = 0; r < rows && r < static_cast<int64_t>(got.tokens.size()); ++r) {
    const SampleRowResult want = SampleRowCpu(widened.data() + r * vocab, vocab, params[r]);
    const int32_t token = got.tokens[r];
    if (token < 0 || token >= vocab || !std::isfinite(got.logprobs[r])) {  // unwritten/bad
      ++mismatched;
      ADD_FAILURE() << what << " row " << r << " token " << token << " logprob "
                    << got.logprobs[r];
      continue;
    }
    if (want.margin < kMinMargin) {
      ++skipped;
      continue;
    }
    if (token != want.token) {
      ++mismatched;
      ADD_FAILURE() << what << " row " << r << ": device " << token << " cpu " << want.token
                    << " (T " << params[r].temperature << " top_k " << params[r].top_k
                    << " top_p " << params[r].top_p << " min_p " << params[r].min_p << " u "
                    << params[r].uniform << " margin " << want.margin << ")";
      continue;
    }
    const double err = std::fabs(static_cast<double>(got.logprobs[r]) - want.logprob);
    max_logprob_err = std::max(max_logprob_err, err);
    EXPECT_LE(err, kLogprobAtol) << what << " row " << r << " logprob " << got.logprobs[r]
                                 << " cpu " << want.logprob;
  }
  std::printf("[cuda-check] %s: rows=%lld vocab=%lld mismatched=%lld skipped=%lld "
              "max_logprob_err=%.3g\n",
              what, static_cast<long long>(rows), static_cast<long long>(vocab),
              static_cast<long long>(mismatched), static_cast<long long>(skipped),
              max_logprob_err);
  return skipped;
}

std::vector<SamplingRow> RandomParams(int64_t rows, std::mt19937& rng) {
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::vector<SamplingRow> params(rows);
  for (int64_t r = 0; r < rows; ++r) {
    params[r] = ParamMix()[r % ParamMix().size()];
    params[r].uniform = unit(rng);
  }
  return params;
}

TEST(SampleRowsCudaTest, MatchesCpuReferenceOnLlamaQwenAndOddVocabs) {
  SLUICE_SKIP_WITHOUT_CUDA();
  std::mt19937 rng = cuda_test::Rng();
  int64_t total_rows = 0, total_skipped = 0;
  for (int64_t vocab : {int64_t{128256}, int64_t{151936}, int64_t{32000}, int64_t{1001}}) {
    for (Shape shape : {Shape::kPeaked, Shape::kFlat}) {
      const int64_t rows = vocab > 100000 ? 84 : 168;
      const std::vector<bf16> logits = RandomLogits(rows, vocab, shape, rng);
      const std::vector<SamplingRow> params = RandomParams(rows, rng);
      DeviceBuffer<bf16> d_logits = Upload(logits);
      const DeviceResult got = RunDevice(d_logits.data(), rows, vocab, params);
      const std::string what = std::string(shape == Shape::kPeaked ? "peaked" : "flat") +
                               " vocab " + std::to_string(vocab);
      total_skipped += ExpectMatchesCpu(logits, rows, vocab, params, got, what.c_str());
      total_rows += rows;
    }
  }
  std::printf("[cuda-check] sampling total: rows=%lld skipped=%lld\n",
              static_cast<long long>(total_rows), static_cast<long long>(total_skipped));
  EXPECT_LT(total_skipped * 50, total_rows);  // < 2%
}

TEST(SampleRowsCudaTest, UnalignedRowsTakeTheScalarPath) {
  SLUICE_SKIP_WITHOUT_CUDA();
  std::mt19937 rng = cuda_test::Rng();
  const int64_t rows = 56, vocab = 4096;
  const std::vector<bf16> padded = RandomLogits(rows + 1, vocab, Shape::kPeaked, rng);
  const std::vector<bf16> logits(padded.begin() + 1, padded.begin() + 1 + rows * vocab);
  const std::vector<SamplingRow> params = RandomParams(rows, rng);
  DeviceBuffer<bf16> d_padded = Upload(padded);
  const DeviceResult got = RunDevice(d_padded.data() + 1, rows, vocab, params);
  const int64_t skipped = ExpectMatchesCpu(logits, rows, vocab, params, got, "unaligned");
  EXPECT_LE(skipped, 1);
}

TEST(SampleRowsCudaTest, EdgeRowsTiesNegativeInfinityAndMinP) {
  SLUICE_SKIP_WITHOUT_CUDA();
  const int64_t vocab = 16;
  std::vector<float> rows_f;
  std::vector<SamplingRow> params;
  auto add = [&](std::vector<float> row, SamplingRow p, double u) {
    p.uniform = u;
    rows_f.insert(rows_f.end(), row.begin(), row.end());
    params.push_back(p);
  };
  std::vector<float> ties(vocab, 1.0f);
  ties[3] = ties[9] = 2.0f;
  std::vector<float> all_neg_inf(vocab, -kInf);
  std::vector<float> some_neg_inf(vocab, -kInf);
  some_neg_inf[5] = 0.0f;
  some_neg_inf[11] = 0.0f;
  add(ties, Row(0.0f, 0, 1.0f, 0.0f), 0.5);           // greedy: lowest id of the maximum → 3
  add(ties, Row(1.0f, 1, 1.0f, 0.0f), 0.99);          // top_k 1 → 3
  add(ties, Row(1.0f, 2, 1.0f, 0.0f), 0.99);          // {3, 9}, rank order → 9
  add(ties, Row(1.0f, 0, 1.0f, 0.9f), 0.99);          // min_p keeps {3, 9}; id order → 9
  add(ties, Row(1.0f, 0, 1.0f, 0.0f), 0.0);           // id order, u 0 → 0
  add(all_neg_inf, Row(0.0f, 0, 1.0f, 0.0f), 0.5);    // → 0, NaN logprob
  add(all_neg_inf, Row(0.7f, 5, 0.5f, 0.1f), 0.5);    // → 0, NaN logprob
  add(some_neg_inf, Row(1.0f, 0, 1.0f, 0.0f), 0.75);  // {5, 11} half each → 11
  add(some_neg_inf, Row(1.0f, 0, 0.3f, 0.0f), 0.75);  // top_p keeps 5 only
  const int64_t rows = static_cast<int64_t>(params.size());
  std::vector<bf16> logits(rows_f.size());
  for (size_t i = 0; i < rows_f.size(); ++i) logits[i] = FloatToBf16(rows_f[i]);
  DeviceBuffer<bf16> d_logits = Upload(logits);
  const DeviceResult got = RunDevice(d_logits.data(), rows, vocab, params);
  ASSERT_EQ(got.tokens.size(), static_cast<size_t>(rows));
  const std::vector<int32_t> want = {3, 3, 9, 9, 0, 0, 0, 11, 5};
  for (int64_t r = 0; r < rows; ++r) {
    EXPECT_EQ(got.tokens[r], want[r]) << "row " << r;
    const SampleRowResult cpu = SampleRowCpu(rows_f.data() + r * vocab, vocab, params[r]);
    EXPECT_EQ(cpu.token, want[r]) << "cpu row " << r;
    if (std::isnan(cpu.logprob)) {
      EXPECT_TRUE(std::isnan(got.logprobs[r])) << "row " << r;
    } else {
      EXPECT_NEAR(got.logprobs[r], cpu.logprob, 1e-5) << "row " << r;
    }
  }
}

// Same inputs → bit-identical outputs, directly and replayed from a captured CUDA graph.
TEST(SampleRowsCudaTest, DeterministicAndGraphCapturable) {
  SLUICE_SKIP_WITHOUT_CUDA();
  std::mt19937 rng = cuda_test::Rng();
  const int64_t rows = 256, vocab = 151936;
  const std::vector<bf16> logits = RandomLogits(rows, vocab, Shape::kFlat, rng);
  const std::vector<SamplingRow> params = RandomParams(rows, rng);
  DeviceBuffer<bf16> d_logits = Upload(logits);
  const DeviceResult first = RunDevice(d_logits.data(), rows, vocab, params);
  const DeviceResult second = RunDevice(d_logits.data(), rows, vocab, params);
  ASSERT_EQ(first.tokens.size(), static_cast<size_t>(rows));
  EXPECT_EQ(first.tokens, second.tokens);
  EXPECT_EQ(std::memcmp(first.logprobs.data(), second.logprobs.data(), rows * sizeof(float)), 0);

  auto stream = CudaStream::Create();
  ASSERT_TRUE(stream.ok()) << stream.status();
  DeviceBuffer<SamplingRow> d_params = Upload(params);
  auto d_tokens = DeviceBuffer<int32_t>::Create(rows);
  auto d_logprobs = DeviceBuffer<float>::Create(rows);
  ASSERT_TRUE(d_tokens.ok() && d_logprobs.ok());
  ASSERT_EQ(cudaMemset(d_tokens->data(), 0xFF, d_tokens->bytes()), cudaSuccess);
  ASSERT_EQ(cudaMemset(d_logprobs->data(), 0xFF, d_logprobs->bytes()), cudaSuccess);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream->get(), cudaStreamCaptureModeThreadLocal),
            cudaSuccess);
  const absl::Status s = SampleRowsCuda(d_logits.data(), rows, vocab, d_params.data(),
                                        d_tokens->data(), d_logprobs->data(), nullptr, 0,
                                        stream->get());
  ASSERT_EQ(cudaStreamEndCapture(stream->get(), &graph), cudaSuccess);
  ASSERT_TRUE(s.ok()) << s;
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  cudaEvent_t start, stop;
  ASSERT_EQ(cudaEventCreate(&start), cudaSuccess);
  ASSERT_EQ(cudaEventCreate(&stop), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(start, stream->get()), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, stream->get()), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(stop, stream->get()), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream->get()), cudaSuccess);
  float ms = 0.0f;
  ASSERT_EQ(cudaEventElapsedTime(&ms, start, stop), cudaSuccess);
  // Informational only (no timing assertion): one launch for 256 rows of the Qwen vocab.
  std::printf("[cuda-info] SampleRowsCuda graph replay rows=%lld vocab=%lld: %.3f ms\n",
              static_cast<long long>(rows), static_cast<long long>(vocab), ms);
  std::vector<int32_t> tokens(rows);
  std::vector<float> logprobs(rows);
  ASSERT_TRUE(d_tokens->CopyToHost(tokens.data()).ok());
  ASSERT_TRUE(d_logprobs->CopyToHost(logprobs.data()).ok());
  EXPECT_EQ(tokens, first.tokens);
  EXPECT_EQ(std::memcmp(logprobs.data(), first.logprobs.data(), rows * sizeof(float)), 0);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

TEST(SampleRowsCudaTest, RejectsBadArguments) {
  SamplingRow* params = reinterpret_cast<SamplingRow*>(16);
  int32_t* tokens = reinterpret_cast<int32_t*>(16);
  float* logprobs = reinterpret_cast<float*>(16);
  const bf16* logits = reinterpret_cast<const bf16*>(16);
  EXPECT_EQ(SampleRowsCuda(logits, -1, 8, params, tokens, logprobs, nullptr, 0, 0).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SampleRowsCuda(logits, 1, 0, params, tokens, logprobs, nullptr, 0, 0).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SampleRowsCuda(logits, 1, kSampleRowsCudaMaxVocab + 1, params, tokens, logprobs,
                           nullptr, 0, 0)
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SampleRowsCuda(nullptr, 1, 8, params, tokens, logprobs, nullptr, 0, 0).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(SampleRowsCuda(nullptr, 0, 8, nullptr, nullptr, nullptr, nullptr, 0, 0).ok());
}

}  // namespace
}  // namespace sluice::kernels
