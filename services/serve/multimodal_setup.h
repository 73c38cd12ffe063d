// Vision-language serving set-up for `sluice serve` / `sluice generate`: flags, and the
// in-process image encoder (engine/vision/vision_encoder.h) with its embedding cache, when the
// model folder is a LlavaForConditionalGeneration.
#ifndef SLUICE_SERVICES_SERVE_MULTIMODAL_SETUP_H_
#define SLUICE_SERVICES_SERVE_MULTIMODAL_SETUP_H_

#include <cstdint>
#include <memory>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/status/statusor.h"
#include "engine/tokenizer/chat_template.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/vision/embedding_cache.h"
#include "engine/vision/vision_encoder.h"
#include "services/api/image_fetch.h"
#include "services/api/multimodal_input.h"
#include "services/serve/vision_device.h"

namespace sluice {

struct MultimodalFlags {
  // vLLM's --limit-mm-per-prompt: '{"image": N}' or 'image=N'. Empty: 8 images.
  std::string limit_mm_per_prompt;
  int64_t max_image_bytes = 20 << 20;   // encoded size of one image
  int64_t max_image_pixels = 89478485;  // declared width × height (decompression bombs)
  int64_t encoder_cache_bytes = 256 << 20;  // embedding cache; 0: off
  // vLLM's --chat-template-content-format: auto (detected from the template), string, openai.
  std::string chat_template_content_format = "auto";
  // http(s) image URLs (vLLM's --allowed-media-domains): comma-separated hosts fetched from,
  // "*" any; empty: off (data URLs only). Limits: --max-image-bytes, the timeout, redirects.
  std::string allowed_media_domains;
  double media_fetch_timeout_s = 10;
  int32_t media_max_redirects = 3;
  // The router: content hashes of images already checked, kept so a repeated image is not
  // decoded again (--image-check-cache-entries; 0: off).
  int64_t image_check_cache_entries = 4096;
  // serve / generate --vision-device: where the in-process vision tower runs (cpu, cuda);
  // empty: the engine's --device. `sluice encoder --device` sets it for the encoder.
  std::string vision_device;
  // --vision-batch: images per CUDA tower pass.
  int64_t vision_max_batch_images = 8;
};

// AddMultimodalFlags: the image flags; `with_cache`: also --encoder-cache-bytes (processes that
// encode: serve, generate, encoder); without it (the router) --image-check-cache-entries.
void AddMultimodalFlags(CLI::App& app, MultimodalFlags& flags, bool with_cache = true);

// MultimodalRuntime owns what MultimodalContext borrows.
struct MultimodalRuntime {
  std::unique_ptr<vision::VisionEncoder> encoder;
  std::unique_ptr<vision::EmbeddingCache> cache;
  std::unique_ptr<ImageFetcher> fetcher;
  std::unique_ptr<CheckedImages> checked;  // the router's: images already checked
  ImageEncodeCounters encode_counters;       // with an encoder
  MultimodalContext context;
};

// ResolveVisionPlacement: flags.vision_device (or `engine_device` when empty) with the batch
// flag, and dummy weights for --load-format dummy.
VisionPlacement ResolveVisionPlacement(const MultimodalFlags& flags,
                                       const std::string& engine_device,
                                       const std::string& load_format);

// LoadMultimodal returns null for a text-only model folder, else the encoder loaded from
// `model_dir` on `placement` (vision_device.h) and the context for the API. Errors:
// InvalidArgument for a malformed --limit-mm-per-prompt or content format, an image token the
// tokenizer cannot spell; those of LoadVisionEncoderOn.
absl::StatusOr<std::unique_ptr<MultimodalRuntime>> LoadMultimodal(
    const std::string& model_dir, const MultimodalFlags& flags, const Tokenizer& tokenizer,
    const ChatTemplate* chat_template, const VisionPlacement& placement = {});

// LoadRouterMultimodal: the router's context (no encoder: images are checked and sent to
// encoder workers), from config.json and preprocessor_config.json only (no weights). Null for a
// text-only model folder. Errors: as LoadMultimodal, and those of the two config parsers.
absl::StatusOr<std::unique_ptr<MultimodalRuntime>> LoadRouterMultimodal(
    const std::string& model_dir, const MultimodalFlags& flags, const Tokenizer& tokenizer,
    const ChatTemplate* chat_template);

}  // namespace sluice

#endif  // SLUICE_SERVICES_SERVE_MULTIMODAL_SETUP_H_
