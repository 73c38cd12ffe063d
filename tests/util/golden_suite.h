// What the golden test files share (tests/golden/*_golden_test.cc): a model folder's model and
// golden cases, loaded once per test binary, and the check of every case run alone against the
// reference logits and greedy tokens.
#ifndef SLUICE_TESTS_UTIL_GOLDEN_SUITE_H_
#define SLUICE_TESTS_UTIL_GOLDEN_SUITE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/model/model.h"
#include "tests/util/golden_runner.h"

namespace sluice::testing {

struct GoldenModelCases {
  std::unique_ptr<Model> model;
  std::vector<GoldenCase> cases;  // of <dir>/golden.safetensors
};

// LoadGoldenModelCases: the model and cases of folder `dir`, loaded on first use and kept for
// the binary's run. Null, after a gtest failure naming the error, when either does not load.
GoldenModelCases* LoadGoldenModelCases(const std::string& dir);

// What CheckGoldenCases expects of every case.
struct GoldenExpectations {
  std::string label;          // names the model in failures and in the printed lines
  int64_t greedy_tokens = 0;  // length of each case's greedy_<i>
  float tolerance = 0;        // max |Δlogit| over the prompt positions
};

// CheckGoldenCases runs each of the 4 cases of folder `dir` (LoadGoldenModelCases) alone with
// `options` (num_new_tokens: the case's greedy length) and checks (gtest EXPECTs) max |Δlogit|
// within the tolerance, the argmax at every prompt position and the greedy tokens; prints each
// case's max |Δlogit| and records the worst as the test property max_abs_dlogit_<mode>. Returns
// the runs, empty after a failure to load or run.
std::vector<GoldenRun> CheckGoldenCases(const std::string& dir, const GoldenExpectations& expect,
                                        const GoldenRunOptions& options, const std::string& mode);

// CheckChunkedPrefillIsBitwiseWhole: CheckGoldenCases with the whole prompt in one Forward
// (block size 16) and in chunks of 7 (block size 4), and the two runs' logits bit-identical
// (the kernels are batch invariant: chunking changes no bit).
void CheckChunkedPrefillIsBitwiseWhole(const std::string& dir, const GoldenExpectations& expect);

// CheckBatchedMatchesGolden runs cases `picked` together (RunGreedyBatch with `batched`: steps
// mix prefill chunks and decode tokens when the prompts differ in length) and checks each
// against its reference (tolerance, argmax, greedy tokens) and its logits bit-identical to a
// run alone with `alone` (batch invariance).
void CheckBatchedMatchesGolden(const std::string& dir, const GoldenExpectations& expect,
                               const std::vector<size_t>& picked, GoldenRunOptions batched,
                               GoldenRunOptions alone);

}  // namespace sluice::testing

#endif  // SLUICE_TESTS_UTIL_GOLDEN_SUITE_H_
