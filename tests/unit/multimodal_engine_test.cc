// LLMEngine with image inputs (EngineRequest::mm_inputs) on a fake model whose next token
// depends on every input embedding read back from the paged KV cache: the embeddings must be
// spliced at exactly the placeholder positions, across prefill chunks and preemptions, and the
// prefix cache must never share a block between prompts that differ only in an image. Images
// handed over as bytes are encoded through the engine's ImageEncoder only when a step must
// compute their positions, while the other requests go on.
#include <deque>
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

// FakeImageEncoder: records StartEncode calls and answers only when the test says so; an image's
// embeddings are looked up by its bytes.
class FakeImageEncoder final : public ImageEncoder {
 public:
  std::map<std::string, std::vector<float>> embeddings;  // image bytes -> embeddings
  std::vector<std::pair<uint64_t, std::vector<MultimodalInput>>> started;
  void StartEncode(uint64_t ticket, std::vector<MultimodalInput> inputs) override {
    started.emplace_back(ticket, std::move(inputs));
  }
  std::vector<ImageEncodeResult> PollEncodes() override {
    std::vector<ImageEncodeResult> out;
    out.swap(done_);
    return out;
  }
  // Answer finishes every encode started so far: with the embeddings, or with `error`.
  void Answer(const absl::Status& error = absl::OkStatus()) {
    for (auto& [ticket, inputs] : started) {
      ImageEncodeResult r;
      r.ticket = ticket;
      if (error.ok()) {
        for (MultimodalInput& mm : inputs) {
          if (mm.embeddings != nullptr) continue;
          mm.embeddings = std::make_shared<const std::vector<float>>(embeddings.at(*mm.image));
          mm.image.reset();
        }
        r.inputs = inputs;
      } else {
        r.inputs = error;
      }
      done_.push_back(std::move(r));
    }
    num_answered += static_cast<int>(started.size());
    started.clear();
  }
  int num_answered = 0;

 private:
  std::vector<ImageEncodeResult> done_;
};

std::unique_ptr<LLMEngine> MakeEncodingEngine(std::shared_ptr<FakeImageEncoder> encoder) {
  EngineOptions options;
  options.block_size = 4;
  options.num_kv_blocks = 64;
  options.max_model_len = 64;
  options.max_num_batched_tokens = 64;
  options.image_encoder = std::move(encoder);
  auto engine = LLMEngine::Create(std::make_unique<EmbeddingChecksumModel>(), options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return std::move(engine).value();
}

// The request of ImageRequest with its image as bytes (no embeddings), and the encoder knowing
// those bytes' embeddings.
EngineRequest BytesRequest(const std::string& id, float base, uint64_t hash,
                           FakeImageEncoder& encoder, EngineRequest* with_embeddings) {
  *with_embeddings = ImageRequest(id, base, hash);
  EngineRequest r = *with_embeddings;
  const std::string bytes = "image " + std::to_string(hash);
  encoder.embeddings[bytes] = *r.mm_inputs[0].embeddings;
  r.mm_inputs[0].embeddings.reset();
  r.mm_inputs[0].image = std::make_shared<const std::string>(bytes);
  return r;
}

void StepAll(LLMEngine& engine, std::map<std::string, std::vector<int32_t>>& tokens,
             std::map<std::string, RequestOutput>& finals, int max_steps = 1000) {
  for (int i = 0; i < max_steps && engine.HasUnfinishedRequests(); ++i) {
    for (const RequestOutput& out : engine.Step()) {
      for (const SampledToken& t : out.new_tokens) tokens[out.request_id].push_back(t.token_id);
      if (out.finished()) finals[out.request_id] = out;
    }
  }
}

TEST(MultimodalEngineTest, ImagesAsBytesAreEncodedOffTheStepWhileOtherRequestsRun) {
  auto encoder = std::make_shared<FakeImageEncoder>();
  auto engine = MakeEncodingEngine(encoder);
  EngineRequest reference;
  const EngineRequest img = BytesRequest("img", 100.0f, 7, *encoder, &reference);
  ASSERT_TRUE(engine->AddRequest(img).ok());
  const EngineRequest txt = testing::GreedyRequest("txt", {20, 21, 22, 23, 24}, 4);
  ASSERT_TRUE(engine->AddRequest(txt).ok());
  std::map<std::string, std::vector<int32_t>> tokens;
  std::map<std::string, RequestOutput> finals;
  // The image request waits for its embeddings (one encode, with its bytes); the text request
  // behind it is served to the end meanwhile.
  for (int i = 0; i < 50 && !finals.contains("txt"); ++i) {
    for (const RequestOutput& out : engine->Step()) {
      for (const SampledToken& t : out.new_tokens) tokens[out.request_id].push_back(t.token_id);
      if (out.finished()) finals[out.request_id] = out;
    }
  }
  ASSERT_TRUE(finals.contains("txt"));
  EXPECT_EQ(tokens["txt"], EmbeddingChecksumModel::Reference({20, 21, 22, 23, 24}, 4));
  EXPECT_FALSE(tokens.contains("img"));
  ASSERT_EQ(encoder->started.size(), 1u);
  ASSERT_EQ(encoder->started[0].second.size(), 1u);
  EXPECT_EQ(*encoder->started[0].second[0].image, "image 7");
  EXPECT_TRUE(engine->HasPendingTimers());  // the driver polls the encode
  encoder->Answer();
  StepAll(*engine, tokens, finals);
  EXPECT_EQ(tokens["img"], EmbeddingChecksumModel::Reference(Inputs(reference), 6));
  EXPECT_EQ(finals["img"].finish_reason, FinishReason::kLength);
  EXPECT_EQ(engine->counters().num_image_encodes, 1);
  // Kept: the same request preempted or recomputed later would not encode again.
  EXPECT_EQ(encoder->num_answered, 1);
}

TEST(MultimodalEngineTest, ATransferredPromptNeverEncodesItsImagesARecomputedOneDoes) {
  auto encoder = std::make_shared<FakeImageEncoder>();
  auto engine = MakeEncodingEngine(encoder);
  EngineRequest reference;
  const EngineRequest req = BytesRequest("a", 100.0f, 7, *encoder, &reference);
  const std::vector<double> inputs = Inputs(reference);
  const std::vector<int32_t> want = EmbeddingChecksumModel::Reference(inputs, 6);
  SampledToken first;
  first.token_id = want[0];

  // KV transferred: the prompt's KV (this fake model stores each position's input) lands in
  // the reserved blocks; decoding it needs no embeddings.
  auto blocks = engine->ReserveForTransfer(req, std::nullopt);
  ASSERT_TRUE(blocks.ok()) << blocks.status();
  const int64_t bs = engine->block_size();
  for (size_t p = 0; p < inputs.size(); ++p) {
    engine->kv_cache().k(0)[(*blocks)[p / bs] * bs + p % bs] = static_cast<float>(inputs[p]);
  }
  ASSERT_TRUE(engine->CompleteTransfer("a", absl::OkStatus(), first).ok());
  std::map<std::string, std::vector<int32_t>> tokens;
  std::map<std::string, RequestOutput> finals;
  StepAll(*engine, tokens, finals);
  EXPECT_EQ(tokens["a"], std::vector<int32_t>(want.begin() + 1, want.end()));
  EXPECT_TRUE(encoder->started.empty());
  EXPECT_EQ(engine->counters().num_image_encodes, 0);

  // The transfer failed: the prompt is recomputed here, with the image encoded first.
  EngineRequest again = req;
  again.request_id = "b";
  ASSERT_TRUE(engine->ReserveForTransfer(again, std::nullopt).ok());
  engine->ResetPrefixCache();  // nothing of "a" to reuse: every position is computed
  ASSERT_TRUE(engine->CompleteTransfer("b", absl::UnavailableError("prefill gone"), first).ok());
  for (int i = 0; i < 5; ++i) engine->Step();
  ASSERT_EQ(encoder->started.size(), 1u);
  EXPECT_FALSE(tokens.contains("b"));
  encoder->Answer();
  StepAll(*engine, tokens, finals);
  EXPECT_EQ(tokens["b"], std::vector<int32_t>(want.begin() + 1, want.end()));
  EXPECT_EQ(engine->counters().num_image_encodes, 1);
  EXPECT_EQ(engine->counters().num_transfers_recomputed, 1);
}

TEST(MultimodalEngineTest, AFailedOrAbortedEncodeEndsOnlyItsRequest) {
  auto encoder = std::make_shared<FakeImageEncoder>();
  auto engine = MakeEncodingEngine(encoder);
  const int64_t free_blocks = engine->num_free_blocks();
  EngineRequest reference;
  EngineRequest bad = BytesRequest("bad", 100.0f, 7, *encoder, &reference);
  ASSERT_TRUE(engine->AddRequest(bad).ok());
  std::map<std::string, std::vector<int32_t>> tokens;
  std::map<std::string, RequestOutput> finals;
  engine->Step();
  ASSERT_EQ(encoder->started.size(), 1u);
  encoder->Answer(absl::InvalidArgumentError("mm_inputs[0]: truncated or corrupt PNG image"));
  StepAll(*engine, tokens, finals);
  ASSERT_TRUE(finals.contains("bad"));
  EXPECT_EQ(finals["bad"].finish_reason, FinishReason::kError);
  EXPECT_EQ(finals["bad"].status,
            absl::InvalidArgumentError("mm_inputs[0]: truncated or corrupt PNG image"));
  EXPECT_FALSE(tokens.contains("bad"));

  // Aborted while its image encodes: ends at once; the late answer is dropped.
  EngineRequest gone = BytesRequest("gone", 100.0f, 8, *encoder, &reference);
  ASSERT_TRUE(engine->AddRequest(gone).ok());
  engine->Step();
  ASSERT_EQ(encoder->started.size(), 1u);
  engine->AbortRequest("gone");
  StepAll(*engine, tokens, finals);
  EXPECT_EQ(finals["gone"].finish_reason, FinishReason::kAbort);
  encoder->Answer();
  engine->Step();
  EXPECT_FALSE(engine->HasUnfinishedRequests());
  EXPECT_FALSE(engine->HasPendingTimers());
  EXPECT_EQ(engine->num_free_blocks(), free_blocks);

  // Without an encoder, bytes alone are refused.
  auto plain = MakeEngine(64);
  EXPECT_EQ(plain->AddRequest(gone).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace sluice
