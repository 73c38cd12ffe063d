// Images through the router (issue 26): the API without an in-process encoder checks images and
// keeps their bytes; the Encode reply is checked and spliced into the request; the images cross
// to the workers (mm_inputs) and back unchanged; encoders register as their own pool.
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "services/api/image_fetch.h"
#include "services/api/multimodal_input.h"
#include "services/router/image_encoding.h"
#include "services/router/worker_registry.h"
#include "services/common/worker_wire.h"
#include "engine/vision/embedding_cache.h"
#include "tests/util/test_paths.h"

namespace sluice {
namespace {

using sluice::testing::ReadFileBytes;

// A router-side context (no encoder): image token 7, 4 placeholder tokens per image.
MultimodalContext RouterContext() {
  MultimodalContext mm;
  mm.image_token_id = 7;
  mm.tokens_per_image = 4;
  mm.preprocess_fingerprint = "fp";
  mm.max_images_per_prompt = 2;
  return mm;
}

TEST(ImageRoutingTest, WithoutAnEncoderImagesAreCheckedAndKeptAsBytes) {
  const std::string png = ReadFileBytes(testing::FixtureDir("llava-tiny") + "/image_0.png");
  ASSERT_FALSE(png.empty());
  MultimodalContext mm = RouterContext();
  std::vector<int32_t> prompt = {1, 7, 9, 7, 2};
  auto out = EncodePromptImages({{png, "messages[0].content[0]"}, {png, "messages[0].content[1]"}},
                                mm, &prompt);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(prompt, (std::vector<int32_t>{1, 7, 7, 7, 7, 9, 7, 7, 7, 7, 2}));
  ASSERT_EQ(out->size(), 2u);
  EXPECT_EQ((*out)[0].offset, 1);
  EXPECT_EQ((*out)[1].offset, 6);
  for (const MultimodalInput& in : *out) {
    EXPECT_EQ(in.num_tokens, 4);
    EXPECT_EQ(in.embeddings, nullptr);
    ASSERT_NE(in.image, nullptr);
    EXPECT_EQ(*in.image, png);
    EXPECT_EQ(in.content_hash, vision::ImageContentHash(png, "fp"));
  }
  // A bad image is the same 400 as with an encoder, before anything is sent anywhere.
  prompt = {1, 7, 2};
  auto bad = EncodePromptImages({{png.substr(0, png.size() / 2), "messages[0].content[0]"}}, mm,
                                &prompt);
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(bad.status()));
  EXPECT_NE(bad.status().message().find("messages[0].content[0]: truncated or corrupt PNG image"),
            std::string::npos)
      << bad.status();
}

EngineRequest PendingRequest() {
  EngineRequest r;
  r.prompt_token_ids = {1, 7, 7, 2, 7, 7};
  for (int32_t offset : {1, 4}) {
    MultimodalInput mm;
    mm.offset = offset;
    mm.num_tokens = 2;
    mm.content_hash = BlockHash{static_cast<uint64_t>(offset), 0x0102030405060708ull};
    mm.image = std::make_shared<const std::string>("img" + std::to_string(offset));
    r.mm_inputs.push_back(std::move(mm));
  }
  return r;
}

v1::ImageEmbedding Embedding(const MultimodalInput& mm, int32_t hidden, float base) {
  v1::ImageEmbedding e;
  e.set_content_hash(ContentHashToWire(mm.content_hash));
  e.set_num_tokens(mm.num_tokens);
  e.set_hidden_size(hidden);
  std::vector<float> v(static_cast<size_t>(mm.num_tokens * hidden));
  for (size_t i = 0; i < v.size(); ++i) v[i] = base + static_cast<float>(i);
  e.set_values(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
  return e;
}

TEST(ImageRoutingTest, EncodeReplyIsCheckedThenSpliced) {
  EngineRequest r = PendingRequest();
  const std::vector<size_t> pending = PendingImages(r);
  ASSERT_EQ(pending, (std::vector<size_t>{0, 1}));
  const v1::EncodeRequest call = EncodeRequestFor(r, pending);
  ASSERT_EQ(call.images_size(), 2);
  EXPECT_EQ(call.images(0), "img1");
  EXPECT_EQ(call.images(1), "img4");

  v1::EncodeResponse reply;
  *reply.add_embeddings() = Embedding(r.mm_inputs[0], 3, 10.0f);
  // Too few embeddings: nothing changes.
  absl::Status s = ApplyEncodeResponse(reply, pending, &r);
  EXPECT_TRUE(absl::IsInternal(s)) << s;
  EXPECT_EQ(r.mm_inputs[0].embeddings, nullptr);
  // Another image's hash (an encoder with another preprocessing config).
  *reply.add_embeddings() = Embedding(r.mm_inputs[0], 3, 20.0f);
  s = ApplyEncodeResponse(reply, pending, &r);
  EXPECT_NE(s.message().find("content hash differs"), std::string::npos) << s;
  // A wrong token count.
  MultimodalInput longer = r.mm_inputs[1];
  longer.num_tokens = 3;
  *reply.mutable_embeddings(1) = Embedding(longer, 3, 20.0f);
  s = ApplyEncodeResponse(reply, pending, &r);
  EXPECT_NE(s.message().find("placeholder tokens"), std::string::npos) << s;
  EXPECT_EQ(r.mm_inputs[1].embeddings, nullptr);
  ASSERT_NE(r.mm_inputs[1].image, nullptr);

  *reply.mutable_embeddings(1) = Embedding(r.mm_inputs[1], 3, 20.0f);
  ASSERT_TRUE(ApplyEncodeResponse(reply, pending, &r).ok());
  EXPECT_TRUE(PendingImages(r).empty());
  EXPECT_EQ(r.mm_inputs[1].image, nullptr);
  ASSERT_EQ(r.mm_inputs[1].embeddings->size(), 6u);
  EXPECT_EQ((*r.mm_inputs[1].embeddings)[5], 25.0f);

  // To the workers and back: offsets, hashes and embeddings unchanged.
  google::protobuf::RepeatedPtrField<v1::MultimodalInput> wire;
  MmInputsToWire(r.mm_inputs, &wire);
  auto back = MmInputsFromWire(wire);
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ((*back)[i].offset, r.mm_inputs[i].offset);
    EXPECT_EQ((*back)[i].num_tokens, r.mm_inputs[i].num_tokens);
    EXPECT_EQ((*back)[i].content_hash, r.mm_inputs[i].content_hash);
    EXPECT_EQ(*(*back)[i].embeddings, *r.mm_inputs[i].embeddings);
  }
  wire.Mutable(0)->set_content_hash("short");
  EXPECT_TRUE(absl::IsInvalidArgument(MmInputsFromWire(wire).status()));
  MmInputsToWire(r.mm_inputs, &wire);
  wire.Mutable(1)->mutable_embeddings()->push_back('x');
  EXPECT_TRUE(absl::IsInvalidArgument(MmInputsFromWire(wire).status()));
  // Neither embeddings nor image (worker_request_fuzz found the 0-byte copy from a null pointer
  // that this was): an empty embedding list, for the engine to refuse.
  MmInputsToWire(r.mm_inputs, &wire);
  wire.Mutable(1)->clear_embeddings();
  back = MmInputsFromWire(wire);
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_NE((*back)[1].embeddings, nullptr);
  EXPECT_TRUE((*back)[1].embeddings->empty());
  EXPECT_EQ((*back)[1].image, nullptr);
}

TEST(ImageRoutingTest, EncodersAreTheirOwnPool) {
  WorkerRegistry registry;
  auto decode = registry.Register(WorkerRole::kDecode, "127.0.0.1:1", WorkerLoad{});
  auto e1 = registry.Register(WorkerRole::kEncoder, "127.0.0.1:2", WorkerLoad{});
  auto e2 = registry.Register(WorkerRole::kEncoder, "127.0.0.1:3", WorkerLoad{});
  ASSERT_TRUE(decode.ok() && e1.ok() && e2.ok());
  EXPECT_EQ(e1->worker_id, "encoder-2");
  EXPECT_EQ(registry.CountLive(WorkerRole::kEncoder), 2);
  EXPECT_EQ(registry.CountLive(WorkerRole::kDecode), 1);
  // Load-balanced: the second pick goes to the other encoder while the first is busy; never
  // to a decode worker.
  auto a = registry.Pick(WorkerRole::kEncoder, 0);
  auto b = registry.Pick(WorkerRole::kEncoder, 0);
  ASSERT_TRUE(a.has_value() && b.has_value());
  EXPECT_NE(a->worker_id, b->worker_id);
  EXPECT_EQ(a->role, WorkerRole::kEncoder);
  // Failover: excluding the one that failed leaves the other.
  auto c = registry.Pick(WorkerRole::kEncoder, 0, {a->worker_id});
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->worker_id, b->worker_id);
  EXPECT_FALSE(registry.Pick(WorkerRole::kEncoder, 0, {e1->worker_id, e2->worker_id}));
}

TEST(ImageFetchTest, UrlsAndTheAllowList) {
  auto u = ParseHttpUrl("HTTPS://Images.Example.com/a/b.png?x=1#frag");
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_TRUE(u->https);
  EXPECT_EQ(u->host, "images.example.com");
  EXPECT_EQ(u->port, "443");
  EXPECT_EQ(u->target, "/a/b.png?x=1");
  u = ParseHttpUrl("http://127.0.0.1:8080");
  ASSERT_TRUE(u.ok());
  EXPECT_EQ(u->port, "8080");
  EXPECT_EQ(u->target, "/");
  u = ParseHttpUrl("http://[::1]:9/i.png");
  ASSERT_TRUE(u.ok());
  EXPECT_EQ(u->host, "::1");
  EXPECT_EQ(u->port, "9");
  EXPECT_TRUE(absl::IsInvalidArgument(ParseHttpUrl("ftp://x/y").status()));
  EXPECT_TRUE(absl::IsInvalidArgument(ParseHttpUrl("http://user:pw@x/y").status()));
  EXPECT_TRUE(absl::IsInvalidArgument(ParseHttpUrl("http://x:99999/y").status()));
  EXPECT_TRUE(absl::IsInvalidArgument(ParseHttpUrl("http:///y").status()));

  ImageFetcher off(ImageFetchOptions{});
  EXPECT_FALSE(off.enabled());
  ImageFetchOptions options;
  options.allowed_domains = {"Images.Example.com", "127.0.0.1"};
  ImageFetcher fetcher(options);
  EXPECT_TRUE(fetcher.enabled());
  EXPECT_TRUE(fetcher.Allowed("images.example.com"));
  EXPECT_FALSE(fetcher.Allowed("evil.images.example.com"));  // no subdomains
  EXPECT_FALSE(fetcher.Allowed("localhost"));
  // Refused before any connection: the host is checked first.
  auto body = fetcher.Fetch("http://localhost:1/i.png");
  EXPECT_NE(body.status().message().find("'localhost' is not in --allowed-media-domains"),
            std::string::npos)
      << body.status();
  options.allowed_domains = {"*"};
  EXPECT_TRUE(ImageFetcher(options).Allowed("anything.example"));
}

}  // namespace
}  // namespace sluice
