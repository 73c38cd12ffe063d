// Jump-forward decoding (EngineOptions::grammar_jump_forward) on the embedded sluice-mini-moe
// with its real tokenizer: JSON-schema requests give exactly the tokens (so the text) of the
// step-by-step constrained run, greedy and sampled with a seed, batched; the forced tokens are
// counted (EngineCounters::num_jump_forward_tokens) and each one saves a model step. With
// speculative decoding (sluice-mini-draft drafting), structured-output rows draft and their
// drafts are checked against the grammar when verified: greedy output equals the output without
// speculation, and sampled output still follows the grammar.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "engine/grammar/grammar_compiler.h"
#include "engine/grammar/grammar_matcher.h"
#include "engine/model/model.h"
#include "engine/sched/llm_engine.h"
#include "engine/spec/draft_model_drafter.h"
#include "engine/tokenizer/tokenizer.h"
#include "tests/util/test_paths.h"

namespace sluice {
namespace {

// Schemas whose objects require their properties, so keys and separators are forced.
const char* kSchemas[] = {
    R"({"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"enum": ["Jerusalem", "Babylon", "Egypt"]}},
        "required": ["name", "age", "city"], "additionalProperties": false})",
    R"({"type": "object", "properties": {"book": {"enum": ["Genesis", "Exodus", "Psalms"]},
        "chapter": {"type": "integer", "minimum": 1, "maximum": 150},
        "verses": {"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": 99},
                   "minItems": 1, "maxItems": 3}},
        "required": ["book", "chapter", "verses"], "additionalProperties": false})",
    R"({"type": "object", "properties": {"ok": {"type": "boolean"},
        "kind": {"const": "verse"}, "tags": {"type": "array", "items": {"enum": ["light", "dark"]},
        "maxItems": 2}}, "required": ["ok", "kind", "tags"], "additionalProperties": false})",
};

struct EngineRun {
  std::map<std::string, std::vector<int32_t>> tokens;
  std::map<std::string, FinishReason> reasons;
  EngineCounters counters;
};

class JumpForwardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string dir = testing::EmbeddedModelDir();
    auto tok = Tokenizer::FromFile(dir + "/tokenizer.json");
    ASSERT_TRUE(tok.ok()) << tok.status();
    tokenizer_ = std::move(*tok);
    compiler_ = std::make_unique<grammar::GrammarCompiler>(
        grammar::TokenVocab::FromTokenizer(*tokenizer_, {}, 8192));
  }

  std::vector<EngineRequest> Requests(float temperature) {
    std::vector<EngineRequest> out;
    const char* asks[] = {"Give me a person as JSON.", "Which verse? Answer in JSON.",
                          "Describe the verse in JSON."};
    for (int i = 0; i < 3; ++i) {
      auto g = compiler_->Compile({grammar::GrammarKind::kJsonSchema, kSchemas[i], {}});
      EXPECT_TRUE(g.ok()) << g.status();
      EngineRequest r;
      r.request_id = "r" + std::to_string(i);
      r.prompt_token_ids = tokenizer_->Encode(
          std::string("<|begin_of_text|><|user|>\n") + asks[i] +
              "<|end_of_text|>\n<|assistant|>\n",
          false);
      r.sampling.temperature = temperature;
      r.sampling.seed = 40 + i;
      r.sampling.max_tokens = 120;
      r.grammar = *g;
      out.push_back(std::move(r));
    }
    return out;
  }

  static EngineRun RunEngine(bool jump_forward, std::vector<EngineRequest> requests,
                             std::shared_ptr<Drafter> drafter = nullptr) {
    auto model = LoadModel(testing::EmbeddedModelDir());
    EXPECT_TRUE(model.ok()) << model.status();
    EngineOptions options;
    options.block_size = 16;
    options.num_kv_blocks = 128;
    options.grammar_jump_forward = jump_forward;
    if (drafter != nullptr) {
      options.speculative.drafter = std::move(drafter);
      options.speculative.verify = VerifyMode::kFixed;
      options.speculative.num_speculative_tokens = 4;
    }
    auto engine = LLMEngine::Create(std::move(*model), options);
    EXPECT_TRUE(engine.ok()) << engine.status();
    EngineRun run;
    for (EngineRequest& r : requests) EXPECT_TRUE((*engine)->AddRequest(std::move(r)).ok());
    for (int i = 0; i < 2000 && (*engine)->HasUnfinishedRequests(); ++i) {
      for (RequestOutput& out : (*engine)->Step()) {
        for (const SampledToken& t : out.new_tokens) run.tokens[out.request_id].push_back(t.token_id);
        if (out.finished()) run.reasons[out.request_id] = out.finish_reason;
      }
    }
    EXPECT_FALSE((*engine)->HasUnfinishedRequests());
    run.counters = (*engine)->counters();
    return run;
  }

  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<grammar::GrammarCompiler> compiler_;
};

TEST_F(JumpForwardTest, SameTokensAsTheStepsGreedyAndSampled) {
  for (float temperature : {0.0f, 1.0f}) {
    SCOPED_TRACE(::testing::Message() << "temperature " << temperature);
    const EngineRun steps = RunEngine(false, Requests(temperature));
    const EngineRun jumped = RunEngine(true, Requests(temperature));
    EXPECT_EQ(steps.counters.num_jump_forward_tokens, 0);
    ASSERT_EQ(steps.tokens.size(), 3u);
    for (const auto& [id, tokens] : steps.tokens) {
      EXPECT_EQ(jumped.tokens.at(id), tokens)
          << id << "\nsteps:  " << tokenizer_->Decode(tokens, true)
          << "\njumped: " << tokenizer_->Decode(jumped.tokens.at(id), true);
      EXPECT_EQ(jumped.reasons.at(id), FinishReason::kStop) << id;
      EXPECT_EQ(steps.reasons.at(id), FinishReason::kStop) << id;
    }
    EXPECT_GT(jumped.counters.num_jump_forward_tokens, 0);
    EXPECT_EQ(jumped.counters.num_generation_tokens, steps.counters.num_generation_tokens);
    EXPECT_LT(jumped.counters.num_steps, steps.counters.num_steps);
  }
}

TEST_F(JumpForwardTest, EachForcedTokenSavesAStep) {
  // One request alone: every forced token is a decode step the run does not take.
  auto first = [&] {
    std::vector<EngineRequest> r = Requests(0.0f);
    r.resize(1);
    return r;
  };
  const EngineRun steps = RunEngine(false, first());
  const EngineRun jumped = RunEngine(true, first());
  ASSERT_GT(jumped.counters.num_jump_forward_tokens, 0);
  EXPECT_EQ(jumped.tokens.at("r0"), steps.tokens.at("r0"));
  EXPECT_EQ(jumped.counters.num_steps + jumped.counters.num_jump_forward_tokens,
            steps.counters.num_steps);
}

std::shared_ptr<Drafter> DraftModel() {
  DraftModelOptions options;
  options.block_size = 16;
  options.num_kv_blocks = 128;
  options.model_id = "sluice-mini-draft";
  auto model = LoadModel(testing::SharedModelDir("sluice-mini-draft"));
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return nullptr;
  auto drafter = DraftModelDrafter::Create(std::move(*model), options);
  EXPECT_TRUE(drafter.ok()) << drafter.status();
  return drafter.ok() ? std::shared_ptr<Drafter>(std::move(*drafter)) : nullptr;
}

TEST_F(JumpForwardTest, SpeculationChecksDraftsAgainstTheGrammar) {
  for (float temperature : {0.0f, 1.0f}) {
    SCOPED_TRACE(::testing::Message() << "temperature " << temperature);
    const EngineRun plain = RunEngine(true, Requests(temperature));
    const EngineRun spec = RunEngine(true, Requests(temperature), DraftModel());
    EXPECT_GT(spec.counters.num_spec_verifications, 0);
    EXPECT_GT(spec.counters.num_spec_accepted_tokens, 0);
    // The draft model knows no grammar: some of its drafts break it and are rejected.
    EXPECT_LT(spec.counters.num_spec_accepted_tokens, spec.counters.num_spec_draft_tokens);
    ASSERT_EQ(spec.tokens.size(), 3u);
    for (const auto& [id, tokens] : spec.tokens) {
      EXPECT_EQ(spec.reasons.at(id), FinishReason::kStop) << id;
      // Every token is one the grammar allows, and the output completes it.
      auto g = compiler_->Compile(
          {grammar::GrammarKind::kJsonSchema, kSchemas[id.back() - '0'], {}});
      ASSERT_TRUE(g.ok()) << g.status();
      grammar::GrammarMatcher matcher(*g);
      for (size_t t = 0; t + 1 < tokens.size(); ++t) {
        ASSERT_TRUE(matcher.AcceptToken(tokens[t]))
            << id << " token " << t << ": " << tokenizer_->Decode(tokens, true);
      }
      EXPECT_TRUE(matcher.CanEnd()) << id << ": " << tokenizer_->Decode(tokens, true);
      // Greedy: token for token the output without speculation (sampled requests draw their
      // random numbers differently with speculation: the same distribution, not the same text).
      if (temperature == 0.0f) {
        EXPECT_EQ(tokens, plain.tokens.at(id))
            << id << "\nplain: " << tokenizer_->Decode(plain.tokens.at(id), true)
            << "\nspec:  " << tokenizer_->Decode(tokens, true);
      }
    }
  }
}

}  // namespace
}  // namespace sluice
