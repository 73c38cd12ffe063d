// Issue 26, images without an encoder worker: the prefill / decode workers encode images sent as
// bytes (WorkerImages) exactly as the encoder would, through a cache by content hash, and refuse
// inputs they cannot trust; the router's record of checked images skips decoding a repeated
// image (CheckedImages) without letting a bad one through.
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "engine/vision/embedding_cache.h"
#include "engine/vision/vision_encoder.h"
#include "gtest/gtest.h"
#include "services/api/checked_images.h"
#include "services/api/multimodal_input.h"
#include "services/router/image_encoding.h"
#include "services/router/worker_registry.h"
#include "services/common/worker_images.h"
#include "services/common/worker_wire.h"
#include "tests/util/test_paths.h"

namespace sluice {
namespace {

using sluice::testing::ReadFileBytes;

std::string Llava() { return testing::FixtureDir("llava-tiny"); }

WorkerImagesOptions Options(int64_t cache_bytes) {
  WorkerImagesOptions o;
  o.cache_bytes = cache_bytes;
  return o;
}

// One image input as the router sends it in the fallback: bytes, no embeddings.
MultimodalInput BytesInput(const std::string& bytes, const std::string& fingerprint,
                           int32_t num_tokens) {
  MultimodalInput mm;
  mm.offset = 1;
  mm.num_tokens = num_tokens;
  mm.content_hash = vision::ImageContentHash(bytes, fingerprint);
  mm.image = std::make_shared<const std::string>(bytes);
  return mm;
}

TEST(WorkerImagesTest, EncodesBytesAsTheEncoderDoesThroughItsCache) {
  auto reference = vision::VisionEncoder::Load(Llava());
  ASSERT_TRUE(reference.ok()) << reference.status();
  auto images = WorkerImages::Load(Llava(), Options(1 << 20));
  ASSERT_TRUE(images.ok()) << images.status();
  ASSERT_NE(*images, nullptr);
  const std::string fp = (*reference)->processor().Fingerprint();
  const int32_t n = static_cast<int32_t>((*reference)->tokens_per_image());
  const std::string png = ReadFileBytes(Llava() + "/image_1.png");
  const std::string jpg = ReadFileBytes(Llava() + "/image_2.jpg");
  ASSERT_FALSE(png.empty() || jpg.empty());

  std::vector<MultimodalInput> in = {BytesInput(png, fp, n), BytesInput(jpg, fp, n)};
  // An input that already has embeddings is left alone.
  MultimodalInput given = BytesInput(png, fp, n);
  given.image.reset();
  given.embeddings = std::make_shared<const std::vector<float>>(3, 1.5f);
  in.push_back(given);
  ASSERT_TRUE((*images)->EncodeMissing(&in).ok());
  for (int i = 0; i < 2; ++i) {
    auto decoded = vision::DecodeImage(i == 0 ? png : jpg, vision::ImageDecodeLimits{});
    ASSERT_TRUE(decoded.ok());
    auto want = (*reference)->EncodeImage(*decoded);
    ASSERT_TRUE(want.ok());
    ASSERT_NE(in[i].embeddings, nullptr);
    EXPECT_EQ(*in[i].embeddings, *want) << "image " << i;  // bit-equal: the same code
    EXPECT_EQ(in[i].image, nullptr);                       // bytes dropped once encoded
  }
  EXPECT_EQ(in[2].embeddings, given.embeddings);
  EXPECT_EQ((*images)->num_encoded(), 2);
  EXPECT_EQ((*images)->cache_stats().misses, 2);
  const double encode_seconds = (*images)->encode_seconds();
  EXPECT_GT(encode_seconds, 0.0);  // two tower runs on the CPU: milliseconds, never 0 µs

  // The same image again (a later turn, or decode after prefill): from the cache.
  std::vector<MultimodalInput> again = {BytesInput(png, fp, n)};
  ASSERT_TRUE((*images)->EncodeMissing(&again).ok());
  EXPECT_EQ(again[0].embeddings, in[0].embeddings);  // the cached vector itself
  EXPECT_EQ((*images)->num_encoded(), 2);
  EXPECT_EQ((*images)->cache_stats().hits, 1);
  const std::string metrics = RenderWorkerImageMetrics(**images);
  EXPECT_NE(metrics.find("sluice_encoder_cache_hits_total 1\n"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("sluice_worker_images_encoded_total 2\n"), std::string::npos) << metrics;
  // A cache hit adds no encode time.
  EXPECT_EQ((*images)->encode_seconds(), encode_seconds);
  EXPECT_NE(metrics.find(absl::StrCat("sluice_worker_image_encode_seconds_total ",
                                      encode_seconds, "\n")),
            std::string::npos)
      << metrics;
}

TEST(WorkerImagesTest, EncodesForTheEngineOnItsOwnThreads) {
  auto reference = vision::VisionEncoder::Load(Llava());
  ASSERT_TRUE(reference.ok()) << reference.status();
  WorkerImagesOptions options = Options(1 << 20);
  options.encode_threads = 1;
  auto images = WorkerImages::Load(Llava(), options);
  ASSERT_TRUE(images.ok()) << images.status();
  const std::string fp = (*reference)->processor().Fingerprint();
  const int32_t n = static_cast<int32_t>((*reference)->tokens_per_image());
  const std::string png = ReadFileBytes(Llava() + "/image_1.png");
  ImageEncoder& encoder = **images;
  encoder.StartEncode(7, {BytesInput(png, fp, n)});
  encoder.StartEncode(8, {BytesInput(png.substr(0, png.size() / 2), fp, n)});
  std::vector<ImageEncodeResult> results;
  for (int i = 0; i < 6000 && results.size() < 2; ++i) {
    for (ImageEncodeResult& r : encoder.PollEncodes()) results.push_back(std::move(r));
    if (results.size() < 2) absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_EQ(results.size(), 2u);
  EXPECT_EQ((*images)->num_encoding(), 0);
  // One thread: in the order started.
  EXPECT_EQ(results[0].ticket, 7u);
  ASSERT_TRUE(results[0].inputs.ok()) << results[0].inputs.status();
  auto decoded = vision::DecodeImage(png, vision::ImageDecodeLimits{});
  ASSERT_TRUE(decoded.ok());
  auto want = (*reference)->EncodeImage(*decoded);
  ASSERT_TRUE(want.ok());
  ASSERT_NE((*results[0].inputs)[0].embeddings, nullptr);
  EXPECT_EQ(*(*results[0].inputs)[0].embeddings, *want);
  EXPECT_EQ(results[1].ticket, 8u);
  EXPECT_TRUE(absl::IsInvalidArgument(results[1].inputs.status())) << results[1].inputs.status();
  EXPECT_NE(results[1].inputs.status().message().find("mm_inputs[0]: truncated or corrupt PNG"),
            std::string::npos)
      << results[1].inputs.status();
  EXPECT_EQ((*images)->num_encoded(), 1);
  EXPECT_TRUE(encoder.PollEncodes().empty());
}

TEST(WorkerImagesTest, RefusesInputsItCannotTrust) {
  auto images = WorkerImages::Load(Llava(), Options(0));  // no cache: every image decoded
  ASSERT_TRUE(images.ok()) << images.status();
  auto reference = vision::VisionEncoder::Load(Llava());
  ASSERT_TRUE(reference.ok());
  const std::string fp = (*reference)->processor().Fingerprint();
  const int32_t n = static_cast<int32_t>((*reference)->tokens_per_image());
  const std::string png = ReadFileBytes(Llava() + "/image_0.png");

  // A hash made with another preprocessing config: the KV blocks would be keyed wrongly.
  std::vector<MultimodalInput> in = {BytesInput(png, "another config", n)};
  absl::Status s = (*images)->EncodeMissing(&in);
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_NE(s.message().find("mm_inputs[0]: the image's content hash differs"),
            std::string::npos) << s;
  EXPECT_EQ(in[0].embeddings, nullptr);

  in = {BytesInput(png, fp, n + 1)};
  s = (*images)->EncodeMissing(&in);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("placeholder tokens"), std::string::npos) << s;

  const std::string half = png.substr(0, png.size() / 2);
  in = {BytesInput(png, fp, n), BytesInput(half, fp, n)};
  s = (*images)->EncodeMissing(&in);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("mm_inputs[1]: truncated or corrupt PNG image"), std::string::npos)
      << s;

  in = {BytesInput(png, fp, n)};
  in[0].image.reset();
  s = (*images)->EncodeMissing(&in);
  EXPECT_NE(s.message().find("neither embeddings nor an image"), std::string::npos) << s;

  // What the gRPC handlers check at once (no decoding): the hash and the placeholder count;
  // truncated bytes pass until the encode.
  EXPECT_TRUE(absl::IsFailedPrecondition(
      (*images)->Check({BytesInput(png, "another config", n)})));
  EXPECT_TRUE(absl::IsInvalidArgument((*images)->Check({BytesInput(png, fp, n + 1)})));
  EXPECT_TRUE((*images)->Check({BytesInput(half, fp, n)}).ok());
  EXPECT_TRUE(CheckImages(images->get(), {BytesInput(png, fp, n)}).ok());

  // A text-only worker: no tower, so bytes are refused and embeddings pass.
  in = {BytesInput(png, fp, n)};
  s = CheckImages(nullptr, in);
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  in[0].image.reset();
  in[0].embeddings = std::make_shared<const std::vector<float>>(1, 0.0f);
  EXPECT_TRUE(CheckImages(nullptr, in).ok());

  // A text-only model folder has no tower to load.
  auto text_only = WorkerImages::Load(testing::FixtureDir("llama-tiny"), Options(1 << 20));
  ASSERT_TRUE(text_only.ok()) << text_only.status();
  EXPECT_EQ(*text_only, nullptr);
}

TEST(WorkerImagesTest, BytesCrossTheWireWhenNothingEncodedThem) {
  EngineRequest r;
  MultimodalInput a = BytesInput("image bytes", "fp", 2);
  MultimodalInput b = BytesInput("other", "fp", 2);
  b.image.reset();
  b.embeddings = std::make_shared<const std::vector<float>>(std::vector<float>{1, 2, 3, 4});
  r.mm_inputs = {a, b};
  EXPECT_EQ(PendingImages(r), (std::vector<size_t>{0}));
  google::protobuf::RepeatedPtrField<v1::MultimodalInput> wire;
  MmInputsToWire(r.mm_inputs, &wire);
  EXPECT_EQ(wire.Get(0).image(), "image bytes");
  EXPECT_TRUE(wire.Get(0).embeddings().empty());
  EXPECT_TRUE(wire.Get(1).image().empty());  // never both
  auto back = MmInputsFromWire(wire);
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_NE((*back)[0].image, nullptr);
  EXPECT_EQ(*(*back)[0].image, "image bytes");
  EXPECT_EQ((*back)[0].embeddings, nullptr);
  EXPECT_EQ((*back)[0].content_hash, a.content_hash);
  EXPECT_EQ((*back)[1].image, nullptr);
  EXPECT_EQ(*(*back)[1].embeddings, *b.embeddings);
}

MultimodalContext RouterContext(CheckedImages* checked) {
  MultimodalContext mm;
  mm.image_token_id = 7;
  mm.tokens_per_image = 4;
  mm.preprocess_fingerprint = "fp";
  mm.max_images_per_prompt = 2;
  mm.checked = checked;
  return mm;
}

TEST(CheckedImagesTest, ARepeatedImageIsNotDecodedAgain) {
  const std::string png0 = ReadFileBytes(Llava() + "/image_0.png");
  const std::string png1 = ReadFileBytes(Llava() + "/image_1.png");
  CheckedImages checked(1);
  MultimodalContext mm = RouterContext(&checked);
  std::vector<int32_t> prompt = {1, 7, 2};
  ASSERT_TRUE(EncodePromptImages({{png0, "m0"}}, mm, &prompt).ok());
  EXPECT_EQ(checked.stats().misses, 1);
  EXPECT_EQ(checked.stats().hits, 0);
  // The second turn of the chat sends it again: found by content hash, same result.
  prompt = {1, 7, 2};
  auto again = EncodePromptImages({{png0, "m0"}}, mm, &prompt);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(checked.stats().hits, 1);
  ASSERT_NE((*again)[0].image, nullptr);
  EXPECT_EQ(*(*again)[0].image, png0);
  EXPECT_EQ((*again)[0].content_hash, vision::ImageContentHash(png0, "fp"));
  EXPECT_EQ(prompt, (std::vector<int32_t>{1, 7, 7, 7, 7, 2}));
  // Capacity 1: another image evicts the first, which is then decoded again.
  prompt = {1, 7, 2};
  ASSERT_TRUE(EncodePromptImages({{png1, "m0"}}, mm, &prompt).ok());
  prompt = {1, 7, 2};
  ASSERT_TRUE(EncodePromptImages({{png0, "m0"}}, mm, &prompt).ok());
  EXPECT_EQ(checked.stats().hits, 1);
  EXPECT_EQ(checked.stats().misses, 3);
  EXPECT_EQ(checked.stats().entries, 1);

  // A bad image is never recorded: the second try is the same 400.
  const std::string bad = png1.substr(0, png1.size() / 2);
  for (int i = 0; i < 2; ++i) {
    prompt = {1, 7, 2};
    auto out = EncodePromptImages({{bad, "messages[0].content[0]"}}, mm, &prompt);
    ASSERT_FALSE(out.ok());
    EXPECT_NE(out.status().message().find("truncated or corrupt PNG image"), std::string::npos);
  }
  EXPECT_EQ(checked.stats().misses, 5);
  const std::string text = RenderCheckedImagesMetrics(checked.stats());
  EXPECT_NE(text.find("sluice_router_image_checks_cached_total 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("sluice_router_image_checks_decoded_total 5\n"), std::string::npos) << text;
}

}  // namespace
}  // namespace sluice

namespace sluice {
namespace {

TEST(PickEncoderTest, CacheAffinityOnTheImageWithinLoad) {
  WorkerRegistry registry;
  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i) {
    auto r = registry.Register(WorkerRole::kEncoder, "127.0.0.1:" + std::to_string(7300 + i),
                               WorkerLoad{});
    ASSERT_TRUE(r.ok());
    ids.push_back(r->worker_id);
  }
  ASSERT_TRUE(registry.Register(WorkerRole::kDecode, "127.0.0.1:7400", WorkerLoad{}).ok());
  // The same image goes to the same encoder every time (its cache has it); images spread.
  std::set<std::string> seen;
  for (uint64_t h = 1; h <= 16; ++h) {
    const BlockHash hash{h * 0x9e3779b97f4a7c15ull, h};
    auto first = PickEncoder(&registry, hash, {});
    ASSERT_TRUE(first.has_value());
    EXPECT_EQ(first->role, WorkerRole::kEncoder);
    registry.Release(first->worker_id);
    for (int k = 0; k < 3; ++k) {
      auto again = PickEncoder(&registry, hash, {});
      ASSERT_TRUE(again.has_value());
      EXPECT_EQ(again->worker_id, first->worker_id);
      registry.Release(again->worker_id);
    }
    seen.insert(first->worker_id);
  }
  EXPECT_GE(seen.size(), 2u);

  const BlockHash hash{42, 43};
  auto home = PickEncoder(&registry, hash, {});
  ASSERT_TRUE(home.has_value());
  EXPECT_EQ(home->num_assigned, 1);
  // Busy within the slack (2 more than the least loaded): still the image's encoder.
  auto busy = PickEncoder(&registry, hash, {});
  ASSERT_TRUE(busy.has_value());
  EXPECT_EQ(busy->worker_id, home->worker_id);
  auto busier = PickEncoder(&registry, hash, {});
  EXPECT_EQ(busier->worker_id, home->worker_id);
  // Three calls in flight there, none elsewhere: the least loaded takes the next one.
  auto elsewhere = PickEncoder(&registry, hash, {});
  ASSERT_TRUE(elsewhere.has_value());
  EXPECT_NE(elsewhere->worker_id, home->worker_id);
  // A failed encoder is skipped; none left: nullopt.
  auto other = PickEncoder(&registry, BlockHash{7, 8}, {home->worker_id});
  ASSERT_TRUE(other.has_value());
  EXPECT_NE(other->worker_id, home->worker_id);
  EXPECT_FALSE(PickEncoder(&registry, hash, {ids[0], ids[1], ids[2]}).has_value());
}

}  // namespace
}  // namespace sluice
