// LLMEngine with image inputs (EngineRequest::mm_inputs) on a fake model whose next token
// depends on every input embedding read back from the paged KV cache: the embeddings must be
// spliced at exactly the placeholder positions, across prefill chunks and preemptions, and the
// prefix cache must never share a block between prompts that differ only in an image.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "engine/sched/llm_engine.h"
#include "tests/util/fake_models.h"

namespace sluice {
namespace {

// EmbeddingChecksumModel: hidden size 1; a token's input is its embedding row when given
// (ForwardInput::embedding_rows), else its token id; the KV cache stores that input and the next
// token is (Σ inputs of the context · 31 + position) mod kVocab (never EOS).
class EmbeddingChecksumModel final : public Model {
 public:
  static constexpr int64_t kVocab = 64;
  EmbeddingChecksumModel() {
    config_.vocab_size = kVocab;
    config_.hidden_size = 1;
    config_.max_position_embeddings = 256;
    config_.eos_token_ids = {1};
  }
  const ModelConfig& config() const override { return config_; }
  KvCacheSpec kv_cache_spec() const override { return {1, 1, 0}; }
  int64_t WeightBytesPerToken() const override { return 0; }
  bool SupportsInputEmbeddings() const override { return true; }
  absl::Status Forward(const ForwardInput& in, KvCache& kv, absl::Span<float> logits) override {
    std::vector<float> input(in.token_ids.begin(), in.token_ids.end());
    for (size_t r = 0; r < in.embedding_rows.size(); ++r) {
      input[in.embedding_rows[r]] = in.embedding_values[r];
    }
    const int64_t bs = kv.block_size();
    for (size_t t = 0; t < input.size(); ++t) kv.k(0)[in.slot_mapping[t]] = input[t];
    std::fill(logits.begin(), logits.end(), 0.0f);
    for (size_t row = 0; row < in.logits_indices.size(); ++row) {
      const int32_t index = in.logits_indices[row];
      const SequenceSlice* seq = nullptr;
      for (const SequenceSlice& s : in.sequences) {
        if (index >= s.query_start && index < s.query_start + s.num_query_tokens) seq = &s;
      }
      const int32_t pos = in.positions[index];
      double sum = 0;
      for (int32_t p = 0; p <= pos; ++p) sum += kv.k(0)[seq->block_table[p / bs] * bs + p % bs];
      logits[row * kVocab + Next(sum, pos)] = 10.0f;
    }
    return absl::OkStatus();
  }
  static int32_t Next(double sum, int32_t pos) {
    const int32_t t = static_cast<int32_t>((static_cast<int64_t>(sum) * 31 + pos) % kVocab);
    return t == 1 ? 2 : t;
  }
  // Cache-free reference: `inputs` are the prompt's per-position inputs.
  static std::vector<int32_t> Reference(std::vector<double> inputs, int n) {
    std::vector<int32_t> out;
    for (int i = 0; i < n; ++i) {
      double sum = 0;
      for (double x : inputs) sum += x;
      out.push_back(Next(sum, static_cast<int32_t>(inputs.size()) - 1));
      inputs.push_back(out.back());
    }
    return out;
  }

 private:
  ModelConfig config_;
};

constexpr int32_t kImageToken = 6;

// A prompt of 3 text tokens, an image of `image_len` placeholders, 5 text tokens.
std::vector<int32_t> ImagePrompt(int image_len) {
  std::vector<int32_t> p = {9, 10, 11};
  p.insert(p.end(), image_len, kImageToken);
  for (int32_t t : {12, 13, 14, 15, 16}) p.push_back(t);
  return p;
}

MultimodalInput Image(int32_t offset, int32_t len, float base, uint64_t hash) {
  MultimodalInput mm;
  mm.offset = offset;
  mm.num_tokens = len;
  auto e = std::make_shared<std::vector<float>>();
  for (int32_t i = 0; i < len; ++i) e->push_back(base + static_cast<float>(i));
  mm.embeddings = e;
  mm.content_hash = BlockHash{hash, ~hash};
  return mm;
}

std::vector<double> Inputs(const EngineRequest& r) {
  std::vector<double> in(r.prompt_token_ids.begin(), r.prompt_token_ids.end());
  for (const MultimodalInput& mm : r.mm_inputs) {
    for (int32_t i = 0; i < mm.num_tokens; ++i) in[mm.offset + i] = (*mm.embeddings)[i];
  }
  return in;
}

std::unique_ptr<LLMEngine> MakeEngine(int32_t budget) {
  EngineOptions options;
  options.block_size = 4;
  options.num_kv_blocks = 64;
  options.max_model_len = 64;
  options.max_num_batched_tokens = budget;
  auto engine = LLMEngine::Create(std::make_unique<EmbeddingChecksumModel>(), options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return std::move(engine).value();
}

RequestOutput RunRequest(LLMEngine& engine, const EngineRequest& r, std::vector<int32_t>* tokens) {
  EXPECT_TRUE(engine.AddRequest(r).ok());
  RequestOutput last;
  for (int i = 0; i < 1000 && engine.HasUnfinishedRequests(); ++i) {
    for (const RequestOutput& out : engine.Step()) {
      for (const SampledToken& t : out.new_tokens) tokens->push_back(t.token_id);
      if (out.finished()) last = out;
    }
  }
  return last;
}

EngineRequest ImageRequest(const std::string& id, float base, uint64_t hash) {
  EngineRequest r = testing::GreedyRequest(id, ImagePrompt(9), 6);
  r.mm_inputs.push_back(Image(3, 9, base, hash));
  return r;
}

TEST(MultimodalEngineTest, EmbeddingsAreSplicedAcrossPrefillChunks) {
  for (int32_t budget : {64, 5, 3}) {  // whole prompt; chunks that cut through the image
    SCOPED_TRACE(budget);
    auto engine = MakeEngine(budget);
    const EngineRequest r = ImageRequest("a", 100.0f, 1);
    std::vector<int32_t> tokens;
    RunRequest(*engine, r, &tokens);
    EXPECT_EQ(tokens, EmbeddingChecksumModel::Reference(Inputs(r), 6));
  }
}

TEST(MultimodalEngineTest, PreemptedRequestsRecomputeWithTheirImages) {
  // 12 blocks of 4 tokens for three 17-token prompts growing to 29 tokens (8 blocks each):
  // sequences are preempted and recomputed (prefix cache first), their images spliced again.
  EngineOptions options;
  options.block_size = 4;
  options.num_kv_blocks = 12;
  options.max_model_len = 32;
  options.max_num_batched_tokens = 8;
  auto engine = LLMEngine::Create(std::make_unique<EmbeddingChecksumModel>(), options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  std::vector<EngineRequest> requests;
  for (int i = 0; i < 3; ++i) {
    EngineRequest r = ImageRequest("r" + std::to_string(i), 100.0f * (i + 1), 10 + i);
    r.sampling.max_tokens = 12;
    requests.push_back(r);
    const absl::Status added = (*engine)->AddRequest(r);
    ASSERT_TRUE(added.ok()) << added;
  }
  std::map<std::string, std::vector<int32_t>> tokens;
  for (int i = 0; i < 10000 && (*engine)->HasUnfinishedRequests(); ++i) {
    for (const RequestOutput& out : (*engine)->Step()) {
      for (const SampledToken& t : out.new_tokens) tokens[out.request_id].push_back(t.token_id);
    }
  }
  EXPECT_GT((*engine)->counters().num_preemptions, 0);
  for (const EngineRequest& r : requests) {
    EXPECT_EQ(tokens[r.request_id], EmbeddingChecksumModel::Reference(Inputs(r), 12))
        << r.request_id;
  }
}

TEST(MultimodalEngineTest, DifferentImagesNeverShareBlocksSameImageDoes) {
  auto engine = MakeEngine(64);
  std::vector<int32_t> a, b, c;
  const EngineRequest ra = ImageRequest("a", 100.0f, 1);
  const EngineRequest rb = ImageRequest("b", 200.0f, 2);  // same tokens, another image
  const EngineRequest rc = ImageRequest("c", 100.0f, 1);  // the first image again
  RunRequest(*engine, ra, &a);
  const RequestOutput ob = RunRequest(*engine, rb, &b);
  EXPECT_EQ(b, EmbeddingChecksumModel::Reference(Inputs(rb), 6));
  EXPECT_NE(a, b);
  // Block 0 (positions 0-3) already holds image position 3: nothing is shared.
  EXPECT_EQ(ob.num_cached_tokens, 0);
  const RequestOutput oc = RunRequest(*engine, rc, &c);
  EXPECT_EQ(c, a);
  EXPECT_EQ(oc.num_cached_tokens, 16);  // 4 full blocks of the 17-token prompt
}

TEST(MultimodalEngineTest, InvalidImageInputsAreRefused) {
  auto engine = MakeEngine(64);
  EngineRequest r = ImageRequest("x", 1.0f, 1);
  r.mm_inputs[0].offset = 12;  // runs past the prompt
  auto s = engine->AddRequest(r);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  r = ImageRequest("y", 1.0f, 1);
  r.mm_inputs.push_back(Image(5, 2, 1.0f, 3));  // overlaps the first
  EXPECT_EQ(engine->AddRequest(r).code(), absl::StatusCode::kInvalidArgument);
  r = ImageRequest("z", 1.0f, 1);
  r.mm_inputs[0].embeddings = std::make_shared<std::vector<float>>(3, 0.0f);
  EXPECT_EQ(engine->AddRequest(r).code(), absl::StatusCode::kInvalidArgument);
  // A text-only model refuses images.
  EngineOptions small;
  small.block_size = 4;
  small.num_kv_blocks = 16;
  small.max_model_len = 64;
  auto text = LLMEngine::Create(std::make_unique<testing::ChecksumModel>(), small);
  ASSERT_TRUE(text.ok());
  EngineRequest t = ImageRequest("t", 1.0f, 1);
  const absl::Status ts = (*text)->AddRequest(t);
  EXPECT_EQ(ts.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ts.message(), "this model does not accept image inputs");
}

TEST(MultimodalEngineTest, ImageHashesEnterTheBlockHashes) {
  BlockHasher hasher("id", 4);
  const std::vector<int32_t> tokens = ImagePrompt(9);
  std::vector<BlockHash> text, img1, img2;
  hasher.ExtendFullBlockHashes(hasher.RootHash(""), tokens, text);
  const BlockExtraKeySpan s1[] = {{3, 12, BlockHash{1, 1}}};
  const BlockExtraKeySpan s2[] = {{3, 12, BlockHash{2, 2}}};
  hasher.ExtendFullBlockHashes(hasher.RootHash(""), tokens, s1, img1);
  hasher.ExtendFullBlockHashes(hasher.RootHash(""), tokens, s2, img2);
  ASSERT_EQ(text.size(), 4u);
  for (size_t b = 0; b < 4; ++b) {
    EXPECT_NE(img1[b], img2[b]) << b;  // every block overlaps the image or follows it
    EXPECT_NE(img1[b], text[b]) << b;
  }
  // A block before any image hashes as text.
  std::vector<BlockHash> late;
  const BlockExtraKeySpan s3[] = {{8, 12, BlockHash{1, 1}}};
  hasher.ExtendFullBlockHashes(hasher.RootHash(""), tokens, s3, late);
  EXPECT_EQ(late[0], text[0]);
  EXPECT_EQ(late[1], text[1]);
  EXPECT_NE(late[2], text[2]);
}

}  // namespace
}  // namespace sluice
