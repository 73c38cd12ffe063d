#include "services/serve/multimodal_setup.h"

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "engine/model/model_config.h"
#include "nlohmann/json.hpp"

namespace sluice {

void AddMultimodalFlags(CLI::App& app, MultimodalFlags& flags) {
  app.add_option("--limit-mm-per-prompt", flags.limit_mm_per_prompt,
                 "Images per prompt at most (vision-language models): '{\"image\": N}' or "
                 "'image=N' (default 8)");
  app.add_option("--max-image-bytes", flags.max_image_bytes,
                 "Largest encoded image accepted, bytes (default 20 MiB)");
  app.add_option("--max-image-pixels", flags.max_image_pixels,
                 "Largest declared image size accepted, width x height (default 89478485)");
  app.add_option("--encoder-cache-bytes", flags.encoder_cache_bytes,
                 "Image embedding cache size in bytes, LRU (default 256 MiB; 0: off)");
  app.add_option("--chat-template-content-format", flags.chat_template_content_format,
                 "How image messages reach the chat template: auto, string, openai")
      ->check(CLI::IsMember({"auto", "string", "openai"}));
}

absl::StatusOr<std::unique_ptr<MultimodalRuntime>> LoadMultimodal(
    const std::string& model_dir, const MultimodalFlags& flags, const Tokenizer& tokenizer,
    const ChatTemplate* chat_template) {
  absl::StatusOr<ModelConfig> config = ModelConfig::Load(model_dir);
  if (!config.ok()) return config.status();
  if (config->multimodal_architecture.empty()) return nullptr;
  auto rt = std::make_unique<MultimodalRuntime>();
  if (!flags.limit_mm_per_prompt.empty()) {
    absl::StatusOr<int32_t> limit = ParseLimitMmPerPrompt(flags.limit_mm_per_prompt);
    if (!limit.ok()) return limit.status();
    rt->context.max_images_per_prompt = *limit;
  }
  absl::StatusOr<std::unique_ptr<vision::VisionEncoder>> encoder =
      vision::VisionEncoder::Load(model_dir);
  if (!encoder.ok()) return encoder.status();
  rt->encoder = *std::move(encoder);
  const int32_t image_token = rt->encoder->image_token_id();
  rt->context.image_placeholder =
      tokenizer.Decode(std::vector<int32_t>{image_token}, /*skip_special_tokens=*/false);
  if (tokenizer.Encode(rt->context.image_placeholder, false) != std::vector<int32_t>{image_token}) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the image token ", image_token, " ('", rt->context.image_placeholder,
        "') does not tokenize back to itself"));
  }
  rt->context.encoder = rt->encoder.get();
  if (flags.encoder_cache_bytes > 0) {
    rt->cache = std::make_unique<vision::EmbeddingCache>(flags.encoder_cache_bytes);
    rt->context.cache = rt->cache.get();
  }
  rt->context.decode_limits.max_bytes = flags.max_image_bytes;
  rt->context.decode_limits.max_pixels = flags.max_image_pixels;
  if (flags.chat_template_content_format == "openai") {
    rt->context.content_format = ChatContentFormat::kOpenAi;
  } else if (flags.chat_template_content_format == "string") {
    rt->context.content_format = ChatContentFormat::kString;
  } else if (chat_template != nullptr) {
    rt->context.content_format = DetectChatContentFormat(chat_template->source());
  }
  return rt;
}

}  // namespace sluice
