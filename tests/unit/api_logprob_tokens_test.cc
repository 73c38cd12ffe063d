// Logprob token strings of a SentencePiece tokenizer (tests/fixtures/llama-spm, Llama 2's
// vocabulary): a token is reported as a continuation of the text before it, as vLLM decodes
// it with context, so "▁the" is " the" (decoding the id alone drops the space: Llama 2's Strip
// decoder removes the text's first space), and a lone byte-fallback byte is U+FFFD.
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "engine/tokenizer/tokenizer.h"
#include "services/api/openai_responses.h"
#include "tests/util/test_paths.h"

namespace sluice {
namespace {

using nlohmann::json;

class SpmLogprobTokensTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto tok = Tokenizer::FromFile(testing::RepoFixtureDir("llama-spm") + "/tokenizer.json");
    ASSERT_TRUE(tok.ok()) << tok.status();
    tokenizer_ = *std::move(tok);
    the_ = *tokenizer_->TokenToId("▁the");
    paris_ = *tokenizer_->TokenToId("▁Paris");
    byte_e2_ = *tokenizer_->TokenToId("<0xE2>");
    ASSERT_EQ(the_, 278);
    // The premise: decoding the id alone loses the space.
    const int32_t ids[1] = {the_};
    ASSERT_EQ(tokenizer_->Decode(ids, false), "the");
  }
  std::unique_ptr<Tokenizer> tokenizer_;
  int32_t the_ = 0, paris_ = 0, byte_e2_ = 0;
};

TEST_F(SpmLogprobTokensTest, ChatLogprobTokensKeepTheirLeadingSpace) {
  TokenLogprobInfo info;
  info.token_id = the_;
  info.logprob = -0.5f;
  info.top_logprobs = {{the_, -0.5f}, {paris_, -1.5f}, {byte_e2_, -3.0f}};
  const json content = ChatLogprobsJson(*tokenizer_, {info})["content"];
  EXPECT_EQ(content[0]["token"], " the");
  EXPECT_EQ(content[0]["bytes"], json::array({32, 116, 104, 101}));
  EXPECT_EQ(content[0]["top_logprobs"][0]["token"], " the");
  EXPECT_EQ(content[0]["top_logprobs"][1]["token"], " Paris");
  EXPECT_EQ(content[0]["top_logprobs"][2]["token"], "\xEF\xBF\xBD");  // U+FFFD
  EXPECT_EQ(content[0]["top_logprobs"][2]["bytes"], json::array({0xE2}));
}

TEST_F(SpmLogprobTokensTest, CompletionAndPromptLogprobTokensKeepTheirLeadingSpace) {
  TokenLogprobInfo info;
  info.token_id = paris_;
  info.logprob = -0.25f;
  info.top_logprobs = {{the_, -1.0f}};
  const json lp = CompletionLogprobsJson(*tokenizer_, {info}, false);
  EXPECT_EQ(lp["tokens"], json::array({" Paris"}));
  EXPECT_TRUE(lp["top_logprobs"][0].contains(" the"));
  EXPECT_TRUE(lp["top_logprobs"][0].contains(" Paris"));

  PromptLogprob p;
  p.token_id = the_;
  p.logprob = -2.0f;
  p.rank = 1;
  p.top_logprobs = {{paris_, -2.5f}};
  const json prompt = PromptLogprobsJson(*tokenizer_, {p});
  EXPECT_EQ(prompt[1][std::to_string(the_)]["decoded_token"], " the");
  EXPECT_EQ(prompt[1][std::to_string(paris_)]["decoded_token"], " Paris");
}

}  // namespace
}  // namespace sluice
