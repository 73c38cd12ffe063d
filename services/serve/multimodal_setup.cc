#include "services/serve/multimodal_setup.h"

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "engine/model/model_config.h"
#include "engine/vision/image_processor.h"
#include "engine/vision/llava_config.h"
#include "nlohmann/json.hpp"

namespace sluice {

void AddMultimodalFlags(CLI::App& app, MultimodalFlags& flags, bool with_cache) {
  app.add_option("--limit-mm-per-prompt", flags.limit_mm_per_prompt,
                 "Images per prompt at most (vision-language models): '{\"image\": N}' or "
                 "'image=N' (default 8)");
  app.add_option("--max-image-bytes", flags.max_image_bytes,
                 "Largest encoded image accepted, bytes (default 20 MiB)");
  app.add_option("--max-image-pixels", flags.max_image_pixels,
                 "Largest declared image size accepted, width x height (default 89478485)");
  if (with_cache) {
    app.add_option("--encoder-cache-bytes", flags.encoder_cache_bytes,
                   "Image embedding cache size in bytes, LRU (default 256 MiB; 0: off)");
  } else {
    app.add_option("--image-check-cache-entries", flags.image_check_cache_entries,
                   "Content hashes of checked images kept, so repeated images are not decoded "
                   "again (default 4096; 0: off)")
        ->check(CLI::NonNegativeNumber);
  }
  app.add_option("--allowed-media-domains", flags.allowed_media_domains,
                 "Hosts whose http(s) image URLs are fetched, comma-separated ('*': any); "
                 "default none: data URLs only");
  app.add_option("--media-fetch-timeout-s", flags.media_fetch_timeout_s,
                 "Time limit of one image URL fetch, redirects included (default 10)")
      ->check(CLI::PositiveNumber);
  app.add_option("--media-max-redirects", flags.media_max_redirects,
                 "Redirects an image URL may take (default 3)")
      ->check(CLI::NonNegativeNumber);
  if (with_cache) {
    app.add_option("--vision-batch", flags.vision_max_batch_images,
                   "Images per vision tower pass on the GPU (default 8)")
        ->check(CLI::PositiveNumber);
  }
  app.add_option("--chat-template-content-format", flags.chat_template_content_format,
                 "How image messages reach the chat template: auto, string, openai")
      ->check(CLI::IsMember({"auto", "string", "openai"}));
}

namespace {

// FillContext sets what the API needs from the flags, the tokenizer and the model's image
// geometry (context->image_token_id etc. already set).
absl::Status FillContext(const MultimodalFlags& flags, const Tokenizer& tokenizer,
                         const ChatTemplate* chat_template, MultimodalRuntime* rt) {
  MultimodalContext* context = &rt->context;
  if (!flags.allowed_media_domains.empty()) {
    ImageFetchOptions fetch;
    for (absl::string_view d : absl::StrSplit(flags.allowed_media_domains, ',',
                                              absl::SkipWhitespace())) {
      fetch.allowed_domains.emplace_back(absl::StripAsciiWhitespace(d));
    }
    fetch.max_bytes = flags.max_image_bytes;
    fetch.timeout = absl::Seconds(flags.media_fetch_timeout_s);
    fetch.max_redirects = flags.media_max_redirects;
    rt->fetcher = std::make_unique<ImageFetcher>(std::move(fetch));
    context->fetcher = rt->fetcher.get();
  }
  if (!flags.limit_mm_per_prompt.empty()) {
    absl::StatusOr<int32_t> limit = ParseLimitMmPerPrompt(flags.limit_mm_per_prompt);
    if (!limit.ok()) return limit.status();
    context->max_images_per_prompt = *limit;
  }
  const int32_t image_token = context->image_token_id;
  context->image_placeholder =
      tokenizer.Decode(std::vector<int32_t>{image_token}, /*skip_special_tokens=*/false);
  if (tokenizer.Encode(context->image_placeholder, false) != std::vector<int32_t>{image_token}) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the image token ", image_token, " ('", context->image_placeholder,
        "') does not tokenize back to itself"));
  }
  context->decode_limits.max_bytes = flags.max_image_bytes;
  context->decode_limits.max_pixels = flags.max_image_pixels;
  if (flags.chat_template_content_format == "openai") {
    context->content_format = ChatContentFormat::kOpenAi;
  } else if (flags.chat_template_content_format == "string") {
    context->content_format = ChatContentFormat::kString;
  } else if (chat_template != nullptr) {
    context->content_format = DetectChatContentFormat(chat_template->source());
  }
  return absl::OkStatus();
}

}  // namespace

VisionPlacement ResolveVisionPlacement(const MultimodalFlags& flags,
                                       const std::string& engine_device,
                                       const std::string& load_format) {
  VisionPlacement placement;
  placement.device = flags.vision_device.empty() ? engine_device : flags.vision_device;
  placement.dummy_weights = load_format == "dummy";
  placement.max_batch_images = flags.vision_max_batch_images;
  return placement;
}

absl::StatusOr<std::unique_ptr<MultimodalRuntime>> LoadMultimodal(
    const std::string& model_dir, const MultimodalFlags& flags, const Tokenizer& tokenizer,
    const ChatTemplate* chat_template, const VisionPlacement& placement) {
  absl::StatusOr<ModelConfig> config = ModelConfig::Load(model_dir);
  if (!config.ok()) return config.status();
  if (config->multimodal_architecture.empty()) return nullptr;
  auto rt = std::make_unique<MultimodalRuntime>();
  absl::StatusOr<std::unique_ptr<vision::VisionEncoder>> encoder =
      LoadVisionEncoderOn(model_dir, placement);
  if (!encoder.ok()) return encoder.status();
  rt->encoder = *std::move(encoder);
  rt->context.encoder = rt->encoder.get();
  rt->context.encode_counters = &rt->encode_counters;
  rt->context.image_token_id = rt->encoder->image_token_id();
  rt->context.tokens_per_image = rt->encoder->tokens_per_image();
  rt->context.preprocess_fingerprint = rt->encoder->processor().Fingerprint();
  if (absl::Status s = FillContext(flags, tokenizer, chat_template, rt.get()); !s.ok()) {
    return s;
  }
  if (flags.encoder_cache_bytes > 0) {
    rt->cache = std::make_unique<vision::EmbeddingCache>(flags.encoder_cache_bytes);
    rt->context.cache = rt->cache.get();
  }
  return rt;
}

absl::StatusOr<std::unique_ptr<MultimodalRuntime>> LoadRouterMultimodal(
    const std::string& model_dir, const MultimodalFlags& flags, const Tokenizer& tokenizer,
    const ChatTemplate* chat_template) {
  absl::StatusOr<ModelConfig> config = ModelConfig::Load(model_dir);
  if (!config.ok()) return config.status();
  if (config->multimodal_architecture.empty()) return nullptr;
  absl::StatusOr<vision::LlavaConfig> llava = vision::LlavaConfig::Load(model_dir);
  if (!llava.ok()) return llava.status();
  absl::StatusOr<vision::ImageProcessorConfig> processor =
      vision::ImageProcessorConfig::Load(model_dir);
  if (!processor.ok()) return processor.status();
  auto rt = std::make_unique<MultimodalRuntime>();
  rt->context.image_token_id = llava->image_token_index;
  rt->context.tokens_per_image = llava->image_seq_length;
  rt->context.preprocess_fingerprint = processor->Fingerprint();
  rt->context.processor = std::make_shared<const vision::ImageProcessorConfig>(*processor);
  rt->context.tower_image_size = llava->vision.image_size;
  if (absl::Status s = FillContext(flags, tokenizer, chat_template, rt.get()); !s.ok()) {
    return s;
  }
  if (flags.image_check_cache_entries > 0) {
    rt->checked = std::make_unique<CheckedImages>(flags.image_check_cache_entries);
    rt->context.checked = rt->checked.get();
  }
  return rt;
}

}  // namespace sluice
