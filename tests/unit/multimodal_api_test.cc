// The API side of image input (services/api/multimodal_input.h) and the embedding cache.
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/escaping.h"
#include "engine/vision/embedding_cache.h"
#include "nlohmann/json.hpp"
#include "services/api/multimodal_input.h"

namespace sluice {
namespace {

using nlohmann::json;

TEST(MultimodalApiTest, LimitMmPerPromptAcceptsVllmSpellings) {
  EXPECT_EQ(*ParseLimitMmPerPrompt(R"({"image": 5})"), 5);
  EXPECT_EQ(*ParseLimitMmPerPrompt("image=2"), 2);
  EXPECT_EQ(*ParseLimitMmPerPrompt("image = 0"), 0);
  for (const char* bad : {R"({"video": 1})", "audio=1", "image=x", R"({"image": 1.5})",
                          "image=-1", "image=5000"}) {
    EXPECT_EQ(ParseLimitMmPerPrompt(bad).status().code(), absl::StatusCode::kInvalidArgument)
        << bad;
  }
}

TEST(MultimodalApiTest, ContentFormatDetection) {
  EXPECT_EQ(DetectChatContentFormat("{{ message['content'].strip() }}"),
            ChatContentFormat::kString);
  EXPECT_EQ(DetectChatContentFormat("{% for part in message['content'] %}{{ part }}{% endfor %}"),
            ChatContentFormat::kOpenAi);
  EXPECT_EQ(DetectChatContentFormat("{% for c in m.content %}{% endfor %}"),
            ChatContentFormat::kOpenAi);
  EXPECT_EQ(DetectChatContentFormat("{% if item['type'] == 'image' %}<image>{% endif %}"),
            ChatContentFormat::kOpenAi);
}

TEST(MultimodalApiTest, StringFormatPutsMissingPlaceholdersFirst) {
  MultimodalContext mm;
  mm.image_placeholder = "<|image|>";
  // [image, text]: vLLM's "<placeholder>\n<text>".
  auto c = FlattenContent({"", "What is it?"}, {true, false}, mm, "m");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(*c, json("<|image|>\nWhat is it?"));
  // Placeholders already in the text stay where they are; only missing ones are added.
  c = FlattenContent({"A <|image|> B", "", ""}, {false, true, true}, mm, "m");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(*c, json("<|image|>\nA <|image|> B"));
  // Text parts are joined by newlines.
  c = FlattenContent({"a", "b"}, {false, false}, mm, "m");
  EXPECT_EQ(*c, json("a\nb"));
  // More placeholders than images.
  c = FlattenContent({"<|image|><|image|>", ""}, {false, true}, mm, "messages[0].content");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("messages[0].content: the text has more '<|image|>' "
                                      "placeholders than the message has images (1)"),
            std::string::npos);
}

TEST(MultimodalApiTest, OpenAiFormatKeepsParts) {
  MultimodalContext mm;
  mm.content_format = ChatContentFormat::kOpenAi;
  auto c = FlattenContent({"hi", ""}, {false, true}, mm, "m");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(*c, json::parse(R"([{"type":"text","text":"hi"},{"type":"image"}])"));
}

TEST(MultimodalApiTest, ImagePartBytes) {
  MultimodalContext mm;
  mm.decode_limits.max_bytes = 6;
  const std::string b64 = absl::Base64Escape("abcdef");
  auto part = json::parse(R"({"type":"image_url","image_url":{"url":"data:image/png;base64,)" +
                          b64 + R"("}})");
  auto image = ImagePartBytes(part, "w", mm);
  ASSERT_TRUE(image.ok()) << image.status();
  EXPECT_EQ(image->bytes, "abcdef");
  // HF style and the string shortcut.
  image = ImagePartBytes(json{{"type", "image"}, {"image", "data:image/png;base64," + b64}},
                         "w", mm);
  ASSERT_TRUE(image.ok());
  image = ImagePartBytes(json{{"type", "image_url"}, {"image_url", "data:;base64," + b64}}, "w",
                         mm);
  ASSERT_TRUE(image.ok());
  const std::string big = absl::Base64Escape(std::string(60, 'x'));
  image = ImagePartBytes(json{{"type", "image_url"}, {"image_url", "data:;base64," + big}}, "w",
                         mm);
  EXPECT_NE(image.status().message().find("over the limit of 6 bytes"), std::string::npos);
  image = ImagePartBytes(json{{"type", "image_url"}, {"image_url", "data:image/png,rawtext"}}, "w",
                         mm);
  EXPECT_NE(image.status().message().find("must be base64-encoded"), std::string::npos);
  image = ImagePartBytes(json{{"type", "image_url"}, {"image_url", {{"url", "HTTP://x/y.png"}}}},
                         "w", mm);
  EXPECT_NE(image.status().message().find("are not fetched"), std::string::npos);
  image = ImagePartBytes(json{{"type", "image_url"}, {"image_url", {{"url", 3}}}}, "w", mm);
  EXPECT_NE(image.status().message().find("needs a string URL"), std::string::npos);
}

TEST(EmbeddingCacheTest, LruWithinTheByteBound) {
  vision::EmbeddingCache cache(3 * 4 * sizeof(float));  // three 4-float entries
  auto entry = [](float v) { return std::make_shared<const std::vector<float>>(4, v); };
  const BlockHash k1{1, 1}, k2{2, 2}, k3{3, 3}, k4{4, 4};
  cache.Insert(k1, entry(1));
  cache.Insert(k2, entry(2));
  cache.Insert(k3, entry(3));
  ASSERT_NE(cache.Lookup(k1), nullptr);  // k1 now most recent: k2 is the LRU
  cache.Insert(k4, entry(4));
  EXPECT_EQ(cache.Lookup(k2), nullptr);
  EXPECT_EQ((*cache.Lookup(k1))[0], 1.0f);
  EXPECT_NE(cache.Lookup(k3), nullptr);
  EXPECT_NE(cache.Lookup(k4), nullptr);
  const vision::EmbeddingCacheStats s = cache.stats();
  EXPECT_EQ(s.hits, 4);
  EXPECT_EQ(s.misses, 1);
  EXPECT_EQ(s.evictions, 1);
  EXPECT_EQ(s.entries, 3);
  EXPECT_EQ(s.bytes, 48);
  cache.Insert(k1, std::make_shared<const std::vector<float>>(13, 0.0f));  // too big: not kept
  EXPECT_EQ(cache.stats().entries, 3);
}

TEST(EmbeddingCacheTest, ContentHashCoversBytesAndPreprocessing) {
  const BlockHash a = vision::ImageContentHash("png bytes", "cfg1");
  EXPECT_EQ(a, vision::ImageContentHash("png bytes", "cfg1"));
  EXPECT_NE(a, vision::ImageContentHash("png bytez", "cfg1"));
  EXPECT_NE(a, vision::ImageContentHash("png bytes", "cfg2"));
}

}  // namespace
}  // namespace sluice
