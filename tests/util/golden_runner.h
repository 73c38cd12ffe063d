// GoldenRunner: drives a Model through prefill and greedy decode with a paged KV cache and
// hand-made block tables (no scheduler), for golden tests against reference logits.
//
// Typical use (see tests/golden/model_golden_test.cc):
//   auto model = LoadModel(dir);                            // any architecture
//   auto cases = LoadGoldenCases(dir + "/golden.safetensors");
//   GoldenRunOptions opt;  opt.block_size = 4;  opt.prefill_chunk = 7;  opt.num_new_tokens = 32;
//   auto run = RunGreedy(**model, cases->at(i).input_ids, opt);
//   CompareToGolden(*run, cases->at(i), vocab_size) → max |Δlogit|, argmax mismatches, ...
#ifndef SLUICE_TESTS_UTIL_GOLDEN_RUNNER_H_
#define SLUICE_TESTS_UTIL_GOLDEN_RUNNER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/model.h"

namespace sluice::testing {

struct GoldenRunOptions {
  int64_t block_size = 16;     // tokens per KV block
  int64_t prefill_chunk = 0;   // prompt tokens per Forward; 0: the whole prompt at once
  int64_t num_new_tokens = 32;  // greedy tokens to generate (the first comes from the prompt)
};

// GoldenRun is one sequence's result.
struct GoldenRun {
  // Logits at every position fed to the model: the T prompt positions, then the
  // num_new_tokens - 1 decode positions. [T + num_new_tokens - 1, vocab_size], row-major.
  std::vector<float> logits;
  int64_t num_prompt_tokens = 0;
  std::vector<int32_t> greedy;  // [num_new_tokens] argmax tokens (first from the last prompt row)
};

// RunGreedyBatch runs all prompts together: every Forward carries the next prefill chunk of each
// sequence still in prefill plus one decode token of each sequence already decoding (so chunked
// prefill and decode are mixed in one step when the prompts differ in length). Blocks are
// handed out in a scattered, non-contiguous order across the sequences of one fresh KvCache.
// Greedy = argmax (lowest index on ties), no EOS stop. Errors: those of Model::Forward.
absl::StatusOr<std::vector<GoldenRun>> RunGreedyBatch(
    Model& model, const std::vector<std::vector<int32_t>>& prompts,
    const GoldenRunOptions& options);

// RunGreedy is RunGreedyBatch for a single prompt.
absl::StatusOr<GoldenRun> RunGreedy(Model& model, const std::vector<int32_t>& prompt,
                                    const GoldenRunOptions& options);

// GoldenCase is one prompt of a golden.safetensors file (shared/fixtures/README.md):
// input_ids_<i> [T] int64, logits_<i> [T, V] float32, greedy_<i> [G] int64.
struct GoldenCase {
  std::vector<int32_t> input_ids;
  std::vector<float> logits;  // [T, V]
  std::vector<int32_t> greedy;
};

// LoadGoldenCases reads cases i = 0, 1, ... until input_ids_<i> is absent.
// Errors: NotFound (no file or no case 0), InvalidArgument (inconsistent shapes).
absl::StatusOr<std::vector<GoldenCase>> LoadGoldenCases(const std::string& path);

// GoldenComparison summarizes a run against a case over the T prompt positions.
struct GoldenComparison {
  float max_abs_diff = 0;            // max |Δlogit| over all prompt positions and vocab
  int64_t argmax_mismatches = 0;     // prompt positions whose argmax differs
  int64_t first_greedy_mismatch = -1;  // index of the first differing greedy token, -1: none
};
GoldenComparison CompareToGolden(const GoldenRun& run, const GoldenCase& golden,
                                 int64_t vocab_size);

// ArgMax returns the index of the largest of values[0..n) (lowest index on ties).
int32_t ArgMax(const float* values, int64_t n);

}  // namespace sluice::testing

#endif  // SLUICE_TESTS_UTIL_GOLDEN_RUNNER_H_
