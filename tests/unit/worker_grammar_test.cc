// Workers compile the grammar text the router sends (SamplingParams.grammar_ebnf).
#include "services/common/worker_grammar.h"

#include "engine/grammar/grammar_compiler.h"
#include "engine/grammar/grammar_matcher.h"
#include "engine/tokenizer/tokenizer.h"
#include "gtest/gtest.h"
#include "tests/util/test_paths.h"

namespace sluice {
namespace {

bool Matches(const std::shared_ptr<const grammar::CompiledGrammar>& g, const std::string& text) {
  grammar::GrammarMatcher m(g);
  return m.AcceptBytes(text) && m.CanEnd();
}

TEST(WorkerGrammars, CompilesTheRoutersGrammarText) {
  auto tokenizer = Tokenizer::FromFile(testing::FixtureDir("tokenizer") + "/tokenizer.json");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  grammar::GrammarCompiler router(grammar::TokenVocab::FromTokenizer(**tokenizer, {}));
  auto sent = router.Compile({grammar::GrammarKind::kJsonSchema,
                              R"({"type": "object", "properties": {"n": {"enum": [1, 22]}},
                                  "required": ["n"]})",
                              {}});
  ASSERT_TRUE(sent.ok()) << sent.status();

  WorkerGrammars worker(tokenizer->get());
  v1::SamplingParams sampling;
  auto none = worker.Compile(sampling);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*none, nullptr);
  sampling.set_grammar_ebnf((*sent)->ebnf());
  auto got = worker.Compile(sampling);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_NE(*got, nullptr);
  EXPECT_TRUE(Matches(*got, "{\"n\": 22}"));
  EXPECT_FALSE(Matches(*got, "{\"n\": 2}"));
  auto again = worker.Compile(sampling);
  EXPECT_EQ(again->get(), got->get());  // cached

  sampling.set_grammar_ebnf("root ::= (\"a\"");
  EXPECT_EQ(worker.Compile(sampling).status().code(), absl::StatusCode::kInvalidArgument);
  sampling.set_grammar_ebnf("no rule here");
  EXPECT_EQ(worker.Compile(sampling).status().code(), absl::StatusCode::kInvalidArgument);
  // A worker without a tokenizer, or without grammars at all, refuses constrained requests.
  sampling.set_grammar_ebnf((*sent)->ebnf());
  WorkerGrammars blind(nullptr);
  EXPECT_EQ(blind.Compile(sampling).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(RequestGrammar(nullptr, sampling).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(*RequestGrammar(nullptr, v1::SamplingParams()), nullptr);
}

}  // namespace
}  // namespace sluice
