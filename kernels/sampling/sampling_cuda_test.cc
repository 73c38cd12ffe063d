// SampleRowsCuda against the CPU reference SampleRowCpu (sampling.h) on the same bf16-widened
// logits and draws. Needs a GPU: part of kernels_cuda_test, skipped without a device (the
// argument checks run everywhere).
#include "kernels/sampling/sampling_cuda.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/sampling/logits_processing.h"
#include "kernels/sampling/logits_processing_cuda.h"
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

// The member lists after a cut (sampling.cu CompactMembers, 2048 entries): top_k at the list's
// size (listed after the top_k select), top_k beyond it (listed after the top_p cut where that
// keeps few tokens; flat rows keep thousands and overflow it, so the draw reads the row), and
// top_p alone, against the CPU on peaked and flat rows.
TEST(SampleRowsCudaTest, MemberListsAtAndBeyondTheirCapacity) {
  SLUICE_SKIP_WITHOUT_CUDA();
  std::mt19937 rng = cuda_test::Rng();
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  const std::vector<SamplingRow> mix = {Row(1.0f, 2048, 1.0f, 0.0f), Row(0.8f, 2048, 0.9f, 0.0f),
                                        Row(1.0f, 2049, 1.0f, 0.0f), Row(1.0f, 4000, 0.95f, 0.0f),
                                        Row(1.2f, 0, 0.99f, 0.0f),   Row(0.9f, 3000, 0.5f, 0.02f)};
  const int64_t rows = 96, vocab = 151936;
  int64_t total_skipped = 0;
  for (Shape shape : {Shape::kPeaked, Shape::kFlat}) {
    const std::vector<bf16> logits = RandomLogits(rows, vocab, shape, rng);
    std::vector<SamplingRow> params(rows);
    for (int64_t r = 0; r < rows; ++r) {
      params[r] = mix[r % mix.size()];
      params[r].uniform = unit(rng);
    }
    DeviceBuffer<bf16> d_logits = Upload(logits);
    const DeviceResult got = RunDevice(d_logits.data(), rows, vocab, params);
    total_skipped += ExpectMatchesCpu(logits, rows, vocab, params, got,
                                      shape == Shape::kPeaked ? "lists peaked" : "lists flat");
  }
  EXPECT_LT(total_skipped * 50, 2 * rows);  // < 2%
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
  const bf16* no_logits = nullptr;
  EXPECT_EQ(SampleRowsCuda(no_logits, 1, 8, params, tokens, logprobs, nullptr, 0, 0).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(SampleRowsCuda(no_logits, 0, 8, nullptr, nullptr, nullptr, nullptr, 0, 0).ok());
  const float* no_float_logits = nullptr;
  EXPECT_EQ(SampleRowsCuda(no_float_logits, 1, 8, params, tokens, logprobs, nullptr, 0, 0).code(),
            absl::StatusCode::kInvalidArgument);
}


// ---- Logits processing (penalties, min_tokens suppression) and top logprobs ----

// Bit equality, NaN equal to NaN.
bool SameFloat(float a, float b) {
  return (std::isnan(a) && std::isnan(b)) || std::memcmp(&a, &b, sizeof(float)) == 0;
}

// A random batch of processing rows: penalty values include the API limits (frequency and
// presence ±2) and extreme repetition penalties; lists hold duplicates, ids outside the vocab,
// placeholders (resolvable and not) and may be empty. Every fourth row has a grammar mask
// (random words, some all-clear and all-set, as a grammar's masks are mostly one or the other).
struct ProcessingBatch {
  std::vector<LogitsProcessingRow> rows;
  std::vector<int32_t> ids;
  std::vector<int32_t> prev_sampled;
  std::vector<uint32_t> masks;
};

ProcessingBatch RandomProcessing(int64_t rows, int64_t vocab, std::mt19937& rng) {
  ProcessingBatch b;
  const int64_t num_prev = 48;
  std::uniform_int_distribution<int32_t> any_id(0, static_cast<int32_t>(vocab - 1));
  for (int64_t i = 0; i < num_prev; ++i) {
    // Mostly real ids, a few outside the vocab (a model may emit nothing else, but the kernel
    // must ignore them like the CPU).
    b.prev_sampled.push_back(i % 11 == 5 ? static_cast<int32_t>(vocab + i) : any_id(rng));
  }
  const float repetition[] = {1.0f, 1.3f, 0.7f, 1.0f, 2.0f, 0.01f, 100.0f, 1.0f};
  const float frequency[] = {0.0f, 0.5f, 2.0f, -2.0f, 0.0f, 1.0f, -0.3f, 0.0f};
  const float presence[] = {0.0f, -0.5f, -2.0f, 2.0f, 0.0f, 0.0f, 1.5f, 0.0f};
  std::uniform_int_distribution<int> len(0, 400);
  std::uniform_int_distribution<int> coin(0, 9);
  // Ids from a small range repeat often (duplicates); the rest spread over the vocab.
  std::uniform_int_distribution<int32_t> small_id(
      0, static_cast<int32_t>(std::min<int64_t>(vocab - 1, 63)));
  auto random_id = [&](bool placeholders) -> int32_t {
    switch (coin(rng)) {
      case 0:
        return static_cast<int32_t>(vocab + coin(rng));  // outside the vocab
      case 1:
        return placeholders ? -(1 + coin(rng) * 6) : any_id(rng);  // rows 0..54: some > 48
      case 2:
      case 3:
      case 4:
        return small_id(rng);
      default:
        return any_id(rng);
    }
  };
  for (int64_t r = 0; r < rows; ++r) {
    LogitsProcessingRow p;
    const int k = static_cast<int>(r % 8);
    p.repetition_penalty = repetition[k];
    p.frequency_penalty = frequency[(r / 8) % 8];
    p.presence_penalty = presence[(r / 3) % 8];
    const int prompt_len = r % 5 == 0 ? 0 : (r % 7 == 0 ? 3000 : len(rng));
    const int output_len = r % 6 == 0 ? 0 : len(rng);
    p.prompt_begin = static_cast<int32_t>(b.ids.size());
    for (int i = 0; i < prompt_len; ++i) b.ids.push_back(random_id(false));
    p.prompt_end = static_cast<int32_t>(b.ids.size());
    p.output_begin = p.prompt_end;
    for (int i = 0; i < output_len; ++i) b.ids.push_back(random_id(true));
    p.output_end = static_cast<int32_t>(b.ids.size());
    p.suppress_begin = p.output_end;
    if (r % 3 == 1) {
      for (int i = 0; i < 1 + coin(rng) / 3; ++i) b.ids.push_back(random_id(true));
      b.ids.push_back(static_cast<int32_t>(vocab - 1));  // the last id
    }
    p.suppress_end = static_cast<int32_t>(b.ids.size());
    if (r % 4 == 3) {
      p.mask_begin = static_cast<int32_t>(b.masks.size());
      for (int64_t w = 0; w < MaskWords(vocab); ++w) {
        const int kind = coin(rng);
        b.masks.push_back(kind < 3 ? 0u : kind < 6 ? ~0u : static_cast<uint32_t>(rng()));
      }
      b.masks.back() |= 1u;  // at least one token allowed, as a grammar's mask
    }
    b.rows.push_back(p);
  }
  return b;
}

// Runs LogitsProcessingCuda; returns the fp32 rows and checks the workspace is zero after.
std::vector<float> RunProcessing(const bf16* d_logits, int64_t rows, int64_t vocab,
                                 const ProcessingBatch& b, DeviceBuffer<float>* d_out_keep) {
  DeviceBuffer<LogitsProcessingRow> d_rows = Upload(b.rows);
  std::vector<int32_t> ids = b.ids;
  if (ids.empty()) ids.push_back(0);
  DeviceBuffer<int32_t> d_ids = Upload(ids);
  DeviceBuffer<int32_t> d_prev = Upload(b.prev_sampled);
  std::vector<uint32_t> masks = b.masks;
  if (masks.empty()) masks.push_back(0);
  DeviceBuffer<uint32_t> d_masks = Upload(masks);
  auto d_out = DeviceBuffer<float>::Create(rows * vocab);
  const size_t ws_bytes = LogitsProcessingCudaWorkspaceBytes(rows, vocab);
  auto d_ws = DeviceBuffer<uint32_t>::Create(ws_bytes / 4);
  EXPECT_TRUE(d_out.ok() && d_ws.ok());
  if (!d_out.ok() || !d_ws.ok()) return {};
  EXPECT_EQ(cudaMemset(d_out->data(), 0xFF, d_out->bytes()), cudaSuccess);
  EXPECT_EQ(cudaMemset(d_ws->data(), 0, d_ws->bytes()), cudaSuccess);
  // Twice: the second call relies on the first leaving the workspace zero.
  for (int i = 0; i < 2; ++i) {
    const absl::Status s = LogitsProcessingCuda(
        d_logits, rows, vocab, d_rows.data(), d_ids.data(), d_masks.data(), d_prev.data(),
        static_cast<int64_t>(b.prev_sampled.size()), d_out->data(), d_ws->data(), ws_bytes, 0);
    EXPECT_TRUE(s.ok()) << s;
  }
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<float> out(rows * vocab);
  EXPECT_TRUE(d_out->CopyToHost(out.data()).ok());
  std::vector<uint32_t> ws(ws_bytes / 4);
  EXPECT_TRUE(d_ws->CopyToHost(ws.data()).ok());
  EXPECT_EQ(std::count(ws.begin(), ws.end(), 0u), static_cast<std::ptrdiff_t>(ws.size()))
      << "workspace not left zero";
  if (d_out_keep != nullptr) *d_out_keep = std::move(*d_out);
  return out;
}

TEST(LogitsProcessingCudaTest, MatchesCpuBitForBitOnRandomLists) {
  SLUICE_SKIP_WITHOUT_CUDA();
  std::mt19937 rng = cuda_test::Rng();
  for (int64_t vocab : {int64_t{151936}, int64_t{1001}, int64_t{64}}) {
    for (Shape shape : {Shape::kPeaked, Shape::kFlat}) {
      const int64_t rows = 72;
      const std::vector<bf16> logits = RandomLogits(rows, vocab, shape, rng);
      const ProcessingBatch b = RandomProcessing(rows, vocab, rng);
      DeviceBuffer<bf16> d_logits = Upload(logits);
      const std::vector<float> got = RunProcessing(d_logits.data(), rows, vocab, b, nullptr);
      ASSERT_EQ(got.size(), static_cast<size_t>(rows * vocab));
      const std::vector<float> widened = cuda_test::ToFloat(logits);
      std::vector<float> want(rows * vocab);
      LogitsProcessingCpu(widened.data(), rows, vocab, b.rows.data(), b.ids.data(),
                          b.masks.data(), b.prev_sampled.data(),
                          static_cast<int64_t>(b.prev_sampled.size()), want.data());
      int64_t changed = 0, mismatched = 0;
      for (int64_t i = 0; i < rows * vocab; ++i) {
        changed += SameFloat(want[i], widened[i]) ? 0 : 1;
        if (!SameFloat(got[i], want[i])) {
          if (++mismatched <= 10) {
            ADD_FAILURE() << "vocab " << vocab << " row " << i / vocab << " id " << i % vocab
                          << ": device " << got[i] << " cpu " << want[i] << " raw "
                          << widened[i];
          }
        }
      }
      std::printf("[cuda-check] logits processing vocab=%lld: %lld of %lld values changed, "
                  "%lld mismatched\n",
                  static_cast<long long>(vocab), static_cast<long long>(changed),
                  static_cast<long long>(rows * vocab), static_cast<long long>(mismatched));
      EXPECT_EQ(mismatched, 0);
      EXPECT_GT(changed, rows);  // the batch does penalize
    }
  }
}

// Unaligned bf16 input (the scalar copy path) and rows with no processing at all.
TEST(LogitsProcessingCudaTest, UnalignedInputAndNeutralRows) {
  SLUICE_SKIP_WITHOUT_CUDA();
  std::mt19937 rng = cuda_test::Rng();
  const int64_t rows = 9, vocab = 4096;
  const std::vector<bf16> padded = RandomLogits(rows + 1, vocab, Shape::kPeaked, rng);
  const std::vector<bf16> logits(padded.begin() + 1, padded.begin() + 1 + rows * vocab);
  ProcessingBatch b = RandomProcessing(rows, vocab, rng);
  b.rows[0] = LogitsProcessingRow{};  // neutral, empty lists: a plain widening copy
  b.rows[2].repetition_penalty = 1.0f;
  b.rows[2].frequency_penalty = b.rows[2].presence_penalty = 0.0f;  // lists but no penalty
  DeviceBuffer<bf16> d_padded = Upload(padded);
  const std::vector<float> got = RunProcessing(d_padded.data() + 1, rows, vocab, b, nullptr);
  ASSERT_EQ(got.size(), static_cast<size_t>(rows * vocab));
  const std::vector<float> widened = cuda_test::ToFloat(logits);
  std::vector<float> want(rows * vocab);
  LogitsProcessingCpu(widened.data(), rows, vocab, b.rows.data(), b.ids.data(), b.masks.data(),
                      b.prev_sampled.data(), static_cast<int64_t>(b.prev_sampled.size()),
                      want.data());
  int64_t mismatched = 0;
  for (int64_t i = 0; i < rows * vocab; ++i) mismatched += SameFloat(got[i], want[i]) ? 0 : 1;
  EXPECT_EQ(mismatched, 0);
  for (int64_t i = 0; i < vocab; ++i) ASSERT_TRUE(SameFloat(got[i], widened[i])) << i;
}

// Processing then the fp32 SampleRowsCuda gives SampleRowCpu's token on the CPU-processed rows
// (the engine's device path: SampleToken's processing, then its choice).
TEST(LogitsProcessingCudaTest, ProcessedRowsSampleLikeTheCpu) {
  SLUICE_SKIP_WITHOUT_CUDA();
  std::mt19937 rng = cuda_test::Rng();
  int64_t total_rows = 0, total_skipped = 0;
  for (int64_t vocab : {int64_t{151936}, int64_t{32000}, int64_t{1001}}) {
    for (Shape shape : {Shape::kPeaked, Shape::kFlat}) {
      const int64_t rows = 112;
      const std::vector<bf16> logits = RandomLogits(rows, vocab, shape, rng);
      ProcessingBatch b = RandomProcessing(rows, vocab, rng);
      // 100 / 0.01 repetition penalties can push a logit past what a draw handles sensibly
      // only in contrived rows; keep them (greedy rows of the mix cover them too).
      const std::vector<SamplingRow> params = RandomParams(rows, rng);
      DeviceBuffer<bf16> d_logits = Upload(logits);
      DeviceBuffer<float> d_processed;
      const std::vector<float> processed =
          RunProcessing(d_logits.data(), rows, vocab, b, &d_processed);
      ASSERT_EQ(processed.size(), static_cast<size_t>(rows * vocab));
      DeviceBuffer<SamplingRow> d_params = Upload(params);
      auto d_tokens = DeviceBuffer<int32_t>::Create(rows);
      auto d_logprobs = DeviceBuffer<float>::Create(rows);
      ASSERT_TRUE(d_tokens.ok() && d_logprobs.ok());
      ASSERT_EQ(cudaMemset(d_tokens->data(), 0xFF, d_tokens->bytes()), cudaSuccess);
      const absl::Status s =
          SampleRowsCuda(d_processed.data(), rows, vocab, d_params.data(), d_tokens->data(),
                         d_logprobs->data(), nullptr, 0, 0);
      ASSERT_TRUE(s.ok()) << s;
      std::vector<int32_t> tokens(rows);
      std::vector<float> logprobs(rows);
      ASSERT_TRUE(d_tokens->CopyToHost(tokens.data()).ok());
      ASSERT_TRUE(d_logprobs->CopyToHost(logprobs.data()).ok());
      int64_t skipped = 0;
      for (int64_t r = 0; r < rows; ++r) {
        const SampleRowResult want = SampleRowCpu(processed.data() + r * vocab, vocab, params[r]);
        if (want.margin < kMinMargin) {
          ++skipped;
          continue;
        }
        EXPECT_EQ(tokens[r], want.token)
            << "vocab " << vocab << " row " << r << " T " << params[r].temperature << " top_k "
            << params[r].top_k << " top_p " << params[r].top_p << " min_p " << params[r].min_p;
        if (std::isfinite(want.logprob)) {
          EXPECT_NEAR(logprobs[r], want.logprob, kLogprobAtol) << "row " << r;
        }
      }
      total_rows += rows;
      total_skipped += skipped;
    }
  }
  std::printf("[cuda-check] processed sampling: rows=%lld skipped=%lld\n",
              static_cast<long long>(total_rows), static_cast<long long>(total_skipped));
  EXPECT_LT(total_skipped * 50, total_rows);
}

// fp32 ties that only the scaled value shows: the two floats below 2 divided by T = 1.99, 1.9 or
// 1.3 round to the same x (not for 1.995, 1.7), and the CPU then ranks the lower id first —
// here the one with the smaller raw value, so ranking raw values would pick the other.
TEST(LogitsProcessingCudaTest, Fp32SamplingRanksTheScaledValue) {
  SLUICE_SKIP_WITHOUT_CUDA();
  const int64_t vocab = 8;
  std::vector<float> row(vocab, -kInf);
  row[5] = std::nextafter(2.0f, 0.0f);
  row[2] = std::nextafter(row[5], 0.0f);
  row[6] = 0.5f;
  std::vector<float> all;
  std::vector<SamplingRow> params;
  for (float t : {1.99f, 1.9f, 1.3f, 1.995f, 1.7f, 1.0f, 0.0f}) {
    for (int k : {1, 2}) {
      for (double u : {0.0, 0.45, 0.55, 0.999}) {
        SamplingRow p = Row(t, k, 1.0f, 0.0f);
        p.uniform = u;
        params.push_back(p);
        all.insert(all.end(), row.begin(), row.end());
      }
    }
  }
  const int64_t rows = static_cast<int64_t>(params.size());
  DeviceBuffer<float> d_logits = Upload(all);
  DeviceBuffer<SamplingRow> d_params = Upload(params);
  auto d_tokens = DeviceBuffer<int32_t>::Create(rows);
  auto d_logprobs = DeviceBuffer<float>::Create(rows);
  ASSERT_TRUE(d_tokens.ok() && d_logprobs.ok());
  ASSERT_TRUE(SampleRowsCuda(d_logits.data(), rows, vocab, d_params.data(), d_tokens->data(),
                             d_logprobs->data(), nullptr, 0, 0)
                  .ok());
  std::vector<int32_t> tokens(rows);
  ASSERT_TRUE(d_tokens->CopyToHost(tokens.data()).ok());
  for (int64_t r = 0; r < rows; ++r) {
    const SampleRowResult want = SampleRowCpu(all.data() + r * vocab, vocab, params[r]);
    EXPECT_EQ(tokens[r], want.token) << "row " << r << " T " << params[r].temperature
                                     << " top_k " << params[r].top_k << " u "
                                     << params[r].uniform;
  }
}

// Random rows with coarse values (many ties), -inf and NaN entries; top counts 0..20.
TEST(LogprobRowsCudaTest, MatchesTopLogprobsCpu) {
  SLUICE_SKIP_WITHOUT_CUDA();
  std::mt19937 rng = cuda_test::Rng();
  for (int64_t vocab : {int64_t{151936}, int64_t{1001}, int64_t{7}}) {
    const int64_t rows = 64;
    const int32_t max_top = kMaxTopLogprobs;
    std::vector<bf16> logits = RandomLogits(rows, vocab, Shape::kPeaked, rng);
    std::uniform_int_distribution<int64_t> pick(0, vocab - 1);
    std::vector<int32_t> counts(rows), tokens(rows);
    for (int64_t r = 0; r < rows; ++r) {
      bf16* row = logits.data() + r * vocab;
      if (r % 4 == 1) {  // ties: values on a coarse grid
        for (int64_t i = 0; i < vocab; ++i) {
          row[i] = FloatToBf16(std::round(Bf16ToFloat(row[i]) * 2.0f) / 2.0f);
        }
      }
      if (r % 4 == 2) {  // -inf and NaN entries, some at the top
        for (int j = 0; j < 6; ++j) row[pick(rng)] = FloatToBf16(-kInf);
        for (int j = 0; j < 3; ++j) row[pick(rng)] = FloatToBf16(std::nanf(""));
      }
      if (r == 3) {  // nothing finite
        for (int64_t i = 0; i < vocab; ++i) row[i] = FloatToBf16(-kInf);
      }
      counts[r] = static_cast<int32_t>(r % (max_top + 1));
      tokens[r] = static_cast<int32_t>(pick(rng));
    }
    counts[5] = max_top;
    DeviceBuffer<bf16> d_logits = Upload(logits);
    DeviceBuffer<int32_t> d_counts = Upload(counts);
    DeviceBuffer<int32_t> d_tokens = Upload(tokens);
    auto d_logprobs = DeviceBuffer<float>::Create(rows);
    auto d_top_ids = DeviceBuffer<int32_t>::Create(rows * max_top);
    auto d_top_lp = DeviceBuffer<float>::Create(rows * max_top);
    ASSERT_TRUE(d_logprobs.ok() && d_top_ids.ok() && d_top_lp.ok());
    ASSERT_EQ(cudaMemset(d_top_ids->data(), 0x7F, d_top_ids->bytes()), cudaSuccess);
    const absl::Status s = LogprobRowsCuda(
        d_logits.data(), rows, vocab, nullptr, nullptr, d_tokens.data(), d_counts.data(), max_top,
        d_logprobs->data(), d_top_ids->data(), d_top_lp->data(), 0);
    ASSERT_TRUE(s.ok()) << s;
    std::vector<float> logprobs(rows), top_lp(rows * max_top);
    std::vector<int32_t> top_ids(rows * max_top);
    ASSERT_TRUE(d_logprobs->CopyToHost(logprobs.data()).ok());
    ASSERT_TRUE(d_top_ids->CopyToHost(top_ids.data()).ok());
    ASSERT_TRUE(d_top_lp->CopyToHost(top_lp.data()).ok());
    const std::vector<float> raw = cuda_test::ToFloat(logits);
    double max_err = 0.0;
    for (int64_t r = 0; r < rows; ++r) {
      const absl::Span<const float> row(raw.data() + r * vocab, vocab);
      const double lse = LogSumExpCpu(row);
      const std::vector<TopLogprob> want = TopLogprobsCpu(row, lse, counts[r]);
      const float want_lp = static_cast<float>(static_cast<double>(row[tokens[r]]) - lse);
      if (r == 3) {
        EXPECT_TRUE(std::isnan(logprobs[r])) << logprobs[r];
      } else if (std::isinf(want_lp) || std::isnan(want_lp)) {
        EXPECT_TRUE(SameFloat(logprobs[r], want_lp) || std::isnan(row[tokens[r]]))
            << "row " << r << " " << logprobs[r] << " vs " << want_lp;
      } else {
        EXPECT_NEAR(logprobs[r], want_lp, 1e-4) << "row " << r;
        max_err = std::max(max_err, std::fabs(static_cast<double>(logprobs[r]) - want_lp));
      }
      for (int32_t j = 0; j < max_top; ++j) {
        const int64_t at = r * max_top + j;
        if (j < static_cast<int32_t>(want.size())) {
          ASSERT_EQ(top_ids[at], want[j].token_id) << "vocab " << vocab << " row " << r
                                                   << " entry " << j;
          if (std::isfinite(want[j].logprob)) {
            EXPECT_NEAR(top_lp[at], want[j].logprob, 1e-4) << "row " << r << " entry " << j;
            max_err = std::max(
                max_err, std::fabs(static_cast<double>(top_lp[at]) - want[j].logprob));
          } else {
            EXPECT_TRUE(SameFloat(top_lp[at], want[j].logprob))
                << "row " << r << " entry " << j << " " << top_lp[at] << " vs "
                << want[j].logprob;
          }
        } else {
          EXPECT_EQ(top_ids[at], -1) << "row " << r << " entry " << j;
          EXPECT_TRUE(std::isnan(top_lp[at]));
        }
      }
    }
    std::printf("[cuda-check] top logprobs vocab=%lld: max_logprob_err=%.3g\n",
                static_cast<long long>(vocab), max_err);
  }
}

// Grammar masks in LogprobRowsCuda: a masked row's logprobs and top entries are those of its
// logits with the cleared tokens at -inf (the host samples a structured-output row from them).
TEST(LogprobRowsCudaTest, MaskedRowsMatchTheCpuOnMaskedLogits) {
  SLUICE_SKIP_WITHOUT_CUDA();
  std::mt19937 rng = cuda_test::Rng();
  const int64_t rows = 8, vocab = 1001, words = MaskWords(vocab);
  const int32_t max_top = 5;
  const std::vector<bf16> logits = RandomLogits(rows, vocab, Shape::kFlat, rng);
  std::vector<LogitsProcessingRow> params(rows);
  std::vector<uint32_t> masks;
  std::vector<int32_t> tokens(rows), counts(rows, max_top);
  for (int64_t r = 0; r < rows; ++r) {
    if (r % 2 == 1) {  // odd rows: masked, a few hundred tokens allowed
      params[r].mask_begin = static_cast<int32_t>(masks.size());
      for (int64_t w = 0; w < words; ++w) masks.push_back(static_cast<uint32_t>(rng()) & rng());
    }
    tokens[r] = static_cast<int32_t>(r * 97 % vocab);
    if (r % 2 == 1) masks[params[r].mask_begin + tokens[r] / 32] |= 1u << (tokens[r] % 32);
  }
  DeviceBuffer<bf16> d_logits = Upload(logits);
  DeviceBuffer<LogitsProcessingRow> d_params = Upload(params);
  DeviceBuffer<uint32_t> d_masks = Upload(masks);
  DeviceBuffer<int32_t> d_tokens = Upload(tokens);
  DeviceBuffer<int32_t> d_counts = Upload(counts);
  auto d_logprobs = DeviceBuffer<float>::Create(rows);
  auto d_top_ids = DeviceBuffer<int32_t>::Create(rows * max_top);
  auto d_top_lp = DeviceBuffer<float>::Create(rows * max_top);
  ASSERT_TRUE(d_logprobs.ok() && d_top_ids.ok() && d_top_lp.ok());
  ASSERT_TRUE(LogprobRowsCuda(d_logits.data(), rows, vocab, d_params.data(), d_masks.data(),
                              d_tokens.data(), d_counts.data(), max_top, d_logprobs->data(),
                              d_top_ids->data(), d_top_lp->data(), 0)
                  .ok());
  std::vector<float> logprobs(rows), top_lp(rows * max_top);
  std::vector<int32_t> top_ids(rows * max_top);
  ASSERT_TRUE(d_logprobs->CopyToHost(logprobs.data()).ok());
  ASSERT_TRUE(d_top_ids->CopyToHost(top_ids.data()).ok());
  ASSERT_TRUE(d_top_lp->CopyToHost(top_lp.data()).ok());
  std::vector<float> masked = cuda_test::ToFloat(logits);
  LogitsProcessingCpu(masked.data(), rows, vocab, params.data(), nullptr, masks.data(), nullptr,
                      0, masked.data());  // neutral penalties, empty lists: only the masks
  for (int64_t r = 0; r < rows; ++r) {
    const absl::Span<const float> row(masked.data() + r * vocab, vocab);
    const double lse = LogSumExpCpu(row);
    EXPECT_NEAR(logprobs[r], static_cast<double>(row[tokens[r]]) - lse, 1e-4) << "row " << r;
    const std::vector<TopLogprob> want = TopLogprobsCpu(row, lse, max_top);
    for (int32_t j = 0; j < max_top; ++j) {
      EXPECT_EQ(top_ids[r * max_top + j], want[j].token_id) << "row " << r << " entry " << j;
      EXPECT_NEAR(top_lp[r * max_top + j], want[j].logprob, 1e-4) << "row " << r;
    }
  }
}

// Informational device times (no assertion) for the engine's decode batch of 256 rows of the
// Qwen vocab: the plain bf16 SampleRowsCuda, and the processed path (LogitsProcessingCuda with
// 1k prompt + 256 output ids per row, the fp32 SampleRowsCuda, LogprobRowsCuda with 20 top
// entries), each the mean of 20 launches.
TEST(LogitsProcessingCudaTest, TimingInfo) {
  SLUICE_SKIP_WITHOUT_CUDA();
  std::mt19937 rng = cuda_test::Rng();
  const int64_t rows = 256, vocab = 151936;
  const std::vector<bf16> logits = RandomLogits(rows, vocab, Shape::kPeaked, rng);
  const std::vector<SamplingRow> params = RandomParams(rows, rng);
  ProcessingBatch b;
  std::uniform_int_distribution<int32_t> any_id(0, static_cast<int32_t>(vocab - 1));
  for (int64_t r = 0; r < rows; ++r) {
    LogitsProcessingRow p;
    p.repetition_penalty = 1.1f;
    p.frequency_penalty = 0.2f;
    p.presence_penalty = 0.1f;
    p.prompt_begin = static_cast<int32_t>(b.ids.size());
    for (int i = 0; i < 1024; ++i) b.ids.push_back(any_id(rng));
    p.prompt_end = p.output_begin = static_cast<int32_t>(b.ids.size());
    for (int i = 0; i < 256; ++i) b.ids.push_back(any_id(rng) % 4096);
    p.output_end = p.suppress_begin = p.suppress_end = static_cast<int32_t>(b.ids.size());
    b.rows.push_back(p);
  }
  DeviceBuffer<bf16> d_logits = Upload(logits);
  DeviceBuffer<SamplingRow> d_params = Upload(params);
  DeviceBuffer<LogitsProcessingRow> d_rows = Upload(b.rows);
  DeviceBuffer<int32_t> d_ids = Upload(b.ids);
  std::vector<int32_t> counts(rows, kMaxTopLogprobs);
  DeviceBuffer<int32_t> d_counts = Upload(counts);
  auto d_out = DeviceBuffer<float>::Create(rows * vocab);
  auto d_ws = DeviceBuffer<uint8_t>::Create(LogitsProcessingCudaWorkspaceBytes(rows, vocab));
  auto d_tokens = DeviceBuffer<int32_t>::Create(rows);
  auto d_logprobs = DeviceBuffer<float>::Create(rows);
  auto d_top_ids = DeviceBuffer<int32_t>::Create(rows * kMaxTopLogprobs);
  auto d_top_lp = DeviceBuffer<float>::Create(rows * kMaxTopLogprobs);
  ASSERT_TRUE(d_out.ok() && d_ws.ok() && d_tokens.ok() && d_logprobs.ok() && d_top_ids.ok() &&
              d_top_lp.ok());
  ASSERT_EQ(cudaMemset(d_ws->data(), 0, d_ws->bytes()), cudaSuccess);
  auto time_ms = [](const std::function<absl::Status()>& fn) {
    cudaEvent_t start, stop;
    cudaEventCreate(&start);
    cudaEventCreate(&stop);
    for (int i = 0; i < 3; ++i) EXPECT_TRUE(fn().ok());
    cudaEventRecord(start, 0);
    for (int i = 0; i < 20; ++i) EXPECT_TRUE(fn().ok());
    cudaEventRecord(stop, 0);
    cudaEventSynchronize(stop);
    float ms = 0.0f;
    cudaEventElapsedTime(&ms, start, stop);
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    return ms / 20.0f;
  };
  const float plain = time_ms([&] {
    return SampleRowsCuda(d_logits.data(), rows, vocab, d_params.data(), d_tokens->data(),
                          d_logprobs->data(), nullptr, 0, 0);
  });
  const float process = time_ms([&] {
    return LogitsProcessingCuda(d_logits.data(), rows, vocab, d_rows.data(), d_ids.data(),
                                nullptr, nullptr, 0, d_out->data(), d_ws->data(), d_ws->bytes(), 0);
  });
  const float sample_fp32 = time_ms([&] {
    return SampleRowsCuda(d_out->data(), rows, vocab, d_params.data(), d_tokens->data(),
                          d_logprobs->data(), nullptr, 0, 0);
  });
  const float logprobs = time_ms([&] {
    return LogprobRowsCuda(d_logits.data(), rows, vocab, nullptr, nullptr, d_tokens->data(),
                           d_counts.data(), kMaxTopLogprobs, d_logprobs->data(), d_top_ids->data(),
                           d_top_lp->data(), 0);
  });
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::printf("[cuda-info] rows=%lld vocab=%lld: SampleRowsCuda bf16 %.3f ms; processed path: "
              "LogitsProcessingCuda %.3f ms + SampleRowsCuda fp32 %.3f ms + LogprobRowsCuda "
              "(top 20) %.3f ms\n",
              static_cast<long long>(rows), static_cast<long long>(vocab), plain, process,
              sample_fp32, logprobs);
}

TEST(LogitsProcessingCudaTest, RejectsBadArguments) {
  const bf16* logits = reinterpret_cast<const bf16*>(16);
  const auto* params = reinterpret_cast<const LogitsProcessingRow*>(16);
  float* out = reinterpret_cast<float*>(16);
  void* ws = reinterpret_cast<void*>(16);
  const size_t ws_bytes = LogitsProcessingCudaWorkspaceBytes(2, 8);
  EXPECT_EQ(ws_bytes, 64u);
  EXPECT_EQ(LogitsProcessingCuda(logits, -1, 8, params, nullptr, nullptr, nullptr, 0, out, ws, ws_bytes,
                                 0)
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LogitsProcessingCuda(logits, 2, 8, params, nullptr, nullptr, nullptr, 0, out, ws, 63, 0)
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LogitsProcessingCuda(logits, 2, 8, params, nullptr, nullptr, nullptr, 0, nullptr, ws,
                                 ws_bytes, 0)
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(
      LogitsProcessingCuda(nullptr, 0, 8, nullptr, nullptr, nullptr, nullptr, 0, nullptr, nullptr,
                           0, 0)
          .ok());
  const int32_t* tokens = reinterpret_cast<const int32_t*>(16);
  float* lp = reinterpret_cast<float*>(16);
  EXPECT_EQ(LogprobRowsCuda(logits, 1, 8, nullptr, nullptr, tokens, nullptr, kMaxTopLogprobs + 1,
                            lp, nullptr, nullptr, 0)
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      LogprobRowsCuda(logits, 1, 8, nullptr, nullptr, tokens, nullptr, 4, lp, nullptr, nullptr, 0)
          .code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(LogprobRowsCuda(nullptr, 0, 8, nullptr, nullptr, nullptr, nullptr, 0, nullptr,
                              nullptr, nullptr, 0)
                  .ok());
}

}  // namespace
}  // namespace sluice::kernels
