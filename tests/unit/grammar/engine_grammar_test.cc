// The engine samples grammar-constrained requests only where the grammar allows, forces EOS
// once it is complete, and keeps unconstrained requests on the device paths beside them.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/grammar/grammar_compiler.h"
#include "engine/grammar/grammar_matcher.h"
#include "engine/sched/llm_engine.h"
#include "gtest/gtest.h"
#include "tests/unit/ranked_model.h"

namespace sluice {
namespace {

// Token i of RankedModel's 64 ids: a few letters and digits, EOS (1) and padding.
std::shared_ptr<const grammar::TokenVocab> Vocab() {
  std::vector<std::string> tokens(RankedModel::kVocab);
  const char* named[] = {"a", "b", "c", "ab", "ba", "abc", "0", "1", "2", "12", "x", "yz"};
  for (int i = 0; i < 12; ++i) tokens[10 + i] = named[i];
  for (int i = 30; i < RankedModel::kVocab; ++i) tokens[i] = std::string(1, static_cast<char>('d' + (i - 30) % 20));
  return grammar::TokenVocab::FromTokens(tokens, {RankedModel::kEos});
}

std::map<std::string, std::vector<int32_t>> RunEngine(bool device, std::vector<EngineRequest> requests,
                                                std::map<std::string, FinishReason>* reasons) {
  EngineOptions options;
  options.block_size = 4;
  options.num_kv_blocks = 256;
  auto engine = LLMEngine::Create(std::make_unique<RankedModel>(device, device), options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  std::map<std::string, std::vector<int32_t>> tokens;
  for (EngineRequest& r : requests) EXPECT_TRUE((*engine)->AddRequest(std::move(r)).ok());
  for (int i = 0; i < 1000 && (*engine)->HasUnfinishedRequests(); ++i) {
    for (RequestOutput& out : (*engine)->Step()) {
      for (const SampledToken& t : out.new_tokens) tokens[out.request_id].push_back(t.token_id);
      if (out.finished()) (*reasons)[out.request_id] = out.finish_reason;
    }
  }
  return tokens;
}

TEST(EngineGrammarTest, ConstrainedRowsFollowTheGrammar) {
  auto vocab = Vocab();
  grammar::GrammarCompiler compiler(vocab);
  auto regex = compiler.Compile({grammar::GrammarKind::kRegex, "(ab|c){1,3}1[0-9]", {}});
  ASSERT_TRUE(regex.ok()) << regex.status();
  auto choice = compiler.Compile({grammar::GrammarKind::kChoice, "", {"abc", "yz"}});
  ASSERT_TRUE(choice.ok());
  for (bool device : {false, true}) {
    for (float temperature : {0.0f, 1.0f}) {
      std::vector<EngineRequest> requests;
      for (int k = 0; k < 4; ++k) {
        EngineRequest r;
        r.request_id = "r" + std::to_string(k);
        r.prompt_token_ids = {3, 4, 5 + k};
        r.sampling.temperature = temperature;
        r.sampling.seed = 100 + k;
        r.sampling.max_tokens = 40;
        if (k == 0) r.grammar = *regex;
        if (k == 1) r.grammar = *choice;
        requests.push_back(std::move(r));
      }
      std::map<std::string, FinishReason> reasons;
      auto tokens = RunEngine(device, requests, &reasons);
      auto text = [&](const std::vector<int32_t>& ids) {
        std::string s;
        for (int32_t id : ids) {
          if (id != RankedModel::kEos) s += vocab->token_bytes(id);
        }
        return s;
      };
      SCOPED_TRACE(::testing::Message() << "device " << device << " temperature " << temperature);
      for (const char* id : {"r0", "r1"}) {
        ASSERT_FALSE(tokens[id].empty());
        EXPECT_EQ(tokens[id].back(), RankedModel::kEos) << id;  // forced once complete
        EXPECT_EQ(reasons[id], FinishReason::kStop) << id;
      }
      grammar::GrammarMatcher m0(*regex);
      EXPECT_TRUE(m0.AcceptBytes(text(tokens["r0"])) && m0.CanEnd()) << text(tokens["r0"]);
      const std::string c = text(tokens["r1"]);
      EXPECT_TRUE(c == "abc" || c == "yz") << c;
      // Unconstrained rows are untouched by the grammar rows' presence.
      std::map<std::string, FinishReason> alone_reasons;
      std::vector<EngineRequest> alone = {requests[2], requests[3]};
      auto alone_tokens = RunEngine(device, alone, &alone_reasons);
      EXPECT_EQ(tokens["r2"], alone_tokens["r2"]);
      EXPECT_EQ(tokens["r3"], alone_tokens["r3"]);
    }
  }
}

}  // namespace
}  // namespace sluice
