// Per-request results of an engine run and their comparison, for the speculative-decoding tests
// (tests/golden/speculative_engine_test.cc on the CPU, engine/cuda/cuda_spec_test.cc on the
// GPU): greedy output with speculation must be the output without it.
#ifndef SLUICE_TESTS_UTIL_SPEC_RESULTS_H_
#define SLUICE_TESTS_UTIL_SPEC_RESULTS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "engine/sched/request.h"
#include "engine/tokenizer/tokenizer.h"

namespace sluice::testing {

struct RequestResult {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  std::vector<std::vector<TokenLogprob>> top;
  FinishReason reason = FinishReason::kNone;
  int32_t num_outputs = 0;  // RequestOutputs with tokens
};
using RequestResults = std::map<std::string, RequestResult>;

// AddOutputs appends one Step()'s outputs to their requests' results.
inline void AddOutputs(const std::vector<RequestOutput>& outputs, RequestResults* results) {
  for (const RequestOutput& out : outputs) {
    RequestResult& r = (*results)[out.request_id];
    if (!out.new_tokens.empty()) ++r.num_outputs;
    for (const SampledToken& t : out.new_tokens) {
      r.tokens.push_back(t.token_id);
      r.logprobs.push_back(t.logprob);
      r.top.push_back(t.top_logprobs);
    }
    if (out.finished()) r.reason = out.finish_reason;
  }
}

// ExpectSameResults: the same requests, tokens, finish reasons and top-logprob ids; logprobs
// within 1e-4 (a device's fp32 log-sum-exp against the host's double one).
inline void ExpectSameResults(const RequestResults& want, const RequestResults& got) {
  ASSERT_EQ(want.size(), got.size());
  for (const auto& [id, w] : want) {
    SCOPED_TRACE(id);
    ASSERT_EQ(got.count(id), 1u);
    const RequestResult& g = got.at(id);
    EXPECT_EQ(w.tokens, g.tokens);
    EXPECT_EQ(w.reason, g.reason);
    ASSERT_EQ(w.logprobs.size(), g.logprobs.size());
    for (size_t i = 0; i < w.logprobs.size(); ++i) {
      EXPECT_NEAR(w.logprobs[i], g.logprobs[i], 1e-4) << "token " << i;
      ASSERT_EQ(w.top[i].size(), g.top[i].size()) << "token " << i;
      for (size_t j = 0; j < w.top[i].size(); ++j) {
        EXPECT_EQ(w.top[i][j].token_id, g.top[i][j].token_id) << "token " << i;
        EXPECT_NEAR(w.top[i][j].logprob, g.top[i][j].logprob, 1e-4) << "token " << i;
      }
    }
  }
}

// EncodeText: `text` through `dir`/tokenizer.json, special tokens added; empty (and a test
// failure) when the tokenizer does not load.
inline std::vector<int32_t> EncodeText(const std::string& dir, const std::string& text) {
  auto tokenizer = Tokenizer::FromFile(dir + "/tokenizer.json");
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
  return tokenizer.ok() ? (*tokenizer)->Encode(text, /*add_special_tokens=*/true)
                        : std::vector<int32_t>{};
}

}  // namespace sluice::testing

#endif  // SLUICE_TESTS_UTIL_SPEC_RESULTS_H_
