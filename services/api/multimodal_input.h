// Images in chat requests (issue 26): content parts to image bytes, the conversation as the
// chat template expects it, and the tokenized prompt's image placeholders expanded and paired
// with their embeddings (EngineRequest::mm_inputs).
//
// Accepted content parts (vLLM / OpenAI):
//   {"type": "image_url", "image_url": {"url": "data:image/png;base64,...", "detail": "auto"}}
//   {"type": "image_url", "image_url": "data:..."}
//   {"type": "image", "image": "data:..."} or {"type": "image", "url": "data:..."}  (HF style)
// Base64 data URLs are read; http(s) URLs only with a fetcher (MultimodalContext::fetcher, from
// --allowed-media-domains: hosts on the allow-list, with size, time and redirect limits), else
// refused.
// `detail` must be auto, low or high and changes nothing (the CLIP tower has one resolution).
//
// Two template conventions, as vLLM's --chat-template-content-format:
//   kString (templates that use message['content'] as text): text parts joined by "\n", and
//     for every image of the message not already marked by a placeholder in its text, one
//     placeholder line in front (vLLM's _get_full_multimodal_text_prompt);
//   kOpenAi (templates that iterate over content parts, the Hugging Face convention): the
//     content stays a list of {"type": "text", "text": ...} and {"type": "image"} parts and
//     the template writes the placeholders.
#ifndef SLUICE_SERVICES_API_MULTIMODAL_INPUT_H_
#define SLUICE_SERVICES_API_MULTIMODAL_INPUT_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/sched/request.h"
#include "engine/vision/embedding_cache.h"
#include "engine/vision/image.h"
#include "engine/vision/image_processor.h"
#include "engine/vision/vision_encoder.h"
#include "services/api/checked_images.h"
#include "nlohmann/json.hpp"

namespace sluice {

enum class ChatContentFormat { kString, kOpenAi };

class ImageFetcher;  // services/api/image_fetch.h

// DetectChatContentFormat: kOpenAi when the template iterates over a message's content or
// reads a part's type, else kString.
ChatContentFormat DetectChatContentFormat(const std::string& template_source);

// ImageEncodeCounters: images a process turned into embeddings itself (embedding-cache misses)
// and the wall time spent decoding and encoding them, for its /metrics (the encoder's share of
// TTFT, bench/vision_ttft.py).
struct ImageEncodeCounters {
  std::atomic<int64_t> images{0};
  std::atomic<int64_t> micros{0};
};

// MultimodalContext: a vision-language deployment's image settings. Pointers are borrowed.
struct MultimodalContext {
  // The in-process encoder (`sluice serve`). Null (the router): images are decoded only to
  // check them (the same 400s), and each MultimodalInput carries its bytes (`image`) for an
  // encoder worker instead of embeddings.
  const vision::VisionEncoder* encoder = nullptr;
  vision::EmbeddingCache* cache = nullptr;  // may be null: every image is encoded
  // Without an encoder: the hashes of images already decoded and found valid, so a repeated
  // image is not decoded again (may be null: every image is decoded).
  CheckedImages* checked = nullptr;
  std::string image_placeholder;            // the text of the image token, e.g. "<|image|>"
  // The model's image geometry (VisionEncoder's, or read from config.json and
  // preprocessor_config.json without the weights): the image token, the placeholder tokens
  // each image expands to, and the preprocessing fingerprint of ImageContentHash.
  int32_t image_token_id = -1;
  int64_t tokens_per_image = 0;
  std::string preprocess_fingerprint;
  // Without an encoder: the preprocessing and the tower's input side, so the check refuses
  // what the encoder would (vision::CheckResizedSize); null: not checked here.
  std::shared_ptr<const vision::ImageProcessorConfig> processor;
  int64_t tower_image_size = 0;
  int32_t max_images_per_prompt = 8;        // --limit-mm-per-prompt
  vision::ImageDecodeLimits decode_limits;
  ChatContentFormat content_format = ChatContentFormat::kString;
  // http(s) image URLs are fetched through this (--allowed-media-domains); null: refused.
  const ImageFetcher* fetcher = nullptr;
  // Where EncodePromptImages counts the images it encodes (may be null).
  ImageEncodeCounters* encode_counters = nullptr;
};

// ChatImage: one image part's bytes and where it was (for error messages).
struct ChatImage {
  std::string bytes;
  std::string where;  // e.g. "messages[1].content[0]"
};

// ImagePartBytes reads an image content part (`type` image_url or image). Errors:
// InvalidArgument (param "messages") naming `where` and the problem: no url, a URL that is not
// a data URL (http(s) named as such), not base64, over the byte limit, a bad detail.
absl::StatusOr<ChatImage> ImagePartBytes(const nlohmann::json& part, const std::string& where,
                                         const MultimodalContext& mm);

// FlattenContent builds one message's template content from its text parts and image parts
// (in order, `is_image` marking which entries of `texts` are image slots) per
// mm.content_format. Errors: InvalidArgument when the text holds more placeholders than the
// message has images (kString).
absl::StatusOr<nlohmann::json> FlattenContent(const std::vector<std::string>& texts,
                                              const std::vector<bool>& is_image,
                                              const MultimodalContext& mm,
                                              const std::string& where);

// EncodePromptImages expands the image tokens of `prompt` (tokenized chat text) to
// tokens_per_image each and returns one MultimodalInput per image: decoded (limits and 400s of
// DecodeImage, naming the image), encoded through the cache — or, without mm.encoder, checked
// by decoding (skipped for a content hash in mm.checked) and returned with its bytes and no
// embeddings. Errors: InvalidArgument (param
// "messages") for an image that does not decode, a placeholder count that differs from the
// number of images, more images than max_images_per_prompt.
absl::StatusOr<std::vector<MultimodalInput>> EncodePromptImages(
    const std::vector<ChatImage>& images, const MultimodalContext& mm,
    std::vector<int32_t>* prompt);

// ParseLimitMmPerPrompt reads vLLM's --limit-mm-per-prompt: '{"image": 3}' or 'image=3' → 3.
// Errors: InvalidArgument for another modality, a non-integer or a value outside [0, 1024].
absl::StatusOr<int32_t> ParseLimitMmPerPrompt(const std::string& value);

}  // namespace sluice

#endif  // SLUICE_SERVICES_API_MULTIMODAL_INPUT_H_
